// ShardedParams: construction (validation, placement, the collective agreement, sub-communicators,
// cached exchange tables), the flat buffers and their views, the full-gradient buffers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include <sys/mman.h>

#include "core/hash.h"
#include "meshmuon/error.h"
#include "comm/agreement.h"
#include "backend/select.h"
#include "comm/device_check.h"
#include "plan/owner_placement.h"
#include "sharded_params_impl.h"

namespace meshmuon {
namespace fsdp {

AlignedBuffer::AlignedBuffer(size_t bytes, bool zero, detail::Backend* device) {
  if (bytes == 0) return;
  if (device != nullptr) {  // the backend's device memory (zero-filled by its allocator)
    device_ = device->allocate(bytes, detail::MemoryKind::Device);
    bytes_ = bytes;
    return;
  }
  // Large buffers on 2 MiB boundaries, advised as transparent huge pages: first touch then faults
  // 512x fewer pages (buffers are made and freed at every unshard / reshard).
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= 2 * kHuge ? kHuge : kAlign;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align == kHuge) (void)::madvise(p, rounded, MADV_HUGEPAGE);
#endif
  if (zero) std::memset(p, 0, rounded);
  p_.reset(p);
  bytes_ = bytes;
}

namespace {

using detail::concat;

const char* kModel = "sharded_params";

// The mesh's shape as ShardedParams accepts it: () | (dp_shard) | (dp_replicate, dp_shard).
void check_mesh(const Mesh& mesh, int world) {
  const auto bad = [&](const std::string& why) {
    detail::throw_invalid_argument(concat("[fsdp] mesh '", mesh.to_string(), "' ", why,
                                          "; ShardedParams takes \"dp_shard=S\", \"dp_replicate=R,dp_shard=S\" "
                                          "or no dims on a one-rank world"));
  };
  if (mesh.ndim() == 0) {
    if (world != 1) bad(concat("has no dims but the world has ", world, " ranks"));
    return;
  }
  if (mesh.ndim() == 1 && mesh.dim(0).name != "dp_shard") bad("does not name its dim \"dp_shard\"");
  if (mesh.ndim() == 2 && (mesh.dim(0).name != "dp_replicate" || mesh.dim(1).name != "dp_shard"))
    bad("is not (dp_replicate, dp_shard) in this order");
  if (mesh.ndim() > 2) bad("has more than two dims");
  if (mesh.size() != world) bad(concat("spans ", mesh.size(), " ranks, the world has ", world));
}

void check_options(const ShardedParamsOptions& o) {
  MESHMUON_CHECK(o.param_dtype == DType::F32 || o.param_dtype == DType::BF16, "[fsdp] options.param_dtype must be fp32 or bf16");
  MESHMUON_CHECK(o.reduce_dtype == DType::F32 || o.reduce_dtype == DType::BF16, "[fsdp] options.reduce_dtype must be fp32 or bf16");
  MESHMUON_CHECK(o.reduce == GradReduce::Mean || o.reduce == GradReduce::Sum, "[fsdp] options.reduce must be mean or sum");
  MESHMUON_CHECK(std::isfinite(o.grad_divisor) && o.grad_divisor >= 0,
              "[fsdp] options.grad_divisor must be finite and >= 0 (0: the rule of options.reduce), got ", o.grad_divisor);
  const float div32 = static_cast<float>(o.grad_divisor);
  MESHMUON_CHECK(o.grad_divisor == 0 || (div32 > 0 && std::isfinite(div32)),
              "[fsdp] options.grad_divisor ", o.grad_divisor, " is not a positive finite fp32 (the division is in fp32)");
  MESHMUON_CHECK(o.unshard_direct_max_messages >= 0, "[fsdp] options.unshard_direct_max_messages must be >= 0 (0: always one all_gather_v), got ",
              o.unshard_direct_max_messages);
  MESHMUON_CHECK(o.bucket_bytes >= 0, "[fsdp] options.bucket_bytes must be >= 0 (0: one bucket), got ", o.bucket_bytes);
  MESHMUON_CHECK(o.placement == ParamPlacement::Sharded || o.placement == ParamPlacement::Owner || o.placement == ParamPlacement::Auto,
                 "[fsdp] options.placement must be sharded, owner or auto");
  if (o.placement == ParamPlacement::Auto) {
    try {
      (void)MachineProfile::named(o.machine);
    } catch (const std::invalid_argument& e) {
      detail::throw_invalid_argument(detail::concat("[fsdp] options.machine: ", e.what()));
    }
  }
  MESHMUON_CHECK(o.owner_rotation >= 0, "[fsdp] options.owner_rotation must be >= 0, got ", o.owner_rotation);
  MESHMUON_CHECK(o.timeout.count() >= 0, "[fsdp] options.timeout must be >= 0 ms (0: the communicator's default)");
}

std::string shape_text(const Shape& s) { return s.to_string(); }

// One line per parameter, then the mesh and options: what ranks must agree on.
std::vector<std::string> claim_lines(const std::vector<ParamSpec>& ps, const Mesh& mesh, const ShardedParamsOptions& o,
                                     const std::string& backend) {
  std::vector<std::string> lines;
  lines.push_back(concat(ps.size(), " parameters"));
  for (const ParamSpec& p : ps) {
    std::string l = concat("'", p.name, "' ", shape_text(p.shape), " ", to_string(p.role), p.expert ? " expert" : "",
                           " tp=", to_string(p.tp));
    if (p.qk) l += concat(" qk(", p.qk->layer, ",", static_cast<int>(p.qk->kind), ",", p.qk->heads, ",", p.qk->head_dim, ",",
                          p.qk->rope_dim, ",", p.qk->v_dim, ")");
    lines.push_back(std::move(l));
  }
  lines.push_back(concat("mesh ", mesh.to_string()));
  char div[64];
  std::snprintf(div, sizeof div, "%a", o.grad_divisor);
  lines.push_back(concat("options param_dtype=", to_string(o.param_dtype), " reduce_dtype=", to_string(o.reduce_dtype),
                         " reduce=", o.reduce == GradReduce::Mean ? "mean" : "sum", " grad_divisor=", div,
                         " bucket_bytes=", o.bucket_bytes, " unshard_direct_max_messages=", o.unshard_direct_max_messages,
                         " placement=", o.placement == ParamPlacement::Owner ? "owner" : o.placement == ParamPlacement::Auto ? "auto" : "sharded",
                         o.placement == ParamPlacement::Auto ? " machine=" + o.machine : std::string(),
                         " owner_rotation=", o.owner_rotation));
  lines.push_back(backend);
  return lines;
}


}  // namespace
}  // namespace fsdp

