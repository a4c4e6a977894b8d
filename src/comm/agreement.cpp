// Internal: the generic agreements (agreement.h).
#include "comm/agreement.h"

#include <algorithm>
#include <cstring>

#include "core/hash.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

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

void LocalFailure::capture() {
  error = std::current_exception();
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
}

void throw_failure_of(Communicator& comm, int failed_rank, const LocalFailure& mine, std::string_view prefix,
                      std::string_view context) {
  std::vector<char> text(2048, '\0');
  if (comm.rank() == failed_rank)
    std::memcpy(text.data(), mine.message.data(), std::min(mine.message.size(), text.size() - 1));
  comm.broadcast(OutBuffer(text.data(), CommType::U8, text.size()), failed_rank, "failure message").wait();
  if (mine) std::rethrow_exception(mine.error);
  text.back() = '\0';
  throw_error(concat(prefix, " ", context, ": rank ", failed_rank, " failed: ", text.data()));
}

void agree_on_failure(Communicator& comm, const LocalFailure& mine, std::string_view prefix, std::string_view context) {
  int64_t failed = mine ? comm.rank() + 1 : 0;
  comm.all_reduce(OutBuffer(&failed, CommType::I64, 1), ReduceOp::Max, "failure agreement").wait();
  if (failed > 0) throw_failure_of(comm, static_cast<int>(failed - 1), mine, prefix, context);
}

}  // namespace meshmuon::detail
