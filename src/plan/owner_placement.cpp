// Owner placement (issue 38): LPT owners for whole matrices, and the placement cost terms the
// planner sets beside the sharded placement's (kept apart from cost_model.cpp's strategy costs).
#include "plan/owner_placement.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <set>

#include "meshmuon/box.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

std::string layer_of(const std::string& name) {
  size_t end = name.size(), best = std::string::npos;
  while (end > 0) {  // components right to left: the last all-digit one ends the layer
    const size_t dot = name.rfind('.', end - 1);
    const size_t begin = dot == std::string::npos ? 0 : dot + 1;
    const bool digits = begin < end && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(begin),
                                                   name.begin() + static_cast<std::ptrdiff_t>(end),
                                                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
    if (digits) {
      best = end;
      break;
    }
    if (dot == std::string::npos) break;
    end = dot;
  }
  if (best != std::string::npos) return name.substr(0, best);
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

std::vector<int> choose_owners(const std::vector<ParamSpec>& params, const std::vector<bool>& owned, int world,
                               const NsOptions& ns) {
  MESHMUON_CHECK(owned.size() == params.size(), "[plan] choose_owners: ", owned.size(), " flags for ", params.size(), " parameters");
  MESHMUON_CHECK(world >= 1, "[plan] choose_owners: world must be ≥ 1, got ", world);
  std::vector<int> owner(params.size(), -1);
  // pass 1: each owned matrix's weight, flops and bytes each as a share of their totals
  std::vector<size_t> jobs;
  std::vector<double> flops(params.size(), 0), bytes(params.size(), 0);
  double total_flops = 0, total_bytes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!owned[i]) continue;
    const ParamSpec& p = params[i];
    flops[i] = p.shape.numel() > 0 ? ns_flops(p.rows(), p.cols(), ns) * (p.expert ? static_cast<double>(p.shape[0]) : 1.0) : 0.0;
    bytes[i] = static_cast<double>(p.shape.numel()) * 4;
    total_flops += flops[i], total_bytes += bytes[i];
    jobs.push_back(i);
  }
  const auto weight = [&](size_t i) {
    return (total_flops > 0 ? flops[i] / total_flops : 0.0) + (total_bytes > 0 ? bytes[i] / total_bytes : 0.0);
  };
  // pass 2: largest first (model order among equals), each to the least-loaded rank without its layer
  std::stable_sort(jobs.begin(), jobs.end(), [&](size_t a, size_t b) { return weight(a) > weight(b); });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  std::vector<std::set<std::string>> layers(static_cast<size_t>(world));
  for (size_t i : jobs) {
    const std::string layer = layer_of(params[i].name);
    int best = -1, best_free = -1;
    for (int r = 0; r < world; ++r) {
      const size_t rs = static_cast<size_t>(r);
      if (best < 0 || load[rs] < load[static_cast<size_t>(best)]) best = r;
      if (!layers[rs].count(layer) && (best_free < 0 || load[rs] < load[static_cast<size_t>(best_free)])) best_free = r;
    }
    const int pick = best_free >= 0 ? best_free : best;
    owner[i] = pick;
    load[static_cast<size_t>(pick)] += weight(i);
    layers[static_cast<size_t>(pick)].insert(layer);
  }
  return owner;
}

namespace {

double steps(int g) { return g > 1 ? std::ceil(std::log2(static_cast<double>(g))) : 0.0; }

}  // namespace

