// Internal: the construction agreement (agreement.h) and the helpers both agreements use. Ranks
// first compare one fingerprint; only when they differ do they exchange per-parameter hashes and
// then the words of the first difference, so the error shows the real difference on every rank.
#include "exec/agreement.h"

#include <algorithm>
#include <limits>

#include "core/hash.h"
#include "dmuon/error.h"

namespace dmuon::detail {

std::vector<std::string> all_gather_strings(Communicator& comm, std::chrono::milliseconds timeout,
                                            const std::string& mine, const char* label) {
  const size_t w = static_cast<size_t>(comm.size());
  std::vector<int64_t> lens(w);
  int64_t len = static_cast<int64_t>(mine.size());
  Work a = comm.all_gather(InBuffer(&len, CommType::I64, 1), OutBuffer(lens.data(), CommType::I64, w),
                           concat(label, " lengths"));
  a.wait(timeout);
  int64_t total = 0;
  for (int64_t l : lens) total += l;
  std::vector<uint8_t> all(static_cast<size_t>(total));
  Work b = comm.all_gather_v(InBuffer(mine.data(), CommType::U8, mine.size()), OutBuffer(all.data(), CommType::U8, all.size()),
                             lens, concat(label, " text"));
  b.wait(timeout);
  std::vector<std::string> out;
  size_t at = 0;
  for (int64_t l : lens) {
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + at, static_cast<size_t>(l));
    at += static_cast<size_t>(l);
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string t;
  int shown = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (++shown > 8) {
      t += ", ...";
      break;
    }
    t += (t.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) t += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + t;
}

std::string texts_by_rank(const std::vector<std::string>& texts) {
  std::vector<std::string> values;
  std::vector<std::vector<int>> ranks;
  for (size_t r = 0; r < texts.size(); ++r) {
    const auto it = std::find(values.begin(), values.end(), texts[r]);
    if (it == values.end()) {
      values.push_back(texts[r]);
      ranks.push_back({static_cast<int>(r)});
    } else {
      ranks[static_cast<size_t>(it - values.begin())].push_back(static_cast<int>(r));
    }
  }
  std::string out;
  for (size_t k = 0; k < values.size() && k < 6; ++k)
    out += (k ? "; " : "") + values[k] + " on " + ranks_text(ranks[k]);
  if (values.size() > 6) out += "; ...";
  return out;
}

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
                     "; the environment (DMUON_STRATEGY) or the machine profile differs between ranks: make them the same"));
}

void agree_on_lines(Communicator& comm, std::chrono::milliseconds timeout, const std::vector<std::string>& lines,
                    std::string_view what, std::string_view hint) {
  Fnv1a h;
  h.pod(lines.size());
  for (const std::string& l : lines) h.str(l);
  const size_t w = static_cast<size_t>(comm.size());
  if (w == 1) return;
  std::vector<uint64_t> all(w);
  comm.all_gather(InBuffer(&h.h, CommType::U64, 1), OutBuffer(all.data(), CommType::U64, w), "agreement digest").wait(timeout);
  if (std::all_of(all.begin(), all.end(), [&](uint64_t x) { return x == all[0]; })) return;
  std::string joined;
  for (const std::string& l : lines) joined += l + "\n";
  const std::vector<std::string> texts = all_gather_strings(comm, timeout, joined, "agreement texts");
  std::vector<std::vector<std::string>> split(w);
  size_t most = 0;
  for (size_t k = 0; k < w; ++k) {
    for (size_t at = 0; at < texts[k].size();) {
      const size_t nl = texts[k].find('\n', at);
      split[k].push_back(texts[k].substr(at, nl - at));
      at = nl + 1;
    }
    most = std::max(most, split[k].size());
  }
  for (size_t line = 0; line < most; ++line) {
    std::vector<std::string> per(w);
    for (size_t k = 0; k < w; ++k) per[k] = line < split[k].size() ? split[k][line] : "(none)";
    if (std::all_of(per.begin(), per.end(), [&](const std::string& x) { return x == per[0]; })) continue;
    throw_error(concat(what, ": line ", line, " differs: ", texts_by_rank(per), "; ", hint));
  }
  throw_error(concat(what, ": the digests differ but the texts agree (", hint, ")"));
}

}  // namespace dmuon::detail
