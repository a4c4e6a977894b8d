// Plan output (text table and JSON, docs/plan.md), machine profiles, baselines and option names.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "meshmuon/error.h"
#include "meshmuon/plan.h"
#include "plan/machine_profile.h"

namespace meshmuon {

std::string_view to_string(ReplicaMode m) {
  return m == ReplicaMode::Auto ? "auto" : m == ReplicaMode::Duplicate ? "duplicate" : "split";
}

ReplicaMode parse_replica_mode(std::string_view name) {
  if (name == "auto") return ReplicaMode::Auto;
  if (name == "duplicate") return ReplicaMode::Duplicate;
  if (name == "split") return ReplicaMode::Split;
  detail::throw_invalid_argument(detail::concat("[plan] unknown replica mode '", name, "'; use auto, duplicate or split"));
}

std::string_view to_string(Decision d) {
  switch (d) {
    case Decision::Pin: return "pin";
    case Decision::Env: return "env";
    case Decision::Cost: return "cost";
    case Decision::Fallback: return "fallback";
  }
  return "?";
}

// Sources of the figures: docs/plan.md, "Machine profiles".
MachineProfile MachineProfile::named(std::string_view name) {
  MachineProfile m;  // h100: shard groups inside an 8-GPU NVLink node, replicas over InfiniBand
  m.name = std::string(name);
  // h200: the same NVLink 4, NICs and tensor-core rate; only its HBM3e is faster (4.8 TB/s against
  // 3.35 TB/s, x0.7 for the elementwise passes as for h100's default), which no plan choice reads
  if (name == "h200" || name == "h200-ib") m.memory_Bps = 3.36e12;
  if (name == "h100" || name == "h200") return m;
  if (name == "h100-ib" || name == "h200-ib") {    // shard groups span nodes: InfiniBand for both
    m.bandwidth_Bps = 46e9;
    m.latency_s = 10e-6;
    return m;
  }
  // fitted on this project's machine by `meshmuon bench calibrate` (docs/plan.md, "Calibration")
  if (name == "cpu") return detail::fitted_cpu_profile();
  std::string names;
  for (const std::string& n : machine_profile_names()) names += n + ", ";
  detail::throw_invalid_argument(detail::concat("[plan] unknown machine profile '", name, "'; use ", names,
                                                "or a JSON file of measured constants"));
}

std::vector<std::string> machine_profile_names() { return {"h100", "h200", "h100-ib", "h200-ib", "cpu"}; }

MachineProfile MachineProfile::from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    detail::throw_invalid_argument(detail::concat("[plan] machine profile: malformed JSON (", e.what(), ")"));
  }
  MESHMUON_CHECK(j.is_object(), "[plan] machine profile: the top level must be an object");
  MachineProfile m;
  m.name = "measured";
  for (const auto& [key, v] : j.items()) {
    if (key == "name") {
      MESHMUON_CHECK(v.is_string(), "[plan] machine profile: field 'name' must be a string");
      m.name = v.get<std::string>();
      continue;
    }
    if (detail::read_measured_field(m, key, v)) continue;
    double* field = key == "bandwidth_Bps" ? &m.bandwidth_Bps
                    : key == "replicate_bandwidth_Bps" ? &m.replicate_bandwidth_Bps
                    : key == "latency_s" ? &m.latency_s
                    : key == "flops_per_s" ? &m.flops_per_s
                    : key == "bf16_flops_per_s" ? &m.bf16_flops_per_s : nullptr;
    MESHMUON_CHECK(field, "[plan] machine profile: unknown field '", key,
                "'; use bandwidth_Bps, replicate_bandwidth_Bps, latency_s, flops_per_s, bf16_flops_per_s, memory_Bps, "
                "cores, overlap, ns_rates, comm_fits, name");
    MESHMUON_CHECK(v.is_number() && v.get<double>() >= 0, "[plan] machine profile: field '", key, "' must be a number ≥ 0");
    *field = v.get<double>();
  }
  return m;
}

