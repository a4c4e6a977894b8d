// `meshmuon bench fsdp`: times ShardedParams' unshard and reduce_grads on a model (a preset's
// parameters, or --params N of --rows x --cols) and, in the same run and on the same bytes, the raw
// collectives they replace: all_gather_v of the same per-rank counts (unshard), reduce_scatter_v of
// the same sizes over the shard group plus all_reduce of each rank's shard over the replicate group
// (reduce). Prints medians (slowest rank), GB/s and fused/raw ratios (raw seconds / fused seconds:
// 1 = as fast as the bare collectives), and on HSDP the overlap: bucketed vs one bucket. The owner
// rows time the same calls with owner placement (Muon matrices whole on one rank: broadcast unshard,
// reduce to the owner) against the sharded ones of the same run.
// Example: mpirun -np 4 --oversubscribe build/bin/meshmuon bench fsdp --model gpt2-124m --mesh dp_replicate=2,dp_shard=2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "distributed_bench.h"
#include "meshmuon/bf16.h"
#include "meshmuon/error.h"
#include "meshmuon/sharded_params.h"

namespace meshmuon::cli {
namespace {

struct FsdpArgs {
  std::string model = "gpt2-124m", mesh, param_dtype = "fp32", reduce_dtype = "fp32", backend;
  int params = 0;
  int64_t rows = 1024, cols = 1024;
  double bucket_mib = 16;
  int64_t direct_max = 4096;
  int repeat = 5;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }



// Median of `repeat` timed runs of f (after one warm-up), each started together, slowest rank.
template <class F>
double time_it(Communicator& world, int repeat, F&& f) {
  std::vector<double> t;
  for (int k = 0; k <= repeat; ++k) {
    world.barrier("bench fsdp").wait();
    const auto t0 = Clock::now();
    f();
    if (k > 0) t.push_back(since(t0));
  }
  return slowest(world, upper_median(t));
}

std::vector<ParamSpec> bench_params(const FsdpArgs& a, std::string& name) {
  if (a.params > 0) {
    std::vector<ParamSpec> ps;
    for (int i = 0; i < a.params; ++i) {
      ParamSpec p;
      p.name = "w" + std::to_string(i), p.shape = Shape{a.rows, a.cols};
      ps.push_back(p);
    }
    name = std::to_string(a.params) + "x[" + std::to_string(a.rows) + "," + std::to_string(a.cols) + "]";
    return ps;
  }
  ModelDesc m = preset_model(a.model);
  name = m.name;
  for (ParamSpec& p : m.params) p.placements.clear(), p.mesh = 0;
  return m.params;
}

void run(const FsdpArgs& a) {
  const std::string backend = bench_backend(a.backend);
  std::shared_ptr<Communicator> world = make_communicator(backend);
  auto comms = std::make_shared<MeshCommunicators>(world);
  const Mesh mesh = Mesh::parse(a.mesh.empty() ? (world->size() > 1 ? "dp_shard=" + std::to_string(world->size()) : "") : a.mesh);
  std::string model;
  const std::vector<ParamSpec> specs = bench_params(a, model);
  ShardedParamsOptions o;
  o.param_dtype = parse_dtype(a.param_dtype, "--param-dtype");
  o.reduce_dtype = parse_dtype(a.reduce_dtype, "--reduce-dtype");
  o.bucket_bytes = static_cast<int64_t>(a.bucket_mib * (1 << 20));
  o.unshard_direct_max_messages = a.direct_max;
  ShardedParams sp(comms, mesh, specs, o);
  const int sd = mesh.find("dp_shard"), rd = mesh.find("dp_replicate");
  const int S = sd >= 0 ? mesh.dim(sd).size : 1, R = rd >= 0 ? mesh.dim(rd).size : 1;
  Communicator* shard = S > 1 ? &comms->get(mesh, DimMask{1} << sd) : nullptr;
  Communicator* rep = R > 1 ? &comms->get(mesh, DimMask{1} << rd) : nullptr;
  const int s = shard ? shard->rank() : 0;

  // Parameters and full gradients: deterministic, cheap.
  for (size_t i = 0; i < sp.size(); ++i) {
    TensorView v = sp.param(i);
    for (int64_t k = 0; k < v.numel(); ++k) v.f32()[k] = static_cast<float>((k * 7 + static_cast<int64_t>(i)) % 101) * 0.01f;
  }
  const int me = world->rank();
  for (size_t i = 0; i < sp.size(); ++i) {
    TensorView g = sp.full_grad(i);
    for (int64_t k = 0; k < g.numel(); ++k) g.f32()[k] = static_cast<float>((k * 13 + me + static_cast<int64_t>(i)) % 97) * 0.001f;
  }

  // Per shard rank: the elements it holds (the all-gather's counts, the reduce-scatter's sizes).
  std::vector<int64_t> counts(static_cast<size_t>(S), 0);
  int64_t numel = 0;
  for (const ParamSpec& p : specs) {
    numel += p.numel();
    const int64_t row = p.shape[0] > 0 ? p.numel() / p.shape[0] : 0;
    for (int j = 0; j < S; ++j) counts[static_cast<size_t>(j)] += chunk_range(p.shape[0], S, j).size() * row;
  }
  const int64_t local = counts[static_cast<size_t>(s)];
  const size_t pes = dtype_size(o.param_dtype), res = dtype_size(o.reduce_dtype);

  // Unshard, fused and raw.
  std::vector<double> post_s, wait_s;
  const double t_unshard = time_it(*world, a.repeat, [&] {
    const auto t0 = Clock::now();
    sp.unshard_async();
    post_s.push_back(since(t0));
    const auto t1 = Clock::now();
    sp.wait_unshard();
    wait_s.push_back(since(t1));
    sp.reshard();
  });
  const double t_post = slowest(*world, upper_median(post_s)), t_wait = slowest(*world, upper_median(wait_s));
  // A local copy of the whole model (pre-faulted buffers): what the copy-out costs at least.
  double t_copy = 0;
  {
    std::vector<std::byte> x(static_cast<size_t>(numel) * pes, std::byte{1}), y(x.size(), std::byte{0});
    t_copy = time_it(*world, a.repeat, [&] { std::memcpy(y.data(), x.data(), x.size()); });
  }
  double t_ag = 0;
  {
    std::vector<std::byte> send(static_cast<size_t>(local) * pes), recv(static_cast<size_t>(numel) * pes);
    std::fill(send.begin(), send.end(), std::byte{1}), std::fill(recv.begin(), recv.end(), std::byte{0});
    const CommType ct = comm_type(o.param_dtype);
    t_ag = time_it(*world, a.repeat, [&] {
      if (shard)
        shard->all_gather_v(InBuffer(send.data(), ct, static_cast<size_t>(local)), OutBuffer(recv.data(), ct, static_cast<size_t>(numel)),
                            counts, "raw all_gather_v")
            .wait();
      else
        std::copy(send.begin(), send.end(), recv.begin());
    });
  }

  // Reduce, fused (bucketed; and one bucket on HSDP) and raw.
  ReduceStats st;
  const double t_reduce = time_it(*world, a.repeat, [&] {
    sp.reduce_grads();
    st = sp.last_reduce_stats();
  });
  double t_reduce_one = 0;
  ReduceStats st_one;
  if (rep) {
    ShardedParamsOptions o1 = o;
    o1.bucket_bytes = 0;
    ShardedParams one(comms, mesh, specs, o1);
    for (size_t i = 0; i < one.size(); ++i) {
      TensorView src = sp.full_grad(i), dst = one.full_grad(i);
      std::copy(src.f32(), src.f32() + src.numel(), dst.f32());
    }
    t_reduce_one = time_it(*world, a.repeat, [&] {
      one.reduce_grads();
      st_one = one.last_reduce_stats();
    });
  }
  double t_rs = 0, t_ar = 0;
  {
    const CommType ct = comm_type(o.reduce_dtype);
    std::vector<std::byte> send(static_cast<size_t>(numel) * res), recv(static_cast<size_t>(local) * res);
    std::fill(send.begin(), send.end(), std::byte{0}), std::fill(recv.begin(), recv.end(), std::byte{0});
    if (shard)
      t_rs = time_it(*world, a.repeat, [&] {
        shard->reduce_scatter_v(InBuffer(send.data(), ct, send.size() / res), OutBuffer(recv.data(), ct, recv.size() / res), counts,
                                ReduceOp::Sum, "raw reduce_scatter_v")
            .wait();
      });
    if (rep)
      t_ar = time_it(*world, a.repeat, [&] {
        rep->all_reduce(OutBuffer(recv.data(), ct, recv.size() / res), ReduceOp::Sum, "raw all_reduce").wait();
      });
  }
  const double t_raw_reduce = t_rs + t_ar;

  // Owner placement: the same parameters and gradients, matrices whole on one rank each.
  double t_own_unshard = 0, t_own_reduce = 0;
  ReduceStats st_own;
  size_t owned = 0;
  {
    ShardedParamsOptions oo = o;
    oo.placement = ParamPlacement::Owner;
    ShardedParams own(comms, mesh, specs, oo);
    for (size_t i = 0; i < own.size(); ++i) {
      owned += own.owner(i) >= 0;
      TensorView src = sp.full_grad(i), dst = own.full_grad(i);
      std::copy(src.f32(), src.f32() + src.numel(), dst.f32());
    }
    sp.free_full_grads();  // measured already; one model's gradients fewer in memory
    t_own_unshard = time_it(*world, a.repeat, [&] {
      own.unshard();
      own.reshard();
    });
    t_own_reduce = time_it(*world, a.repeat, [&] {
      own.reduce_grads();
      st_own = own.last_reduce_stats();
    });
  }

  nlohmann::json out;
  out["model"] = model, out["mesh"] = mesh.to_string(), out["world_size"] = world->size(), out["backend"] = backend;
  out["parameters"] = specs.size(), out["elements"] = numel, out["param_dtype"] = a.param_dtype, out["reduce_dtype"] = a.reduce_dtype;
  out["bucket_bytes"] = o.bucket_bytes, out["repeat"] = a.repeat;
  const double ub = static_cast<double>(numel) * static_cast<double>(pes), rb = static_cast<double>(numel) * static_cast<double>(res);
  out["unshard"] = {{"seconds", t_unshard}, {"post_seconds", t_post}, {"wait_seconds", t_wait},
                    {"model_memcpy_seconds", t_copy}, {"direct_landing", static_cast<int64_t>(specs.size()) * (S - 1) <= a.direct_max}, {"raw_all_gather_v_seconds", t_ag}, {"GBps", ub / t_unshard / 1e9},
                    {"raw_GBps", ub / t_ag / 1e9}, {"fused_over_raw", t_ag / t_unshard}};
  out["reduce"] = {{"seconds", t_reduce},
                   {"buckets", st.buckets},
                   {"raw_reduce_scatter_v_seconds", t_rs},
                   {"raw_all_reduce_seconds", t_ar},
                   {"GBps", rb / t_reduce / 1e9},
                   {"raw_GBps", t_raw_reduce > 0 ? rb / t_raw_reduce / 1e9 : 0.0},
                   {"fused_over_raw", t_raw_reduce > 0 ? t_raw_reduce / t_reduce : 0.0},
                   {"shard_seconds", st.shard_seconds},
                   {"replicate_seconds", st.replicate_seconds},
                   {"overlap_seconds", st.overlap_seconds},
                   {"sum_seconds", st.sum_seconds},
                   {"bytes_sent", st.bytes_sent}};
  out["owner"] = {{"owned_matrices", owned},
                  {"unshard_seconds", t_own_unshard},
                  {"reduce_seconds", t_own_reduce},
                  {"reduce_bytes_sent", st_own.bytes_sent},
                  {"unshard_over_sharded", t_own_unshard / t_unshard},
                  {"reduce_over_sharded", t_own_reduce / t_reduce}};
  if (rep)
    out["reduce"]["one_bucket"] = {{"seconds", t_reduce_one}, {"overlap_seconds", st_one.overlap_seconds},
                                   {"bucketed_speedup", t_reduce_one / t_reduce}};
  if (me != 0) return;
  if (a.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("%s: %zu parameters, %.1f M elements, mesh %s (%d ranks), param %s, reduce %s, bucket %.1f MiB, median of %d\n",
              model.c_str(), specs.size(), static_cast<double>(numel) / 1e6, mesh.to_string().c_str(), world->size(),
              a.param_dtype.c_str(), a.reduce_dtype.c_str(), a.bucket_mib, a.repeat);
  std::printf("%-34s %10s %9s %10s %9s %8s\n", "", "fused s", "GB/s", "raw s", "raw GB/s", "fused/raw");
  const bool direct = static_cast<int64_t>(specs.size()) * (S - 1) <= a.direct_max;
  std::printf("%-34s %10.4f %9.2f %10.4f %9.2f %8.2f\n", direct ? "unshard (direct landing)" : "unshard (all_gather_v)", t_unshard, ub / t_unshard / 1e9, t_ag,
              ub / t_ag / 1e9, t_ag / t_unshard);
  std::printf("  unshard: post (alloc, copy-in, post) %.4f s, wait (gather, copy-out) %.4f s; memcpy of the model %.4f s\n",
              t_post, t_wait, t_copy);
  std::printf("%-34s %10.4f %9.2f %10.4f %9.2f %8.2f\n", rep ? "reduce (reduce_scatter + all_reduce)" : "reduce (reduce_scatter_v)",
              t_reduce, rb / t_reduce / 1e9, t_raw_reduce, t_raw_reduce > 0 ? rb / t_raw_reduce / 1e9 : 0.0,
              t_raw_reduce > 0 ? t_raw_reduce / t_reduce : 0.0);
  std::printf("  reduce on rank 0: %d buckets, shard stage %.4f s, replicate stage %.4f s, both %.4f s, sums %.4f s\n", st.buckets,
              st.shard_seconds, st.replicate_seconds, st.overlap_seconds, st.sum_seconds);
  std::printf("%-34s %10.4f %9.2f %10s %9s %8.2f  (owner / sharded, %zu matrices owned)\n", "unshard (owner placement)", t_own_unshard,
              ub / t_own_unshard / 1e9, "", "", t_own_unshard / t_unshard, owned);
  std::printf("%-34s %10.4f %9.2f %10s %9s %8.2f  (owner / sharded; rank 0 sent %.1f MiB vs %.1f MiB)\n", "reduce (owner placement)",
              t_own_reduce, rb / t_own_reduce / 1e9, "", "", t_own_reduce / t_reduce, static_cast<double>(st_own.bytes_sent) / (1 << 20),
              static_cast<double>(st.bytes_sent) / (1 << 20));
  if (rep)
    std::printf("  overlap: one bucket %.4f s vs %d buckets %.4f s (%.2fx); raw reduce_scatter %.4f s + all_reduce %.4f s\n",
                t_reduce_one, st.buckets, t_reduce, t_reduce_one / t_reduce, t_rs, t_ar);
}

}  // namespace

void add_bench_fsdp_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("fsdp", "Time ShardedParams' unshard and gradient reduction against the raw collectives (run under mpirun)");
  auto a = std::make_shared<FsdpArgs>();
  cmd->add_option("--model", a->model, "Preset whose parameters to shard (ignored with --params)")->capture_default_str();
  cmd->add_option("--params", a->params, "Synthetic model: this many [rows, cols] matrices");
  cmd->add_option("--rows", a->rows, "Rows of each synthetic matrix")->capture_default_str();
  cmd->add_option("--cols", a->cols, "Columns of each synthetic matrix")->capture_default_str();
  cmd->add_option("--mesh", a->mesh, "dp_shard=S or dp_replicate=R,dp_shard=S (default: dp_shard=<world size>)");
  cmd->add_option("--param-dtype", a->param_dtype, "Unsharded parameters: fp32 or bf16")->capture_default_str();
  cmd->add_option("--reduce-dtype", a->reduce_dtype, "Gradient reduction: fp32 or bf16")->capture_default_str();
  cmd->add_option("--direct-max", a->direct_max,
                  "Unshard by direct landing up to this many receives per rank (0: one all_gather_v + copy-out)")
      ->capture_default_str();
  cmd->add_option("--bucket-mib", a->bucket_mib, "Reduction bucket size (MiB; 0: one bucket)")->capture_default_str();
  cmd->add_option("--repeat", a->repeat, "Timed runs (after one warm-up); medians reported")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->add_option("--backend", a->backend, "mpi or single (default: mpi under mpirun)");
  cmd->callback([a] { run_distributed([&] { run(*a); }); });
}

}  // namespace meshmuon::cli
