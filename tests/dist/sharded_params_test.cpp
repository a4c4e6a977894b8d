// ShardedParams (FSDP / HSDP) at 1-4 ranks: unshard bitwise equal to the full tensors every rank
// can compute; reduce_grads bitwise equal to a reference that recomputes every rank's full gradient
// and sums it in the documented order with the documented roundings (a reference in another order
// must differ: the test can fail); errors; and ShardedParams + meshmuon::Optimizer vs LocalOptimizer.
//   mpirun -n 4 --oversubscribe build/bin/fsdp_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshmuon/bf16.h"
#include "meshmuon/error.h"
#include "meshmuon/sharded_params.h"
#include "sharded_params_fixture.h"

namespace meshmuon {
namespace {

// A fresh set per object (its sub-communicators are made on first use, collectively).
std::shared_ptr<MeshCommunicators> mesh_comms() { return std::make_shared<MeshCommunicators>(shared_comm()); }

uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}

float param_value(size_t p, int64_t j) {
  const uint32_t x = mix(static_cast<uint32_t>(p * 1000003u + static_cast<uint64_t>(j) * 7919u + 17u));
  return (static_cast<float>(x % 20001) - 10000.0f) / 3333.0f;
}

// Rank `rank`'s gradient of element j of parameter p: non-integer values over 16 binades (the sum
// order matters), or small integers (exact in every order).
float grad_value(int rank, size_t p, int64_t j, bool integer) {
  const uint32_t x = mix(static_cast<uint32_t>(rank * 2654435761u + p * 40503u + static_cast<uint64_t>(j) * 97u + 5u));
  if (integer) return static_cast<float>(static_cast<int>(x % 41) - 20);
  const float base = (static_cast<float>(x % 20001) - 10000.0f) / 7777.0f;
  return std::ldexp(base, static_cast<int>((x >> 20) % 16) - 8);
}

float to_dtype(float x, DType dt) { return dt == DType::BF16 ? bf16_to_float(float_to_bf16(x)) : x; }

struct Dims {
  int R = 1, S = 1;
};
Dims dims_of(const Mesh& m) {
  Dims d;
  if (m.find("dp_replicate") >= 0) d.R = m.dim(m.find("dp_replicate")).size;
  if (m.find("dp_shard") >= 0) d.S = m.dim(m.find("dp_shard")).size;
  return d;
}

float divisor_of(const ShardedParamsOptions& o, Dims d) {
  if (o.grad_divisor > 0) return static_cast<float>(o.grad_divisor);
  return o.reduce == GradReduce::Mean ? static_cast<float>(d.R * d.S) : 1.0f;
}

// The documented reduction of element j of parameter p (world rank of (r, s) = r * S + s).
// reversed: a DIFFERENT order (every rank in reverse world order, flat, no partial rounding).
float reference(const ShardedParamsOptions& o, Dims d, size_t p, int64_t j, bool integer, bool reversed = false) {
  const DType rd = o.reduce_dtype;
  float total = 0;
  if (reversed) {
    for (int w = d.R * d.S - 1; w >= 0; --w) {
      const float g = to_dtype(grad_value(w, p, j, integer), rd);
      total = w == d.R * d.S - 1 ? g : total + g;
    }
  } else {
    for (int r = 0; r < d.R; ++r) {
      float partial = 0;
      for (int s = 0; s < d.S; ++s) {
        const float g = to_dtype(grad_value(r * d.S + s, p, j, integer), rd);
        partial = s == 0 ? g : partial + g;
      }
      if (d.R > 1) partial = to_dtype(partial, rd);
      total = r == 0 ? partial : total + partial;
    }
  }
  const float div = divisor_of(o, d);
  return div == 1.0f ? total : total / div;
}

// First global element of rank's local shard of p (Shard(0): its rows are contiguous).
int64_t first_global(ShardedParams& sp, size_t p) {
  const Box b = sp.local_box(p);
  const Shape& g = sp.spec(p).shape;
  const int64_t row = g.numel() / std::max<int64_t>(g[0], 1);
  return b.dims[0].empty() ? 0 : b.dims[0].at(0) * row;
}

void fill_params(ShardedParams& sp) {
  for (size_t p = 0; p < sp.size(); ++p) {
    TensorView v = sp.param(p);
    const int64_t g0 = first_global(sp, p);
    for (int64_t k = 0; k < v.numel(); ++k) v.f32()[k] = param_value(p, g0 + k);
  }
}

void fill_full_grads(ShardedParams& sp, bool integer) {
  const int me = comm().rank();
  for (size_t p = 0; p < sp.size(); ++p) {
    TensorView g = sp.full_grad(p);
    for (int64_t j = 0; j < g.numel(); ++j) g.f32()[j] = grad_value(me, p, j, integer);
  }
}

std::string opt_text(const ShardedParamsOptions& o) {
  return detail::concat("param ", to_string(o.param_dtype), " reduce ", to_string(o.reduce_dtype), " ",
                        o.grad_divisor > 0 ? "divisor" : o.reduce == GradReduce::Mean ? "mean" : "sum", " bucket_bytes ",
                        o.bucket_bytes);
}

TEST(ShardedParams, LayoutViewsAndInventory) {
  for (const std::string& ms : meshes()) {
    SCOPED_TRACE("mesh '" + ms + "'");
    const Mesh mesh = Mesh::parse(ms);
    ShardedParams sp(mesh_comms(), mesh, model());
    const Dims d = dims_of(mesh);
    ASSERT_EQ(sp.size(), model().size());
    const Inventory& inv = sp.inventory();
    EXPECT_EQ(inv.mesh_names, std::vector<std::string>{"dense"});
    EXPECT_NO_THROW(inv.validate());
    EXPECT_EQ(sp.find("bias"), 3);
    EXPECT_EQ(sp.find("nope"), -1);
    const int me = comm().rank();
    const int s = me % d.S;
    std::span<float> flat = sp.flat_params();
    for (size_t p = 0; p < sp.size(); ++p) {
      const ParamSpec& ps = inv.params[p];
      EXPECT_EQ(ps.placements.size(), static_cast<size_t>(mesh.ndim()));
      const Range rows = chunk_range(ps.shape[0], d.S, s);
      EXPECT_EQ(sp.local_box(p).dims[0], IndexSet(rows)) << ps.name;
      TensorView v = sp.param(p), g = sp.grad(p);
      EXPECT_EQ(v.shape, sp.local_box(p).shape());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 64, 0u) << ps.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(g.data) % 64, 0u) << ps.name;
      EXPECT_GE(v.f32(), flat.data());
      EXPECT_LE(v.f32() + v.numel(), flat.data() + flat.size());
      for (int64_t k = 0; k < v.numel(); ++k) EXPECT_EQ(v.f32()[k], 0.0f);
      EXPECT_EQ(sp.params()[p].data, v.data);
      EXPECT_EQ(sp.grads()[p].data, g.data);
    }
  }
}

