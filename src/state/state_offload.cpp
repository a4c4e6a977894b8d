// Internal: state offload (state_offload.h).
#include "state/state_offload.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

constexpr size_t kAlign = 256;  // each tensor of a slot starts on a 256-byte boundary (device loads)
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

// The copy stream's jobs end with their copies queued (JobEnd::Queued): whoever uses a group's slot
// waits on the device for the fence its copy-in job records; the write-backs are ordered after
// the slot's kernels by a fence and before the slot's next copy-in by the stream's order; flush()
// and the destructor wait for the device work too.
std::unique_ptr<Stream> make_copy_stream(DeviceServices& backend) { return backend.make_stream(true, JobEnd::Queued); }

}  // namespace

StateOffload::StateOffload(DeviceServices& backend, std::vector<std::vector<Region>> params, std::vector<std::string> names)
    : backend_(backend), params_(std::move(params)), names_(std::move(names)), copies_(make_copy_stream(backend)),
      group_of_(params_.size(), nullptr) {}

StateOffload::~StateOffload() {
  try {
    copies_->synchronize();  // no copy may outlive the slots or the home copies
  } catch (...) {
  }
  copies_.reset();  // (a failed synchronize returns before the device work: the stream's destructor waits)
}

size_t StateOffload::group_bytes(std::span<const size_t> params, std::vector<std::vector<size_t>>* offsets) const {
  size_t total = 0;
  for (size_t p : params) {
    if (offsets) offsets->emplace_back();
    for (const Region& r : params_[p]) {
      if (offsets) offsets->back().push_back(total);
      total += aligned(r.bytes);
    }
  }
  return total;
}

