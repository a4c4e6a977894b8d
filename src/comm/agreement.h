// Internal: the agreements every component runs over a Communicator (the optimizer's plan and step
// claims, ShardedParams' construction, checkpoints): generic, so they live with the communicators.
// Every function here is COLLECTIVE and throws the same error on every rank, before anything is
// modified, when the ranks disagree or one of them failed.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/comm.h"

namespace meshmuon::detail {

// "rank 1", "ranks 0, 2", "ranks 0-63, 65" (sorted input).
std::string ranks_text(const std::vector<int>& ranks);
// Ranks grouped by identical text, first appearance first: "'a' on ranks 0, 2; 'b' on rank 1".
std::string texts_by_rank(const std::vector<std::string>& texts);
// Every rank's string (COLLECTIVE: two all-gathers).
std::vector<std::string> all_gather_strings(Communicator& comm, std::chrono::milliseconds timeout,
                                            const std::string& mine, const char* label);
// COLLECTIVE: every rank describes what must be equal everywhere as lines of text. One all-gather
// of a 64-bit digest of them; on a difference (seen alike by every rank) the texts are gathered and
// every rank throws the same meshmuon::Error "<what>: line <k> differs: <texts_by_rank>; <hint>"
// naming the first differing line and the ranks on each side.
void agree_on_lines(Communicator& comm, std::chrono::milliseconds timeout, const std::vector<std::string>& lines,
                    std::string_view what, std::string_view hint);

// A rank's failure, caught so that every rank reaches the agreement.
struct LocalFailure {
  std::exception_ptr error;
  std::string message;
  void capture();  // inside a catch block
  explicit operator bool() const { return error != nullptr; }
};
// COLLECTIVE: one all-reduce of the failure flags; when any rank failed, throw_failure_of the
// highest such rank.
void agree_on_failure(Communicator& comm, const LocalFailure& mine, std::string_view prefix, std::string_view context);
// COLLECTIVE, once every rank knows that `failed_rank` failed: its message is broadcast, a failing
// rank rethrows its own error and the others throw meshmuon::Error "<prefix> <context>: rank <r>
// failed: <its message>" (prefix e.g. "[checkpoint]").
[[noreturn]] void throw_failure_of(Communicator& comm, int failed_rank, const LocalFailure& mine, std::string_view prefix,
                                   std::string_view context);

}  // namespace meshmuon::detail
