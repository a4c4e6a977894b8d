// Resuming training from a checkpoint at another world size, bitwise (checkpoint.h's trainer
// overloads over ShardedParams + meshmuon::Optimizer):
//   checkpoint_train_test --save DIR            K steps at this world size, then save
//   checkpoint_train_test --load DIR            at this world size: a reference run of K + J steps
//                                               from scratch (always on the cpu backend), and a run
//                                               that loads DIR (saved at any world size, on either
//                                               backend) and continues J steps; the full
//                                               parameters, step counts and step must match bitwise
//   checkpoint_train_test --errors DIR          (fake device) save, corrupt the last rank's file,
//                                               load into a trained engine: every rank throws,
//                                               no byte of its device memory changes
//   --placement owner                           the trainer that saves / loads places its matrices
//                                               whole on owner ranks (ShardedParamsOptions::placement;
//                                               the reference always runs sharded): checkpoints
//                                               move in and out of owner placement at any world size
//   --device fake                               the trainer that saves / loads runs on the fake
//                                               device backend (tests/support/fake_device.h: the
//                                               host touching its memory faults), over a
//                                               communicator staging through its memory space
// Gradients are small integers written into full_grad on every rank so that their Sum reduction is
// exact and the same at every world size (rank 0 writes G - (W-1)·c, the others c). The optimizer
// is bitwise layout-invariant (optimizer.h), so the reference may run at the load's world size.
// Meshes: dp_shard=W, and HSDP dp_replicate=2,dp_shard=2 for a save at 4 ranks.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../support/corrupt_file.h"
#include "../support/fake_device.h"
#include "comm/staging.h"
#include "meshmuon/checkpoint.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/sharded_params.h"
#include "backend/select.h"
#include "verdict.h"

namespace {

using namespace meshmuon;

constexpr int kSavedSteps = 3;
constexpr int kMoreSteps = 2;
int g_rank = 0;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "[rank %d] check failed: %s\n", g_rank, what.c_str());
}

ParamSpec spec(std::string name, Shape shape, Role role = Role::Muon, bool expert = false) {
  ParamSpec p;
  p.name = std::move(name), p.shape = shape, p.role = role, p.expert = expert;
  return p;
}

std::vector<ParamSpec> model() {
  return {spec("w_57", {5, 7}),  spec("w_93", {9, 3}),  spec("bias", {7}, Role::AdamW),
          spec("experts", {3, 4, 5}, Role::Muon, true), spec("w_1", {1, 6})};
}

std::vector<ParamGroup> groups() {
  ParamGroup plain, nor, adam;
  plain.options.lr = 0.02;
  nor.options.lr = 0.03, nor.options.normuon = true;
  adam.options.algorithm = Algorithm::AdamW, adam.options.lr = 0.01;
  plain.params = {0, 4};
  nor.params = {1, 3};
  adam.params = {2};
  return {plain, nor, adam};
}

uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}

// Host views of the engine's memory: every access to a fake device trainer goes through its
// backend's copy (the host touching that memory faults).
struct Trainer {
  std::shared_ptr<test::FakeDeviceBackend> fake;  // null: the cpu backend
  std::unique_ptr<ShardedParams> params;
  std::unique_ptr<Optimizer> opt;

