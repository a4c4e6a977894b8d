// `meshmuon bench step`: times meshmuon::Optimizer::step on a model with seeded synthetic gradients (each
// rank fills its local box deterministically), per strategy, with the single-process
// orthogonalization time of all Muon matrices as the reference (measured in the same run).
// Example: mpirun -np 2 build/bin/meshmuon bench step --model gpt2-124m --parallel dp_shard=2 --compare --json
// --device cuda runs the engine on the cuda backend: parameters and gradients in device memory, the
// communicator staging them (mpi: several ranks may share one GPU) or copying them (single); the
// reference stays the CPU's single-process orthogonalization.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "commands.h"
#include "distributed_bench.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/optimizer.h"
#include "backend/select.h"
#include "plan_options.h"

namespace meshmuon::cli {
namespace {

struct StepArgs {
  PlanArgs plan;
  int steps = 3, blas_threads = 0;
  bool compare = false, json = false, predict = false, no_reference = false;
  std::string backend;  // "" = mpi under mpirun, else single
  std::string device = "cpu";
};

// The step's parameters and gradients where the engine runs: the host vectors themselves on the
// CPU; on a device, device buffers filled from them once, before the timed steps.
class StepTensors {
 public:
  explicit StepTensors(const std::string& device) {
    if (device != "cpu") backend_ = detail::resolve_engine_device(device).backend;
  }
  TensorView view(std::vector<float>& host, const Shape& shape) {
    if (!backend_) return TensorView(host.data(), shape);
    const size_t bytes = host.size() * sizeof(float);
    detail::Buffer& b = buffers_.emplace_back(backend_->allocate(std::max<size_t>(bytes, 4), detail::MemoryKind::Device));
    if (bytes > 0) backend_->copy(b.data(), host.data(), bytes);
    TensorView v(static_cast<float*>(b.data()), shape);
    v.device = backend_->device();
    return v;
  }

