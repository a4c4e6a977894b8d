// Internal: state offload (OptimizerOptions::offload_state). Every parameter's optimizer state has
// its home copy in pinned host memory (the StateStore's tensors); a step makes a group of parameters'
// state resident in one device slot before it uses it and writes it back after:
//   prefetch(g)  copy-in of g issued on the copy stream (overlaps the current chunk's compute);
//   acquire(g)   g resident: the calling thread's stream waits on the device for its copy-in (the
//                host waits only until the copy-in job has queued its copies); resident() then
//                gives the slot's pointers;
//   release(g)   write-back of g issued on the copy stream, which waits on the device for the
//                calling thread's kernels (a Backend::fence, no host wait); the slot returns to the
//                pool once the write-back is queued: the next copy-in into it follows it on the copy
//                stream;
//   flush()      end of step: waits for every copy, so the home copies (what the state views, state
//                dicts and checkpoints read) hold the step's result.
// A group is the exact list of one acquire/prefetch call (a pipeline chunk's parameters, an AdamW
// batch); release names the same list. Copies are Backend::copy_queued (memcpy on the cpu backend,
// cudaMemcpyAsync on the copy stream on cuda, ordered by fences, never waited for on the host
// before flush), so the values are moved, never computed: results are bitwise those without
// offload.
//
// Slots come from a pool in the backend's device memory (host memory on the cpu backend, which has
// no other): a group takes the smallest free slot that fits; when none does, write-backs not yet
// queued are awaited first, and only then is a slot allocated (after freeing the free slots, all too
// small). So a new slot is only ever made while every other slot holds a group, and the pool never
// exceeds (groups resident at once) × (largest group's state bytes): the bound the pipeline keeps
// by holding at most window + 1 groups (pipeline.cpp). The pool is kept between steps.
//
// Driving thread only (not thread-safe); the copy stream's worker runs the copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/device_services.h"

namespace meshmuon::detail {

struct OffloadCounters {
  uint64_t bytes_in = 0, bytes_out = 0;  // this step: state copied home -> slot, slot -> home
  uint64_t resident_bytes = 0;           // slot pool now (device memory holding state)
  uint64_t peak_resident_bytes = 0;      // largest pool this step
};

class StateOffload {
 public:
  // One region per state tensor of a parameter: its home copy and size.
  struct Region {
    void* home = nullptr;
    size_t bytes = 0;
  };
  // `names`: per parameter, for error messages. The backend must outlive this object.
  StateOffload(DeviceServices& backend, std::vector<std::vector<Region>> params, std::vector<std::string> names);
  ~StateOffload();
  StateOffload(const StateOffload&) = delete;
  StateOffload& operator=(const StateOffload&) = delete;

  void prefetch(std::span<const size_t> params);
  void acquire(std::span<const size_t> params);
  void release(std::span<const size_t> params);
  void flush();

  // The resident copy of tensor `tensor` of `param`; std::invalid_argument (internal) unless the
  // parameter is acquired.
  void* resident(size_t param, size_t tensor) const;

  void begin_step();  // counters of a new step (the pool carries over)
  const OffloadCounters& counters() const { return counters_; }

 private:
  struct Slot {
    Buffer mem;
    enum State : unsigned char { Free, Used, Draining } state = Free;
    Event drained;  // Draining: the write-back is queued (a copy-in into the slot follows it)
    bool drain_queued = false;  // Free, but its write-back may still run on the device (freeing waits)
  };
  struct Group {
    std::vector<size_t> params;
    Slot* slot = nullptr;  // null when the group holds no bytes
    std::vector<std::vector<void*>> resident;  // per params[k], per region
    Event ready;                     // the copy-in job has run (its copies queued)
    std::shared_ptr<Fence> copied;   // after the copy-in's device work (null when nothing to copy)
    bool acquired = false;
  };
  size_t group_bytes(std::span<const size_t> params, std::vector<std::vector<size_t>>* offsets) const;
  Group* create(std::span<const size_t> params);
  Group* find(std::span<const size_t> params, const char* what) const;
  void drop(Group* g);
  Slot* take_slot(size_t bytes);
  void reclaim();
  void wait(const Event& e);

  DeviceServices& backend_;
  std::vector<std::vector<Region>> params_;
  std::vector<std::string> names_;
  std::unique_ptr<Stream> copies_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Group>> groups_;  // prefetched or acquired
  std::vector<Group*> group_of_;                // per parameter, null when not resident
  OffloadCounters counters_;
};

}  // namespace meshmuon::detail
