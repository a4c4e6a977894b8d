// Resuming training from a checkpoint at another world size, bitwise (checkpoint.h's trainer
// overloads over ShardedParams + dmuon::Optimizer):
//   checkpoint_train_test --save DIR            K steps at this world size, then save
//   checkpoint_train_test --load DIR            at this world size: a reference run of K + J steps
//                                               from scratch, and a run that loads DIR (saved at
//                                               any world size) and continues J steps; the full
//                                               parameters, step counts and step must match bitwise
// Gradients are small integers written into full_grad on every rank so that their Sum reduction is
// exact and the same at every world size (rank 0 writes G - (W-1)·c, the others c). The optimizer
// is bitwise layout-invariant (optimizer.h), so the reference may run at the load's world size.
// Meshes: dp_shard=W, and HSDP dp_replicate=2,dp_shard=2 for a save at 4 ranks.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dmuon/checkpoint.h"
#include "dmuon/comm.h"
#include "dmuon/error.h"
#include "dmuon/mesh_comms.h"
#include "dmuon/optimizer.h"
#include "dmuon/sharded_params.h"
#include "verdict.h"

namespace {

using namespace dmuon;

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

struct Trainer {
  std::unique_ptr<ShardedParams> params;
  std::unique_ptr<Optimizer> opt;

  Trainer(std::shared_ptr<Communicator> world, const std::string& mesh_text) {
    auto comms = std::make_shared<MeshCommunicators>(world);
    ShardedParamsOptions po;
    po.reduce = GradReduce::Sum;
    params = std::make_unique<ShardedParams>(comms, Mesh::parse(mesh_text), model(), po);
    OptimizerOptions oo;
    oo.env_override = false;
    opt = std::make_unique<Optimizer>(comms, params->inventory(), groups(), oo);
    // Initial values from the global index (shards of the same full tensors at any world size).
    for (size_t i = 0; i < params->size(); ++i) {
      const Box box = params->local_box(i);
      const Shape& shape = params->spec(i).shape;
      float* p = params->param(i).f32();
      const int64_t row = shape.numel() / std::max<int64_t>(shape[0], 1);
      int64_t k = 0;
      for (const Range& r : box.dims[0].ranges())
        for (int64_t g = r.begin * row; g < r.end * row; ++g)
          p[k++] = static_cast<float>(static_cast<int>(mix(static_cast<uint32_t>(i * 7919 + g)) % 2001) - 1000) / 256.0f;
    }
  }

  void step(int s, int world, int rank) {
    for (size_t i = 0; i < params->size(); ++i) {
      TensorView g = params->full_grad(i);
      float* d = g.f32();
      for (int64_t j = 0; j < g.numel(); ++j) {
        const uint32_t x = mix(static_cast<uint32_t>(s * 1000003 + i * 40503 + j * 97));
        const float G = static_cast<float>(static_cast<int>(x % 41) - 20);
        const float c = static_cast<float>(static_cast<int>((x >> 8) % 7) - 3);
        d[j] = rank == 0 ? G - static_cast<float>(world - 1) * c : c;
      }
    }
    params->reduce_grads();
    opt->step(params->params(), params->grads());
  }

  std::vector<std::vector<float>> full() {
    params->unshard();
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < params->size(); ++i) {
      const TensorView f = params->full_param(i);
      out.emplace_back(f.f32(), f.f32() + f.numel());
    }
    params->reshard();
    return out;
  }
};

std::string mesh_for(int world, bool saving) {
  if (world == 4 && saving) return "dp_replicate=2,dp_shard=2";
  return "dp_shard=" + std::to_string(world);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--save" || a == "--load") mode = a.substr(2), dir = argv[i + 1];
  }
  if (mode.empty()) {
    std::fprintf(stderr, "usage: %s --save DIR | --load DIR\n", argv[0]);
    return 2;
  }
  const char* backend = std::getenv("DMUON_TEST_BACKEND");
  std::shared_ptr<Communicator> world = make_communicator(backend != nullptr && *backend != '\0' ? backend : "mpi");
  world->set_default_timeout(std::chrono::seconds(30));
  g_rank = world->rank();
  const int W = world->size();
  try {
    if (mode == "save") {
      Trainer t(world, mesh_for(W, true));
      for (int s = 0; s < kSavedSteps; ++s) t.step(s, W, g_rank);
      CheckpointSaveOptions o;
      o.metadata["mesh"] = mesh_for(W, true);
      save_checkpoint(dir, *t.params, t.opt.get(), kSavedSteps, o);
    } else {
      Trainer ref(world, mesh_for(W, false));
      for (int s = 0; s < kSavedSteps + kMoreSteps; ++s) ref.step(s, W, g_rank);
      const auto expect = ref.full();

      Trainer resumed(world, mesh_for(W, false));
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
  const int code = dmuon::test::agree_verdict(*world, g_failures, "checkpoint train " + mode + " at " + std::to_string(W) + " ranks");
  world.reset();
  return code;
}