void StateOffload::wait(const Event& e) {
  for (int spin = 0; !e.done(); ++spin) {
    copies_->rethrow();  // a failed copy: its events never complete
    if (spin < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void StateOffload::reclaim() {
  for (auto& s : slots_)
    if (s->state == Slot::Draining && s->drained.done()) s->state = Slot::Free, s->drain_queued = true;
}

StateOffload::Slot* StateOffload::take_slot(size_t bytes) {
  if (bytes == 0) return nullptr;
  const auto best_free = [&]() -> Slot* {
    Slot* best = nullptr;
    for (auto& s : slots_)
      if (s->state == Slot::Free && s->mem.bytes() >= bytes && (!best || s->mem.bytes() < best->mem.bytes())) best = s.get();
    return best;
  };
  reclaim();
  Slot* s = best_free();
  if (!s && std::any_of(slots_.begin(), slots_.end(), [](const auto& x) { return x->state == Slot::Draining; })) {
    for (auto& x : slots_)
      if (x->state == Slot::Draining) wait(x->drained);
    reclaim();
    s = best_free();
  }
  if (!s) {  // every free slot is too small: give them back, then make one (keeps the pool bound)
    // A slot reclaimed behind a queued write-back may still be read by it on the device: wait for
    // the copy stream's device work before freeing one (only here: reusing it needs no wait).
    if (std::any_of(slots_.begin(), slots_.end(), [](const auto& x) { return x->state == Slot::Free && x->drain_queued; })) {
      copies_->synchronize();
      for (auto& x : slots_) x->drain_queued = false;
    }
    std::erase_if(slots_, [&](const auto& x) {
      if (x->state != Slot::Free) return false;
      counters_.resident_bytes -= x->mem.bytes();
      return true;
    });
    auto fresh = std::make_unique<Slot>();
    fresh->mem = backend_.allocate(bytes, backend_.device_caps().device_memory ? MemoryKind::Device : MemoryKind::Host);
    counters_.resident_bytes += fresh->mem.bytes();
    counters_.peak_resident_bytes = std::max(counters_.peak_resident_bytes, counters_.resident_bytes);
    s = fresh.get();
    slots_.push_back(std::move(fresh));
  }
  s->state = Slot::Used;
  s->drain_queued = false;  // (its next write-back follows on the copy stream)
  return s;
}

StateOffload::Group* StateOffload::create(std::span<const size_t> params) {
  for (size_t p : params) {
    MESHMUON_CHECK(p < params_.size(), "[optim] internal: state offload of parameter index ", p, " (", params_.size(),
                " parameters)");
    MESHMUON_CHECK(group_of_[p] == nullptr, "[optim] internal: the state of '", names_[p],
                "' is already resident (acquired or prefetched twice)");
  }
  auto g = std::make_unique<Group>();
  g->params.assign(params.begin(), params.end());
  std::vector<std::vector<size_t>> offsets;
  const size_t bytes = group_bytes(params, &offsets);
  g->slot = take_slot(bytes);
  std::vector<Copy> in;
  uint64_t moved = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    auto& res = g->resident.emplace_back();
    const std::vector<Region>& regions = params_[params[k]];
    for (size_t t = 0; t < regions.size(); ++t) {
      void* dst = g->slot ? static_cast<std::byte*>(g->slot->mem.data()) + offsets[k][t] : nullptr;
      res.push_back(regions[t].bytes ? dst : nullptr);
      if (regions[t].bytes) in.push_back({dst, regions[t].home, regions[t].bytes}), moved += regions[t].bytes;
    }
  }
  if (!in.empty()) {
    DeviceServices* be = &backend_;
    auto fence = std::make_shared<Fence>();  // recorded by the job after its copies
    copies_->submit([be, in = std::move(in), fence] {
      for (const Copy& c : in) be->copy_queued(c.dst, c.src, c.bytes);
      *fence = be->fence();
    });
    g->copied = std::move(fence);
  }
  g->ready = copies_->record();
  counters_.bytes_in += moved;
  for (size_t p : params) group_of_[p] = g.get();
  groups_.push_back(std::move(g));
  return groups_.back().get();
}

StateOffload::Group* StateOffload::find(std::span<const size_t> params, const char* what) const {
  Group* g = group_of_[params.front()];
  if (!g) return nullptr;
  const bool same = g->params.size() == params.size() && std::equal(params.begin(), params.end(), g->params.begin());
  MESHMUON_CHECK(same, "[optim] internal: state offload ", what, " of a parameter list that differs from the one '",
              names_[params.front()], "' was made resident with");
  return g;
}

void StateOffload::drop(Group* g) {
  for (size_t p : g->params) group_of_[p] = nullptr;
  std::erase_if(groups_, [g](const auto& x) { return x.get() == g; });
}

void StateOffload::prefetch(std::span<const size_t> params) {
  if (params.empty() || group_of_[params.front()] != nullptr) return;  // already resident
  create(params);
}

void StateOffload::acquire(std::span<const size_t> params) {
  if (params.empty()) return;
  Group* g = find(params, "acquire");
  MESHMUON_CHECK(!g || !g->acquired, "[optim] internal: the state of '", names_[params.front()], "' is acquired twice");
  if (!g) g = create(params);
  wait(g->ready);  // the copy-in job has run: its copies are queued and its fence recorded
  if (g->copied) backend_.wait(g->copied->event());  // this thread's later kernels run after them
  g->acquired = true;
}

void StateOffload::release(std::span<const size_t> params) {
  if (params.empty()) return;
  Group* g = find(params, "release");
  MESHMUON_CHECK(g && g->acquired, "[optim] internal: the state of '", names_[params.front()], "' is released without acquire");
  std::vector<Copy> out;
  uint64_t moved = 0;
  for (size_t k = 0; k < g->params.size(); ++k) {
    const std::vector<Region>& regions = params_[g->params[k]];
    for (size_t t = 0; t < regions.size(); ++t)
      if (regions[t].bytes) out.push_back({regions[t].home, g->resident[k][t], regions[t].bytes}), moved += regions[t].bytes;
  }
  if (!out.empty()) {
    // The copy stream reads what this thread's kernels wrote (a device backend's kernels may still
    // be queued on the thread's stream: backend.h): it waits for them on the device.
    DeviceServices* be = &backend_;
    copies_->submit(
        [be, out = std::move(out)] {
          for (const Copy& c : out) be->copy_queued(c.dst, c.src, c.bytes);
        },
        backend_.fence());
  }
  counters_.bytes_out += moved;
  if (g->slot) g->slot->state = Slot::Draining, g->slot->drained = copies_->record();
  drop(g);
}

void StateOffload::flush() {
  // A step that threw may leave groups behind: acquired ones are written back (their state was
  // updated in place, as without offload), prefetched ones dropped (their slot equals home).
  std::exception_ptr failed;
  try {
    while (!groups_.empty()) {
      Group* g = groups_.back().get();
      if (g->acquired) {
        release(g->params);
      } else {
        if (g->slot) g->slot->state = Slot::Draining, g->slot->drained = copies_->record();
        drop(g);
      }
    }
  } catch (...) {  // (a release that cannot be queued: the copies already queued still end here)
    failed = std::current_exception();
    while (!groups_.empty()) drop(groups_.back().get());
  }
  try {
    copies_->synchronize();
  } catch (...) {
    if (!failed) failed = std::current_exception();
  }
  if (failed) {
    copies_ = make_copy_stream(backend_);  // a failed stream runs nothing more: start a fresh one
    for (auto& s : slots_) s->state = Slot::Free, s->drain_queued = false;
    std::rethrow_exception(failed);
  }
  reclaim();
  for (auto& s : slots_) s->drain_queued = false;  // every copy is done
}

void* StateOffload::resident(size_t param, size_t tensor) const {
  const Group* g = group_of_[param];
  MESHMUON_CHECK(g && g->acquired, "[optim] internal: the state of '", names_[param],
              "' is used outside acquire/release (state offload)");
  for (size_t k = 0; k < g->params.size(); ++k)
    if (g->params[k] == param) return g->resident[k][tensor];
  return nullptr;
}

void StateOffload::begin_step() {
  counters_.bytes_in = counters_.bytes_out = 0;
  counters_.peak_resident_bytes = counters_.resident_bytes;
}

}  // namespace meshmuon::detail