using fsdp::AlignedBuffer;

ShardedParams::ShardedParams(std::shared_ptr<MeshCommunicators> comms, Mesh mesh, std::vector<ParamSpec> params,
                             ShardedParamsOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  MESHMUON_CHECK(comms != nullptr, "[fsdp] ShardedParams needs mesh communicators (got null)");
  Communicator& world = comms->world();
  // Local validation, before any communication.
  fsdp::check_mesh(mesh, world.size());
  fsdp::check_options(options);
  MESHMUON_CHECK(!params.empty(), "[fsdp] ShardedParams needs at least one parameter");
  const int shard_dim = mesh.find("dp_shard"), rep_dim = mesh.find("dp_replicate");
  std::vector<Placement> placements;
  if (rep_dim >= 0) placements.push_back(Placement::replicate());
  if (shard_dim >= 0) placements.push_back(Placement::shard(0));
  const int S0 = shard_dim >= 0 ? mesh.dim(shard_dim).size : 1;
  for (ParamSpec& p : params) {
    const std::string what = detail::concat("[fsdp] parameter '", p.name, "'");
    MESHMUON_CHECK(p.shape.ndim() >= 1, what, " field 'shape': needs at least one dim, got ", p.shape.to_string());
    MESHMUON_CHECK(p.placements.empty(), what, " field 'placements': must be left empty (ShardedParams places it), got ",
                p.placements.size(), " entries");
    MESHMUON_CHECK(p.mesh == 0, what, " field 'mesh': must be left at 0 (ShardedParams has one mesh), got ", p.mesh);
    MESHMUON_CHECK(p.dtype == DType::F32, what, " field 'dtype': the masters are fp32, got ", to_string(p.dtype));
    p.placements = placements;
  }
  // Owner placement: Muon matrices whole on one rank of the whole mesh, owners by LPT (pure, so
  // every rank picks the same; the agreement below covers the inputs).
  std::vector<int> owners(params.size(), -1);
  if (options.placement != ParamPlacement::Sharded) {
    PlanOptions po;
    if (options.placement == ParamPlacement::Auto) po.machine = MachineProfile::named(options.machine);
    po.comm_dtype = options.reduce_dtype;
    const std::vector<detail::PlacementChoice> choices = detail::choose_placements(
        params, world.size() / S0, S0, po,
        options.placement == ParamPlacement::Owner ? detail::PlacementMode::Owner : detail::PlacementMode::Auto);
    for (size_t i = 0; i < params.size(); ++i)
      owners[i] = choices[i].owned ? (choices[i].owner + options.owner_rotation % world.size()) % world.size() : -1;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (owners[i] < 0) continue;
    std::vector<Placement>& pl = params[i].placements;
    if (rep_dim >= 0) pl[static_cast<size_t>(rep_dim)] = Placement::owned(owners[i] / S0);
    if (shard_dim >= 0) pl[static_cast<size_t>(shard_dim)] = Placement::owned(owners[i] % S0);
  }
  Inventory inv;
  inv.model = fsdp::kModel;
  inv.mesh_names = {"dense"};
  inv.meshes = {mesh};
  inv.params = std::move(params);
  inv.validate();  // names unique, roles and shapes valid on the mesh (std::invalid_argument)
  // The backend: a bad name throws here (every rank has the same options); a rank whose device
  // fails (a missing GPU) brings its error to the agreement below, so every rank fails there.
  std::string backend_line;
  try {
    m.backend = detail::resolve_engine_device(options.device).backend;
    backend_line = detail::concat("backend ", m.backend->name());
  } catch (const std::invalid_argument& e) {
    detail::throw_invalid_argument(detail::concat("[fsdp] options.device: ", e.what()));
  } catch (const std::exception& e) {
    backend_line = detail::concat("backend '", options.device, "' unavailable: ", e.what());
  }
  try {  // same on every rank; through the agreement below all the same (a rank may lack its GPU)
    if (m.backend) detail::check_comm_carries_device(*m.backend, world, "");
  } catch (const std::exception& e) {
    backend_line = detail::concat("backend '", m.backend->name(), "' refused: ", e.what());  // rank-independent
    m.backend = nullptr;
  }
  m.comms = std::move(comms);
  m.mesh = std::move(mesh);
  m.opt = options;
  m.inv = std::move(inv);
  m.world_rank = world.rank();
  m.timeout = options.timeout.count() > 0 ? options.timeout : world.default_timeout();
  m.S = shard_dim >= 0 ? m.mesh.dim(shard_dim).size : 1;
  m.R = rep_dim >= 0 ? m.mesh.dim(rep_dim).size : 1;
  const DimMask shard_mask = shard_dim >= 0 ? DimMask{1} << shard_dim : 0;
  const DimMask rep_mask = rep_dim >= 0 ? DimMask{1} << rep_dim : 0;
  m.s = m.S > 1 ? m.mesh.group_index(m.world_rank, shard_mask) : 0;
  m.r = m.R > 1 ? m.mesh.group_index(m.world_rank, rep_mask) : 0;

  // Layout (local, pure): boxes, per-rank counts, flat regions.
  const size_t n = m.n();
  const size_t S = static_cast<size_t>(m.S);
  m.owner_world = std::move(owners);
  m.count_of.assign(n * S, 0), m.row_begin_of.assign(n * S, 0), m.red_count_of.assign(n * S, 0);
  int64_t sharded = 0;
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = m.inv.params[i];
    m.boxes.push_back(meshmuon::local_box(p.shape, p.placements, m.mesh, m.world_rank));
    const int64_t rows = p.shape[0];
    m.row_elems.push_back(rows > 0 ? p.numel() / rows : 0);
    const int ow = m.owner_world[i];
    sharded += ow < 0;
    for (size_t j = 0; j < S; ++j) {
      if (ow >= 0) {  // owned: rows 0.. at the owner's shard position; held only in the owner's replica
        const bool at_owner = static_cast<int>(j) == ow % m.S;
        m.red_count_of[i * S + j] = at_owner ? p.numel() : 0;
        m.count_of[i * S + j] = at_owner && m.r == ow / m.S ? p.numel() : 0;
        continue;
      }
      const Range rr = chunk_range(rows, m.S, static_cast<int64_t>(j));
      m.row_begin_of[i * S + j] = rr.begin;
      m.count_of[i * S + j] = m.red_count_of[i * S + j] = rr.size() * m.row_elems[i];
    }
    m.full_offset.push_back(m.full_elems);
    m.full_elems += fsdp::align_elems(p.numel(), 2);  // 64-byte aligned in bf16 and fp32
  }
  // Flat regions: the sharded parameters first (in order: the all-gather block's layout), then the
  // owned ones (none of them travels in the shard group's exchange).
  m.offset.assign(n, 0);
  for (const bool own : {false, true})
    for (size_t i = 0; i < n; ++i)
      if (m.owned(i) == own) m.offset[i] = m.flat_elems, m.flat_elems += fsdp::align_elems(m.count(i, m.s), 4);
  // Rank j's block of the all-gather is its flat buffer's layout (regions padded to 64 bytes in fp32,
  // < 64 bytes each), so an fp32 unshard sends the flat buffer itself.
  m.ag_counts.assign(S, 0), m.ag_param_off.assign(S * n, 0);
  for (size_t j = 0; j < S; ++j)
    for (size_t i = 0; i < n; ++i)
      if (!m.owned(i)) m.ag_param_off[j * n + i] = m.ag_counts[j], m.ag_counts[j] += fsdp::align_elems(m.count(i, static_cast<int>(j)), 4);
  m.ag_displs = packed_displs(m.ag_counts);
  m.unshard_direct = sharded * (m.S - 1) <= m.opt.unshard_direct_max_messages;
  m.plan_buckets();

  // Agreement (the first communication), then the sub-communicators (collective on first use).
  detail::agree_on_lines(world, m.timeout, fsdp::claim_lines(m.inv.params, m.mesh, m.opt, backend_line),
                         "[fsdp] ranks disagree on the ShardedParams",
                         "every rank must pass the same parameters (names, shapes, roles, order), mesh and options");
  MESHMUON_CHECK_RUNTIME(m.backend != nullptr, "[fsdp] rank ", m.world_rank, ": ", backend_line);  // every rank failed alike
  m.device_memory = m.backend->capabilities().device_memory ? m.backend.get() : nullptr;
  m.dev = m.backend->device();
  if (m.S > 1) m.shard_comm = &m.comms->get(m.mesh, shard_mask);
  if (m.R > 1) m.rep_comm = &m.comms->get(m.mesh, rep_mask);

  m.flat_params = AlignedBuffer(static_cast<size_t>(m.flat_elems) * 4, true, m.device_memory);
  m.flat_grads = AlignedBuffer(static_cast<size_t>(m.flat_elems) * 4, true, m.device_memory);
  for (size_t i = 0; i < n; ++i) {
    const Shape shape = m.boxes[i].shape();
    m.param_views.emplace_back(m.flat_params.as<float>() + m.offset[i], shape), m.param_views.back().device = m.dev;
    m.grad_views.emplace_back(m.flat_grads.as<float>() + m.offset[i], shape), m.grad_views.back().device = m.dev;
  }
}

