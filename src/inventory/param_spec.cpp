// ParamSpec names (role, tp style) and validation against its mesh.
#include "meshmuon/param_spec.h"

#include "core/checked_math.h"
#include "meshmuon/box.h"
#include "meshmuon/error.h"

namespace meshmuon {

std::string_view to_string(Role r) { return r == Role::Muon ? "muon" : "adamw"; }

Role parse_role(std::string_view name, std::string_view what) {
  if (name == "muon") return Role::Muon;
  if (name == "adamw") return Role::AdamW;
  detail::throw_invalid_argument(
      detail::concat("[inventory] ", what, ": unknown role '", name, "'; use muon or adamw"));
}

std::string_view to_string(TpStyle t) {
  switch (t) {
    case TpStyle::None: return "none";
    case TpStyle::Colwise: return "colwise";
    case TpStyle::Rowwise: return "rowwise";
  }
  return "?";
}

TpStyle parse_tp_style(std::string_view name, std::string_view what) {
  if (name == "none") return TpStyle::None;
  if (name == "colwise") return TpStyle::Colwise;
  if (name == "rowwise") return TpStyle::Rowwise;
  detail::throw_invalid_argument(detail::concat("[inventory] ", what, ": unknown tp style '", name,
                                                "'; use none, colwise or rowwise"));
}

void validate_param(const ParamSpec& p, const Mesh& mesh) {
  MESHMUON_CHECK(!p.name.empty(), "[inventory] a parameter has no name");
  const std::string what = "parameter '" + p.name + "'";
  MESHMUON_CHECK(p.shape.ndim() >= 1, "[inventory] ", what, ": field 'shape' is empty");
  for (int d = 0; d < p.shape.ndim(); ++d)
    MESHMUON_CHECK(p.shape[d] >= 0, "[inventory] ", what, ": field 'shape' has a negative extent");
  const std::span<const int64_t> extents(p.shape.begin(), p.shape.end());
  int64_t numel = 0;
  bool fits = detail::checked_product(extents, kMaxParamElements, numel);
  for (int64_t e : extents) fits &= e <= kMaxParamElements;  // a zero extent does not excuse a huge one
  MESHMUON_CHECK(fits, "[inventory] ", what, " has ", detail::product_text(extents), " elements ", p.shape.to_string(),
              "; meshmuon supports at most 2^60 (", kMaxParamElements, ") elements and extents per tensor (2^62 bytes in fp32)");
  if (p.expert && p.shape.ndim() == 3)
    MESHMUON_CHECK(p.shape[0] <= kMaxExperts, "[inventory] ", what, " stacks ", p.shape[0], " experts ", p.shape.to_string(),
                "; meshmuon supports at most 2^20 (", kMaxExperts, ") experts per stack");
  if (p.expert)
    MESHMUON_CHECK(p.shape.ndim() == 3, "[inventory] ", what, " is marked 'expert' but has ", p.shape.ndim(),
                " dims ", p.shape.to_string(), "; expert stacks are [E, out, in]");
  if (p.role == Role::Muon) {
    MESHMUON_CHECK(p.shape.ndim() != 3 || p.expert, "[inventory] ", what, " has 3 dims ", p.shape.to_string(),
                "; give its expert dim (\"expert\": true for [E, out, in]) or route it to AdamW");
    MESHMUON_CHECK(p.shape.ndim() == 2 || p.shape.ndim() == 3, "[inventory] ", what, " has ", p.shape.ndim(),
                " dims ", p.shape.to_string(), "; Muon takes 2-D matrices and 3-D expert stacks, route it to AdamW");
  }
  check_placements(p.shape, p.placements, mesh, what + " (field 'placements')");
  if (!p.split.empty()) {
    MESHMUON_CHECK(p.role == Role::Muon, "[inventory] ", what, ": field 'split' is set on an AdamW parameter");
    int64_t sum = 0;
    for (int64_t b : p.split) {
      MESHMUON_CHECK(b > 0, "[inventory] ", what, ": field 'split' has a block of ", b, " rows; every block needs ≥ 1");
      sum += b;
    }
    MESHMUON_CHECK(sum == p.rows(), "[inventory] ", what, ": field 'split' sums to ", sum, " rows but the matrix has ",
                p.rows(), " ", p.shape.to_string(), "; the row blocks must cover dim ", p.shape.ndim() - 2, " exactly");
  }
  if (p.qk) {
    MESHMUON_CHECK(p.role == Role::Muon, "[inventory] ", what, ": field 'qk' is set on an AdamW parameter");
    MESHMUON_CHECK(!p.expert, "[inventory] ", what, ": field 'qk' is set on an expert stack");
    validate_qk_tag(*p.qk, p.name, p.shape[0]);
  }
}

}  // namespace meshmuon
