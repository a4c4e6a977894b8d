// Machine profiles as files: the measured fields `meshmuon bench calibrate` writes (docs/plan.md,
// "Calibration"), resolve (a name or a .json path), to_json, and the Newton–Schulz rate by shape.
#include "plan/machine_profile.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "meshmuon/error.h"

namespace meshmuon {
namespace detail {
namespace {

double number(const nlohmann::json& v, const std::string& what) {
  MESHMUON_CHECK(v.is_number() && v.get<double>() >= 0, "[plan] machine profile: ", what, " must be a number ≥ 0");
  return v.get<double>();
}

}  // namespace

bool read_measured_field(MachineProfile& m, const std::string& key, const nlohmann::json& v) {
  if (key == "memory_Bps") return m.memory_Bps = number(v, "field 'memory_Bps'"), true;
  if (key == "overlap") {
    m.overlap = number(v, "field 'overlap'");
    MESHMUON_CHECK(m.overlap <= 1, "[plan] machine profile: field 'overlap' is a fraction from 0 to 1 (got ", m.overlap, ")");
    return true;
  }
  if (key == "fwd_bwd_overlap") {
    m.fwd_bwd_overlap = number(v, "field 'fwd_bwd_overlap'");
    MESHMUON_CHECK(m.fwd_bwd_overlap <= 1, "[plan] machine profile: field 'fwd_bwd_overlap' is a fraction from 0 to 1 (got ",
                   m.fwd_bwd_overlap, ")");
    return true;
  }
  if (key == "cores") {
    MESHMUON_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= (1 << 20),
                   "[plan] machine profile: field 'cores' must be an integer from 0 to 2^20");
    return m.cores = v.get<int>(), true;
  }
  if (key == "ns_rates") {
    MESHMUON_CHECK(v.is_array(), "[plan] machine profile: field 'ns_rates' must be an array of {short_side, long_side, fp32, bf16}");
    m.ns_rates.clear();
    for (const auto& x : v) {
      MESHMUON_CHECK(x.is_object() && x.contains("short_side") && x.contains("long_side"),
                     "[plan] machine profile: each 'ns_rates' item needs short_side and long_side");
      MachineProfile::NsRate r;
      r.short_side = static_cast<int64_t>(number(x["short_side"], "ns_rates short_side"));
      r.long_side = static_cast<int64_t>(number(x["long_side"], "ns_rates long_side"));
      MESHMUON_CHECK(r.short_side > 0 && r.long_side >= r.short_side,
                     "[plan] machine profile: ns_rates needs 0 < short_side ≤ long_side (got ", r.short_side, ", ", r.long_side, ")");
      if (x.contains("fp32")) r.fp32 = number(x["fp32"], "ns_rates fp32");
      if (x.contains("bf16")) r.bf16 = number(x["bf16"], "ns_rates bf16");
      m.ns_rates.push_back(r);
    }
    return true;
  }
  if (key == "comm_fits") {
    MESHMUON_CHECK(v.is_array(), "[plan] machine profile: field 'comm_fits' must be an array of {ranks, bandwidth_Bps, latency_s}");
    m.comm_fits.clear();
    for (const auto& x : v) {
      MESHMUON_CHECK(x.is_object() && x.contains("ranks"), "[plan] machine profile: each 'comm_fits' item needs ranks");
      MachineProfile::CommFit f;
      f.ranks = static_cast<int>(number(x["ranks"], "comm_fits ranks"));
      if (x.contains("bandwidth_Bps")) f.bandwidth_Bps = number(x["bandwidth_Bps"], "comm_fits bandwidth_Bps");
      if (x.contains("latency_s")) f.latency_s = number(x["latency_s"], "comm_fits latency_s");
      m.comm_fits.push_back(f);
    }
    return true;
  }
  return false;
}

// docs/plan.md, "Calibration": fitted on this project's box (AMD EPYC family 26 model 2, Zen 5,
// 2 cores shared with other jobs, KVM) by
//   mpirun -np 2 meshmuon bench calibrate --out cpu.json --model gpt2-124m --model nanochat-d20
//   mpirun -np 4 meshmuon bench calibrate --out cpu.json
// at 01:14 UTC on 2026-11-28 (load average 4.2 → 4.3 from other jobs during the fit; round r3 of
// docs/plan.md's table). Latency: 110 us at 2 ranks against 6 us at 4, in every fit: the poll's 50 us
// spin paid on each hand-over when the scheduler puts both ranks on one core (docs/decisions/
// 054-waiting-for-a-peer.md); kept, as it is what a 2-rank job on this 2-core machine pays.
MachineProfile fitted_cpu_profile() {
  MachineProfile m;
  m.name = "cpu";
  m.bandwidth_Bps = 3.125e+09;
  m.replicate_bandwidth_Bps = 3.125e+09;
  m.latency_s = 0.0001101;
  m.flops_per_s = 3.532e+10;
  m.bf16_flops_per_s = 1.22e+11;
  m.memory_Bps = 2.565e+10;
  m.overlap = 0.03273;
  m.fwd_bwd_overlap = 0.03273;  // the same measurement: collectives copy on the cores that compute
  m.cores = 2;
  m.ns_rates = {
      {768, 768, 3.309e+10, 1.137e+11},
      {768, 2304, 3.527e+10, 1.167e+11},
      {768, 3072, 3.532e+10, 1.22e+11},
      {1280, 1280, 5.61e+10, 1.8e+11},
      {1280, 5120, 5.518e+10, 1.933e+11},
  };
  m.comm_fits = {
      {2, 3.125e+09, 0.0001101},
      {4, 1.417e+09, 6.259e-06},
  };
  return m;
}

}  // namespace detail