TEST(ShardedParams, UnshardIsBitwiseTheFullTensor) {
  for (const std::string& ms : meshes())
    for (DType pd : {DType::F32, DType::BF16})
    for (int64_t direct_max : {int64_t{4096}, int64_t{0}}) {  // direct landing, then one all_gather_v
      SCOPED_TRACE("mesh '" + ms + "' param_dtype " + std::string(to_string(pd)) + " direct_max " + std::to_string(direct_max));
      ShardedParamsOptions o;
      o.param_dtype = pd;
      o.unshard_direct_max_messages = direct_max;
      ShardedParams sp(mesh_comms(), Mesh::parse(ms), model(), o);
      fill_params(sp);
      EXPECT_FALSE(sp.unsharded());
      for (int round = 0; round < 2; ++round) {  // a second unshard after reshard (buffers freed and remade)
        sp.unshard();
        ASSERT_TRUE(sp.unsharded());
        int64_t diffs = 0;
        for (size_t p = 0; p < sp.size(); ++p) {
          TensorView f = sp.full_param(p);
          EXPECT_EQ(f.shape, sp.spec(p).shape);
          EXPECT_EQ(f.dtype, pd);
          EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data) % 64, 0u);
          for (int64_t j = 0; j < f.numel(); ++j) {
            const float want = param_value(p, j);
            if (pd == DType::F32)
              diffs += std::memcmp(&f.f32()[j], &want, 4) != 0;
            else
              diffs += f.bf16()[j].bits != float_to_bf16(want).bits;
          }
        }
        EXPECT_EQ(diffs, 0);
        sp.reshard();
        EXPECT_FALSE(sp.unsharded());
        EXPECT_THROW(sp.full_param(0), std::logic_error);
        sp.reshard();  // a no-op when sharded
        if (round == 0) fill_params(sp);
      }
    }
}

struct ReduceCase {
  ShardedParamsOptions o;
  bool integer = false;
};

std::vector<ReduceCase> reduce_cases() {
  std::vector<ReduceCase> out;
  for (DType rd : {DType::F32, DType::BF16})
    for (int rule = 0; rule < 3; ++rule)
      for (int64_t bucket : {int64_t{1}, int64_t{0}, int64_t{600}}) {
        ReduceCase c;
        c.o.reduce_dtype = rd;
        c.o.param_dtype = rule == 1 ? DType::BF16 : DType::F32;
        c.o.reduce = rule == 1 ? GradReduce::Sum : GradReduce::Mean;
        c.o.grad_divisor = rule == 2 ? 6.0 : 0.0;
        c.o.bucket_bytes = bucket;
        out.push_back(c);
      }
  ReduceCase ints;
  ints.integer = true, ints.o.bucket_bytes = 256;
  out.push_back(ints);
  ints.o.reduce_dtype = DType::BF16, ints.o.reduce = GradReduce::Sum;
  out.push_back(ints);
  return out;
}