 private:
  std::shared_ptr<detail::Backend> backend_;
  std::vector<detail::Buffer> buffers_;
};


float synthetic(uint64_t seed) {
  seed = (seed + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  seed ^= seed >> 31;
  return static_cast<float>(static_cast<int64_t>(seed % 2001) - 1000) * 1e-3f;
}

// Fills a local box with values that depend only on the global index (any layout gives the same).
void fill(std::vector<float>& out, const Box& box, const Shape& shape, uint64_t seed) {
  out.clear();
  const int nd = shape.ndim();
  std::function<void(int, int64_t)> rec = [&](int d, int64_t base) {
    if (d == nd) return out.push_back(synthetic(seed * 1000003ull + static_cast<uint64_t>(base)));
    for (const Range& r : box.dims[static_cast<size_t>(d)].ranges())
      for (int64_t i = r.begin; i < r.end; ++i) rec(d + 1, base * shape[d] + i);
  };
  if (box.numel() > 0) rec(0, 0);
}

int64_t reduce_max(Communicator& c, int64_t x) {
  c.all_reduce(OutBuffer(&x, CommType::I64, 1), ReduceOp::Max, "bench max").wait();
  return x;
}

// Single-process orthogonalization of every Muon matrix (rank 0, one BLAS thread per rank setting).
double reference_seconds(const Inventory& inv, const NsOptions& ns) {
  Orthogonalizer orth(ns);
  double total = 0;
  std::vector<float> m;
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamSpec& p = inv.params[i];
    if (p.role != Role::Muon) continue;
    Box full;
    for (int d = 0; d < p.shape.ndim(); ++d) full.dims.push_back(IndexSet::full(p.shape[d]));
    fill(m, full, p.shape, i + 1);
    const auto t = std::chrono::steady_clock::now();
    for (int64_t u = 0; u < p.units(); ++u) orth.run(m.data() + u * p.rows() * p.cols(), m.data() + u * p.rows() * p.cols(), p.rows(), p.cols());
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  return total;
}

// The same run's reference for the executor's Newton–Schulz rate: a standalone Orthogonalizer (the
// plan's options, as `bench calibrate` runs it) on one matrix of each distinct Muon shape of the
// model, every rank at once, one warm-up run each; the flops over the slowest rank's seconds, next
// to the profile's rate for the same matrices (each at its shape class's rate). Measured right
// after a strategy's timed steps, so it sees the step's load, which a calibration minutes earlier
// does not (docs/plan.md, "Measured on this machine").
struct StandaloneRate {
  double measured = 0, profile = 0;  // flops per second
};
StandaloneRate standalone_ns_rate(Communicator& c, const Inventory& inv, const NsOptions& ns, const MachineProfile& machine) {
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (const ParamSpec& p : inv.params)
    if (p.role == Role::Muon && p.rows() > 0 && p.cols() > 0) shapes.insert({p.rows(), p.cols()});
  Orthogonalizer orth(ns);
  std::vector<float> g, out;
  double flops = 0, secs = 0, profile_secs = 0;
  c.barrier("bench standalone").wait();
  for (const auto& [m, n] : shapes) {
    g.resize(static_cast<size_t>(m * n)), out.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = synthetic(i + 1);
    orth.run(g.data(), out.data(), m, n);
    const auto t = std::chrono::steady_clock::now();
    orth.run(g.data(), out.data(), m, n);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    const double f = ns_flops(m, n, ns);
    flops += f, profile_secs += f / machine.ns_rate(m, n, ns);
  }
  secs = slowest(c, secs);
  return {secs > 0 ? flops / secs : 0.0, profile_secs > 0 ? flops / profile_secs : 0.0};
}

// Ranks sharing this node's cores: Open MPI's local size, else every rank of the job.
int ranks_per_node(int world) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int n = local ? std::atoi(local) : 0;
  return n > 0 ? n : world;
}

nlohmann::json run_strategy(const std::shared_ptr<Communicator>& comm, const Inventory& inv, const PlanOptions& po,
                            const StepArgs& a, const std::string& strategy) {
  OptimizerOptions o;
  o.comm_dtype = po.comm_dtype, o.machine = po.machine, o.replica = po.replica, o.exact = po.exact;
  o.chunk_bytes = po.chunk_bytes, o.window = po.window, o.blas_threads = a.blas_threads;
  o.device = a.device;
  std::string rules = strategy == "auto" ? "" : "default:" + strategy;
  for (const std::string& p : a.plan.pins) rules += (rules.empty() ? "" : ";") + p;
  o.pins = StrategyRules::parse(rules, "--strategy / --pin");
  ParamGroup muon, adam;
  muon.options.ns = po.ns;
  adam.options.algorithm = Algorithm::AdamW;
  for (size_t i = 0; i < inv.params.size(); ++i) (inv.params[i].role == Role::Muon ? muon : adam).params.push_back(i);
  Optimizer opt(comm, inv, {muon, adam}, o);
  const size_t n = inv.params.size();
  std::vector<std::vector<float>> w(n), g(n);
  std::vector<TensorView> wv, gv;
  StepTensors tensors(a.device);
  for (size_t i = 0; i < n; ++i) {
    fill(w[i], opt.local_box(i), inv.params[i].shape, 7 * i + 1);
    fill(g[i], opt.local_box(i), inv.params[i].shape, 7 * i + 2);
    wv.push_back(tensors.view(w[i], opt.local_shape(i)));
    gv.push_back(tensors.view(g[i], opt.local_shape(i)));
  }
  std::vector<double> step, pack, wait, orth, upd, comm_s, overlap, agree;
  StepStats last;
  for (int s = 0; s <= a.steps; ++s) {  // step 0 warms up (allocations, BLAS buffers)
    comm->barrier("bench step").wait();
    opt.step(wv, gv);
    last = opt.last_stats();
    if (s == 0) continue;
    step.push_back(last.step_seconds), pack.push_back(last.pack_seconds), wait.push_back(last.comm_wait_seconds);
    orth.push_back(last.orthogonalize_seconds), upd.push_back(last.update_seconds), comm_s.push_back(last.comm_seconds);
    overlap.push_back(last.overlap), agree.push_back(last.agree_seconds);
  }
  Communicator& c = *comm;
  nlohmann::json r;
  r["strategy"] = strategy;
  r["step_seconds"] = slowest(c, upper_median(step));
  r["phase_seconds"] = {{"pack", slowest(c, upper_median(pack))}, {"comm_wait", slowest(c, upper_median(wait))},
                        {"orthogonalize", slowest(c, upper_median(orth))}, {"update", slowest(c, upper_median(upd))},
                        {"agree", slowest(c, upper_median(agree))}};
  r["comm_seconds"] = slowest(c, upper_median(comm_s));
  r["overlap"] = upper_median(overlap);
  r["bytes_sent_max"] = reduce_max(c, static_cast<int64_t>(last.bytes_sent));
  r["bytes_predicted_max"] = opt.plan().total().bytes_sent_max;
  r["bytes_match_plan"] = reduce_max(c, static_cast<int64_t>(last.bytes_sent != last.bytes_sent_predicted)) == 0;
  r["peak_buffer_bytes_max"] = reduce_max(c, static_cast<int64_t>(last.peak_buffer_bytes));
  r["chunks"] = last.chunks;
  if (a.predict) {
    // the cost model's prediction of this plan (docs/plan.md, "Predicted step time"), next to the
    // measured step: the planner's own function, the ranks of this node sharing its cores
    const StepPrediction p = predict_step(opt.plan(), ranks_per_node(c.size()));
    const double measured = r["step_seconds"].get<double>();
    r["predicted"] = {{"step_seconds", p.step}, {"compute_seconds", p.compute}, {"bandwidth_seconds", p.bandwidth},
                      {"latency_seconds", p.latency}, {"pipeline_seconds", p.pipeline},
                      {"elementwise_seconds", p.elementwise}, {"time_sharing", p.time_sharing}};
    r["predicted_over_measured"] = measured > 0 ? p.step / measured : 0.0;
    // diagnostic, not a prediction: the Newton–Schulz rate the busiest rank reached in this run
    // (its plan flops over the measured orthogonalize phase) against the profile's for the same
    // flops: how far the machine's state (other jobs' load) drifted from the calibration's
    const double flops = opt.plan().total().flops_max, orth_s = r["phase_seconds"]["orthogonalize"].get<double>();
    r["ns_rate_measured"] = orth_s > 0 ? flops / orth_s : 0.0;
    r["ns_rate_profile"] = p.compute > 0 ? flops * p.time_sharing / p.compute : 0.0;
    // the same prediction with the profile's Newton–Schulz rates rescaled to the standalone rate of
    // this run (the calibration's shape ratios kept): measured ranks sharing the node already, so
    // the model's time sharing is taken out of the scale. CPU only: the standalone Orthogonalizer
    // is the CPU's, which says nothing about a device's rate.
    if (a.device == "cpu") {
      const StandaloneRate sr = standalone_ns_rate(c, inv, po.ns, opt.plan().options().machine);
      const double scale = sr.profile > 0 && sr.measured > 0 ? sr.measured * p.time_sharing / sr.profile : 1.0;
      const StepPrediction q = predict_step(opt.plan(), ranks_per_node(c.size()), scale);
      r["ns_rate_standalone"] = sr.measured;
      r["ns_rate_scale"] = scale;
      r["predicted_same_run"] = {{"step_seconds", q.step}, {"compute_seconds", q.compute}};
      r["predicted_same_run_over_measured"] = measured > 0 ? q.step / measured : 0.0;
    }
  }
  r["strategy_counts"] = nlohmann::json::object();
  const auto counts = opt.plan().strategy_counts();
  for (int s = 0; s < kNumStrategies; ++s)
    if (counts[static_cast<size_t>(s)] > 0) r["strategy_counts"][std::string(to_string(static_cast<Strategy>(s)))] = counts[static_cast<size_t>(s)];
  return r;
}

void run(const StepArgs& a) {
  const std::string backend = bench_backend(a.backend);
  MESHMUON_CHECK(parse_device(a.device).has_value(), "[bench] --device must be cpu, cuda or cuda:N (got '", a.device, "')");
  // the single communicator of a device engine copies device buffers; mpi stages them
  std::shared_ptr<Communicator> comm =
      backend == "single" ? make_single_communicator(a.device) : make_communicator(backend);
  const int threads = a.blas_threads > 0 ? a.blas_threads : (comm->size() > 1 ? 1 : 0);
  if (threads > 0) blas_set_num_threads(threads);
  const Inventory inv = make_inventory(a.plan);
  const PlanOptions po = make_plan_options(a.plan);
  std::vector<std::string> strategies = {a.plan.strategy};
  if (a.compare) {
    strategies = {"auto"};
    const std::vector<Strategy> all = {Strategy::OwnerA2A, Strategy::AllGather, Strategy::Agrs, Strategy::ExpertLocal,
                                       Strategy::ExpertSubgroup};
    for (const Baseline& b : plan_baselines(inv, po, all))
      if (b.applied > 0) strategies.push_back(std::string(to_string(b.strategy)));
  }
  double ref = 0;
  comm->barrier("bench reference").wait();
  if (comm->rank() == 0 && !a.no_reference) ref = reference_seconds(inv, po.ns);
  comm->broadcast(OutBuffer(&ref, CommType::I64, 1), 0, "bench reference").wait();  // 8 raw bytes
  nlohmann::json out;
  out["model"] = inv.model, out["parallel"] = a.plan.parallel, out["world_size"] = comm->size();
  out["comm_dtype"] = a.plan.comm_dtype, out["backend"] = backend, out["steps"] = a.steps;
  out["device"] = a.device;
  out["blas_threads"] = blas_get_num_threads();
  out["reference_orthogonalize_seconds"] = ref;
  out["results"] = nlohmann::json::array();
  for (const std::string& s : strategies) out["results"].push_back(run_strategy(comm, inv, po, a, s));
  const double base = out["results"][0]["step_seconds"].get<double>();
  double fastest = base;
  for (const auto& r : out["results"]) fastest = std::min(fastest, r["step_seconds"].get<double>());
  out["machine"] = po.machine.name, out["ranks_per_node"] = ranks_per_node(comm->size());
  out["auto_over_fastest"] = fastest > 0 ? base / fastest : 0.0;  // results[0] is auto under --compare
  for (auto& r : out["results"]) {
    r["ratio_to_auto"] = base > 0 ? r["step_seconds"].get<double>() / base : 0.0;
    // the target's bound: single-process orthogonalization / ranks + measured communication time
    r["ideal_seconds"] = ref / comm->size() + r["comm_seconds"].get<double>();
  }
  if (comm->rank() != 0) return;
  if (a.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("%s on %s (%d ranks, %s comm, %d BLAS thread(s), device %s); single-process orthogonalization "
              "(CPU) %.3f s\n",
              inv.model.c_str(), a.plan.parallel.c_str(), comm->size(), a.plan.comm_dtype.c_str(),
              out["blas_threads"].get<int>(), a.device.c_str(), ref);
  std::printf("%-16s %9s %8s %8s %8s %8s %8s %8s %7s %12s %12s %10s %8s\n", "strategy", "step s", "agree", "pack", "wait", "orth",
              "update", "comm", "overlap", "sent max", "predicted", "peak buf", "vs auto");
  for (const auto& r : out["results"]) {
    const auto& ph = r["phase_seconds"];
    std::printf("%-16s %9.4f %8.5f %8.4f %8.4f %8.4f %8.4f %8.4f %6.0f%% %12.0f %12.0f %10.0f %7.2fx\n",
                r["strategy"].get<std::string>().c_str(), r["step_seconds"].get<double>(), ph["agree"].get<double>(), ph["pack"].get<double>(),
                ph["comm_wait"].get<double>(), ph["orthogonalize"].get<double>(), ph["update"].get<double>(),
                r["comm_seconds"].get<double>(), 100 * r["overlap"].get<double>(), r["bytes_sent_max"].get<double>(),
                r["bytes_predicted_max"].get<double>(), r["peak_buffer_bytes_max"].get<double>(), r["ratio_to_auto"].get<double>());
  }
  if (!a.predict) return;
  std::printf("\npredicted (machine %s, %d rank(s) per node, time sharing x%.2f) vs measured step:\n", po.machine.name.c_str(),
              ranks_per_node(comm->size()), out["results"][0]["predicted"]["time_sharing"].get<double>());
  std::printf("%-16s %10s %10s %8s %10s %10s %10s %10s %8s %9s\n", "strategy", "measured s", "predict s", "pred/meas", "compute",
              "bandwidth", "latency", "elementw", "vs best", "same-run");
  double best = 0;
  for (const auto& r : out["results"]) best = best == 0 ? r["step_seconds"].get<double>() : std::min(best, r["step_seconds"].get<double>());
  for (const auto& r : out["results"]) {
    const auto& p = r["predicted"];
    std::printf("%-16s %10.4f %10.4f %8.3f %10.4f %10.4f %10.4f %10.4f %7.3fx %9.3f\n", r["strategy"].get<std::string>().c_str(),
                r["step_seconds"].get<double>(), p["step_seconds"].get<double>(), r["predicted_over_measured"].get<double>(),
                p["compute_seconds"].get<double>(), p["bandwidth_seconds"].get<double>(), p["latency_seconds"].get<double>(),
                p["elementwise_seconds"].get<double>(), best > 0 ? r["step_seconds"].get<double>() / best : 0.0,
                r.value("predicted_same_run_over_measured", 0.0));
  }
}

}  // namespace

void add_bench_step_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("step", "Time the distributed optimizer step per strategy (run under mpirun)");
  auto a = std::make_shared<StepArgs>();
  a->plan.model = "gpt2-124m", a->plan.parallel = "dp_shard=1", a->plan.machine = "cpu", a->plan.chunk_mib = 32;
  add_plan_args(*cmd, a->plan);
  cmd->add_option("--steps", a->steps, "Timed steps (after one warm-up step); medians reported")->capture_default_str();
  cmd->add_flag("--compare", a->compare, "Run auto and every single-strategy baseline that applies; print ratios");
  cmd->add_flag("--json", a->json, "Print JSON (top level: results)");
  cmd->add_flag("--predict", a->predict,
                "Also print the cost model's predicted step per strategy (predict_step: --machine's constants) "
                "next to the measured one, with their ratio");
  cmd->add_flag("--no-reference", a->no_reference, "Skip the single-process orthogonalization reference (slow on big models)");
  cmd->add_option("--blas-threads", a->blas_threads, "BLAS threads per rank (0: 1 under MPI with > 1 rank)");
  cmd->add_option("--backend", a->backend, "mpi or single (default: mpi under mpirun)");
  cmd->add_option("--device", a->device,
                  "cpu, cuda or cuda:N: where the step runs (cuda: parameters and gradients in device memory; "
                  "ranks may share one GPU under mpirun)")
      ->capture_default_str();
  cmd->callback([a] { run_distributed([&] { run(*a); }); });
}

}  // namespace meshmuon::cli