  Trainer(std::shared_ptr<Communicator> world, const std::string& mesh_text, bool on_fake_device = false,
          ParamPlacement placement = ParamPlacement::Sharded) {
    std::unique_ptr<detail::ScopedEngineDevice> inject;
    if (on_fake_device) {
      fake = std::make_shared<test::FakeDeviceBackend>();
      const std::shared_ptr<detail::MemorySpace> space = fake->space();
      const char* backend = std::getenv("MESHMUON_TEST_BACKEND");
      world = backend != nullptr && std::string(backend) == "mpi" ? make_mpi_communicator(space, detail::StagingOptions{})
                                                                  : make_single_communicator(space);  // collective
      inject = std::make_unique<detail::ScopedEngineDevice>(detail::EngineDevice{fake, space});
    }
    auto comms = std::make_shared<MeshCommunicators>(world);
    ShardedParamsOptions po;
    po.reduce = GradReduce::Sum;
    po.placement = placement;
    params = std::make_unique<ShardedParams>(comms, Mesh::parse(mesh_text), model(), po);
    OptimizerOptions oo;
    oo.env_override = false;
    opt = std::make_unique<Optimizer>(comms, params->inventory(), groups(), oo);
    check(params->param(0).device.kind == (fake ? DeviceKind::Cuda : DeviceKind::Cpu), "the engine's device");
    // Initial values from the global index (shards of the same full tensors at any world size).
    for (size_t i = 0; i < params->size(); ++i) {
      const Box box = params->local_box(i);
      const Shape& shape = params->spec(i).shape;
      std::vector<float> p(static_cast<size_t>(box.numel()));
      const int64_t row = shape.numel() / std::max<int64_t>(shape[0], 1);
      size_t k = 0;
      for (const Range& r : box.dims[0].ranges())
        for (int64_t g = r.begin * row; g < r.end * row; ++g)
          p[k++] = static_cast<float>(static_cast<int>(mix(static_cast<uint32_t>(i * 7919 + g)) % 2001) - 1000) / 256.0f;
      write(params->param(i), p);
    }
  }

  void write(const TensorView& v, const std::vector<float>& h) {
    if (h.empty()) return;
    if (fake) fake->copy(v.data, h.data(), h.size() * sizeof(float));
    else std::memcpy(v.data, h.data(), h.size() * sizeof(float));
  }
  std::vector<float> read(const TensorView& v) {
    std::vector<float> h(static_cast<size_t>(v.numel()));
    if (h.empty()) return h;
    if (fake) fake->copy(h.data(), v.data, h.size() * sizeof(float));
    else std::memcpy(h.data(), v.data, h.size() * sizeof(float));
    return h;
  }

  void step(int s, int world, int rank) {
    for (size_t i = 0; i < params->size(); ++i) {
      TensorView g = params->full_grad(i);
      std::vector<float> d(static_cast<size_t>(g.numel()));
      for (int64_t j = 0; j < g.numel(); ++j) {
        const uint32_t x = mix(static_cast<uint32_t>(s * 1000003 + i * 40503 + j * 97));
        const float G = static_cast<float>(static_cast<int>(x % 41) - 20);
        const float c = static_cast<float>(static_cast<int>((x >> 8) % 7) - 3);
        d[static_cast<size_t>(j)] = rank == 0 ? G - static_cast<float>(world - 1) * c : c;
      }
      write(g, d);
    }
    params->reduce_grads();
    opt->step(params->params(), params->grads());
  }

  std::vector<std::vector<float>> full() {
    params->unshard();
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < params->size(); ++i) out.push_back(read(params->full_param(i)));
    params->reshard();
    return out;
  }

  // This rank's parameters and optimizer state, read back (the checkpoint's tensors).
  std::vector<std::vector<float>> local() {
    std::vector<std::vector<float>> out;
    for (const CheckpointTensor& t : checkpoint_tensors(*params, opt.get())) out.push_back(read(t.data));
    return out;
  }
};

std::string mesh_for(int world, bool saving) {
  if (world == 4 && saving) return "dp_replicate=2,dp_shard=2";
  return "dp_shard=" + std::to_string(world);
}

