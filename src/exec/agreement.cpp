// Internal: the collective agreements of the executor. At construction the ranks compare plan
// fingerprints and per-parameter hashes (variable counts handled: counts first, then hashes), so a
// mismatch raises the same error everywhere instead of a hang. Each step one all-reduce carries
// "some rank rejected its inputs" and "first non-finite gradient" so every rank decides alike.
#include <algorithm>
#include <cstring>
#include <limits>

#include "dmuon/error.h"
#include "exec/executor.h"

namespace dmuon::detail {
namespace {

std::vector<std::string> all_gather_strings(Communicator& comm, const Optimizer::Impl& s, const std::string& mine) {
  const size_t w = static_cast<size_t>(comm.size());
  std::vector<int64_t> lens(w);
  int64_t len = static_cast<int64_t>(mine.size());
  Work a = comm.all_gather(InBuffer(&len, CommType::I64, 1), OutBuffer(lens.data(), CommType::I64, w), "optimizer agreement lengths");
  wait_work(s, a);
  int64_t total = 0;
  for (int64_t l : lens) total += l;
  std::vector<uint8_t> all(static_cast<size_t>(total));
  Work b = comm.all_gather_v(InBuffer(mine.data(), CommType::U8, mine.size()), OutBuffer(all.data(), CommType::U8, all.size()),
                             lens, "optimizer agreement text");
  wait_work(s, b);
  std::vector<std::string> out;
  size_t at = 0;
  for (int64_t l : lens) {
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + at, static_cast<size_t>(l));
    at += static_cast<size_t>(l);
  }
  return out;
}

std::string per_rank(const std::vector<std::string>& texts) {
  std::string m;
  for (size_t r = 0; r < texts.size() && r < 8; ++r) m += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + ": " + texts[r];
  if (texts.size() > 8) m += "; ...";
  return m;
}

}  // namespace

void agree_on_plan(Communicator& comm, const Optimizer::Impl& s, const std::string& local_error,
                   const std::vector<uint64_t>& param_hashes, uint64_t fingerprint,
                   const std::vector<std::string>& param_descriptions, const std::string& options_description) {
  const size_t w = static_cast<size_t>(comm.size());
  uint64_t mine[3] = {local_error.empty() ? 0u : 1u, fingerprint, param_hashes.size()};
  std::vector<uint64_t> all(3 * w);
  Work a = comm.all_gather(InBuffer(mine, CommType::U64, 3), OutBuffer(all.data(), CommType::U64, all.size()), "optimizer fingerprint");
  wait_work(s, a);
  bool failed = false, same = true;
  for (size_t r = 0; r < w; ++r) {
    failed |= all[3 * r] != 0;
    same &= all[3 * r + 1] == all[1] && all[3 * r + 2] == all[2];
  }
  if (failed) {
    const std::vector<std::string> errors = all_gather_strings(comm, s, local_error);
    if (!local_error.empty()) throw std::invalid_argument(local_error);
    for (size_t r = 0; r < w; ++r)
      if (!errors[r].empty())
        detail::throw_invalid_argument(detail::concat("[optim] rank ", r, " could not build the optimizer: ", errors[r]));
  }
  if (same) return;
  // pass 2: per-parameter hashes (counts may differ) -> the first index where ranks differ
  std::vector<int64_t> counts(w);
  for (size_t r = 0; r < w; ++r) counts[r] = static_cast<int64_t>(all[3 * r + 2]);
  int64_t total = 0, shortest = std::numeric_limits<int64_t>::max();
  for (int64_t c : counts) total += c, shortest = std::min(shortest, c);
  std::vector<uint64_t> hashes(static_cast<size_t>(total));
  Work b = comm.all_gather_v(InBuffer(param_hashes.data(), CommType::U64, param_hashes.size()),
                             OutBuffer(hashes.data(), CommType::U64, hashes.size()), counts, "optimizer parameter hashes");
  wait_work(s, b);
  const std::vector<int64_t> displs = packed_displs(counts);
  int64_t first = -1;
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  for (int64_t i = 0; i < longest && first < 0; ++i) {
    if (i >= shortest) { first = i; break; }
    for (size_t r = 1; r < w; ++r)
      if (hashes[static_cast<size_t>(displs[r] + i)] != hashes[static_cast<size_t>(displs[0] + i)]) first = i;
  }
  if (first < 0) {
    const std::vector<std::string> texts = all_gather_strings(comm, s, options_description);
    detail::throw_error(detail::concat("[optim] ranks disagree on the plan options (same parameters): ", per_rank(texts),
                                       "; pass the same meshes and options on every rank"));
  }
  const size_t i = static_cast<size_t>(first);
  const std::string desc = i < param_descriptions.size() ? param_descriptions[i]
                                                         : "(none: " + std::to_string(param_descriptions.size()) + " parameters)";
  const std::vector<std::string> texts = all_gather_strings(comm, s, desc);
  detail::throw_error(detail::concat("[optim] ranks disagree on parameter #", first, ": ", per_rank(texts),
                                     "; every rank must pass the same parameters, shapes, order, placements and groups"));
}

bool agree_on_step(Communicator& comm, const Optimizer::Impl& s, const std::string& local_error, int64_t bad_param,
                   NonFinitePolicy policy) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const int64_t w = comm.size(), r = comm.rank();
  int64_t flags[2] = {local_error.empty() ? kNone : r, bad_param < 0 ? kNone : bad_param * w + r};
  Work a = comm.all_reduce(OutBuffer(flags, CommType::I64, 2), ReduceOp::Min, "optimizer step flags");
  wait_work(s, a);
  if (flags[0] != kNone) {
    if (!local_error.empty()) throw std::invalid_argument(local_error);
    detail::throw_invalid_argument(detail::concat("[optim] rank ", flags[0],
                                                  " rejected its step inputs (see its error); nothing was modified on any rank"));
  }
  if (flags[1] == kNone) return true;
  if (policy == NonFinitePolicy::Skip) return false;
  const int64_t param = flags[1] / w, rank = flags[1] % w;
  detail::throw_error(detail::concat("[optim] gradient of parameter '", s.plan.inventory().params[static_cast<size_t>(param)].name,
                                     "' is not finite on rank ", rank,
                                     "; nothing was modified on any rank (policy raise; use skip to skip such steps)"));
}

}  // namespace dmuon::detail
