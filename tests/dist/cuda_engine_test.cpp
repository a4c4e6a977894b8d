// meshmuon::Optimizer on the cuda backend (OptimizerOptions::device "cuda") over the mpi communicator,
// the ranks sharing one GPU through pinned staging, against LocalOptimizer on the same GPU in each
// process (the single-process run): parameters and every state tensor BITWISE equal on each rank's
// local box, for every mesh of shard_parallels() × strategy (auto, owner_a2a, allgather, agrs) ×
// comm dtype, and with nanochat's MuonEq / Muon+ / adjusted decay (fp32 comm); measured bytes equal
// the plan's prediction. Skipped without a device; on every CI run it runs on the CUDA host emulation
// (tests/cuda_emu: cuda_engine_emu_np*).
//   mpirun -n 2 --oversubscribe build/bin/cuda_engine_test
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "meshmuon/bf16.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "optimizer_fixture.h"

namespace meshmuon {
namespace {

bool have_device(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
    return false;
  }
  return true;
}

// Device memory holding `bytes` bytes, filled from / read back to the host.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(bytes, 1)), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(p_); }
  DeviceBytes(DeviceBytes&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceBytes(const DeviceBytes&) = delete;
  void put(const void* h, size_t bytes) {
    ASSERT_LE(bytes, bytes_);
    if (bytes) ASSERT_EQ(cudaMemcpy(p_, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void* data() const { return p_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

std::vector<float> read_device(const TensorView& v) {
  std::vector<float> h(static_cast<size_t>(v.numel()));
  if (!h.empty()) EXPECT_EQ(cudaMemcpy(h.data(), v.data, h.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

int64_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], 4) != 0;
  return d;
}

// 3 steps distributed and in one process, both on cuda:0; the differing elements on this rank.
int64_t run_and_compare(const RunConfig& c, std::string& detail, bool& bytes_ok) {
  const Device dev{DeviceKind::Cuda, 0};
  Inventory inv = make_inventory(c.parallel);
  if (c.split) split_test_params(inv);
  const size_t n = inv.params.size();
  const bool bf16 = c.comm_dtype == DType::BF16;
  const bool normuon = c.strategy != "gram_allreduce";
  const bool bf16_products = normuon;
  OptimizerOptions oo = options_for(c);
  oo.device = "cuda";
  // The NorMuon group (the expert stack among its parameters) on bf16 products too: its 3 experts
  // are one batch of Newton–Schulz products in one process and other batches distributed, so the
  // batched products' layout invariance (batched_gemm.h) is part of the bitwise comparison.
  std::vector<ParamGroup> groups = test_groups(n, normuon, bf16_products, c.nanochat);
  if (bf16_products) groups[1].options.ns.matmul_dtype = DType::BF16;
  Optimizer opt(shared_comm(), inv, groups, oo);
  const std::vector<ParamInfo> infos = infos_of(inv);
  LocalOptimizerOptions lo{NonFinitePolicy::Raise, c.comm_dtype};
  lo.device = "cuda";
  LocalOptimizer ref(infos, groups, lo);
  std::vector<DeviceBytes> fw, fg, lw, lg;
  for (size_t i = 0; i < n; ++i) {
    const Shape& gs = inv.params[i].shape;
    std::vector<float> full(static_cast<size_t>(gs.numel()));
    for (size_t j = 0; j < full.size(); ++j) full[j] = value(static_cast<int>(i), static_cast<int64_t>(j), 99, false);
    const std::vector<float> local = extract(full, gs, opt.local_box(i));
    fw.emplace_back(full.size() * 4), fw.back().put(full.data(), full.size() * 4);
    lw.emplace_back(local.size() * 4), lw.back().put(local.data(), local.size() * 4);
    fg.emplace_back(full.size() * 4), lg.emplace_back(local.size() * 4);
  }
  const std::map<int, std::vector<float>> logits{{0, {50.0f, 3.0f}}};
  bytes_ok = true;
  for (int t = 0; t < 3; ++t) {
    std::vector<TensorView> fwv, fgv, lwv, lgv;
    for (size_t i = 0; i < n; ++i) {
      const Shape& gs = inv.params[i].shape;
      std::vector<float> full(static_cast<size_t>(gs.numel()));
      for (size_t j = 0; j < full.size(); ++j) full[j] = value(static_cast<int>(i), static_cast<int64_t>(j), t, bf16);
      const std::vector<float> local = extract(full, gs, opt.local_box(i));
      fwv.emplace_back(static_cast<float*>(fw[i].data()), gs), fwv.back().device = dev;
      lwv.emplace_back(static_cast<float*>(lw[i].data()), opt.local_shape(i)), lwv.back().device = dev;
      if (bf16) {  // bf16 gradients with bf16 communication
        std::vector<BFloat16> fb(full.size()), lb(local.size());
        float_to_bf16(full.data(), fb.data(), full.size());
        float_to_bf16(local.data(), lb.data(), local.size());
        fg[i].put(fb.data(), fb.size() * 2), lg[i].put(lb.data(), lb.size() * 2);
        fgv.emplace_back(static_cast<BFloat16*>(fg[i].data()), gs);
        lgv.emplace_back(static_cast<BFloat16*>(lg[i].data()), opt.local_shape(i));
      } else {
        fg[i].put(full.data(), full.size() * 4), lg[i].put(local.data(), local.size() * 4);
        fgv.emplace_back(static_cast<float*>(fg[i].data()), gs);
        lgv.emplace_back(static_cast<float*>(lg[i].data()), opt.local_shape(i));
      }
      fgv.back().device = lgv.back().device = dev;
    }
    if (t == 1) fgv[0] = TensorView(), lgv[0] = TensorView();  // no gradient this step
    EXPECT_TRUE(ref.step(fwv, fgv, logits));
    EXPECT_TRUE(opt.step(lwv, lgv, logits));
    const StepStats& st = opt.last_stats();
    if (st.bytes_sent != st.bytes_sent_predicted || st.bytes_recv != st.bytes_recv_predicted) {
      bytes_ok = false;
      detail += "step " + std::to_string(t) + " bytes sent " + std::to_string(st.bytes_sent) + " predicted " +
                std::to_string(st.bytes_sent_predicted) + "; ";
    }
  }
  const int r = comm().rank();
  int64_t diffs = 0;
  for (size_t i = 0; i < n; ++i) {
    const ParamSpec& p = inv.params[i];
    TensorView full_view(static_cast<float*>(fw[i].data()), p.shape), local_view(static_cast<float*>(lw[i].data()), opt.local_shape(i));
    int64_t d = bit_diffs(extract(read_device(full_view), p.shape, opt.local_box(i)), read_device(local_view));
    for (const std::string& key : ref.state_keys(i)) {
      const TensorView rv = ref.state(i, key), lv = opt.state(i, key);
      EXPECT_EQ(rv.device, dev) << p.name << " " << key;
      EXPECT_EQ(lv.device, dev) << p.name << " " << key;
      const Box box = key == "normuon_v" ? local_box(rv.shape, p.placements, inv.meshes[static_cast<size_t>(p.mesh)], r)
                                         : opt.local_box(i);
      d += bit_diffs(extract(read_device(rv), rv.shape, box), read_device(lv));
    }
    if (d > 0) detail += p.name + ": " + std::to_string(d) + " differing elements; ";
    diffs += d;
  }
  return diffs;
}

TEST(CudaEngineDist, BitwiseEqualsOneProcessOnTheSameGpu) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator (staging device buffers)";
  for (const std::string& parallel : shard_parallels())
    for (const char* strategy : {"auto", "owner_a2a", "allgather", "agrs"})
      for (DType c : {DType::F32, DType::BF16})
        for (const bool nanochat : {false, true}) {  // nanochat: MuonEq, Muon+ and adjusted decay on two groups
          if (nanochat && (c == DType::BF16 || std::string(strategy) == "allgather")) continue;
          RunConfig config{parallel, strategy, c};
          config.nanochat = nanochat;
          const std::string what =
              parallel + " " + strategy + " comm " + std::string(to_string(c)) + (nanochat ? " nanochat" : "");
          std::string detail;
          bool bytes_ok = true;
          const int64_t d = run_and_compare(config, detail, bytes_ok);
          EXPECT_EQ(d, 0) << what << ": " << detail;
          EXPECT_TRUE(bytes_ok) << what << ": " << detail;
        }
}

// Split orthogonalization (issue 37): the row blocks are smaller matrices to the cuda backend (bf16
// products batch equal blocks across units), bitwise as the one-process run on the same GPU.
TEST(CudaEngineDist, SplitBlocksBitwiseEqualOneProcess) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  if (test::expected_backend() != "mpi") GTEST_SKIP() << "needs the mpi communicator (staging device buffers)";
  for (const std::string& parallel : shard_parallels())
    for (const char* strategy : {"auto", "owner_a2a", "allgather", "agrs"}) {
      RunConfig config{parallel, strategy, DType::F32};
      config.split = true;
      std::string detail;
      bool bytes_ok = true;
      const int64_t d = run_and_compare(config, detail, bytes_ok);
      EXPECT_EQ(d, 0) << parallel << " " << strategy << " split: " << detail;
      EXPECT_TRUE(bytes_ok) << parallel << " " << strategy << " split: " << detail;
    }
}

}  // namespace
}  // namespace meshmuon
