// Shared by the meshmuon::Optimizer dist tests: the test model (uneven and degenerate shapes, a QK
// pair, an expert stack, an AdamW bias), its groups, deterministic values and helpers.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist_env.h"
#include "meshmuon/bf16.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"

namespace meshmuon {
namespace {

using test::comm;

// Meshes that every world size has, for the suites that run one model over several layouts: FSDP
// over all ranks, FSDP × TP=2 (even worlds), TP=3 (3 ranks), FSDP × EP over all ranks (2+).
std::vector<std::string> shard_parallels() {
  const int w = comm().size();
  std::vector<std::string> out = {"dp_shard=" + std::to_string(w)};
  if (w % 2 == 0) out.push_back("dp_shard=" + std::to_string(w / 2) + ",tp=2");
  if (w == 3) out.push_back("tp=3");
  if (w > 1) out.push_back("dp_shard=" + std::to_string(w) + ",ep=" + std::to_string(w));
  return out;
}

// A non-owning shared_ptr to the test's world communicator.
std::shared_ptr<Communicator> shared_comm() { return std::shared_ptr<Communicator>(&comm(), [](Communicator*) {}); }

// The model: uneven and degenerate shapes, a QK pair, an expert stack, an AdamW bias.
ModelDesc test_model(bool extra = false, int64_t w57_rows = 5) {
  ModelDesc m{"dist-test", {}};
  const auto add = [&](std::string name, Shape shape, Role role, TpStyle tp, bool expert = false,
                       std::optional<QkTag> qk = std::nullopt) {
    ParamSpec p;
    p.name = std::move(name), p.shape = shape, p.role = role, p.tp = tp, p.expert = expert, p.qk = qk;
    m.params.push_back(p);
  };
  add("w57", {w57_rows, 7}, Role::Muon, TpStyle::Colwise);
  add("w183", {18, 3}, Role::Muon, TpStyle::Colwise);
  add("w19", {1, 9}, Role::Muon, TpStyle::None);
  add("w1364", {13, 64}, Role::Muon, TpStyle::Rowwise);
  add("attn.q", {8, 6}, Role::Muon, TpStyle::Colwise, false, QkTag{0, QkKind::Q, 2, 4});
  add("attn.k", {4, 6}, Role::Muon, TpStyle::Colwise, false, QkTag{0, QkKind::K, 1, 4});
  add("moe.experts", {3, 6, 10}, Role::Muon, TpStyle::None, true);
  add("bias", {7}, Role::AdamW, TpStyle::None);
  if (extra) add("extra", {4, 4}, Role::Muon, TpStyle::None);
  return m;
}

// bf16_products: the plain group's Newton–Schulz reads bf16 operands (whichever path this CPU runs).
// nanochat: nanochat's options on two groups: the NorMuon group (cautious decay) with MuonEq, Muon+
// and the decay on the adjusted lr, as nanochat's muon_step_fused; the QK group with MuonEq, Muon+
// and the adjusted-lr decay on plain decoupled decay (cpu backend only; not with gram_allreduce).
std::vector<ParamGroup> test_groups(size_t nparams, bool normuon = true, bool bf16_products = true,
                                    bool nanochat = false) {
  ParamGroup plain, nor, qk, adam;
  plain.options.lr = 0.02, plain.options.weight_decay = 0.1;
  if (bf16_products) plain.options.ns.matmul_dtype = DType::BF16;
  nor.options.lr = 0.03, nor.options.normuon = normuon, nor.options.cautious_wd = true;
  nor.options.momentum_kind = MomentumKind::HeavyBall, nor.options.lr_rule = LrRule::MatchRmsAdamw;
  nor.options.ns.schedule = Schedule::PolarExpress;
  qk.options.lr = 0.05, qk.options.qk_clip_threshold = 10.0;
  for (ParamGroup* g : {&nor, &qk})
    if (nanochat) g->options.ns.muon_eq = true, g->options.ns.muon_plus = true, g->options.decay_lr = DecayLr::Adjusted;
  adam.options.algorithm = Algorithm::AdamW, adam.options.lr = 0.01;
  plain.params = {0, 2};
  nor.params = {1, 3, 6};
  qk.params = {4, 5};
  adam.params = {7};
  if (nparams > 8) plain.params.push_back(8);
  return {plain, nor, qk, adam};
}

// Deterministic values of global element j of parameter p at step t (exact in bf16 when asked).
float value(int p, int64_t j, int t, bool bf16) {
  uint32_t x = static_cast<uint32_t>(p * 7919 + j * 104729 + t * 1299709) * 2654435761u;
  x ^= x >> 15;
  const float v = static_cast<float>(static_cast<int32_t>(x % 20001) - 10000) / 5000.0f;
  return bf16 ? bf16_to_float(float_to_bf16(v)) : v;
}

// The local box of a full row-major tensor, in local order.
std::vector<float> extract(const std::vector<float>& full, const Shape& shape, const Box& box) {
  std::vector<float> out;
  const int nd = shape.ndim();
  std::vector<int64_t> idx(static_cast<size_t>(nd));
  std::function<void(int, int64_t)> rec = [&](int d, int64_t base) {
    if (d == nd) return out.push_back(full[static_cast<size_t>(base)]);
    for (const Range& r : box.dims[static_cast<size_t>(d)].ranges())
      for (int64_t i = r.begin; i < r.end; ++i) rec(d + 1, base * shape[d] + i);
  };
  rec(0, 0);
  return out;
}

struct RunConfig {
  std::string parallel;
  std::string strategy;  // "auto" or a default: pin
  DType comm_dtype = DType::F32;
  ReplicaMode replica = ReplicaMode::Auto;
  std::vector<size_t> no_grad;  // parameters without a gradient at step 1, on every rank (and in the reference)
  bool nanochat = false;        // test_groups' nanochat options (MuonEq, Muon+, adjusted-lr decay)
  bool split = false;           // split_test_params: row blocks on three matrices
};

// Split orthogonalization (ParamSpec::split) on three matrices of test_model, the blocks straddling
// shards on every mesh: w57 [5, 7] in uneven blocks (2, 3) (plain group), w183 [18, 3] as a fused
// q | k | v (9, 6, 3) (NorMuon group: blocks at least as tall as wide keep per-row statistics),
// attn.q [8, 6] per head (4, 4) (the QK-clip group: clipping rows of a split weight).
void split_test_params(Inventory& inv) {
  for (ParamSpec& p : inv.params) {
    if (p.name == "w57" && p.rows() == 5) p.split = {2, 3};
    if (p.name == "w183") p.split = {9, 6, 3};
    if (p.name == "attn.q") p.split = {4, 4};
  }
}

// The LocalOptimizer view of an inventory (whole parameters, their split and QK tags).
std::vector<ParamInfo> infos_of(const Inventory& inv) {
  std::vector<ParamInfo> infos;
  for (const ParamSpec& p : inv.params) infos.push_back({p.name, p.shape, p.expert, p.qk, p.split});
  return infos;
}

Inventory make_inventory(const std::string& parallel, bool extra = false, int64_t w57_rows = 5) {
  ParallelConfig pc = parse_parallel(parallel);
  return apply_parallel(test_model(extra, w57_rows), pc);
}

OptimizerOptions options_for(const RunConfig& c) {
  OptimizerOptions o;
  o.comm_dtype = c.comm_dtype;
  o.env_override = false;
  o.chunk_bytes = 2048;  // several chunks: the pipeline and its window are exercised
  if (c.strategy != "auto") o.pins = StrategyRules::parse("default:" + c.strategy);
  if (c.strategy == "gram_allreduce") o.exact = false;
  o.replica = c.replica;
  return o;
}

// Every rank's message, gathered, must be the same string.
bool same_everywhere(const std::string& msg) {
  const size_t w = static_cast<size_t>(comm().size());
  uint64_t h = std::hash<std::string>{}(msg);
  std::vector<uint64_t> all(w);
  comm().all_gather(InBuffer(&h, CommType::U64, 1), OutBuffer(all.data(), CommType::U64, w), "test hash").wait();
  for (uint64_t x : all)
    if (x != all[0]) return false;
  return true;
}

// This rank's shards of every parameter of `opt`: parameters all `w`, gradients all `g`, and views.
struct LocalShards {
  std::vector<std::vector<float>> w, g;
  std::vector<TensorView> lw, lg;
  LocalShards(const Optimizer& opt, size_t n, float wv = 1.0f, float gv = 0.5f) {
    for (size_t i = 0; i < n; ++i) {
      w.emplace_back(static_cast<size_t>(opt.local_shape(i).numel()), wv);
      g.emplace_back(static_cast<size_t>(opt.local_shape(i).numel()), gv);
    }
    for (size_t i = 0; i < n; ++i) lw.emplace_back(w[i].data(), opt.local_shape(i)), lg.emplace_back(g[i].data(), opt.local_shape(i));
  }
};

}  // namespace
}  // namespace meshmuon
