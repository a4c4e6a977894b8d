// train_cpp: a character-level MLP language model trained with meshmuon's native FSDP/HSDP parameter
// group (meshmuon::ShardedParams) and meshmuon::Optimizer (Muon for the hidden matrices, AdamW for the
// rest), with reshardable checkpoints. See README.md.
//
// One step: unshard -> forward/backward of this rank's G/N micro-batches on the full parameters,
// accumulated into the full gradients (quantized to a fixed-point grid with --deterministic) ->
// reduce_grads (fixed-order sum / G) -> optimizer.step on the shards -> reshard.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshmuon/checkpoint.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"
#include "meshmuon/mesh.h"
#include "meshmuon/mesh_comms.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/sharded_params.h"
#include "model.h"

#ifndef TRAIN_CPP_DEFAULT_DATA
#define TRAIN_CPP_DEFAULT_DATA "examples/train_gpt/data/alice.txt"
#endif

namespace {

using namespace train_cpp;
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  int steps = 800;
  std::string mesh;  // default dp_shard=<world size>
  double lr = 0.02, adamw_lr = 3e-3, wd = 0.1;
  int micro_batches = 12;
  int batch = 64;
  int context = 12, dim = 24, hidden = 256;
  uint64_t seed = 1;
  std::string data = TRAIN_CPP_DEFAULT_DATA;
  std::string ckpt_dir;
  int ckpt_every = 0;
  bool resume = false;
  int log_every = 50;
  int eval_batches = 8;
  bool deterministic = true;
  double quant_clip = 1.0;
};

// The corpus as token ids over the bytes it contains (sorted), split 90% train / 10% validation.
struct Corpus {
  std::vector<int> byte_to_id = std::vector<int>(256, -1);
  std::vector<unsigned char> vocab;
  std::vector<int32_t> train, val;
};

Corpus load_corpus(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read the data file " + path + " (--data)");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Corpus c;
  bool present[256] = {};
  for (unsigned char ch : text) present[ch] = true;
  for (int b = 0; b < 256; ++b)
    if (present[b]) {
      c.byte_to_id[b] = static_cast<int>(c.vocab.size());
      c.vocab.push_back(static_cast<unsigned char>(b));
    }
  const size_t split = text.size() * 9 / 10;
  for (size_t i = 0; i < text.size(); ++i)
    (i < split ? c.train : c.val).push_back(c.byte_to_id[static_cast<unsigned char>(text[i])]);
  return c;
}

// Micro-batch `mb` of step `step`: B windows at positions drawn from (seed, step, mb) only, so the
// data a micro-batch sees never depends on which rank runs it.
void sample(const std::vector<int32_t>& toks, int T, int B, uint64_t seed, uint64_t step, uint64_t mb,
            std::vector<int32_t>& ctx, std::vector<int32_t>& tgt) {
  uint64_t s = seed ^ (step * 0xD1B54A32D192ED03ull) ^ (mb * 0x8CB92BA72F3D8DD7ull);
  splitmix64(s);
  ctx.resize(size_t(B) * T);
  tgt.resize(size_t(B));
  const uint64_t n = toks.size() - static_cast<uint64_t>(T);
  for (int b = 0; b < B; ++b) {
    const size_t p = static_cast<size_t>(T + splitmix64(s) % n);  // target position
    std::copy(toks.begin() + static_cast<ptrdiff_t>(p - T), toks.begin() + static_cast<ptrdiff_t>(p),
              ctx.begin() + static_cast<ptrdiff_t>(size_t(b) * T));
    tgt[b] = toks[p];
  }
}