TEST(ShardedParams, ReduceGradsIsBitwiseTheDocumentedOrder) {
  int64_t negative_diffs = 0, compared = 0;
  for (const std::string& ms : meshes())
    for (const ReduceCase& c : reduce_cases()) {
      SCOPED_TRACE("mesh '" + ms + "' " + opt_text(c.o) + (c.integer ? " integer" : ""));
      const Mesh mesh = Mesh::parse(ms);
      const Dims d = dims_of(mesh);
      ShardedParams sp(mesh_comms(), mesh, model(), c.o);
      for (int step = 0; step < 2; ++step) {  // twice: the workspace is reused
        sp.zero_full_grads();
        fill_full_grads(sp, c.integer);
        sp.reduce_grads_async();
        sp.wait_reduce_grads();
        int64_t diffs = 0;
        for (size_t p = 0; p < sp.size(); ++p) {
          TensorView g = sp.grad(p);
          const int64_t g0 = first_global(sp, p);
          for (int64_t k = 0; k < g.numel(); ++k) {
            const float want = reference(c.o, d, p, g0 + k, c.integer);
            const bool differ = std::memcmp(&g.f32()[k], &want, 4) != 0;
            if (differ && diffs < 3)
              ADD_FAILURE() << sp.spec(p).name << "[" << g0 + k << "]: got " << g.f32()[k] << " want " << want;
            diffs += differ;
            if (step == 0 && !c.integer) {
              const float other = reference(c.o, d, p, g0 + k, false, true);
              negative_diffs += std::memcmp(&g.f32()[k], &other, 4) != 0, ++compared;
            }
            if (c.integer) {  // exact in every order
              const float other = reference(c.o, d, p, g0 + k, true, true);
              EXPECT_EQ(std::memcmp(&g.f32()[k], &other, 4), 0);
            }
          }
        }
        EXPECT_EQ(diffs, 0);
        const ReduceStats& st = sp.last_reduce_stats();
        if (c.o.bucket_bytes == 1) EXPECT_EQ(st.buckets, static_cast<int>(sp.size()));
        if (c.o.bucket_bytes == 0) EXPECT_EQ(st.buckets, 1);
        if (c.o.bucket_bytes == 600) EXPECT_GT(st.buckets, 1);
        EXPECT_GE(st.seconds, st.shard_seconds);
        EXPECT_GE(st.seconds, st.replicate_seconds);
        EXPECT_LE(st.overlap_seconds, std::min(st.shard_seconds, st.replicate_seconds) + 1e-9);
        if (comm().size() > 1) {
          EXPECT_GT(st.bytes_sent, 0u);
          EXPECT_GT(st.bytes_recv, 0u);
        } else {
          EXPECT_EQ(st.bytes_sent, 0u);
        }
      }
    }
  // Negative control: a reference in a different order must differ somewhere (≥ 3 addends).
  int64_t total[2] = {negative_diffs, compared};
  comm().all_reduce(OutBuffer(total, CommType::I64, 2), ReduceOp::Sum, "negative control").wait();
  if (comm().size() >= 3) EXPECT_GT(total[0], 0) << "of " << total[1] << " elements: the test could not fail";
}