PlacementCost owner_placement_cost(const PlacementInputs& in, const MachineProfile& m, const NsOptions& ns) {
  PlacementCost c;
  const double P = static_cast<double>(in.rows) * static_cast<double>(in.cols);
  const int N = in.R * in.S;
  c.peak_bytes = P * 4 * (1 + in.state_copies);
  c.mean_bytes = c.peak_bytes / N;
  // Unshard: a broadcast from the owner (every rank receives the matrix once; a pipelined tree keeps
  // the busiest link near one copy), over the replicate link when the mesh has replicas.
  const double bcast = N > 1 ? P * static_cast<double>(in.param_bytes) : 0.0;
  const double bcast_bw = in.R > 1 ? m.replicate_bandwidth_Bps : m.bandwidth_Bps;
  // Reduce to the owner: S−1 full gradients arrive over the shard link, then R−1 partial sums over
  // the replicate link (the fixed-order two-stage sum of sharded_params.h): the owner's link is the busiest.
  double red_shard = (in.S - 1) * P * static_cast<double>(in.grad_bytes);
  double red_rep = (in.R - 1) * P * static_cast<double>(in.grad_bytes);
  double red_latency = (in.S > 1 ? 1 : 0) + (in.R > 1 ? 1 : 0);
  if (in.scatter_gather_reduce && N > 1) {
    // reduce-scatter over the world by data movement, then the summed blocks to the owner: (N−1)/N of
    // the gradient in each stage through the owner's link, (S−1)/N of it within the shard group and
    // (N−S)/N across replicas.
    const double g = P * static_cast<double>(in.grad_bytes);
    red_shard = 2.0 * (in.S - 1) / N * g;
    red_rep = 2.0 * (N - in.S) / N * g;
    red_latency = 2;
  }
  c.fwd_bwd_bytes = bcast + red_shard + red_rep;
  c.fwd_bwd_latency_s = m.latency_s * (steps(N) + red_latency);
  const double fwd_bwd_s = bcast / bcast_bw + red_shard / m.bandwidth_Bps + red_rep / m.replicate_bandwidth_Bps + c.fwd_bwd_latency_s;
  // The step: no communication; the matrix's Newton–Schulz once in the whole mesh (mean per rank: 1/N
  // of it once LPT balances many matrices).
  c.step_bytes = 0, c.step_latency_s = 0;
  c.step_flops = ns_flops(in.rows, in.cols, ns) / N;
  c.seconds = c.step_flops / m.ns_flops_per_s(ns) + (1 - in.overlap) * fwd_bwd_s;
  return c;
}

PlacementCost sharded_placement_cost(const PlacementInputs& in, const MachineProfile& m, const NsOptions& ns) {
  PlacementCost c;
  const double P = static_cast<double>(in.rows) * static_cast<double>(in.cols);
  const double S = in.S, R = in.R;
  const double row = static_cast<double>(in.cols);
  const double peak_rows = std::ceil(static_cast<double>(in.rows) / S);
  c.peak_bytes = peak_rows * row * 4 * (1 + in.state_copies);
  c.mean_bytes = P * 4 * (1 + in.state_copies) / S;
  // FSDP2: all-gather and reduce-scatter over the shard group, replicate exchange of the 1/S shard.
  const double ag = (S - 1) / S * P * static_cast<double>(in.param_bytes);
  const double rs = (S - 1) / S * P * static_cast<double>(in.grad_bytes);
  const double rep = R > 1 ? 2 * (R - 1) / R * (P / S) * static_cast<double>(in.grad_bytes) : 0.0;
  c.fwd_bwd_bytes = ag + rs + rep;
  c.fwd_bwd_latency_s = m.latency_s * (2 * steps(in.S) + (in.R > 1 ? 2 : 0));
  const double fwd_bwd_s = (ag + rs) / m.bandwidth_Bps + rep / m.replicate_bandwidth_Bps + c.fwd_bwd_latency_s;
  // The step under owner_a2a: shards to the owner and back (mean per rank 2·P·(S−1)/S², fp32), two
  // grouped exchanges; Newton–Schulz once per replica group (mean 1/S of it per rank).
  c.step_bytes = in.S > 1 ? 2 * P * (S - 1) / (S * S) * 4 : 0.0;
  c.step_latency_s = in.S > 1 ? 2 * m.latency_s : 0.0;
  c.step_flops = ns_flops(in.rows, in.cols, ns) / S;
  c.seconds = c.step_bytes / m.bandwidth_Bps + c.step_latency_s + c.step_flops / m.ns_flops_per_s(ns) + (1 - in.overlap) * fwd_bwd_s;
  return c;
}

