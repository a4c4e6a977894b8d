// Internal: the KERNEL INTERFACE of a backend, what the optimizer step needs: the element-wise update
// kernels, the FSDP data movement, orthogonalization (Newton–Schulz batches, NorMuon, Gram NS with a
// reduce callback, so no BLAS call lives outside a backend) and the thread control of its libraries.
// A backend implements it together with the device interface (device_services.h); `Backend`
// (backend.h) is the two together. The executor and LocalOptimizer call it; nothing below the
// executor does.
//
// Contract (every implementation; the conformance suite, tests/conformance, runs it over the backends):
// - Pointers passed to a kernel are the backend's memory (device memory on a device backend).
// - Numerics are those of the kernels in update.h / orthogonalize.h, bitwise the cpu backend's for
//   the element-wise kernels and the data movement; orthogonalization within the bounds the
//   backend's tests state. For a given backend the results do not depend on the stream, the thread
//   or the thread count (the basis of bitwise layout invariance).
// - Completion: see backend.h (the kernels are ordered on the calling thread's stream).
// - Optional kernels are declared in kernel_caps(): `ns_methods` lists the orthogonalization methods
//   the backend implements; make_orthogonalizer refuses any other by name (check_ns_method below),
//   never runs another in its place. bf16_products / gram_newton_schulz / batched say the same for
//   those kernels.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/pack.h"
#include "meshmuon/device.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/qk_clip.h"
#include "meshmuon/tensor.h"
#include "meshmuon/update.h"

namespace meshmuon::detail {

// What the kernel side implements beyond the required kernels.
struct KernelCaps {
  bool bf16_products = false;     // NsOptions::matmul_dtype BF16
  bool gram_newton_schulz = true;
  bool batched = true;            // expert stacks / same-shape batches in one call
  bool batches_units = false;     // muon_batch runs several units' products together (device backends)
  // The orthogonalization methods (NsOptions::method) make_orthogonalizer accepts; none by default,
  // so a new backend says what it implements.
  std::vector<NsMethod> ns_methods;
};

// Gram NS's collective: sums `a` (count floats, an s×s Gram matrix) over the shard group in place.
// `ready`: the backend's point after which `a` is written (empty: it is in memory now); the
// collective is ordered after it (Communicator::order_after). When the callback returns, the sum is
// in `a` for the backend's later work.
using GramReduce = std::function<void(float* a, size_t count, int step, DeviceEvent ready)>;

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual KernelCaps kernel_caps() const = 0;

  // Thread control of the backend's own kernels (cpu: the BLAS thread count); 0 leaves it. Returns
  // the previous value. Loads the libraries it needs: a missing one fails here (meshmuon::Error).
  virtual int set_threads(int threads) = 0;
  virtual int threads() const = 0;

  // Runs a pack table (pack.h) over `bases` (the buffers its runs name), on the calling thread.
  virtual void pack(std::span<const PackRun> runs, std::span<std::byte* const> bases) = 0;