// unshard_into: the caller's full tensors (fp32 and bf16 mixed, new pointers each call) get the
// masters' bits / their bf16 rounding (RNE), bitwise; nothing else is touched (the internal state
// stays sharded); bad views throw std::invalid_argument naming the parameter before communicating.
TEST(ShardedParams, UnshardIntoCallerTensors) {
  for (const std::string& ms : meshes()) {
    SCOPED_TRACE("mesh '" + ms + "'");
    ShardedParams sp(mesh_comms(), Mesh::parse(ms), model());
    fill_params(sp);
    for (int round = 0; round < 2; ++round) {
      std::vector<std::vector<float>> f32(sp.size());
      std::vector<std::vector<BFloat16>> b16(sp.size());
      std::vector<TensorView> views;
      for (size_t p = 0; p < sp.size(); ++p) {
        const Shape& shape = sp.spec(p).shape;
        const bool bf = (p + static_cast<size_t>(round)) % 2 == 1;
        if (bf) {
          b16[p].assign(static_cast<size_t>(shape.numel()), BFloat16{});
          views.emplace_back(b16[p].data(), shape);
        } else {
          f32[p].assign(static_cast<size_t>(shape.numel()), -1.0f);
          views.emplace_back(f32[p].data(), shape);
        }
      }
      sp.unshard_into(views);
      EXPECT_FALSE(sp.unsharded());
      int64_t diffs = 0;
      for (size_t p = 0; p < sp.size(); ++p)
        for (int64_t j = 0; j < sp.spec(p).shape.numel(); ++j) {
          const float want = param_value(p, j);
          if (views[p].dtype == DType::F32)
            diffs += std::memcmp(&f32[p][static_cast<size_t>(j)], &want, 4) != 0;
          else
            diffs += b16[p][static_cast<size_t>(j)].bits != float_to_bf16(want).bits;
        }
      EXPECT_EQ(diffs, 0);
    }
    // Negative control: a master changed on its owner shows in every rank's target.
    std::vector<std::vector<float>> f(sp.size());
    std::vector<TensorView> views;
    for (size_t p = 0; p < sp.size(); ++p) {
      f[p].assign(static_cast<size_t>(sp.spec(p).shape.numel()), 0.0f);
      views.emplace_back(f[p].data(), sp.spec(p).shape);
    }
    const size_t wide = static_cast<size_t>(sp.find("w_wide"));
    if (sp.param(wide).numel() > 0) sp.param(wide).f32()[0] += 1.0f;
    sp.unshard_into(views);
    int64_t changed = 0;
    for (int64_t j = 0; j < sp.spec(wide).shape.numel(); ++j) changed += f[wide][static_cast<size_t>(j)] != param_value(wide, j);
    const Dims d = dims_of(Mesh::parse(ms));
    EXPECT_EQ(changed, d.S);  // one changed element per shard rank's first row
    // Bad views: wrong count, shape, stride; before any communication, on every rank alike.
    const auto msg = [&](std::vector<TensorView> v) -> std::string {
      try {
        sp.unshard_into(v);
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
      return "(no throw)";
    };
    std::vector<TensorView> bad = views;
    bad.pop_back();
    EXPECT_NE(msg(bad).find("tensors for"), std::string::npos);
    bad = views;
    bad[1] = TensorView(f[1].data(), Shape{5, 3});
    std::string m = msg(bad);
    EXPECT_NE(m.find("w_r3"), std::string::npos) << m;
    EXPECT_NE(m.find("shape"), std::string::npos) << m;
    bad = views;
    bad[2] = TensorView(f[2].data(), DType::F32, Shape{5, 4}, Shape{1, 5});
    m = msg(bad);
    EXPECT_NE(m.find("w_r5"), std::string::npos) << m;
    EXPECT_NE(m.find("contiguous"), std::string::npos) << m;
    bad = views;
    bad[0] = TensorView();
    EXPECT_NE(msg(bad).find("w_r1"), std::string::npos);
    sp.reduce_grads_async();
    EXPECT_THROW(sp.unshard_into(views), std::logic_error);
    sp.wait_reduce_grads();
  }
}

// reduce_grads_from: the caller's gradients (fp32, bf16, absent) give bitwise what reduce_grads()
// gives for the same values written into full_grad(i) (bf16 widened exactly, absent = zeros), and the
// documented order for fp32 sources; new pointers every step.
TEST(ShardedParams, ReduceGradsFromCallerTensors) {
  for (const std::string& ms : meshes())
    for (DType rd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE("mesh '" + ms + "' reduce " + std::string(to_string(rd)));
      const Mesh mesh = Mesh::parse(ms);
      const Dims d = dims_of(mesh);
      ShardedParamsOptions o;
      o.reduce_dtype = rd, o.bucket_bytes = 600;
      ShardedParams from(mesh_comms(), mesh, model(), o), ref(mesh_comms(), mesh, model(), o);
      const int me = comm().rank();
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> f32(from.size());
        std::vector<std::vector<BFloat16>> b16(from.size());
        std::vector<TensorView> views;
        ref.zero_full_grads();
        for (size_t p = 0; p < from.size(); ++p) {
          const Shape& shape = from.spec(p).shape;
          const int kind = static_cast<int>((p + static_cast<size_t>(step)) % 3);  // fp32, bf16, absent
          TensorView rg = ref.full_grad(p);
          if (kind == 2) {
            views.emplace_back();
            continue;
          }
          if (kind == 1) {
            b16[p].resize(static_cast<size_t>(shape.numel()));
            for (int64_t j = 0; j < shape.numel(); ++j) {
              b16[p][static_cast<size_t>(j)] = float_to_bf16(grad_value(me, p, j, false));
              rg.f32()[j] = bf16_to_float(b16[p][static_cast<size_t>(j)]);
            }
            views.emplace_back(b16[p].data(), shape);
          } else {
            f32[p].resize(static_cast<size_t>(shape.numel()));
            for (int64_t j = 0; j < shape.numel(); ++j) rg.f32()[j] = f32[p][static_cast<size_t>(j)] = grad_value(me, p, j, false);
            views.emplace_back(f32[p].data(), shape);
          }
        }
        from.reduce_grads_from(views);
        ref.reduce_grads();
        int64_t diffs = 0, documented = 0;
        for (size_t p = 0; p < from.size(); ++p) {
          const int64_t g0 = first_global(from, p);
          for (int64_t k = 0; k < from.grad(p).numel(); ++k) {
            diffs += std::memcmp(&from.grad(p).f32()[k], &ref.grad(p).f32()[k], 4) != 0;
            if (views[p].is_none()) diffs += from.grad(p).f32()[k] != 0.0f;
            if (!views[p].is_none() && views[p].dtype == DType::F32) {
              const float want = reference(o, d, p, g0 + k, false);
              documented += std::memcmp(&from.grad(p).f32()[k], &want, 4) != 0;
            }
          }
        }
        EXPECT_EQ(diffs, 0);
        EXPECT_EQ(documented, 0);
      }
      std::vector<TensorView> bad(from.size());
      bad[3] = TensorView(static_cast<float*>(nullptr), Shape{8});
      std::string m = "(no throw)";
      try {
        from.reduce_grads_from(bad);
      } catch (const std::invalid_argument& e) {
        m = e.what();
      }
      EXPECT_NE(m.find("bias"), std::string::npos) << m;
    }
}

// Ranks that hold nothing at all (every parameter has one row): empty flat buffers, empty blocks.
TEST(ShardedParams, RanksWithNoRowsAtAll) {
  for (const std::string& ms : meshes()) {
    SCOPED_TRACE("mesh '" + ms + "'");
    const Mesh mesh = Mesh::parse(ms);
    const Dims d = dims_of(mesh);
    ShardedParamsOptions o;
    o.bucket_bytes = 1;
    ShardedParams sp(mesh_comms(), mesh, {spec("a", {1, 3}), spec("b", {1}, Role::AdamW)}, o);
    fill_params(sp);
    sp.unshard();
    for (size_t p = 0; p < sp.size(); ++p)
      for (int64_t j = 0; j < sp.full_param(p).numel(); ++j) EXPECT_EQ(sp.full_param(p).f32()[j], param_value(p, j));
    sp.reshard();
    fill_full_grads(sp, false);
    sp.reduce_grads();
    for (size_t p = 0; p < sp.size(); ++p) {
      const int64_t g0 = first_global(sp, p);
      for (int64_t k = 0; k < sp.grad(p).numel(); ++k) {
        const float want = reference(o, d, p, g0 + k, false);
        EXPECT_EQ(std::memcmp(&sp.grad(p).f32()[k], &want, 4), 0);
      }
    }
  }
}

