// Mesh: validation, parsing and row-major rank <-> coordinate arithmetic (torch DeviceMesh order).
#include "meshmuon/mesh.h"

#include <charconv>

#include "core/checked_math.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

std::string to_text(const std::vector<MeshDim>& dims) {
  std::string s;
  for (const MeshDim& d : dims) s += (s.empty() ? "" : ",") + d.name + "=" + std::to_string(d.size);
  return s;
}

}  // namespace

Mesh::Mesh(std::vector<MeshDim> dims) : dims_(std::move(dims)) {
  MESHMUON_CHECK(ndim() <= kMaxMeshDims, "[layout] mesh has ", ndim(), " dims; at most ", kMaxMeshDims,
              " are supported");
  int64_t size = 1;
  for (size_t i = 0; i < dims_.size(); ++i) {
    MESHMUON_CHECK(!dims_[i].name.empty(), "[layout] mesh dim ", i, " has no name");
    MESHMUON_CHECK(dims_[i].size >= 1, "[layout] mesh dim '", dims_[i].name, "' has size ", dims_[i].size,
                "; sizes must be ≥ 1");
    for (size_t j = 0; j < i; ++j)
      MESHMUON_CHECK(dims_[j].name != dims_[i].name, "[layout] mesh dim name '", dims_[i].name,
                  "' appears twice");
    size *= dims_[i].size;  // ≤ 2^20 · 2^31 before the check: no overflow
    if (size > kMaxWorldSize) {
      std::vector<int64_t> sizes;
      for (const MeshDim& d : dims_) sizes.push_back(d.size);
      detail::throw_invalid_argument(detail::concat("[layout] mesh ", to_text(dims_), " has ", detail::product_text(sizes),
                                                    " ranks; meshmuon supports at most ", kMaxWorldSize, " (2^20)"));
    }
  }
  size_ = static_cast<int>(size);
  strides_.assign(dims_.size(), 1);
  for (int i = ndim() - 2; i >= 0; --i)
    strides_[static_cast<size_t>(i)] = strides_[static_cast<size_t>(i) + 1] * dims_[static_cast<size_t>(i) + 1].size;
}

std::vector<MeshDim> Mesh::parse_dims(std::string_view text, std::string_view what) {
  std::vector<MeshDim> dims;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const size_t eq = item.find('=');
    MESHMUON_CHECK(eq != std::string_view::npos && eq > 0, "[layout] ", what, " item '", item,
                "' must be name=size, e.g. dp_shard=8");
    const std::string_view name = item.substr(0, eq), num = item.substr(eq + 1);
    int64_t size = 0;
    const auto r = std::from_chars(num.data(), num.data() + num.size(), size);
    const bool integer = r.ptr == num.data() + num.size() && !num.empty() &&
                         (r.ec == std::errc{} || r.ec == std::errc::result_out_of_range);
    MESHMUON_CHECK(integer, "[layout] ", what, " dim '", name, "' has size '", num, "'; give an integer from 1 to ",
                kMaxWorldSize);
    MESHMUON_CHECK(r.ec == std::errc{} && size >= 1 && size <= kMaxWorldSize, "[layout] ", what, " dim '", name,
                "' has size ", num, "; sizes must be from 1 to ", kMaxWorldSize, " (2^20, the most ranks meshmuon supports)");
    dims.push_back({std::string(name), static_cast<int>(size)});
  }
  return dims;
}

Mesh Mesh::parse(std::string_view text) { return Mesh(parse_dims(text)); }

int Mesh::find(std::string_view name) const {
  for (int i = 0; i < ndim(); ++i)
    if (dims_[static_cast<size_t>(i)].name == name) return i;
  return -1;
}

int Mesh::index_of(std::string_view name) const {
  const int i = find(name);
  MESHMUON_CHECK(i >= 0, "[layout] mesh ", to_string(), " has no dim '", name, "'");
  return i;
}

std::vector<int> Mesh::coords(int rank) const {
  MESHMUON_CHECK(rank >= 0 && rank < size_, "[layout] rank ", rank, " is outside the mesh of ", size_, " ranks");
  std::vector<int> c(dims_.size());
  for (int i = 0; i < ndim(); ++i) c[static_cast<size_t>(i)] = coord(rank, i);
  return c;
}

int Mesh::rank_of(std::span<const int> coords) const {
  MESHMUON_CHECK(static_cast<int>(coords.size()) == ndim(), "[layout] ", coords.size(),
              " coordinates given for a mesh of ", ndim(), " dims");
  int rank = 0;
  for (int i = 0; i < ndim(); ++i) {
    const int c = coords[static_cast<size_t>(i)];
    MESHMUON_CHECK(c >= 0 && c < dims_[static_cast<size_t>(i)].size, "[layout] coordinate ", c,
                " is outside mesh dim '", dims_[static_cast<size_t>(i)].name, "'");
    rank += c * strides_[static_cast<size_t>(i)];
  }
  return rank;
}

int Mesh::group_size(DimMask dims) const {
  int n = 1;
  for (int i = 0; i < ndim(); ++i)
    if (dims >> i & 1) n *= dims_[static_cast<size_t>(i)].size;
  return n;
}

int Mesh::group_index(int rank, DimMask dims) const {
  int index = 0;
  for (int i = 0; i < ndim(); ++i)
    if (dims >> i & 1) index = index * dims_[static_cast<size_t>(i)].size + coord(rank, i);
  return index;
}

int Mesh::group_member(int rank, DimMask dims, int index) const {
  int out = rank;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (!(dims >> i & 1)) continue;
    const int n = dims_[static_cast<size_t>(i)].size;
    out += (index % n - coord(rank, i)) * strides_[static_cast<size_t>(i)];
    index /= n;
  }
  return out;
}

std::vector<int> Mesh::group_ranks(int rank, DimMask dims) const {
  MESHMUON_CHECK(rank >= 0 && rank < size_, "[layout] rank ", rank, " is outside the mesh of ", size_, " ranks");
  const int n = group_size(dims);
  std::vector<int> out(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) out[static_cast<size_t>(k)] = group_member(rank, dims, k);
  return out;
}

std::string Mesh::to_string() const { return dims_.empty() ? "(1 rank)" : to_text(dims_); }

}  // namespace meshmuon