std::string_view to_string(PlacementMode m) {
  switch (m) {
    case PlacementMode::Sharded: return "sharded";
    case PlacementMode::Owner: return "owner";
    case PlacementMode::Auto: return "auto";
  }
  return "?";
}

PlacementMode parse_placement_mode(std::string_view name) {
  if (name == "sharded") return PlacementMode::Sharded;
  if (name == "owner") return PlacementMode::Owner;
  if (name == "auto") return PlacementMode::Auto;
  detail::throw_invalid_argument(concat("[plan] unknown placement '", name, "'; use sharded, owner or auto"));
}

bool dp_mesh_sizes(const Mesh& mesh, int& R, int& S) {
  R = 1, S = 1;
  for (const MeshDim& d : mesh.dims()) {
    if (d.name == "dp_shard") S = d.size;
    else if (d.name == "dp_replicate") R = d.size;
    else return false;
  }
  return true;
}

namespace {

std::string bytes_text(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return buf;
}

std::string seconds_text(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  return buf;
}

}  // namespace

std::vector<PlacementChoice> choose_placements(const std::vector<ParamSpec>& params, int R, int S, const PlanOptions& o,
                                               PlacementMode mode, double overlap, bool scatter_gather_reduce) {
  if (overlap < 0) overlap = o.machine.fwd_bwd_overlap;
  MESHMUON_CHECK(overlap >= 0 && overlap <= 1, "[plan] placement overlap must be in [0, 1], got ", overlap);
  // the communication fitted at this world size where the profile has one (as predict_step)
  MachineProfile m = o.machine;
  for (const MachineProfile::CommFit& f : m.comm_fits)
    if (f.ranks == R * S) {
      if (f.bandwidth_Bps > 0) m.bandwidth_Bps = f.bandwidth_Bps;
      m.latency_s = f.latency_s;
    }
  std::vector<PlacementChoice> out(params.size());
  std::vector<bool> owned(params.size(), false);
  const size_t comm_bytes = dtype_size(o.comm_dtype);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    PlacementChoice& c = out[i];
    if (p.role != Role::Muon) {
      c.why = "AdamW: sharded (owner placement is for Muon matrices)";
      continue;
    }
    if (p.expert) {
      c.why = "expert stack: sharded over experts (each expert already whole on one shard rank: expert_local)";
      continue;
    }
    if (p.shape.ndim() != 2) {
      c.why = "not 2-D: sharded";
      continue;
    }
    c.eligible = true;
    PlacementInputs in;
    in.R = R, in.S = S, in.rows = p.shape[0], in.cols = p.shape[1], in.overlap = overlap;
    in.param_bytes = comm_bytes, in.grad_bytes = comm_bytes;
    in.scatter_gather_reduce = scatter_gather_reduce;
    c.owner_cost = owner_placement_cost(in, m, o.ns);
    c.sharded_cost = sharded_placement_cost(in, m, o.ns);
    const bool cheaper = c.owner_cost.seconds < c.sharded_cost.seconds;
    c.owned = mode == PlacementMode::Owner || (mode == PlacementMode::Auto && cheaper && R * S > 1);
    owned[i] = c.owned;
    c.why = concat(mode == PlacementMode::Auto ? (c.owned ? "owner (cost): " : "sharded (cost): ")
                   : mode == PlacementMode::Owner ? "owner (asked): " : "sharded (asked): ",
                   "predicted ", seconds_text(c.owner_cost.seconds), " owned vs ", seconds_text(c.sharded_cost.seconds),
                   " sharded; step traffic 0 B vs ", bytes_text(c.sharded_cost.step_bytes), ", fwd/bwd traffic ",
                   bytes_text(c.owner_cost.fwd_bwd_bytes), " vs ", bytes_text(c.sharded_cost.fwd_bwd_bytes), " (",
                   static_cast<int>(overlap * 100 + 0.5), "% hidden), peak memory ", bytes_text(c.owner_cost.peak_bytes), " vs ",
                   bytes_text(c.sharded_cost.peak_bytes));
  }
  const std::vector<int> owners = choose_owners(params, owned, R * S, o.ns);
  for (size_t i = 0; i < params.size(); ++i) out[i].owner = owners[i];
  return out;
}