// The replicate stage's byte counts: what the comm counters say, with the balanced split.
TEST(ShardedParams, ReduceBytesMatchTheExchanges) {
  const std::string ms = meshes().back();
  const Mesh mesh = Mesh::parse(ms);
  const Dims d = dims_of(mesh);
  ShardedParamsOptions o;
  o.bucket_bytes = 0;
  ShardedParams sp(mesh_comms(), mesh, model(), o);
  fill_full_grads(sp, false);
  sp.reduce_grads();
  const int me = comm().rank();
  const int s = me % d.S, r = me / d.S;
  uint64_t sent = 0, recv = 0, local = 0, numel = 0;
  for (size_t p = 0; p < sp.size(); ++p) {
    const Shape& g = sp.spec(p).shape;
    const int64_t row = g.numel() / std::max<int64_t>(g[0], 1);
    numel += static_cast<uint64_t>(g.numel());
    local += static_cast<uint64_t>(chunk_range(g[0], d.S, s).size() * row);
  }
  if (d.S > 1) sent += (numel - local) * 4, recv += local * static_cast<uint64_t>(d.S - 1) * 4;
  if (d.R > 1) {
    const std::vector<int64_t> bal = balanced_counts(static_cast<int64_t>(local), d.R);
    const uint64_t mine = static_cast<uint64_t>(bal[static_cast<size_t>(r)]);
    sent += (local - mine) * 4 + mine * static_cast<uint64_t>(d.R - 1) * 4;  // a2a, then gather
    recv += mine * static_cast<uint64_t>(d.R - 1) * 4 + (local - mine) * 4;
  }
  EXPECT_EQ(sp.last_reduce_stats().bytes_sent, sent);
  EXPECT_EQ(sp.last_reduce_stats().bytes_recv, recv);
}

TEST(ShardedParams, BadMeshesAndSpecsThrowBeforeCommunicating) {
  const int w = comm().size();
  const auto make = [&](const std::string& ms, std::vector<ParamSpec> ps, ShardedParamsOptions o = {}) {
    ShardedParams sp(mesh_comms(), Mesh::parse(ms), std::move(ps), o);
  };
  const auto msg = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no throw)";
  };
  std::string m = msg([&] { make("tp=" + std::to_string(w), model()); });
  EXPECT_NE(m.find("tp="), std::string::npos) << m;
  if (w > 1) {
    m = msg([&] { make("", model()); });
    EXPECT_NE(m.find("mesh"), std::string::npos) << m;
    m = msg([&] { make("dp_shard=1,dp_replicate=" + std::to_string(w), model()); });
    EXPECT_NE(m.find("dp_shard=1,dp_replicate"), std::string::npos) << m;
  }
  m = msg([&] { make("dp_shard=" + std::to_string(w + 1), model()); });
  EXPECT_NE(m.find("dp_shard="), std::string::npos) << m;
  std::vector<ParamSpec> ps = model();
  ps[2].placements = {Placement::shard(0)};
  m = msg([&] { make("dp_shard=" + std::to_string(w), ps); });
  EXPECT_NE(m.find("w_r5"), std::string::npos) << m;
  EXPECT_NE(m.find("placements"), std::string::npos) << m;
  ps = model();
  ps[1].dtype = DType::BF16;
  m = msg([&] { make("dp_shard=" + std::to_string(w), ps); });
  EXPECT_NE(m.find("w_r3"), std::string::npos) << m;
  ps = model();
  ps[3].role = Role::Muon;  // a 1-D Muon parameter
  m = msg([&] { make("dp_shard=" + std::to_string(w), ps); });
  EXPECT_NE(m.find("bias"), std::string::npos) << m;
  ShardedParamsOptions o;
  o.grad_divisor = std::nan("");
  m = msg([&] { make("dp_shard=" + std::to_string(w), model(), o); });
  EXPECT_NE(m.find("grad_divisor"), std::string::npos) << m;
  o = {};
  o.bucket_bytes = -1;
  m = msg([&] { make("dp_shard=" + std::to_string(w), model(), o); });
  EXPECT_NE(m.find("bucket_bytes"), std::string::npos) << m;
}

TEST(ShardedParams, CallsOutOfOrderThrowLogicError) {
  ShardedParams sp(mesh_comms(), Mesh::parse(meshes().back()), model());
  EXPECT_THROW(sp.wait_unshard(), std::logic_error);
  EXPECT_THROW(sp.full_param(0), std::logic_error);
  EXPECT_THROW(sp.wait_reduce_grads(), std::logic_error);
  sp.unshard_async();
  EXPECT_THROW(sp.unshard_async(), std::logic_error);
  EXPECT_THROW(sp.full_param(0), std::logic_error);
  EXPECT_THROW(sp.reshard(), std::logic_error);
  sp.wait_unshard();
  EXPECT_THROW(sp.unshard_async(), std::logic_error);  // unsharded: reshard first
  sp.reshard();
  sp.reduce_grads_async();
  EXPECT_THROW(sp.reduce_grads_async(), std::logic_error);
  EXPECT_THROW(sp.free_full_grads(), std::logic_error);
  EXPECT_THROW(sp.zero_full_grads(), std::logic_error);
  sp.wait_reduce_grads();
  EXPECT_THROW(sp.wait_reduce_grads(), std::logic_error);
  EXPECT_THROW(sp.param(sp.size()), std::invalid_argument);
  sp.free_full_grads();
  sp.reduce_grads();  // full gradients remade (zeros)
  for (size_t p = 0; p < sp.size(); ++p)
    for (int64_t k = 0; k < sp.grad(p).numel(); ++k) EXPECT_EQ(sp.grad(p).f32()[k], 0.0f);
}

