// `meshmuon bench calibrate`: fits a machine profile's constants on the machine it runs on
// (docs/plan.md, "Calibration"), by micro-measurements with the engine's own code, every rank at
// once (so the rates are those of ranks sharing the node as a job's do):
// - Newton–Schulz rate per shape class and product dtype (Orthogonalizer, one BLAS thread per rank),
//   a grid of shapes plus the Muon shapes of the --model presets;
// - memory bandwidth of the elementwise passes: an AdamW step on a 16 Mi-element parameter,
//   kAdamWBytesPerElem bytes per element;
// - under mpirun with N ranks: the communicator's latency (a grouped point-to-point exchange of 4
//   bytes with every peer, the owner_a2a round) and bandwidth (the same exchange of --comm-mib MiB
//   per rank), stored as the comm fit for N ranks;
// - the overlap: a Newton–Schulz run on a second thread while the exchange is in flight, against
//   each alone (the Newton–Schulz block sized to last about as long as the exchange).
// Writes --out (rank 0), merging into the file when it exists: run it at np 2 then np 4 to have both
// comm fits. Example: mpirun -np 2 build/bin/meshmuon bench calibrate --out cpu.json --model gpt2-124m
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "distributed_bench.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/inventory.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/plan.h"

namespace meshmuon::cli {
namespace {

struct CalibrateArgs {
  std::string out, name = "measured", dtypes = "both";
  std::vector<std::string> models;
  int repeats = 3, cores = 0;
  double comm_mib = 16;
  bool no_grid = false;
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every rank's x, in rank order (the bits travel as int64).
std::vector<double> all_values(Communicator& c, double x) {
  std::vector<double> v(static_cast<size_t>(c.size()));
  c.all_gather(InBuffer(&x, CommType::I64, 1), OutBuffer(v.data(), CommType::I64, v.size()), "calibrate").wait();
  return v;
}
double mean_over_ranks(Communicator& c, double x) {
  const std::vector<double> v = all_values(c, x);
  double s = 0;
  for (double y : v) s += y;
  return s / static_cast<double>(v.size());
}

// Full-rank pseudo-random values in [-1, 1] (a splitmix64 hash, as bench step's gradients): a
// structured matrix (low rank) would leave Newton–Schulz with near-zero singular directions whose
// subnormal values run many times slower than the real gradients'.
float value(uint64_t i) {
  i = (i + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  i ^= i >> 31;
  i *= 0x94D049BB133111EBull;
  i ^= i >> 29;
  return static_cast<float>(static_cast<int64_t>(i % 2001) - 1000) * 1e-3f;
}

// Seconds of one orthogonalization of an m×n matrix (median of `repeats` after one warm-up).
double ns_seconds(const NsOptions& ns, int64_t m, int64_t n, int repeats) {
  Orthogonalizer orth(ns);
  std::vector<float> g(static_cast<size_t>(m * n)), out(g.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = value(i);
  orth.run(g.data(), out.data(), m, n);
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    orth.run(g.data(), out.data(), m, n);
    t.push_back(since(t0));
  }
  return upper_median(t);
}

// The shapes measured: a grid of short sides × aspects, and every Muon shape of the presets.
std::vector<std::pair<int64_t, int64_t>> shapes_of(const CalibrateArgs& a) {
  std::set<std::pair<int64_t, int64_t>> s;
  if (!a.no_grid)
    for (int64_t side : {128, 256, 512, 1024, 2048})
      for (int64_t aspect : {1, 4})
        if (side * aspect <= 4096) s.insert({side, side * aspect});
  for (const std::string& name : a.models)
    for (const ParamSpec& p : preset_model(name).params)
      if (p.role == Role::Muon && p.shape.ndim() >= 2) {
        const int64_t r = p.shape[p.shape.ndim() - 2], c = p.shape[p.shape.ndim() - 1];
        s.insert({std::min(r, c), std::max(r, c)});
      }
  return {s.begin(), s.end()};
}

// Bytes per second of the engine's AdamW pass (kAdamWBytesPerElem per element), on this rank.
double memory_rate(int repeats) {
  ModelDesc m{"calibrate", {}};
  ParamSpec p;
  p.name = "w", p.shape = Shape({4096, 4096}), p.role = Role::AdamW;
  m.params.push_back(p);
  const Inventory inv = apply_parallel(m, parse_parallel("dp_shard=1"));
  ParamGroup adam;
  adam.options.algorithm = Algorithm::AdamW;
  adam.params = {0};
  OptimizerOptions o;
  o.blas_threads = 1;
  Optimizer opt(make_single_communicator(), inv, {adam}, o);
  const size_t n = 4096 * 4096;
  std::vector<float> w(n), g(n);
  for (size_t i = 0; i < n; ++i) w[i] = value(i), g[i] = value(i + 7);
  std::vector<TensorView> wv{TensorView(w.data(), opt.local_shape(0))}, gv{TensorView(g.data(), opt.local_shape(0))};
  opt.step(wv, gv);
  std::vector<double> t;
  for (int r = 0; r < std::max(3, repeats); ++r) {
    opt.step(wv, gv);
    t.push_back(opt.last_stats().update_seconds);
  }
  return kAdamWBytesPerElem * static_cast<double>(n) / upper_median(t);
}

// One round of the owner_a2a exchange: `bytes` per rank split over the peers, sent and received.
double exchange_seconds(Communicator& c, std::vector<char>& send, std::vector<char>& recv) {
  const int n = c.size(), me = c.rank();
  const size_t per = send.size() / static_cast<size_t>(n - 1);
  c.barrier("calibrate").wait();
  const auto t0 = Clock::now();
  c.group_begin();
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n, from = (me - k + n) % n;
    (void)c.send(InBuffer(send.data() + (k - 1) * per, CommType::U8, per), to, "calibrate");
    (void)c.recv(OutBuffer(recv.data() + (k - 1) * per, CommType::U8, per), from, "calibrate");
  }
  c.group_end("calibrate").wait();
  return since(t0);
}

void run(const CalibrateArgs& a) {
  const std::string backend = bench_backend("");
  std::shared_ptr<Communicator> comm = backend == "single" ? make_single_communicator() : make_communicator(backend);
  Communicator& c = *comm;
  blas_set_num_threads(1);
  // a new file starts from the `cpu` profile's scalars with no measured classes or fits (only what
  // this machine measures goes in); an existing one is merged into
  MachineProfile m = MachineProfile::named("cpu");
  m.ns_rates.clear(), m.comm_fits.clear();
  if (!a.out.empty()) {
    std::ifstream in(a.out);
    if (in.good()) {
      std::stringstream ss;
      ss << in.rdbuf();
      m = MachineProfile::from_json(ss.str());
    }
  }
  m.name = a.name;
  const int hw = a.cores > 0 ? a.cores : static_cast<int>(std::thread::hardware_concurrency());
  m.cores = hw;
  const bool oversubscribed = c.size() > hw;
  nlohmann::json report;
  report["world_size"] = c.size(), report["cores"] = hw;
  if (!oversubscribed) {
    // Newton–Schulz per shape class and dtype, every rank at once
    std::vector<DType> dtypes;
    if (a.dtypes != "bf16") dtypes.push_back(DType::F32);
    if (a.dtypes != "fp32") dtypes.push_back(DType::BF16);
    std::vector<MachineProfile::NsRate> rates;
    for (const auto& [s, l] : shapes_of(a)) {
      MachineProfile::NsRate r{s, l, 0, 0};
      for (DType dt : dtypes) {
        NsOptions ns;
        ns.matmul_dtype = dt;
        c.barrier("calibrate").wait();
        const double rate = mean_over_ranks(c, ns_flops(s, l, ns) / ns_seconds(ns, s, l, a.repeats));
        (dt == DType::BF16 ? r.bf16 : r.fp32) = rate;
        if (c.rank() == 0) std::fprintf(stderr, "ns %lldx%lld %s: %.1f GFLOP/s\n", static_cast<long long>(s),
                                        static_cast<long long>(l), dt == DType::BF16 ? "bf16" : "fp32", rate / 1e9);
      }
      rates.push_back(r);
    }
    m.ns_rates = rates;
    // the planner's scalar rates: the median class
    for (DType dt : dtypes) {
      std::vector<double> v;
      for (const auto& r : rates) v.push_back(dt == DType::BF16 ? r.bf16 : r.fp32);
      if (!v.empty()) (dt == DType::BF16 ? m.bf16_flops_per_s : m.flops_per_s) = upper_median(v);
    }
    c.barrier("calibrate").wait();
    m.memory_Bps = mean_over_ranks(c, memory_rate(a.repeats));
    if (c.rank() == 0) std::fprintf(stderr, "memory (AdamW pass): %.2f GB/s per rank\n", m.memory_Bps / 1e9);
  }
  if (c.size() > 1) {
    const size_t bytes = static_cast<size_t>(a.comm_mib * 1024 * 1024) / static_cast<size_t>(c.size() - 1) * static_cast<size_t>(c.size() - 1);
    std::vector<char> small_s(static_cast<size_t>(4 * (c.size() - 1))), small_r(small_s.size());
    std::vector<char> big_s(bytes, 1), big_r(bytes);
    std::vector<double> lat, big;
    for (int i = 0; i < 3; ++i) exchange_seconds(c, small_s, small_r);
    for (int i = 0; i < 50; ++i) lat.push_back(exchange_seconds(c, small_s, small_r));
    exchange_seconds(c, big_s, big_r);
    for (int i = 0; i < std::max(3, a.repeats); ++i) big.push_back(exchange_seconds(c, big_s, big_r));
    const double latency = slowest(c, upper_median(lat));
    const double t_big = slowest(c, upper_median(big));
    const double bw = static_cast<double>(bytes) / std::max(1e-9, t_big - latency);
    // overlap: the exchange in flight while Newton–Schulz runs on another thread, against each
    // alone; the NS block is sized to last about as long as the exchange (else the shorter one's
    // share drowns in the other's noise), median of 3 trials
    NsOptions ns;
    const int64_t side = 256;
    Orthogonalizer orth(ns);
    std::vector<float> g(static_cast<size_t>(side * side)), o(g.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = value(i);
    orth.run(g.data(), o.data(), side, side);
    auto t0 = Clock::now();
    for (int i = 0; i < 3; ++i) orth.run(g.data(), o.data(), side, side);
    const double one = since(t0) / 3;
    const int k = static_cast<int>(all_values(c, std::clamp(std::round(t_big / std::max(1e-9, one)), 1.0, 1e5))[0]);
    const auto block = [&] {
      for (int i = 0; i < k; ++i) orth.run(g.data(), o.data(), side, side);
    };
    std::vector<double> trials;
    for (int trial = 0; trial < 3; ++trial) {
      c.barrier("calibrate").wait();
      t0 = Clock::now();
      block();
      const double t_ns = since(t0);
      const double t_x = exchange_seconds(c, big_s, big_r);
      c.barrier("calibrate").wait();
      t0 = Clock::now();
      std::thread worker(block);
      (void)exchange_seconds(c, big_s, big_r);
      worker.join();
      const double both = since(t0);
      trials.push_back(std::clamp((t_ns + t_x - both) / std::max(1e-9, std::min(t_ns, t_x)), 0.0, 1.0));
    }
    const double hidden = upper_median(trials);
    const double overlap = mean_over_ranks(c, hidden);
    MachineProfile::CommFit f{c.size(), bw, latency};
    std::erase_if(m.comm_fits, [&](const MachineProfile::CommFit& x) { return x.ranks == c.size(); });
    m.comm_fits.push_back(f);
    std::sort(m.comm_fits.begin(), m.comm_fits.end(), [](const auto& x, const auto& y) { return x.ranks < y.ranks; });
    // the planner's scalars: the smallest world measured (the least time sharing)
    m.bandwidth_Bps = m.replicate_bandwidth_Bps = m.comm_fits.front().bandwidth_Bps;
    m.latency_s = m.comm_fits.front().latency_s;
    if (!oversubscribed) m.overlap = overlap, m.fwd_bwd_overlap = overlap;
    if (c.rank() == 0)
      std::fprintf(stderr, "comm at %d ranks: latency %.1f us, bandwidth %.2f GB/s per rank; overlap %.2f%s\n", c.size(),
                   latency * 1e6, bw / 1e9, overlap, oversubscribed ? " (oversubscribed: not stored)" : "");
  }
  if (c.rank() != 0) return;
  const std::string text = m.to_json();
  (void)MachineProfile::from_json(text);  // what --machine will read back
  if (a.out.empty()) {
    std::cout << text << "\n";
    return;
  }
  std::ofstream o(a.out);
  MESHMUON_CHECK(o.good(), "[bench] --out: cannot write '", a.out, "'");
  o << text << "\n";
  std::fprintf(stderr, "wrote %s\n", a.out.c_str());
}

}  // namespace

void add_bench_calibrate_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("calibrate",
                                   "Fit a machine profile (Newton-Schulz rates, memory, communicator) here; run under mpirun");
  auto a = std::make_shared<CalibrateArgs>();
  cmd->add_option("--out", a->out, "Profile JSON to write (merged into when it exists; read by --machine FILE.json)");
  cmd->add_option("--name", a->name, "The profile's name")->capture_default_str();
  cmd->add_option("--model", a->models, "Preset whose Muon shapes are measured too (repeatable)");
  cmd->add_option("--matmul-dtype", a->dtypes, "fp32, bf16 or both")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Timed runs per measurement (medians)")->capture_default_str();
  cmd->add_option("--cores", a->cores, "Cores the ranks of this node share (0: the hardware's)")->capture_default_str();
  cmd->add_option("--comm-mib", a->comm_mib, "MiB each rank exchanges for the bandwidth")->capture_default_str();
  cmd->add_flag("--no-grid", a->no_grid, "Measure only the --model shapes");
  cmd->callback([a] {
    MESHMUON_CHECK(a->dtypes == "fp32" || a->dtypes == "bf16" || a->dtypes == "both", "[bench] --matmul-dtype is '",
                   a->dtypes, "'; use fp32, bf16 or both");
    MESHMUON_CHECK(a->repeats >= 1, "[bench] --repeats must be ≥ 1");
    MESHMUON_CHECK(a->comm_mib > 0 && a->comm_mib <= 4096, "[bench] --comm-mib must be in (0, 4096]");
    run_distributed([&] { run(*a); });
  });
}

}  // namespace meshmuon::cli
