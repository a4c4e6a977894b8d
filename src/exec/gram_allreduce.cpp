// Internal: the gram_allreduce strategy. A matrix sharded only along its long dim runs Newton–Schulz
// on its local slice; each step all-reduces the small s×s Gram matrix over the shard group (s = the
// short dim). Not bitwise layout-invariant: MPI's sum order differs from a single process's BLAS
// (docs/executor.md gives the tolerance the tests use).
#include <cmath>

#include "dmuon/error.h"
#include "exec/executor.h"
#include "exec/muon_math.h"
#include "kernels/cpu/blas.h"

namespace dmuon::detail {

void run_gram(Optimizer::Impl& s, const StepInputs& in, int entry, std::vector<float>& update) {
  const PlanEntry& e = s.plan.entries()[static_cast<size_t>(entry)];
  const ParamLayout& L = s.routes.layouts[static_cast<size_t>(e.param)];
  const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[static_cast<size_t>(e.param)])];
  const GroupKey key{e.mesh, e.group_dims};
  size_t gi = 0;
  while (!(s.routes.group_keys[gi] == key)) ++gi;
  Communicator& comm = *s.group_comms[gi];
  const Shape local = L.box.shape();
  const bool wide = L.rows <= L.cols;                         // Gram side: rows (wide) or cols (tall)
  const int64_t sd = wide ? L.rows : L.cols;                  // s
  const int64_t ld = wide ? local[1] : local[0];              // local extent of the long dim
  float* x = update.data();
  std::vector<float> a(static_cast<size_t>(sd * sd)), a2(a.size()), tmp(update.size());
  const auto gram = [&](const std::string& label) {
    std::fill(a.begin(), a.end(), 0.0f);
    if (ld > 0)
      cpu::ssyrk_lower(!wide, static_cast<int>(sd), static_cast<int>(ld), 1.0f, x, static_cast<int>(wide ? ld : sd), 0.0f,
                       a.data(), static_cast<int>(sd));
    for (int64_t i = 0; i < sd; ++i)
      for (int64_t j = i + 1; j < sd; ++j) a[static_cast<size_t>(i * sd + j)] = a[static_cast<size_t>(j * sd + i)];
    Work w = comm.all_reduce(OutBuffer(a.data(), CommType::F32, a.size()), ReduceOp::Sum, label);
    wait_work(s, w);
  };
  const std::vector<Coefficients> coef = make_schedule(o.ns);
  const std::string base = "param '" + s.plan.inventory().params[static_cast<size_t>(e.param)].name + "' gram step ";
  // step 0's Gram of the unnormalized G also gives ‖G‖² (its trace): one collective per step in all
  gram(base + "0");
  double norm2 = 0;
  for (int64_t i = 0; i < sd; ++i) norm2 += a[static_cast<size_t>(i * sd + i)];
  const double norm = std::sqrt(norm2) * o.ns.scale;
  const double d = o.ns.eps_mode == EpsMode::Add ? norm + o.ns.eps : std::max(norm, static_cast<double>(o.ns.eps));
  if (norm2 == 0 || d == 0) {  // all ranks see the same sum: all leave here together
    std::fill(update.begin(), update.end(), 0.0f);
    return;
  }
  const float inv = static_cast<float>(1.0 / d), inv2 = static_cast<float>(1.0 / (d * d));
  for (float& v : update) v *= inv;
  for (float& v : a) v *= inv2;
  const int m = static_cast<int>(local[0]), n = static_cast<int>(local[1]), S = static_cast<int>(sd);
  for (size_t t = 0; t < coef.size(); ++t) {
    if (t > 0) gram(base + std::to_string(t));
    // B = b·A + c·A·A (into a2), then X ← a·X + B·X (wide) or a·X + X·B (tall)
    cpu::sgemm(false, false, S, S, S, static_cast<float>(coef[t].c), a.data(), S, a.data(), S, 0.0f, a2.data(), S);
    for (size_t i = 0; i < a.size(); ++i) a2[i] += static_cast<float>(coef[t].b) * a[i];
    if (update.empty()) continue;
    std::copy(update.begin(), update.end(), tmp.begin());
    if (wide) cpu::sgemm(false, false, m, n, S, 1.0f, a2.data(), S, tmp.data(), n, static_cast<float>(coef[t].a), x, n);
    else cpu::sgemm(false, false, m, n, S, 1.0f, tmp.data(), n, a2.data(), S, static_cast<float>(coef[t].a), x, n);
  }
  round_to_comm(update.data(), static_cast<int64_t>(update.size()), s.options.comm_dtype);
}

}  // namespace dmuon::detail
