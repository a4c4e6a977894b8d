// Internal: the compute pass of a chunk (executor.h compute_units): orthogonalization and NorMuon of
// the units this rank assembled, on the stream that calls it.
#include <algorithm>

#include "exec/executor.h"

namespace dmuon::detail {

void compute_units(Optimizer::Impl& s, const StepInputs& in, std::span<const UnitJob> jobs) {
  std::vector<float> v_mean;
  for (const UnitJob& j : jobs) {
    const size_t g = static_cast<size_t>(s.group_of[static_cast<size_t>(j.param)]);
    const GroupOptions& o = in.options[g];
    v_mean.resize(static_cast<size_t>(std::max(j.rows, j.cols)));
    s.backend->muon_units(*s.orth[g], j.data, j.batch, j.rows, j.cols, j.v, v_mean.data(), o.normuon_beta2,
                          s.options.comm_dtype);
  }
}

}  // namespace dmuon::detail
