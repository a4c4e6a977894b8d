// Internal: n-d copy of box intersections (box_copy.h).
#include "checkpoint/box_copy.h"

#include <algorithm>
#include <cstring>

#include "meshmuon/error.h"

namespace meshmuon::detail {

std::vector<DimMatch> match_dim(const IndexSet& src, const IndexSet& dst) {
  std::vector<DimMatch> out;
  int64_t spos = 0;
  for (const Range& s : src.ranges()) {
    int64_t dpos = 0;
    for (const Range& d : dst.ranges()) {
      const int64_t lo = std::max(s.begin, d.begin), hi = std::min(s.end, d.end);
      if (lo < hi) out.push_back({spos + (lo - s.begin), dpos + (lo - d.begin), hi - lo});
      dpos += d.size();
    }
    spos += s.size();
  }
  return out;
}

int64_t intersection_numel(const Box& a, const Box& b) {
  MESHMUON_CHECK(a.dims.size() == b.dims.size(), "[checkpoint] boxes ", a.to_string(), " and ", b.to_string(),
              " have different numbers of dims");
  int64_t n = 1;
  for (size_t d = 0; d < a.dims.size(); ++d) {
    int64_t k = 0;
    for (const DimMatch& m : match_dim(a.dims[d], b.dims[d])) k += m.len;
    if (k == 0) return 0;
    n *= k;
  }
  return n;
}

bool boxes_intersect(const Box& a, const Box& b) { return intersection_numel(a, b) > 0; }

int64_t copy_box_intersection(const void* src, const Box& src_box, void* dst, const Box& dst_box, size_t elem_size,
                              uint8_t* coverage) {
  MESHMUON_CHECK(src_box.dims.size() == dst_box.dims.size(), "[checkpoint] boxes ", src_box.to_string(), " and ",
              dst_box.to_string(), " have different numbers of dims");
  const size_t nd = src_box.dims.size();
  const auto* s = static_cast<const std::byte*>(src);
  auto* t = static_cast<std::byte*>(dst);
  const auto cover = [&](int64_t pos, int64_t n) {
    if (coverage == nullptr) return;
    for (int64_t i = pos; i < pos + n; ++i)
      if (coverage[i] != 255) ++coverage[i];
  };
  if (nd == 0) {
    std::memcpy(t, s, elem_size);
    cover(0, 1);
    return 1;
  }
  std::vector<std::vector<DimMatch>> matches(nd);
  for (size_t d = 0; d < nd; ++d) {
    matches[d] = match_dim(src_box.dims[d], dst_box.dims[d]);
    if (matches[d].empty()) return 0;
  }
  // Row-major element strides of both local tensors.
  std::vector<int64_t> sstride(nd, 1), dstride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) {
    sstride[d - 1] = sstride[d] * src_box.dims[d].size();
    dstride[d - 1] = dstride[d] * dst_box.dims[d].size();
  }
  int64_t copied = 0;
  const auto rec = [&](auto& self, size_t d, int64_t soff, int64_t doff) -> void {
    for (const DimMatch& m : matches[d]) {
      if (d + 1 == nd) {
        std::memcpy(t + static_cast<size_t>(doff + m.dst_pos) * elem_size,
                    s + static_cast<size_t>(soff + m.src_pos) * elem_size, static_cast<size_t>(m.len) * elem_size);
        cover(doff + m.dst_pos, m.len);
        copied += m.len;
      } else {
        for (int64_t k = 0; k < m.len; ++k)
          self(self, d + 1, soff + (m.src_pos + k) * sstride[d], doff + (m.dst_pos + k) * dstride[d]);
      }
    }
  };
  rec(rec, 0, 0, 0);
  return copied;
}

}  // namespace meshmuon::detail