  // ---- element-wise update kernels (update.h, qk_clip.h numerics) ----
  virtual void momentum(const MomentumOptions& o, float* buf, const TensorView& grad, float* update) = 0;
  virtual void apply_update(const ApplyOptions& o, float* param, const float* update, int64_t n) = 0;
  virtual void adamw(const AdamWOptions& o, float* param, const TensorView& grad, float* exp_avg, float* exp_avg_sq) = 0;
  // Multi-tensor forms of momentum (+ round_to_comm of each update to `comm`) and apply_update: each
  // tensor gets the bits of the single-tensor calls; a device backend runs a list as one launch
  // (the cuda backend checks every tensor's arguments first). The tensors of one call must not
  // overlap each other (a device runs them concurrently). The defaults call the single forms.
  struct MomentumTensor {
    MomentumOptions o;
    float* buf = nullptr;
    TensorView grad;
    float* update = nullptr;
  };
  virtual void momentum_multi(std::span<const MomentumTensor> tensors, DType comm) {
    for (const MomentumTensor& t : tensors) {
      momentum(t.o, t.buf, t.grad, t.update);
      round_to_comm(t.update, t.grad.numel(), comm);
    }
  }
  struct ApplyTensor {
    ApplyOptions o;
    float* param = nullptr;
    const float* update = nullptr;
    int64_t n = 0;
  };
  virtual void apply_multi(std::span<const ApplyTensor> tensors) {
    for (const ApplyTensor& t : tensors) apply_update(t.o, t.param, t.update, t.n);
  }
  // One tensor of adamw_multi.
  struct AdamWTensor {
    AdamWOptions o;
    float* param = nullptr;
    TensorView grad;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
  };
  // adamw over several tensors, each getting the bits adamw gives it alone (a device backend runs
  // them as one multi-tensor launch: one kernel, not one per tensor; the cuda backend checks every
  // tensor's arguments before it). The default calls adamw per tensor.
  virtual void adamw_multi(std::span<const AdamWTensor> tensors) {
    for (const AdamWTensor& t : tensors) adamw(t.o, t.param, t.grad, t.exp_avg, t.exp_avg_sq);
  }
  virtual void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double threshold, float* w,
                            int64_t row_begin, int64_t row_end, int64_t cols) = 0;
  // Rounds n values to the communication dtype and back (bf16: as the wire format; fp32: no-op).
  virtual void round_to_comm(float* x, int64_t n, DType comm) = 0;
  // Index of the first non-finite element of a contiguous fp32 / bf16 view, or -1.
  virtual int64_t first_non_finite(const TensorView& g) = 0;
  // The index of the first of `views` (in order) holding a non-finite element, or -1; empty views
  // (TensorView::is_none) are skipped. A device backend scans them all into device flags and reads
  // them back once (one host synchronization for the step's gradients, not one per tensor).
  virtual int64_t first_non_finite_of(std::span<const TensorView> views) {
    for (size_t i = 0; i < views.size(); ++i)
      if (!views[i].is_none() && first_non_finite(views[i]) >= 0) return static_cast<int64_t>(i);
    return -1;
  }

  // ---- FSDP data movement (sharded_params.h numerics; src/fsdp) ----
  // n elements of src (fp32 | bf16) into dst (fp32 | bf16): bits when the dtypes match, fp32 -> bf16
  // round to nearest even (NaN -> 0x7FC0), bf16 -> fp32 exact.
  virtual void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) = 0;
  // `blocks_n` blocks of n elements (dtype fp32 | bf16) back to back: out = block 0 (widened), then
  // out += block j for j = 1..blocks_n-1, per element in this order, in fp32.
  virtual void ordered_sum(const void* blocks, DType dtype, int64_t n, int blocks_n, float* out) = 0;
  // x[k] = x[k] / d (one fp32 division per element).
  virtual void divide(float* x, int64_t n, float d) = 0;
  // bytes of zeros at p.
  virtual void fill_zero(void* p, size_t bytes) = 0;
  // bytes of zeros at p, as an update kernel: ordered on the calling thread's stream (the completion
  // contract above), no host wait. The default is fill_zero.
  virtual void zero(void* p, size_t bytes) { fill_zero(p, bytes); }

  // ---- orthogonalization ----
  virtual std::unique_ptr<Orthogonalizer> make_orthogonalizer(const NsOptions& o) = 0;
  // `batch` matrices rows × cols back to back, input already rounded to the comm dtype: each
  // orthogonalized in place, then NorMuon when `v` is not null (v: batch × normuon_state_size
  // values; v_mean: scratch of one matrix's size), then rounded to the comm dtype.
  virtual void muon_units(Orthogonalizer& orth, float* u, int64_t batch, int64_t rows, int64_t cols, float* v,
                          float* v_mean, double beta2, DType comm) = 0;
  // One unit of a muon_batch call: `batch` matrices back to back at u, their NorMuon state at v
  // (batch × normuon_state_size values) or null.
  struct UnitRef {
    float* u = nullptr;
    int64_t batch = 0;
    float* v = nullptr;
  };
  // muon_units over several units of one shape and one Orthogonalizer: each matrix gets exactly the
  // bits muon_units gives it (a device backend runs their products as batches: capabilities()
  // batches_units). The default calls muon_units per unit.
  virtual void muon_batch(Orthogonalizer& orth, std::span<const UnitRef> units, int64_t rows, int64_t cols,
                          float* v_mean, double beta2, DType comm) {
    for (const UnitRef& r : units) muon_units(orth, r.u, r.batch, rows, cols, r.v, v_mean, beta2, comm);
  }
  // Gram Newton–Schulz on a slice of a matrix sharded along its long dim: x is the local slice
  // (local_rows × local_cols, row-major), the Gram side is rows when `wide` (else cols) of size s;
  // `reduce` sums each step's s×s Gram matrix over the shard group. Result rounded to `comm`.
  virtual void gram_newton_schulz(const NsOptions& o, float* x, int64_t local_rows, int64_t local_cols, bool wide,
                                  int64_t s, const GramReduce& reduce, DType comm) = 0;
};

// std::invalid_argument "[<backend>] orthogonalization method '<m>' is not implemented by the <backend>
// backend ..." when `o.method` is not in caps.ns_methods (the message names the methods it has and
// what to do). A backend's make_orthogonalizer calls it first, so an engine asking for a method its
// backend lacks is refused when it is constructed.
void check_ns_method(std::string_view backend, const KernelCaps& caps, const NsOptions& o);

}  // namespace meshmuon::detail