std::vector<Baseline> plan_baselines(const Inventory& inv, const PlanOptions& options, std::span<const Strategy> strategies) {
  std::vector<Baseline> out;
  for (Strategy s : strategies) {
    PlanOptions o = options;
    o.pins = StrategyRules{};
    o.pins.fallback = s;
    o.env_override = StrategyRules{};
    o.exact = false;
    const Plan plan = make_plan(inv, o);
    Baseline b{s, plan.total(), 0, 0};
    for (const PlanEntry& e : plan.entries()) (e.decision == Decision::Pin ? b.applied : b.fell_back) += 1;
    out.push_back(b);
  }
  return out;
}

namespace {

std::string fmt_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  return fmt::format("{:.1f} {}", b, units[i]);
}

std::string fmt_flops(double f) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (f >= 1000 && i < 5) f /= 1000, ++i;
  return fmt::format("{:.2f} {}F", f, units[i]);
}

std::string fmt_time(double s) {
  return s >= 1 ? fmt::format("{:.2f} s", s) : s >= 1e-3 ? fmt::format("{:.2f} ms", s * 1e3) : fmt::format("{:.1f} us", s * 1e6);
}

std::string balance(const CostSummary& c) { return c.flops_mean > 0 ? fmt::format("{:.2f}", c.flops_max / c.flops_mean) : "-"; }

std::string dims_text(const Mesh& mesh, DimMask m) {
  std::string s;
  for (int i = 0; i < mesh.ndim(); ++i)
    if (m >> i & 1) s += (s.empty() ? "" : "+") + mesh.dim(i).name;
  return s.empty() ? "-" : s;
}

std::string_view peer_of(Strategy s) {
  switch (s) {
    case Strategy::OwnerA2A: return " (Motif)";
    case Strategy::AllGather: return " (Moonlight)";
    case Strategy::Agrs: return " (xtuner)";
    default: return "";
  }
}

// Row block sizes, runs of equal sizes folded: [128 x32] or [2048, 512, 512].
std::string block_text(const std::vector<int64_t>& split) {
  std::string t;
  for (size_t i = 0; i < split.size();) {
    size_t j = i;
    while (j < split.size() && split[j] == split[i]) ++j;
    t += fmt::format("{}{}", t.empty() ? "" : ", ", split[i]);
    if (j - i > 1) t += fmt::format(" x{}", j - i);
    i = j;
  }
  return "[" + t + "]";
}

nlohmann::ordered_json summary_json(const CostSummary& c) {
  return {{"params", c.params}, {"matrices", c.matrices},
          {"bytes_sent_max", c.bytes_sent_max}, {"bytes_sent_mean", c.bytes_sent_mean},
          {"bytes_recv_max", c.bytes_recv_max}, {"bytes_recv_mean", c.bytes_recv_mean},
          {"flops_max", c.flops_max}, {"flops_mean", c.flops_mean},
          {"peak_buffer_bytes_max", c.peak_buffer_bytes_max}, {"collectives", c.collectives},
          {"comm_seconds", c.comm_seconds}, {"compute_seconds", c.compute_seconds},
          {"predicted_seconds", c.predicted_seconds}};
}

// The split parameters (ParamSpec::split): how many, their row blocks per matrix, and the first
// few by name with their block sizes (empty when no parameter is split).
std::string split_summary(const Inventory& inv, const std::vector<PlanEntry>& entries) {
  int params = 0;
  int64_t blocks = 0;
  std::string named;
  for (const PlanEntry& e : entries) {
    const ParamSpec& p = inv.params[static_cast<size_t>(e.param)];
    if (p.split.empty()) continue;
    blocks += static_cast<int64_t>(p.split.size()) * p.units();
    if (params++ < 4) named += fmt::format("{}{} {}", named.empty() ? "" : ", ", p.name, block_text(p.split));
  }
  if (params == 0) return "";
  return fmt::format("  split: {} parameters orthogonalized as {} row blocks ({}{})\n", params, blocks, named,
                     params > 4 ? ", ..." : "");
}

}  // namespace

