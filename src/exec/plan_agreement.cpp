// Internal: the construction agreement (agreement.h). Ranks first compare one fingerprint; only
// when they differ do they exchange per-parameter hashes and then the words of the first
// difference, so the error shows the real difference on every rank.
#include "exec/agreement.h"

#include <algorithm>
#include <limits>

#include "meshmuon/error.h"

namespace meshmuon::detail {

namespace {

// The first index at which the ranks' hash lists differ (a list that ends counts as different);
// -1 when all are equal. `all` holds every rank's list back to back (counts[r] each).
int64_t first_difference(const std::vector<uint64_t>& all, const std::vector<int64_t>& counts) {
  const std::vector<int64_t> displs = packed_displs(counts);
  const int64_t shortest = *std::min_element(counts.begin(), counts.end());
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  for (int64_t i = 0; i < longest; ++i) {
    if (i >= shortest) return i;
    for (size_t r = 1; r < counts.size(); ++r)
      if (all[static_cast<size_t>(displs[r] + i)] != all[static_cast<size_t>(displs[0] + i)]) return i;
  }
  return -1;
}

std::vector<uint64_t> gather_hashes(Communicator& comm, std::chrono::milliseconds timeout, const std::vector<uint64_t>& mine,
                                    const std::vector<int64_t>& counts, const char* label) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<uint64_t> all(static_cast<size_t>(total));
  Work w = comm.all_gather_v(InBuffer(mine.data(), CommType::U64, mine.size()), OutBuffer(all.data(), CommType::U64, all.size()),
                             counts, label);
  w.wait(timeout);
  return all;
}

std::string item_or_none(const std::vector<std::string>& items, int64_t i) {
  return i < static_cast<int64_t>(items.size()) ? items[static_cast<size_t>(i)] : std::string("(no such parameter)");
}

}  // namespace

void agree_on_plan(Communicator& comm, std::chrono::milliseconds timeout, const PlanClaim& claim) {
  const size_t w = static_cast<size_t>(comm.size());
  uint64_t mine[3] = {claim.error.empty() ? 0u : 1u, claim.fingerprint, claim.spec_hashes.size()};
  std::vector<uint64_t> all(3 * w);
  Work a = comm.all_gather(InBuffer(mine, CommType::U64, 3), OutBuffer(all.data(), CommType::U64, all.size()), "optimizer fingerprint");
  a.wait(timeout);
  bool failed = false, same = true;
  for (size_t r = 0; r < w; ++r) {
    failed |= all[3 * r] != 0;
    same &= all[3 * r + 1] == all[1] && all[3 * r + 2] == all[2];
  }
  if (failed) {
    const std::vector<std::string> errors = all_gather_strings(comm, timeout, claim.error, "optimizer errors");
    if (!claim.error.empty()) throw std::invalid_argument(claim.error);
    for (size_t r = 0; r < w; ++r)
      if (!errors[r].empty()) throw_invalid_argument(concat("[optim] rank ", r, " could not build the optimizer: ", errors[r]));
  }
  if (same) return;
  // pass 2: the parameters themselves (counts may differ) -> the first one that differs, in words
  std::vector<int64_t> counts(w);
  for (size_t r = 0; r < w; ++r) counts[r] = static_cast<int64_t>(all[3 * r + 2]);
  const int64_t first = first_difference(gather_hashes(comm, timeout, claim.spec_hashes, counts, "optimizer parameter hashes"), counts);
  if (first >= 0) {
    std::string count_text;
    if (*std::min_element(counts.begin(), counts.end()) != *std::max_element(counts.begin(), counts.end())) {
      std::vector<std::string> per(w);
      for (size_t r = 0; r < w; ++r) per[r] = std::to_string(counts[r]) + " parameters";
      count_text = concat("different parameter counts (", texts_by_rank(per), "); ");
    }
    const std::vector<std::string> texts = all_gather_strings(comm, timeout, item_or_none(claim.spec_texts, first), "optimizer parameter");
    throw_error(concat("[optim] ranks disagree on the parameters: ", count_text, "the first that differs is #", first, ": ",
                       texts_by_rank(texts), "; every rank must pass the same parameters, shapes, order, placements and groups"));
  }
  // pass 3: same parameters -> the options, then the plan's decisions
  const std::vector<std::string> options = all_gather_strings(comm, timeout, claim.options_text, "optimizer options");
  if (std::any_of(options.begin(), options.end(), [&](const std::string& o) { return o != options[0]; }))
    throw_error(concat("[optim] ranks disagree on the optimizer options (same parameters): ", texts_by_rank(options),
                       "; pass the same meshes and options on every rank"));
  const int64_t entry = first_difference(gather_hashes(comm, timeout, claim.entry_hashes, counts, "optimizer plan hashes"), counts);
  const std::vector<std::string> texts =
      all_gather_strings(comm, timeout, entry >= 0 ? item_or_none(claim.entry_texts, entry) : std::string(), "optimizer plan");
  throw_error(concat("[optim] ranks planned parameter #", entry, " differently: ", texts_by_rank(texts),
                     "; the environment (MESHMUON_STRATEGY) or the machine profile differs between ranks: make them the same"));
}

}  // namespace meshmuon::detail