ShardedParams::~ShardedParams() = default;

size_t ShardedParams::size() const { return impl_->n(); }
const Mesh& ShardedParams::mesh() const { return impl_->mesh; }
const ShardedParamsOptions& ShardedParams::options() const { return impl_->opt; }
const Inventory& ShardedParams::inventory() const { return impl_->inv; }
const std::shared_ptr<MeshCommunicators>& ShardedParams::mesh_communicators() const { return impl_->comms; }

static void check_index(const ShardedParams::Impl& m, size_t i, const char* what) {
  MESHMUON_CHECK(i < m.n(), "[fsdp] ", what, "(", i, "): index out of range (", m.n(), " parameters)");
}

const ParamSpec& ShardedParams::spec(size_t i) const {
  check_index(*impl_, i, "spec");
  return impl_->inv.params[i];
}
Box ShardedParams::local_box(size_t i) const {
  check_index(*impl_, i, "local_box");
  return impl_->boxes[i];
}
int ShardedParams::owner(size_t i) const {
  check_index(*impl_, i, "owner");
  return impl_->owner_world[i];
}
int64_t ShardedParams::find(std::string_view name) const {
  for (size_t i = 0; i < impl_->n(); ++i)
    if (impl_->inv.params[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

TensorView ShardedParams::param(size_t i) {
  check_index(*impl_, i, "param");
  return impl_->param_views[i];
}
std::span<const TensorView> ShardedParams::params() { return impl_->param_views; }
std::span<float> ShardedParams::flat_params() {
  return {impl_->flat_params.as<float>(), static_cast<size_t>(impl_->flat_elems)};
}
TensorView ShardedParams::grad(size_t i) {
  check_index(*impl_, i, "grad");
  return impl_->grad_views[i];
}
std::span<const TensorView> ShardedParams::grads() { return impl_->grad_views; }

void ShardedParams::Impl::ensure_full_grads() {
  if (!full_grad_views.empty()) return;
  full_grads = AlignedBuffer(static_cast<size_t>(full_elems) * 4, true, device_memory);
  for (size_t i = 0; i < n(); ++i) {
    full_grad_views.emplace_back(full_grads.as<float>() + full_offset[i], inv.params[i].shape);
    full_grad_views.back().device = dev;
  }
}

TensorView ShardedParams::full_grad(size_t i) {
  check_index(*impl_, i, "full_grad");
  impl_->ensure_full_grads();
  return impl_->full_grad_views[i];
}

void ShardedParams::zero_full_grads() {
  Impl& m = *impl_;
  if (m.reduce_posted) throw std::logic_error("[fsdp] zero_full_grads() while a gradient reduction is in flight");
  if (m.full_grads.data()) m.backend->fill_zero(m.full_grads.data(), m.full_grads.bytes());
}

void ShardedParams::free_full_grads() {
  Impl& m = *impl_;
  if (m.reduce_posted) throw std::logic_error("[fsdp] free_full_grads() while a gradient reduction is in flight");
  m.full_grad_views.clear();
  m.full_grads.reset();
  m.workspace.reset();
}

const ReduceStats& ShardedParams::last_reduce_stats() const { return impl_->stats; }

void ShardedParams::Impl::check_full_views(std::span<const TensorView> full, const char* what, bool allow_none) const {
  MESHMUON_CHECK(full.size() == n(), "[fsdp] ", what, ": got ", full.size(), " tensors for ", n(),
              " parameters (one full tensor per parameter, in order)");
  for (size_t i = 0; i < n(); ++i) {
    const TensorView& v = full[i];
    const ParamSpec& p = inv.params[i];
    const std::string where = detail::concat("[fsdp] ", what, ": parameter '", p.name, "'");
    if (v.is_none()) {
      MESHMUON_CHECK(allow_none, where, " has no tensor (none); give its full tensor");
      continue;
    }
    MESHMUON_CHECK(v.dtype == DType::F32 || v.dtype == DType::BF16, where, " field 'dtype': must be fp32 or bf16, got ",
                to_string(v.dtype));
    MESHMUON_CHECK(v.shape == p.shape, where, " field 'shape': must be the global shape ", p.shape.to_string(), ", got ",
                v.shape.to_string());
    MESHMUON_CHECK(v.is_contiguous(), where, " is not contiguous (strides ", v.strides.to_string(), "); pass a contiguous tensor");
    MESHMUON_CHECK(v.data != nullptr || v.numel() == 0, where, " has no data pointer");
    MESHMUON_CHECK(v.device == dev, where, " field 'device': is on ", to_string(v.device), " but this ShardedParams runs on ",
                to_string(dev), " (options.device '", opt.device, "'); pass tensors on its device");
  }
}

std::shared_ptr<detail::Backend> detail::engine_backend(const ShardedParams& params) { return params.impl_->backend; }

}  // namespace meshmuon