std::string Plan::to_string(std::span<const Baseline> baselines) const {
  const auto counts = strategy_counts();
  const int muon = static_cast<int>(entries_.size());
  std::string s;
  s += fmt::format("meshmuon plan: {} on {} ({} ranks)\n", inventory_.model, inventory_.meshes[0].to_string(), world_size());
  for (size_t i = 1; i < inventory_.meshes.size(); ++i)
    s += fmt::format("  mesh '{}': {}\n", inventory_.mesh_names[i], inventory_.meshes[i].to_string());
  s += fmt::format("  {} parameters ({} muon, {} adamw), {:.3f} B elements; comm {}, ns {} x{} {}\n",
                   inventory_.params.size(), muon, inventory_.params.size() - static_cast<size_t>(muon),
                   static_cast<double>(inventory_.num_elements()) / 1e9, meshmuon::to_string(options_.comm_dtype),
                   meshmuon::to_string(options_.ns.schedule), options_.ns.steps, meshmuon::to_string(options_.ns.method));
  const MachineProfile& m = options_.machine;
  s += fmt::format("  machine {}: {:.0f} GB/s ({:.0f} GB/s across replicas), {} per step, {:.0f} TFLOP/s ({} products)\n",
                   m.name, m.bandwidth_Bps / 1e9, m.replicate_bandwidth_Bps / 1e9, fmt_time(m.latency_s),
                   m.ns_flops_per_s(options_.ns) / 1e12, meshmuon::to_string(options_.ns.matmul_dtype));
  s += fmt::format("  {} chunks (cap {}, window {}), replicas {}, fingerprint {:016x}\n\n", chunks_.size(),
                   fmt_bytes(static_cast<double>(options_.chunk_bytes)), options_.window, meshmuon::to_string(options_.replica),
                   fingerprint_);
  s += split_summary(inventory_, entries_);
  static constexpr const char header[] = "{:<16} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>8} {:>10} {:>6} {:>10}\n";
  s += fmt::format(fmt::runtime(header), "strategy", "params", "matrices", "sent max", "sent mean", "recv max", "recv mean",
                   "flops max", "flops mean", "max/mean", "peak buf", "coll", "time");
  const auto row = [&](std::string_view name, const CostSummary& c, double time) {
    s += fmt::format(fmt::runtime(header), name, c.params, c.matrices, fmt_bytes(c.bytes_sent_max), fmt_bytes(c.bytes_sent_mean),
                     fmt_bytes(c.bytes_recv_max), fmt_bytes(c.bytes_recv_mean), fmt_flops(c.flops_max),
                     fmt_flops(c.flops_mean), balance(c), fmt_bytes(c.peak_buffer_bytes_max), c.collectives, fmt_time(time));
  };
  for (int i = 0; i < kNumStrategies; ++i)
    if (counts[static_cast<size_t>(i)] > 0) row(meshmuon::to_string(static_cast<Strategy>(i)), by_strategy_[static_cast<size_t>(i)], by_strategy_[static_cast<size_t>(i)].predicted_seconds);
  row("total", total_, total_.predicted_seconds);
  if (baselines.empty()) return s;
  s += "\nwhole-model baselines (the strategy wherever it applies, the cost model elsewhere)\n";
  static constexpr const char bh[] = "{:<28} {:>7} {:>10} {:>10} {:>10} {:>11} {:>8} {:>10} {:>6} {:>10} {:>9}\n";
  s += fmt::format(fmt::runtime(bh), "plan", "applied", "sent max", "sent mean", "recv max", "flops max", "max/mean", "peak buf",
                   "coll", "predicted", "vs chosen");
  const auto brow = [&](const std::string& name, int applied, const CostSummary& c) {
    const double ratio = total_.predicted_seconds > 0 ? c.predicted_seconds / total_.predicted_seconds : 1.0;
    s += fmt::format(fmt::runtime(bh), name, applied, fmt_bytes(c.bytes_sent_max), fmt_bytes(c.bytes_sent_mean), fmt_bytes(c.bytes_recv_max),
                     fmt_flops(c.flops_max), balance(c), fmt_bytes(c.peak_buffer_bytes_max), c.collectives,
                     fmt_time(c.predicted_seconds), fmt::format("{:.2f}x", ratio));
  };
  brow("chosen (this plan)", muon, total_);
  for (const Baseline& b : baselines)
    brow(std::string(meshmuon::to_string(b.strategy)) + std::string(peer_of(b.strategy)), b.applied, b.total);
  return s;
}