MachineProfile MachineProfile::resolve(std::string_view name_or_path) {
  if (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json") {
    std::ifstream in{std::string(name_or_path)};
    MESHMUON_CHECK(in.good(), "[plan] cannot read machine profile '", name_or_path,
                   "' (a .json path; write one with `meshmuon bench calibrate --out`)");
    std::stringstream ss;
    ss << in.rdbuf();
    return from_json(ss.str());
  }
  return named(name_or_path);
}

std::string MachineProfile::to_json() const {
  nlohmann::json j = {{"name", name},
                      {"bandwidth_Bps", bandwidth_Bps},
                      {"replicate_bandwidth_Bps", replicate_bandwidth_Bps},
                      {"latency_s", latency_s},
                      {"flops_per_s", flops_per_s},
                      {"bf16_flops_per_s", bf16_flops_per_s},
                      {"memory_Bps", memory_Bps},
                      {"cores", cores},
                      {"overlap", overlap},
                      {"fwd_bwd_overlap", fwd_bwd_overlap}};
  j["ns_rates"] = nlohmann::json::array();
  for (const NsRate& r : ns_rates)
    j["ns_rates"].push_back({{"short_side", r.short_side}, {"long_side", r.long_side}, {"fp32", r.fp32}, {"bf16", r.bf16}});
  j["comm_fits"] = nlohmann::json::array();
  for (const CommFit& f : comm_fits)
    j["comm_fits"].push_back({{"ranks", f.ranks}, {"bandwidth_Bps", f.bandwidth_Bps}, {"latency_s", f.latency_s}});
  return j.dump(2);
}

// The nearest measured class in (log short side, log long side), among those measured for the
// dtype; the scalar rate when none is.
double MachineProfile::ns_rate(int64_t m, int64_t n, const NsOptions& ns) const {
  const bool bf16 = ns.matmul_dtype == DType::BF16;
  const double s = std::log(static_cast<double>(std::max<int64_t>(1, std::min(m, n))));
  const double l = std::log(static_cast<double>(std::max<int64_t>(1, std::max(m, n))));
  double best = 0, dist = std::numeric_limits<double>::infinity();
  for (const NsRate& r : ns_rates) {
    const double rate = bf16 ? r.bf16 : r.fp32;
    if (rate <= 0) continue;
    const double d = std::abs(s - std::log(static_cast<double>(r.short_side))) + std::abs(l - std::log(static_cast<double>(r.long_side)));
    if (d < dist) dist = d, best = rate;
  }
  return best > 0 ? best : ns_flops_per_s(ns);
}

}  // namespace meshmuon