// The fixed-point grid of --deterministic: values k/2^bits with |k| <= limit, where
// G·limit <= 2^24, so any sum of at most G grid values is an integer multiple of 2^-bits below 2^24
// in magnitude after scaling: exactly representable in fp32, hence computed exactly in any order.
struct Quantizer {
  int bits = 0;
  float scale = 1, inv_scale = 1, limit = 0;
  Quantizer(int G, double clip) {
    const double max_units = std::ldexp(1.0, 24) / G;  // per micro-batch, in grid units
    bits = static_cast<int>(std::floor(std::log2(max_units / clip)));
    scale = static_cast<float>(std::ldexp(1.0, bits));
    inv_scale = static_cast<float>(std::ldexp(1.0, -bits));
    limit = static_cast<float>(std::min(std::floor(max_units), std::floor(clip * std::ldexp(1.0, bits))));
  }
  float operator()(float g) const {
    float u = g * scale;  // exact (power of two) barring overflow, which the clamp absorbs
    u = std::min(std::max(u, -limit), limit);
    return std::nearbyint(u) * inv_scale;  // integer of magnitude <= limit < 2^24: exact
  }
};

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"train_cpp: a char-level MLP LM trained with meshmuon::ShardedParams (FSDP/HSDP) + meshmuon::Optimizer"};
  app.add_option("--steps", a.steps, "train until this global step")->capture_default_str();
  app.add_option("--mesh", a.mesh, "dp_shard=S or dp_replicate=R,dp_shard=S (default dp_shard=<world size>)");
  app.add_option("--lr", a.lr, "Muon learning rate (w1, w2)")->capture_default_str();
  app.add_option("--adamw-lr", a.adamw_lr, "AdamW learning rate (embed, biases, norm, head)")->capture_default_str();
  app.add_option("--wd", a.wd, "weight decay (both groups)")->capture_default_str();
  app.add_option("--micro-batches,-G", a.micro_batches, "micro-batches per step (global; divisible by the world size)")
      ->capture_default_str();
  app.add_option("--batch,-B", a.batch, "sequences (context windows) per micro-batch")->capture_default_str();
  app.add_option("--context,-T", a.context, "characters of context")->capture_default_str();
  app.add_option("--dim", a.dim, "embedding width d")->capture_default_str();
  app.add_option("--hidden", a.hidden, "hidden width h")->capture_default_str();
  app.add_option("--seed", a.seed, "initialization and data seed")->capture_default_str();
  app.add_option("--data", a.data, "text file to train on")->capture_default_str();
  app.add_option("--ckpt-dir", a.ckpt_dir, "checkpoint directory (saved every --ckpt-every steps and at the end)");
  app.add_option("--ckpt-every", a.ckpt_every, "save every K steps (0: only at the end)")->capture_default_str();
  app.add_flag("--resume", a.resume, "load the checkpoint in --ckpt-dir if there is one");
  app.add_option("--log-every", a.log_every, "progress line every K steps")->capture_default_str();
  app.add_option("--eval-batches", a.eval_batches, "validation micro-batches at each progress line (0: none)")
      ->capture_default_str();
  app.add_flag("--deterministic,!--no-deterministic", a.deterministic,
               "quantize micro-batch gradients to a fixed-point grid: bitwise the same at any rank count (default on)");
  app.add_option("--quant-clip", a.quant_clip, "--deterministic: per-element gradient clip c")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  auto world = std::shared_ptr<meshmuon::Communicator>(meshmuon::make_mpi_communicator());
  const int rank = world->rank(), nranks = world->size();
  auto say = [&](const char* fmt, auto... xs) {
    if (rank == 0) {
      std::printf(fmt, xs...);
      std::fflush(stdout);
    }
  };
  const int G = a.micro_batches;
  if (G <= 0 || G % nranks != 0)
    throw std::invalid_argument("--micro-batches " + std::to_string(G) + " must be a positive multiple of the " +
                                std::to_string(nranks) + " ranks");
  if (a.steps < 0 || a.batch <= 0 || a.context <= 0 || a.dim <= 0 || a.hidden <= 0 || a.log_every <= 0 ||
      a.quant_clip <= 0)
    throw std::invalid_argument("--steps, --batch, --context, --dim, --hidden, --log-every, --quant-clip must be > 0");
  if (a.resume && a.ckpt_dir.empty()) throw std::invalid_argument("--resume needs --ckpt-dir");

  const Corpus corpus = load_corpus(a.data);
  const ModelConfig cfg{static_cast<int>(corpus.vocab.size()), a.context, a.dim, a.hidden};
  const auto defs = param_defs(cfg);
  const meshmuon::Mesh mesh = meshmuon::Mesh::parse(a.mesh.empty() ? "dp_shard=" + std::to_string(nranks) : a.mesh);
  if (mesh.size() != nranks)
    throw std::invalid_argument("--mesh " + mesh.to_string() + " has " + std::to_string(mesh.size()) +
                                " ranks, the job " + std::to_string(nranks));

  std::vector<meshmuon::ParamSpec> specs;
  for (const auto& d : defs) {
    meshmuon::ParamSpec p;
    p.name = d.name;
    p.shape = meshmuon::Shape(std::span<const int64_t>(d.shape));
    p.role = d.muon ? meshmuon::Role::Muon : meshmuon::Role::AdamW;
    specs.push_back(std::move(p));
  }
  auto comms = std::make_shared<meshmuon::MeshCommunicators>(world);
  meshmuon::ShardedParamsOptions spo;
  spo.grad_divisor = G;  // the sum over all G micro-batches of their mean-loss gradients, / G
  meshmuon::ShardedParams sp(comms, mesh, specs, spo);

  // Muon for the hidden matrices, AdamW for embedding, biases, norm gain and LM head.
  meshmuon::ParamGroup muon, adamw;
  muon.options.algorithm = meshmuon::Algorithm::Muon;
  muon.options.lr = a.lr;
  muon.options.weight_decay = a.wd;
  adamw.options.algorithm = meshmuon::Algorithm::AdamW;
  adamw.options.lr = a.adamw_lr;
  adamw.options.weight_decay = a.wd;
  adamw.options.beta1 = 0.9;
  adamw.options.beta2 = 0.95;
  for (size_t i = 0; i < defs.size(); ++i) (defs[i].muon ? muon : adamw).params.push_back(i);
  meshmuon::OptimizerOptions oo;
  oo.blas_threads = 1;  // the same BLAS thread count at every world size (bitwise results)
  meshmuon::Optimizer opt(comms, sp.inventory(), {muon, adamw}, oo);

  // Initialization: full tensors from the seed on every rank, this rank's rows copied in.
  {
    const auto full = init_params(cfg, a.seed);
    for (size_t i = 0; i < defs.size(); ++i) {
      const meshmuon::Box box = sp.local_box(i);
      const meshmuon::TensorView v = sp.param(i);
      const int64_t row = defs[i].numel() / defs[i].shape[0];
      const auto& rows = box.dims[0];
      float* dst = v.f32();
      for (int64_t r = 0; r < rows.size(); ++r)
        std::memcpy(dst + r * row, full[i].data() + rows.at(r) * row, sizeof(float) * size_t(row));
    }
  }

  int64_t start = 0;
  namespace fs = std::filesystem;
  if (a.resume && fs::exists(fs::path(a.ckpt_dir) / "index.json")) {
    const auto t0 = Clock::now();
    const meshmuon::CheckpointInfo info = meshmuon::load_checkpoint(a.ckpt_dir, sp, &opt);
    start = info.step;
    for (const auto& [k, want] : std::map<std::string, std::string>{{"micro_batches", std::to_string(G)},
                                                                     {"batch", std::to_string(a.batch)},
                                                                     {"seed", std::to_string(a.seed)},
                                                                     {"deterministic", a.deterministic ? "1" : "0"}}) {
      auto it = info.metadata.find(k);
      if (it != info.metadata.end() && it->second != want)
        say("warning: checkpoint has %s=%s, this run %s: the run will not match an uninterrupted one\n", k.c_str(),
            it->second.c_str(), want.c_str());
    }
    say("resumed from %s at step %lld (saved by %d ranks, mesh %s; now %d ranks, mesh %s) in %.2f s\n",
        a.ckpt_dir.c_str(), static_cast<long long>(start), info.world_size, info.mesh.c_str(), nranks,
        mesh.to_string().c_str(), seconds_since(t0));
  }

  int64_t nparams = 0;
  for (const auto& d : defs) nparams += d.numel();
  const Quantizer quant(G, a.quant_clip);
  say("train_cpp: %lld parameters (vocab %d, context %d, dim %d, hidden %d), %d ranks, mesh %s\n",
      static_cast<long long>(nparams), cfg.vocab, cfg.context, cfg.dim, cfg.hidden, nranks,
      mesh.to_string().c_str());
  say("  step = %d micro-batches x %d windows (%d per rank); Muon lr %g on w1,w2; AdamW lr %g on the rest\n", G,
      a.batch, G / nranks, a.lr, a.adamw_lr);
  if (a.deterministic)
    say("  deterministic gradients: micro-batch gradients clipped to +-%g and rounded to multiples of 2^-%d\n",
        a.quant_clip, quant.bits);
  else
    say("  deterministic gradients: off (fp32 sums: results depend on the rank count)\n");

  Mlp<float> model(cfg);
  std::vector<std::vector<float>> g(defs.size());
  for (size_t i = 0; i < defs.size(); ++i) g[i].resize(size_t(defs[i].numel()));
  std::vector<float*> gp;
  for (auto& v : g) gp.push_back(v.data());
  std::vector<const float*> pp(defs.size());
  std::vector<int32_t> ctx, tgt;
  const int per_rank = G / nranks;

  // Validation loss on a fixed set of windows (micro-batches split round-robin over ranks).
  auto evaluate = [&]() -> double {
    sp.unshard();
    for (size_t i = 0; i < defs.size(); ++i) pp[i] = sp.full_param(i).f32();
    float sum = 0;
    for (int m = rank; m < a.eval_batches; m += nranks) {
      sample(corpus.val, a.context, a.batch, a.seed ^ 0xE7A1ull, 0, static_cast<uint64_t>(m), ctx, tgt);
      sum += static_cast<float>(model.forward_backward(pp.data(), nullptr, ctx.data(), tgt.data(), a.batch));
    }
    sp.reshard();
    world->all_reduce(meshmuon::OutBuffer(&sum, meshmuon::CommType::F32, 1), meshmuon::ReduceOp::Sum, "eval loss").wait();
    return sum / a.eval_batches;
  };

  struct Acc {
    int steps = 0;
    double total = 0, fb = 0, unshard = 0, reduce = 0, optim = 0, optim_comm = 0;
  } acc;
  for (int64_t step = start + 1; step <= a.steps; ++step) {
    const auto t_step = Clock::now();
    auto t = Clock::now();
    sp.unshard();
    const double t_unshard = seconds_since(t);

    t = Clock::now();
    for (size_t i = 0; i < defs.size(); ++i) pp[i] = sp.full_param(i).f32();
    sp.zero_full_grads();
    float loss_sum = 0;
    for (int j = 0; j < per_rank; ++j) {
      const int mb = rank * per_rank + j;  // global micro-batch index
      sample(corpus.train, a.context, a.batch, a.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(mb), ctx,
             tgt);
      loss_sum += static_cast<float>(model.forward_backward(pp.data(), gp.data(), ctx.data(), tgt.data(), a.batch));
      for (size_t i = 0; i < defs.size(); ++i) {
        float* acc_g = sp.full_grad(i).f32();
        const float* src = g[i].data();
        const size_t n = g[i].size();
        if (a.deterministic)
          for (size_t e = 0; e < n; ++e) acc_g[e] += quant(src[e]);  // exact: see Quantizer
        else
          for (size_t e = 0; e < n; ++e) acc_g[e] += src[e];
      }
    }
    const double t_fb = seconds_since(t);

    sp.reduce_grads();  // fixed-order sum over ranks, / G
    opt.step(sp.params(), sp.grads());
    sp.reshard();
    world->all_reduce(meshmuon::OutBuffer(&loss_sum, meshmuon::CommType::F32, 1), meshmuon::ReduceOp::Sum, "loss").wait();
    const double t_total = seconds_since(t_step);

    acc.steps++;
    acc.total += t_total;
    acc.fb += t_fb;
    acc.unshard += t_unshard;
    acc.reduce += sp.last_reduce_stats().seconds;
    acc.optim += opt.last_stats().step_seconds;
    acc.optim_comm += opt.last_stats().comm_wait_seconds;

    const bool last = step == a.steps;
    if (step % a.log_every == 0 || last || step == start + 1) {
      const double n = acc.steps;
      const double val = a.eval_batches > 0 ? evaluate() : NAN;
      const double tokens = double(G) * a.batch * n;
      char val_text[32] = "";
      if (a.eval_batches > 0) std::snprintf(val_text, sizeof val_text, " | val %.4f", val);
      say("step %5lld | loss %.4f%s | %8.0f tok/s | %6.1f ms/step: fwd/bwd %.1f, comm %.1f (unshard %.1f, "
          "reduce %.1f), optim %.1f (comm wait %.1f)\n",
          static_cast<long long>(step), loss_sum / G, val_text, tokens / acc.total, 1e3 * acc.total / n,
          1e3 * acc.fb / n, 1e3 * (acc.unshard + acc.reduce) / n, 1e3 * acc.unshard / n, 1e3 * acc.reduce / n,
          1e3 * acc.optim / n, 1e3 * acc.optim_comm / n);
      acc = {};
    }
    if (!a.ckpt_dir.empty() && ((a.ckpt_every > 0 && step % a.ckpt_every == 0) || last)) {
      const auto t0 = Clock::now();
      meshmuon::CheckpointSaveOptions so;
      so.metadata = {{"trainer", "train_cpp"},
                     {"micro_batches", std::to_string(G)},
                     {"batch", std::to_string(a.batch)},
                     {"seed", std::to_string(a.seed)},
                     {"deterministic", a.deterministic ? "1" : "0"},
                     {"model", "vocab=" + std::to_string(cfg.vocab) + ",context=" + std::to_string(cfg.context) +
                                   ",dim=" + std::to_string(cfg.dim) + ",hidden=" + std::to_string(cfg.hidden)}};
      meshmuon::save_checkpoint(a.ckpt_dir, sp, &opt, step, so);
      say("checkpoint: step %lld saved to %s (%.2f s)\n", static_cast<long long>(step), a.ckpt_dir.c_str(),
          seconds_since(t0));
    }
  }

  // Checksum of the full parameters (bitwise comparisons across runs, rank counts and meshes).
  sp.unshard();
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < defs.size(); ++i) {
    const meshmuon::TensorView v = sp.full_param(i);
    h = fnv1a(h, v.data, v.nbytes());
  }
  sp.reshard();
  say("final step %d checksum fnv1a64 %016llx\n", a.steps, static_cast<unsigned long long>(h));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_cpp: error: %s\n", e.what());
    std::fflush(stderr);
    meshmuon::abort_all(1);  // other ranks may be inside a collective: end the whole job
  }
}
