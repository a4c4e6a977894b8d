// The planner: a pure function from (inventory, options) to a Plan that says, for every Muon
// parameter, how its orthogonalization is distributed, and predicts what that costs.
//
// Contract: make_plan is local and deterministic: it never communicates, never allocates tensors,
// never reads the environment (callers pass MESHMUON_STRATEGY in options.env_override), and every rank
// computes the same Plan from the same inputs (fingerprint() proves it). The executor runs a Plan
// without re-deciding anything: per entry it reads the strategy, the mesh and the mesh dims of the
// collective group, the owner of every matrix, the chunk, and any rank's local box. Throws
// std::invalid_argument (naming the parameter and field) on bad input or an impossible pin.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/box.h"
#include "meshmuon/dtype.h"
#include "meshmuon/export.h"
#include "meshmuon/inventory.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/strategy.h"

namespace meshmuon {

// Machine constants of the cost model. Defaults: an H100-class GPU cluster (400 Gb/s per rank,
// 20 µs per collective step, 400 TFLOP/s bf16 Newton–Schulz). `cpu` is this project's 2-core box.
// The cost model's constants for one kind of machine (per rank). Named profiles (docs/plan.md,
// "Machine profiles", gives the source of every figure): "h100" / "h200" (8-GPU NVLink nodes, shard
// groups inside a node, replicas across nodes over InfiniBand), "h100-ib" / "h200-ib" (shard groups
// spanning nodes: InfiniBand for both), "cpu" (this project's 2-core machines).
struct MachineProfile {
  std::string name = "h100";
  double bandwidth_Bps = 370e9;           // per rank, inside a shard group (bytes / s)
  double replicate_bandwidth_Bps = 46e9;  // per rank, across replicate (HSDP) dims
  double latency_s = 4e-6;                // per step of a collective (log2(group) steps)
  double flops_per_s = 50e12;             // orthogonalization throughput per rank, fp32 products
  double bf16_flops_per_s = 560e12;       // the same with bf16 products (0: flops_per_s)
  // Step-time prediction only (predict_step; the per-parameter choice uses the fields above, so
  // these never change a plan). docs/plan.md, "Predicted step time".
  double memory_Bps = 2.3e12;             // elementwise passes per rank: momentum, pack, update, AdamW
  int cores = 0;                          // cores the ranks of one node share (0: a core per rank)
  double overlap = 1;                     // fraction of min(comm, compute) per chunk the pipeline hides
  // Owner placement's choice (choose_owner_placement, `plan --placement auto`): the fraction of the
  // forward / backward traffic (unshard, gradient reduction) hidden behind compute. 0.8 on the GPU
  // profiles (assumed: collectives on their own stream; not measured); on `cpu` and calibrated
  // profiles the measured comm / compute overlap (calibrate: a CPU's collectives copy on the cores that
  // compute, ~0).
  double fwd_bwd_overlap = 0.8;
  // Measured Newton–Schulz rates by matrix shape (short side, long side); the nearest class in log
  // space is used, `flops_per_s` / `bf16_flops_per_s` where empty (0 in a class: not measured).
  struct NsRate {
    int64_t short_side = 0, long_side = 0;
    double fp32 = 0, bf16 = 0;
  };
  std::vector<NsRate> ns_rates;
  // Measured communication per world size (bandwidth_Bps / latency_s where absent).
  struct CommFit {
    int ranks = 0;
    double bandwidth_Bps = 0, latency_s = 0;
  };
  std::vector<CommFit> comm_fits;
  MESHMUON_API static MachineProfile named(std::string_view name);  // the names above; throws otherwise
  // A measured profile: JSON object with any of the fields above; throws naming the field.
  MESHMUON_API static MachineProfile from_json(std::string_view text);
  // A name above, or a path ending in .json: the file read by from_json (`--machine`, `machine=`).
  MESHMUON_API static MachineProfile resolve(std::string_view name_or_path);
  // The JSON object from_json reads back (every field).
  MESHMUON_API std::string to_json() const;
  // The Newton–Schulz rate for an m×n matrix with these options (ns_rates, else ns_flops_per_s).
  MESHMUON_API double ns_rate(int64_t m, int64_t n, const NsOptions& ns) const;
  // The rate Newton–Schulz with these options runs at (bf16_flops_per_s for bf16 products).
  double ns_flops_per_s(const NsOptions& ns) const {
    return ns.matmul_dtype == DType::BF16 && bf16_flops_per_s > 0 ? bf16_flops_per_s : flops_per_s;
  }
};
// The named profiles, in the order `meshmuon plan --help` lists them.
MESHMUON_API std::vector<std::string> machine_profile_names();

// How HSDP replicas (replicate mesh dims) share the work of owner-based strategies:
// duplicate: every replica group runs the same plan (compute ×replicas, no extra traffic);
// split: matrices are owned across all replicas; the result is scattered to every replica;
// auto: the one the cost model predicts faster (plan-wide).
enum class ReplicaMode : uint8_t { Auto, Duplicate, Split };
MESHMUON_API std::string_view to_string(ReplicaMode m);
MESHMUON_API ReplicaMode parse_replica_mode(std::string_view name);

struct PlanOptions {
  NsOptions ns;                       // flops model (ns_flops) and what the executor runs
  DType comm_dtype = DType::F32;      // what shards travel as
  MachineProfile machine;
  StrategyRules pins;                 // user pins: highest precedence
  StrategyRules env_override;         // MESHMUON_STRATEGY (strategy_rules_from_env())
  bool exact = true;                  // cost model never picks gram_allreduce (pins still may)
  ReplicaMode replica = ReplicaMode::Auto;
  int64_t chunk_bytes = int64_t{1} << 30;  // cap on a chunk's mean buffer bytes per rank
  int window = 2;                     // chunks in flight (≥ 2 overlaps communication and compute)
  // Per inventory parameter: whether its NorMuon state (normuon_state_shape, fp32, stored with the
  // parameter's placements) travels with its data, which the byte accounting then includes. The
  // optimizer fills it from its groups; empty means no parameter has NorMuon state.
  std::vector<bool> normuon;
};

// Why an entry has its strategy.
enum class Decision : uint8_t { Pin, Env, Cost, Fallback };
MESHMUON_API std::string_view to_string(Decision d);

struct PlanEntry {
  int param = -1;              // index into Plan::inventory().params
  Strategy strategy = Strategy::Local;
  Decision decision = Decision::Cost;
  int mesh = 0;                // inventory mesh the collectives run on
  DimMask group_dims = 0;      // shard dims: the gather / scatter group (all-gather, a2a, all-reduce)
  DimMask replica_dims = 0;    // replicate dims
  bool replica_split = false;  // owners spread over replicas; the result scatter spans group|replica
  int chunk = -1;
  double unit_flops = 0;       // one matrix's (one expert's) orthogonalization flops
  // owner_a2a / agrs: per matrix (per expert) the owner's index inside the group over group_dims,
  // and, when replica_split, the index of the owning replica group (inside the group over
  // replica_dims). Empty for other strategies. Use Plan::owner_rank for world ranks.
  std::vector<int32_t> owner_index;
  std::vector<int32_t> owner_replica;
  uint64_t hash = 0;           // inputs and decisions of this entry (fingerprint item)
};

struct Chunk {
  int first_entry = 0, end_entry = 0;  // entries [first, end)
  double buffer_bytes_max = 0;         // on the busiest rank
  double comm_seconds = 0, compute_seconds = 0;
};

// Per-rank figures, reduced over ranks.
struct CostSummary {
  int params = 0;
  int64_t matrices = 0;  // orthogonalized matrices (experts counted one by one), per replica
  double bytes_sent_max = 0, bytes_sent_mean = 0, bytes_recv_max = 0, bytes_recv_mean = 0;
  double flops_max = 0, flops_mean = 0;
  double peak_buffer_bytes_max = 0;
  int64_t collectives = 0;     // collective calls per step (all chunks)
  double comm_seconds = 0, compute_seconds = 0, predicted_seconds = 0;
};

// A whole-model single-strategy baseline (what a peer does): the strategy as `default:` for every
// parameter it can run, the cost model for the rest.
struct Baseline {
  Strategy strategy = Strategy::OwnerA2A;
  CostSummary total;
  int applied = 0, fell_back = 0;  // parameters run with the strategy / by the cost model instead
};

class MESHMUON_API Plan {
 public:
  const Inventory& inventory() const { return inventory_; }
  const PlanOptions& options() const { return options_; }
  const std::vector<PlanEntry>& entries() const { return entries_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  // The entry of inventory parameter `param`, or nullptr for AdamW parameters.
  const PlanEntry* entry_of(int param) const;

  // The world rank that owns matrix `unit` of `entry` for the replica group `rank` belongs to
  // (owner strategies only; throws std::invalid_argument otherwise).
  int owner_rank(const PlanEntry& entry, int64_t unit, int rank) const;
  // Any rank's local box of an inventory parameter (computed on demand; O(mesh dims)).
  Box local_box(int param, int rank) const;

  const CostSummary& total() const { return total_; }
  const CostSummary& by_strategy(Strategy s) const { return by_strategy_[static_cast<size_t>(s)]; }
  std::array<int, kNumStrategies> strategy_counts() const;
  uint64_t fingerprint() const { return fingerprint_; }
  int world_size() const { return inventory_.world_size(); }

  // Per-strategy table, totals and, when given, baselines side by side (docs/plan.md explains
  // every column). to_json: the same, machine-readable, plus every entry's decision.
  std::string to_string(std::span<const Baseline> baselines = {}) const;
  std::string to_json(std::span<const Baseline> baselines = {}) const;

 private:
  friend MESHMUON_API Plan make_plan(const Inventory&, const PlanOptions&);
  Inventory inventory_;
  PlanOptions options_;
  std::vector<PlanEntry> entries_;
  std::vector<int> entry_of_param_;
  std::vector<Chunk> chunks_;
  CostSummary total_;
  std::array<CostSummary, kNumStrategies> by_strategy_{};
  uint64_t fingerprint_ = 0;
};

// Validates the inventory, then decides per Muon parameter: user pin > env override > cost model
// (a `default:` rule whose strategy does not apply to a parameter falls back to the cost model; a
// pattern that names a parameter with a strategy that cannot apply throws). Owners are assigned
// longest-processing-time first on flops; chunks close at options.chunk_bytes.
MESHMUON_API Plan make_plan(const Inventory& inventory, const PlanOptions& options);

// Baselines for `strategies` (pins and env cleared, exact off, other options as given).
MESHMUON_API std::vector<Baseline> plan_baselines(const Inventory& inventory, const PlanOptions& options,
                                               std::span<const Strategy> strategies);

// Whether `s` can run parameter `param` of `inventory` (see strategy.h for the conditions).
MESHMUON_API bool strategy_applies(Strategy s, const Inventory& inventory, int param);

// The predicted wall time of one optimizer step running `plan` (docs/plan.md, "Predicted step
// time"): per chunk, Newton–Schulz on the busiest rank at the profile's rate for each matrix shape,
// and communication (bandwidth of the busiest rank and collective latency, comm_fits for this
// world size when measured), overlapped as the pipeline does (profile `overlap`); plus the
// elementwise passes of the busiest rank (momentum, pack / unpack, update, AdamW) at memory_Bps.
// Compute and elementwise time are multiplied by the time sharing of `ranks_per_node` ranks on the
// profile's `cores` (0: no sharing). Every field in seconds.
struct StepPrediction {
  double compute = 0;      // Newton–Schulz, summed over chunks (busiest rank of each)
  double bandwidth = 0;    // communication bytes / bandwidth, summed over chunks
  double latency = 0;      // collective latency terms, summed over chunks
  double pipeline = 0;     // the chunks overlapped: sum of comm + compute − overlap · hidden
  double elementwise = 0;  // momentum, pack / unpack, update, AdamW on the busiest rank
  double time_sharing = 1; // the factor applied to compute and elementwise
  double step = 0;         // pipeline + elementwise: the prediction
};
// Bytes each elementwise pass moves per element of a local shard (docs/plan.md): momentum (read
// gradient and momentum, write momentum and the Nesterov blend), update (read parameter and update,
// write parameter), AdamW (read gradient, parameter, two moments; write the last three), and per
// byte sent or received: packing it and unpacking it (read and write each).
inline constexpr double kMomentumBytesPerElem = 16, kUpdateBytesPerElem = 12, kAdamWBytesPerElem = 28;
inline constexpr double kPackBytesPerCommByte = 2;
// `ns_rate_scale` (> 0) multiplies every Newton–Schulz rate of the profile: the ratio of a rate
// measured in the same run as the step to the calibrated one (`bench step --predict` measures it:
// a calibration's rates are a snapshot of the node's load, which moves 2–4x within minutes here).
MESHMUON_API StepPrediction predict_step(const Plan& plan, int ranks_per_node = 0, double ns_rate_scale = 1.0);

// Owner placement (issue 38): which of `params` (an FSDP / HSDP model's parameters, placements not
// needed) to place whole on one owner rank of a `replicate` x `shard` data-parallel mesh, and which
// rank. mode "owner": every eligible matrix (Muon, 2-D, not an expert stack); "auto": those whose
// owner placement the cost model (options.machine, options.ns, comm dtype) predicts faster than the
// sharded one, `overlap` (0..1) the fraction of forward / backward traffic hidden behind compute
// (negative: the profile's `fwd_bwd_overlap`),
// `scatter_gather_reduce` the gradient's way to the owner (false: every rank's gradient to the owner,
// as ShardedParams; true: reduce-scatter then gather of the sums, as meshmuon.torch.own); "sharded": none. Owners by longest-processing-time on Newton–Schulz flops and memory, matrices of
// one layer on different ranks. Pure and local: every rank gets the same answer. Throws
// std::invalid_argument naming the bad argument.
struct OwnerPlacementChoice {
  bool eligible = false, owned = false;
  int owner = -1;                                   // world rank (row-major over the mesh) when owned
  double owner_seconds = 0, sharded_seconds = 0;    // the cost model's exposed seconds per step
  double owner_peak_bytes = 0, sharded_peak_bytes = 0;
  std::string why;                                  // one line: what was compared, or why not eligible
};
MESHMUON_API std::vector<OwnerPlacementChoice> choose_owner_placement(const std::vector<ParamSpec>& params,
                                                                      int replicate, int shard,
                                                                      const PlanOptions& options,
                                                                      std::string_view mode, double overlap = -1,
                                                                      bool scatter_gather_reduce = false);

}  // namespace meshmuon