TEST(ShardedParams, RanksThatDisagreeThrowTheSameError) {
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string ms = "dp_shard=" + std::to_string(comm().size());
  std::vector<ParamSpec> ps = model();
  if (comm().rank() == 1) ps[2].shape = Shape{6, 4};
  std::string m = "(no throw)";
  try {
    ShardedParams sp(mesh_comms(), Mesh::parse(ms), ps);
  } catch (const Error& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("w_r5"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
  EXPECT_TRUE(same_everywhere(m)) << m;
  // Options too.
  ShardedParamsOptions o;
  if (comm().rank() == 0) o.bucket_bytes = 1234;
  m = "(no throw)";
  try {
    ShardedParams sp(mesh_comms(), Mesh::parse(ms), model(), o);
  } catch (const Error& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("bucket_bytes"), std::string::npos) << m;
  EXPECT_TRUE(same_everywhere(m)) << m;
  // Still usable afterwards.
  ShardedParams sp(mesh_comms(), Mesh::parse(ms), model());
  sp.unshard();
}

// ShardedParams + meshmuon::Optimizer over the same MeshCommunicators: 3 steps (unshard, backward into
// full_grad, reduce_grads, step on params()/grads()) equal LocalOptimizer on the full tensors with
// the reference-reduced gradients, bitwise, and the next unshard gives the updated full tensors.
TEST(ShardedParams, WithOptimizerMatchesLocalOptimizer) {
  for (const std::string& ms : meshes()) {
    SCOPED_TRACE("mesh '" + ms + "'");
    const Mesh mesh = Mesh::parse(ms);
    const Dims d = dims_of(mesh);
    const ModelDesc md = test_model();
    ShardedParamsOptions so;
    so.bucket_bytes = 512;
    ShardedParams sp(mesh_comms(), mesh, md.params, so);
    const size_t n = sp.size();
    OptimizerOptions oo;
    oo.env_override = false;
    oo.chunk_bytes = 2048;
    Optimizer opt(sp.mesh_communicators(), sp.inventory(), test_groups(n), oo);
    std::vector<ParamInfo> infos;
    for (const ParamSpec& p : sp.inventory().params) infos.push_back({p.name, p.shape, p.expert, p.qk});
    LocalOptimizer ref(infos, test_groups(n), LocalOptimizerOptions{});
    std::vector<std::vector<float>> full_w(n), full_g(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t numel = sp.spec(i).shape.numel();
      full_w[i].resize(static_cast<size_t>(numel));
      for (int64_t j = 0; j < numel; ++j) full_w[i][static_cast<size_t>(j)] = value(static_cast<int>(i), j, 99, false);
      const std::vector<float> loc = extract(full_w[i], sp.spec(i).shape, sp.local_box(i));
      ASSERT_EQ(static_cast<int64_t>(loc.size()), sp.param(i).numel());
      std::copy(loc.begin(), loc.end(), sp.param(i).f32());
    }
    const std::map<int, std::vector<float>> logits{{0, {50.0f, 3.0f}}};
    for (int t = 0; t < 3; ++t) {
      sp.unshard();
      for (size_t i = 0; i < n; ++i) {  // the "forward" reads the full parameters
        TensorView f = sp.full_param(i);
        ASSERT_EQ(std::memcmp(f.f32(), full_w[i].data(), full_w[i].size() * 4), 0) << sp.spec(i).name << " step " << t;
      }
      sp.reshard();
      sp.zero_full_grads();
      const int me = comm().rank();
      std::vector<TensorView> fw, fg;
      for (size_t i = 0; i < n; ++i) {
        TensorView g = sp.full_grad(i);
        full_g[i].resize(full_w[i].size());
        for (int64_t j = 0; j < g.numel(); ++j) {
          g.f32()[j] = grad_value(me, i + static_cast<size_t>(10 * t), j, false);
          full_g[i][static_cast<size_t>(j)] = reference(so, d, i + static_cast<size_t>(10 * t), j, false);
        }
        fw.emplace_back(full_w[i].data(), sp.spec(i).shape);
        fg.emplace_back(full_g[i].data(), sp.spec(i).shape);
      }
      sp.reduce_grads();
      EXPECT_TRUE(opt.step(sp.params(), sp.grads(), logits));
      EXPECT_TRUE(ref.step(fw, fg, logits));
    }
    int64_t diffs = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float> want = extract(full_w[i], sp.spec(i).shape, sp.local_box(i));
      for (size_t k = 0; k < want.size(); ++k) diffs += std::memcmp(&want[k], &sp.param(i).f32()[k], 4) != 0;
    }
    EXPECT_EQ(diffs, 0);
    sp.unshard();
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(std::memcmp(sp.full_param(i).f32(), full_w[i].data(), full_w[i].size() * 4), 0) << sp.spec(i).name;
  }
}

}  // namespace
}  // namespace meshmuon