std::vector<double> placement_bytes_per_rank(const std::vector<ParamSpec>& params, int R, int S,
                                             const std::vector<PlacementChoice>& choices) {
  MESHMUON_CHECK(choices.size() == params.size(), "[plan] placement_bytes_per_rank: ", choices.size(), " choices for ",
                 params.size(), " parameters");
  std::vector<double> bytes(static_cast<size_t>(R) * static_cast<size_t>(S), 0.0);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const double copies = 1.0 + (p.role == Role::Muon ? 1.0 : 2.0);
    if (choices[i].owned) {
      bytes[static_cast<size_t>(choices[i].owner)] += static_cast<double>(p.shape.numel()) * 4 * copies;
      continue;
    }
    const int64_t rows = p.shape.ndim() > 0 ? p.shape[0] : 1;
    const double row = rows > 0 ? static_cast<double>(p.shape.numel()) / static_cast<double>(rows) : 0.0;
    for (int s = 0; s < S; ++s) {
      const double b = static_cast<double>(chunk_range(rows, S, s).size()) * row * 4 * copies;
      for (int r = 0; r < R; ++r) bytes[static_cast<size_t>(r * S + s)] += b;
    }
  }
  return bytes;
}

Inventory apply_placements(const Inventory& inv, const std::vector<PlacementChoice>& choices) {
  MESHMUON_CHECK(choices.size() == inv.params.size(), "[plan] apply_placements: ", choices.size(), " choices for ",
                 inv.params.size(), " parameters");
  Inventory out = inv;
  for (size_t i = 0; i < out.params.size(); ++i) {
    if (!choices[i].owned) continue;
    ParamSpec& p = out.params[i];
    const Mesh& mesh = out.meshes[static_cast<size_t>(p.mesh)];
    int R = 1, S = 1;
    MESHMUON_CHECK(dp_mesh_sizes(mesh, R, S), "[plan] parameter '", p.name, "': owner placement needs a mesh of dp_shard / ",
                   "dp_replicate dims only, its mesh is ", mesh.to_string());
    p.placements.assign(static_cast<size_t>(mesh.ndim()), Placement::replicate());
    for (int d = 0; d < mesh.ndim(); ++d)
      p.placements[static_cast<size_t>(d)] =
          Placement::owned(mesh.dim(d).name == "dp_shard" ? choices[i].owner % S : choices[i].owner / S);
  }
  return out;
}

}  // namespace meshmuon::detail

namespace meshmuon {

std::vector<OwnerPlacementChoice> choose_owner_placement(const std::vector<ParamSpec>& params, int replicate, int shard,
                                                         const PlanOptions& options, std::string_view mode,
                                                         double overlap, bool scatter_gather_reduce) {
  MESHMUON_CHECK(replicate >= 1 && shard >= 1, "[plan] choose_owner_placement: replicate and shard must be >= 1, got ",
                 replicate, " x ", shard);
  const auto choices = detail::choose_placements(params, replicate, shard, options,
                                                 detail::parse_placement_mode(mode), overlap, scatter_gather_reduce);
  std::vector<OwnerPlacementChoice> out(choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    const detail::PlacementChoice& c = choices[i];
    OwnerPlacementChoice& o = out[i];
    o.eligible = c.eligible, o.owned = c.owned, o.owner = c.owner, o.why = c.why;
    o.owner_seconds = c.owner_cost.seconds, o.sharded_seconds = c.sharded_cost.seconds;
    o.owner_peak_bytes = c.owner_cost.peak_bytes, o.sharded_peak_bytes = c.sharded_cost.peak_bytes;
  }
  return out;
}

}  // namespace meshmuon
