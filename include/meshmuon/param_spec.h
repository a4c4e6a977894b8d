// ParamSpec: one parameter as the planner sees it (name, global shape, dtype, role, placements over
// a mesh, expert stack, QK-clip tag). Pure data; validation is local and throws
// std::invalid_argument naming the parameter and the field.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/dtype.h"
#include "meshmuon/export.h"
#include "meshmuon/mesh.h"
#include "meshmuon/placement.h"
#include "meshmuon/qk_clip.h"
#include "meshmuon/tensor.h"

namespace meshmuon {

// "muon": orthogonalized update (2-D matrices, 3-D expert stacks); "adamw": everything else
// (embeddings, LM head, norms, biases, routers by the presets' choice).
enum class Role : uint8_t { Muon, AdamW };
MESHMUON_API std::string_view to_string(Role r);
MESHMUON_API Role parse_role(std::string_view name, std::string_view what = "role");

// How tensor parallelism splits the weight (a hint that parallelism recipes turn into placements):
// "none" (replicated over tp), "colwise" (Shard(0) of [out, in]; also embeddings' vocab dim),
// "rowwise" (Shard(1) of [out, in]; for an expert stack [E, out, in] the dims shift by one).
enum class TpStyle : uint8_t { None, Colwise, Rowwise };
MESHMUON_API std::string_view to_string(TpStyle t);
MESHMUON_API TpStyle parse_tp_style(std::string_view name, std::string_view what = "tp");

// Size limits on a parameter (checked by validate_param; errors name the parameter and the limit).
// Elements: at most 2^60 per tensor (and per model), so that a tensor's bytes in fp32 (2^62) and
// every multiple the planner forms of them fit int64 arithmetic; each extent is bounded the same way.
// Expert stacks: at most 2^20 experts (the planner keeps per-expert owners and holders).
inline constexpr int64_t kMaxParamElements = int64_t{1} << 60;
inline constexpr int64_t kMaxExperts = int64_t{1} << 20;

struct ParamSpec {
  std::string name;
  Shape shape;                        // global shape
  DType dtype = DType::F32;           // of the master parameter
  Role role = Role::Muon;
  bool expert = false;                // 3-D expert stack [E, out, in]; dim 0 indexes experts
  TpStyle tp = TpStyle::None;
  int mesh = 0;                       // index into the inventory's meshes
  std::vector<Placement> placements;  // one per mesh dim of that mesh
  std::optional<QkTag> qk;            // QK-clip rows (muon role only)
  // Split orthogonalization (muon role only): row blocks of each matrix (of each expert's matrix),
  // along the matrix's dim 0 (the output dim, heads of an attention projection), top to bottom.
  // Empty: the matrix is one block. Otherwise the sizes are positive and sum to rows(); each block
  // is orthogonalized, normalized, NorMuon'd, MuonEq'd, Muon+'d and LR-adjusted as its own matrix.
  // Filled from the group's split option (optim_options.h, resolve_split) or an inventory file.
  std::vector<int64_t> split;

  int64_t numel() const { return shape.numel(); }
  // Matrices the optimizer orthogonalizes: 1 for a 2-D matrix, E for an expert stack.
  int64_t units() const { return expert ? shape[0] : 1; }
  int64_t rows() const { return shape[shape.ndim() - 2]; }  // of one matrix
  int64_t cols() const { return shape[shape.ndim() - 1]; }
  // Row blocks of one matrix: `split`, or one block of rows() when unsplit.
  std::vector<int64_t> blocks() const { return split.empty() ? std::vector<int64_t>{rows()} : split; }
};

// Throws std::invalid_argument "[inventory] parameter '<name>' ..." when: the name is empty; an
// extent is negative; its element count (or an extent) passes kMaxParamElements, or an expert stack
// has more than kMaxExperts experts; a Muon parameter is not 2-D, or is 3-D without `expert`; `expert` is set on a
// tensor that is not 3-D; placements do not match `mesh` (count, shard dim range); a QK tag sits on
// an AdamW parameter or does not match the rows; `split` is set on an AdamW parameter, has a size
// ≤ 0, or does not sum to rows().
MESHMUON_API void validate_param(const ParamSpec& p, const Mesh& mesh);

}  // namespace meshmuon