namespace meshmuon {
namespace {

// Owner placement (issue 38): ShardedParams + meshmuon::Optimizer, three steps, on every mesh of this
// world size (FSDP at 2-4 ranks: 7 matrices, uneven over every rank count; HSDP 2x2 at 4 ranks; an
// expert stack; a 1-D AdamW bias), against LocalOptimizer on the full tensors: bitwise. Returns the
// optimizer's bytes over the three steps, with the plan's prediction.
struct StepBytes {
  uint64_t sent = 0, recv = 0, predicted_sent = 0;
};

StepBytes train_three_steps(const Mesh& mesh, const ShardedParamsOptions& so, int64_t& diffs) {
  const Dims d = dims_of(mesh);
  const ModelDesc md = test_model(true);  // + "extra": 7 matrices
  ShardedParams sp(mesh_comms(), mesh, md.params, so);
  const size_t n = sp.size();
  OptimizerOptions oo;
  oo.env_override = false;
  oo.chunk_bytes = 2048;
  Optimizer opt(sp.mesh_communicators(), sp.inventory(), test_groups(n), oo);
  std::vector<ParamInfo> infos;
  for (const ParamSpec& p : sp.inventory().params) infos.push_back({p.name, p.shape, p.expert, p.qk});
  LocalOptimizer ref(infos, test_groups(n), LocalOptimizerOptions{});
  std::vector<std::vector<float>> full_w(n), full_g(n);
  for (size_t i = 0; i < n; ++i) {
    full_w[i].resize(static_cast<size_t>(sp.spec(i).shape.numel()));
    for (size_t j = 0; j < full_w[i].size(); ++j) full_w[i][j] = value(static_cast<int>(i), static_cast<int64_t>(j), 99, false);
    const std::vector<float> loc = extract(full_w[i], sp.spec(i).shape, sp.local_box(i));
    EXPECT_EQ(static_cast<int64_t>(loc.size()), sp.param(i).numel());
    std::copy(loc.begin(), loc.end(), sp.param(i).f32());
  }
  const std::map<int, std::vector<float>> logits{{0, {50.0f, 3.0f}}};
  StepBytes bytes;
  for (int t = 0; t < 3; ++t) {
    sp.unshard();
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(std::memcmp(sp.full_param(i).f32(), full_w[i].data(), full_w[i].size() * 4), 0) << sp.spec(i).name << " step " << t;
    sp.reshard();
    sp.zero_full_grads();
    std::vector<TensorView> fw, fg;
    for (size_t i = 0; i < n; ++i) {
      TensorView g = sp.full_grad(i);
      full_g[i].resize(full_w[i].size());
      for (int64_t j = 0; j < g.numel(); ++j) {
        g.f32()[j] = grad_value(comm().rank(), i + static_cast<size_t>(10 * t), j, false);
        full_g[i][static_cast<size_t>(j)] = reference(so, d, i + static_cast<size_t>(10 * t), j, false);
      }
      fw.emplace_back(full_w[i].data(), sp.spec(i).shape);
      fg.emplace_back(full_g[i].data(), sp.spec(i).shape);
    }
    sp.reduce_grads();
    for (size_t i = 0; i < n; ++i) {  // the reduced gradient is the documented sum, on its holders
      const std::vector<float> want = extract(full_g[i], sp.spec(i).shape, sp.local_box(i));
      EXPECT_EQ(std::memcmp(want.data(), sp.grad(i).f32(), want.size() * 4), 0) << sp.spec(i).name << " step " << t;
    }
    EXPECT_TRUE(opt.step(sp.params(), sp.grads(), logits));
    EXPECT_TRUE(ref.step(fw, fg, logits));
    const StepStats& st = opt.last_stats();
    bytes.sent += st.bytes_sent, bytes.recv += st.bytes_recv, bytes.predicted_sent += st.bytes_sent_predicted;
  }
  diffs = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<float> want = extract(full_w[i], sp.spec(i).shape, sp.local_box(i));
    for (size_t k = 0; k < want.size(); ++k) diffs += std::memcmp(&want[k], &sp.param(i).f32()[k], 4) != 0;
  }
  sp.unshard();
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(std::memcmp(sp.full_param(i).f32(), full_w[i].data(), full_w[i].size() * 4), 0) << sp.spec(i).name;
  if (so.placement == ParamPlacement::Owner) {
    // every 2-D Muon matrix is held whole by its owner and by no other rank; the plan runs it `local`
    std::vector<int> per_rank(static_cast<size_t>(comm().size()), 0);
    for (size_t i = 0; i < n; ++i) {
      const ParamSpec& p = sp.spec(i);
      const bool matrix = p.role == Role::Muon && !p.expert && p.shape.ndim() == 2;
      EXPECT_EQ(sp.owner(i) >= 0, matrix) << p.name;
      if (!matrix) continue;
      ++per_rank[static_cast<size_t>(sp.owner(i))];
      EXPECT_EQ(sp.local_box(i).numel(), sp.owner(i) == comm().rank() ? p.shape.numel() : 0) << p.name;
    }
    for (int c : per_rank) EXPECT_GE(c, 1) << "LPT gives each of " << comm().size() << " ranks one of the 7 matrices at least";
    for (const PlanEntry& e : opt.plan().entries())
      if (sp.owner(static_cast<size_t>(e.param)) >= 0) EXPECT_EQ(e.strategy, Strategy::Local) << sp.spec(static_cast<size_t>(e.param)).name;
  }
  return bytes;
}

TEST(ShardedParams, OwnerPlacementMatchesLocalOptimizerWithNoStepTraffic) {
  for (const std::string& ms : meshes()) {
    SCOPED_TRACE("mesh '" + ms + "'");
    const Mesh mesh = Mesh::parse(ms);
    for (const DType rd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(detail::concat("reduce ", to_string(rd)));
      ShardedParamsOptions so;
      so.bucket_bytes = 512;
      so.reduce_dtype = rd;
      so.placement = ParamPlacement::Owner;
      so.owner_rotation = rd == DType::BF16 ? 1 : 0;  // other owners, same bits
      int64_t diffs = -1;
      const StepBytes owned = train_three_steps(mesh, so, diffs);
      EXPECT_EQ(diffs, 0);
      // Zero optimizer-step bytes, measured and predicted (expert stacks run expert_local, AdamW locally).
      EXPECT_EQ(owned.sent, 0u);
      EXPECT_EQ(owned.recv, 0u);
      EXPECT_EQ(owned.predicted_sent, 0u);
      // Negative control: the same model sharded moves bytes in the step wherever a shard group exists.
      so.placement = ParamPlacement::Sharded;
      const StepBytes sharded = train_three_steps(mesh, so, diffs);
      EXPECT_EQ(diffs, 0);
      if (dims_of(mesh).S > 1) EXPECT_GT(sharded.sent, 0u);
    }
  }
}

TEST(ShardedParams, OwnerPlacementOptionsAreChecked) {
  const Mesh mesh = Mesh::parse(meshes()[0]);
  const ModelDesc md = test_model(true);
  ShardedParamsOptions bad;
  bad.placement = ParamPlacement::Owner, bad.owner_rotation = -1;
  EXPECT_THROW(ShardedParams(mesh_comms(), mesh, md.params, bad), std::invalid_argument);
  bad.owner_rotation = 0, bad.placement = ParamPlacement::Auto, bad.machine = "abacus";
  EXPECT_THROW(ShardedParams(mesh_comms(), mesh, md.params, bad), std::invalid_argument);
  // Auto: whatever the cost model picks, owned matrices are whole on their owner, the rest sharded
  ShardedParamsOptions au;
  au.placement = ParamPlacement::Auto, au.machine = "cpu";
  ShardedParams sp(mesh_comms(), mesh, md.params, au);
  for (size_t i = 0; i < sp.size(); ++i)
    if (sp.owner(i) >= 0) EXPECT_EQ(sp.local_box(i).numel(), sp.owner(i) == comm().rank() ? sp.spec(i).shape.numel() : 0);
}

// Owner placement through caller-owned tensors (the ZeRO path): unshard_into lands every owned
// matrix from its owner (fp32 and bf16 targets), reduce_grads_from reduces to the owner, bitwise.
TEST(ShardedParams, OwnerPlacementCallerTensors) {
  for (const std::string& ms : meshes()) {
    SCOPED_TRACE("mesh '" + ms + "'");
    const Mesh mesh = Mesh::parse(ms);
    ShardedParamsOptions so;
    so.placement = ParamPlacement::Owner;
    so.bucket_bytes = 256;
    ShardedParams sp(mesh_comms(), mesh, model(), so);
    fill_params(sp);
    std::vector<std::vector<float>> f32(sp.size());
    std::vector<std::vector<BFloat16>> b16(sp.size());
    std::vector<TensorView> views;
    for (size_t p = 0; p < sp.size(); ++p) {
      const Shape& shape = sp.spec(p).shape;
      if (p % 2 == 1) {
        b16[p].assign(static_cast<size_t>(shape.numel()), BFloat16{});
        views.emplace_back(b16[p].data(), shape);
      } else {
        f32[p].assign(static_cast<size_t>(shape.numel()), -1.0f);
        views.emplace_back(f32[p].data(), shape);
      }
    }
    sp.unshard_into(views);
    int64_t diffs = 0, owned = 0;
    for (size_t p = 0; p < sp.size(); ++p) {
      owned += sp.owner(p) >= 0;
      for (int64_t j = 0; j < sp.spec(p).shape.numel(); ++j) {
        const float want = param_value(p, j);
        if (views[p].dtype == DType::F32) diffs += std::memcmp(&f32[p][static_cast<size_t>(j)], &want, 4) != 0;
        else diffs += b16[p][static_cast<size_t>(j)].bits != float_to_bf16(want).bits;
      }
    }
    EXPECT_EQ(diffs, 0);
    EXPECT_EQ(owned, 5);  // the 2-D Muon matrices of model()
    std::vector<std::vector<float>> g(sp.size());
    std::vector<TensorView> gv;
    for (size_t p = 0; p < sp.size(); ++p) {
      g[p].resize(static_cast<size_t>(sp.spec(p).shape.numel()));
      for (size_t j = 0; j < g[p].size(); ++j) g[p][j] = grad_value(comm().rank(), p, static_cast<int64_t>(j), false);
      gv.emplace_back(g[p].data(), sp.spec(p).shape);
    }
    sp.reduce_grads_from(gv);
    const Dims d = dims_of(mesh);
    for (size_t p = 0; p < sp.size(); ++p) {
      const TensorView got = sp.grad(p);
      const int64_t g0 = first_global(sp, p);
      for (int64_t k = 0; k < got.numel(); ++k) {
        const float want = reference(so, d, p, g0 + k, false);
        diffs += std::memcmp(&got.f32()[k], &want, 4) != 0;
      }
    }
    EXPECT_EQ(diffs, 0);
  }
}

}  // namespace
}  // namespace meshmuon