// Fake device: a load from a corrupt checkpoint fails on every rank and leaves every byte of the
// engines' device memory (parameters, optimizer state) and the step counts as they were.
void run_errors(const std::shared_ptr<Communicator>& world, const std::string& dir) {
  const int W = world->size(), last = W - 1;
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier("clean").wait();
  {
    Trainer saver(world, mesh_for(W, false), true);
    for (int s = 0; s < kSavedSteps; ++s) saver.step(s, W, g_rank);
    save_checkpoint(dir, *saver.params, saver.opt.get(), kSavedSteps);
  }
  const std::string file = dir + "/" + read_checkpoint_info(dir).generation + "/rank-" + std::to_string(last) + ".safetensors";
  if (world->rank() == 0) {  // flip a byte of the last rank's file
    test::flip_bits_near_end(file, 3, 0x21);
  }
  world->barrier("corrupted").wait();
  Trainer target(world, mesh_for(W, false), true);
  target.step(7, W, g_rank);  // state that differs from the checkpoint's
  const auto before = target.local();
  try {
    load_checkpoint(dir, *target.params, target.opt.get());
    check(false, "load succeeded despite the corrupt file");
  } catch (const Error& e) {
    const std::string msg = e.what();
    check(msg.find(file) != std::string::npos && msg.find("CRC-32") != std::string::npos, "message: " + msg);
  }
  check(target.local() == before, "a failed load modified device memory");
  for (size_t i = 0; i < target.params->size(); ++i)
    check(target.opt->step_count(i) == 1, "a failed load changed a step count");
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, dir;
  bool fake = false;
  ParamPlacement placement = ParamPlacement::Sharded;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--save" || a == "--load" || a == "--errors") mode = a.substr(2), dir = argv[i + 1];
    else if (a == "--device") fake = std::string(argv[i + 1]) == "fake";
    else if (a == "--placement") placement = std::string(argv[i + 1]) == "owner" ? ParamPlacement::Owner : ParamPlacement::Sharded;
  }
  if (mode.empty()) {
    std::fprintf(stderr, "usage: %s --save DIR | --load DIR | --errors DIR [--device cpu|fake]\n", argv[0]);
    return 2;
  }
  const char* backend = std::getenv("MESHMUON_TEST_BACKEND");
  std::shared_ptr<Communicator> world = make_communicator(backend != nullptr && *backend != '\0' ? backend : "mpi");
  world->set_default_timeout(std::chrono::seconds(30));
  g_rank = world->rank();
  const int W = world->size();
  try {
    if (mode == "errors") {
      run_errors(world, dir);
    } else if (mode == "save") {
      Trainer t(world, mesh_for(W, true), fake, placement);
      if (placement == ParamPlacement::Owner)
        for (size_t i = 0; i < t.params->size(); ++i)
          check(t.params->owner(i) >= 0 || t.params->spec(i).shape.ndim() != 2, "matrix '" + t.params->spec(i).name + "' is owned");
      for (int s = 0; s < kSavedSteps; ++s) t.step(s, W, g_rank);
      CheckpointSaveOptions o;
      o.metadata["mesh"] = mesh_for(W, true) + (placement == ParamPlacement::Owner ? " owner placement" : "");
      save_checkpoint(dir, *t.params, t.opt.get(), kSavedSteps, o);
    } else {
      Trainer ref(world, mesh_for(W, false));
      for (int s = 0; s < kSavedSteps + kMoreSteps; ++s) ref.step(s, W, g_rank);
      const auto expect = ref.full();

      Trainer resumed(world, mesh_for(W, false), fake, placement);
      const CheckpointInfo info = load_checkpoint(dir, *resumed.params, resumed.opt.get());
      check(info.step == kSavedSteps, "step " + std::to_string(info.step));
      for (size_t i = 0; i < resumed.params->size(); ++i)
        check(resumed.opt->step_count(i) == kSavedSteps, "step count of " + resumed.params->spec(i).name);
      for (int s = kSavedSteps; s < kSavedSteps + kMoreSteps; ++s) resumed.step(s, W, g_rank);
      const auto got = resumed.full();
      for (size_t i = 0; i < got.size(); ++i) {
        const bool same = got[i].size() == expect[i].size() &&
                          std::memcmp(got[i].data(), expect[i].data(), got[i].size() * sizeof(float)) == 0;
        check(same, "parameter '" + resumed.params->spec(i).name + "' differs from the uninterrupted run (saved at " +
                        info.metadata.at("mesh") + ")");
      }
      for (size_t i = 0; i < resumed.params->size(); ++i)
        check(resumed.opt->step_count(i) == kSavedSteps + kMoreSteps, "final step count");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", g_rank, mode.c_str(), e.what());
    ++g_failures;
  }
  const int code = meshmuon::test::agree_verdict(*world, g_failures, "checkpoint train " + mode + " at " + std::to_string(W) +
                                                                       " ranks" + (fake ? " (fake device)" : "") +
                                                                       (placement == ParamPlacement::Owner ? " (owner placement)" : ""));
  world.reset();
  return code;
}