std::string Plan::to_json(std::span<const Baseline> baselines) const {
  nlohmann::ordered_json j;
  j["model"] = inventory_.model;
  j["world_size"] = world_size();
  nlohmann::ordered_json meshes = nlohmann::ordered_json::object();
  for (size_t i = 0; i < inventory_.meshes.size(); ++i) meshes[inventory_.mesh_names[i]] = inventory_.meshes[i].to_string();
  j["meshes"] = meshes;
  j["num_params"] = inventory_.params.size();
  j["num_muon_params"] = entries_.size();
  j["num_elements"] = inventory_.num_elements();
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  const auto c = strategy_counts();
  for (int i = 0; i < kNumStrategies; ++i) counts[std::string(meshmuon::to_string(static_cast<Strategy>(i)))] = c[static_cast<size_t>(i)];
  j["strategy_counts"] = counts;
  j["per_rank"] = summary_json(total_);
  j["predicted_step_seconds"] = total_.predicted_seconds;
  nlohmann::ordered_json by = nlohmann::ordered_json::object();
  for (int i = 0; i < kNumStrategies; ++i)
    if (c[static_cast<size_t>(i)] > 0) by[std::string(meshmuon::to_string(static_cast<Strategy>(i)))] = summary_json(by_strategy_[static_cast<size_t>(i)]);
  j["by_strategy"] = by;
  nlohmann::ordered_json bl = nlohmann::ordered_json::object();
  for (const Baseline& b : baselines) {
    auto v = summary_json(b.total);
    v["predicted_step_seconds"] = b.total.predicted_seconds;
    v["applied"] = b.applied;
    v["fell_back"] = b.fell_back;
    bl[std::string(meshmuon::to_string(b.strategy))] = v;
  }
  j["baselines"] = bl;
  j["options"] = {{"comm_dtype", meshmuon::to_string(options_.comm_dtype)}, {"ns_schedule", meshmuon::to_string(options_.ns.schedule)},
                  {"ns_steps", options_.ns.steps}, {"ns_method", meshmuon::to_string(options_.ns.method)},
                  {"chunk_bytes", options_.chunk_bytes}, {"window", options_.window},
                  {"replica", meshmuon::to_string(options_.replica)}, {"exact", options_.exact},
                  {"machine", {{"name", options_.machine.name}, {"bandwidth_Bps", options_.machine.bandwidth_Bps},
                               {"replicate_bandwidth_Bps", options_.machine.replicate_bandwidth_Bps},
                               {"latency_s", options_.machine.latency_s}, {"flops_per_s", options_.machine.flops_per_s},
                               {"bf16_flops_per_s", options_.machine.bf16_flops_per_s}}}};
  j["num_chunks"] = chunks_.size();
  j["fingerprint"] = fmt::format("{:016x}", fingerprint_);
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const PlanEntry& e : entries_) {
    const ParamSpec& p = inventory_.params[static_cast<size_t>(e.param)];
    const Mesh& mesh = inventory_.meshes[static_cast<size_t>(e.mesh)];
    std::string pl;
    for (const Placement& x : p.placements) pl += (pl.empty() ? "" : ",") + meshmuon::to_string(x);
    entries.push_back({{"name", p.name}, {"shape", p.shape.to_string()}, {"placements", pl},
                       {"strategy", meshmuon::to_string(e.strategy)}, {"decision", meshmuon::to_string(e.decision)},
                       {"mesh", inventory_.mesh_names[static_cast<size_t>(e.mesh)]},
                       {"group_dims", dims_text(mesh, e.group_dims)}, {"replica_dims", dims_text(mesh, e.replica_dims)},
                       {"replica_split", e.replica_split}, {"chunk", e.chunk}, {"unit_flops", e.unit_flops}});
    if (!p.split.empty()) entries.back()["blocks"] = p.split;  // row blocks orthogonalized independently
  }
  j["entries"] = entries;
  return j.dump(2);
}

}  // namespace meshmuon
