// Internal: the per-step agreement (agreement.h). Every step, one all-reduce (MIN) carries this
// rank's input error, its first non-finite gradient and three digests, each as (d, −d) so that the
// minimum also yields the maximum: equal everywhere iff min == max. Only when they differ do the
// ranks exchange their claims in words, to name the first difference and the ranks on each side.
#include <algorithm>
#include <charconv>
#include <limits>

#include "core/hash.h"
#include "meshmuon/error.h"
#include "exec/agreement.h"

namespace meshmuon::detail {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
constexpr char kSection = '\x1e', kItem = '\x1f';

// Shortest text that reads back to the same value (exact: every bit of a field takes part).
template <class T>
std::string num(T v) {
  char b[40];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}

// Non-negative 62-bit digest, so that its negation is exact.
int64_t digest(const Fnv1a& h) { return static_cast<int64_t>(h.h >> 2); }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back().push_back(c);
  }
  return out;
}

std::string serialize(const StepClaim& c) {
  std::string t(c.has_grad.begin(), c.has_grad.end());
  for (char& ch : t) ch = ch ? '1' : '0';
  t += kSection;
  for (size_t i = 0; i < c.step_counts.size(); ++i) t += (i ? "," : "") + std::to_string(c.step_counts[i]);
  t += kSection;
  for (const auto& [k, v] : c.fields) t += k + '=' + v + kItem;
  return t;
}

std::string shorten(const std::string& v) { return v.size() <= 60 ? v : v.substr(0, 57) + "..."; }

// pass 2 of a disagreement: every rank's claim in words -> the first difference.
[[noreturn]] void explain(Communicator& comm, std::chrono::milliseconds timeout, const StepClaim& claim,
                          const std::vector<std::string>& names) {
  const std::vector<std::string> all = all_gather_strings(comm, timeout, serialize(claim), "optimizer step claims");
  const size_t w = all.size();
  std::vector<std::vector<std::string>> parts(w);
  for (size_t r = 0; r < w; ++r) parts[r] = split(all[r], kSection);
  const std::string tail = "; nothing was modified on any rank";
  auto name = [&](size_t i) { return i < names.size() ? "'" + names[i] + "'" : "#" + std::to_string(i); };
  // which parameters have gradients
  const std::string& mask0 = parts[0][0];
  for (size_t i = 0; i < mask0.size(); ++i) {
    std::vector<int> with, without;
    for (size_t r = 0; r < w; ++r) (parts[r][0][i] == '1' ? with : without).push_back(static_cast<int>(r));
    if (with.empty() || without.empty()) continue;
    throw_error(concat("[optim] ranks disagree at this step: parameter ", name(i), " has no gradient on ", ranks_text(without),
                       " but has one on ", ranks_text(with),
                       "; step() is collective: a gradient that is None on one rank must be None on every rank (call "
                       "zero_grad / backward alike everywhere)",
                       tail));
  }
  // step counts
  std::vector<std::vector<std::string>> counts(w);
  for (size_t r = 0; r < w; ++r) counts[r] = split(parts[r][1], ',');
  for (size_t i = 0; i < counts[0].size(); ++i) {
    std::vector<std::string> per(w);
    for (size_t r = 0; r < w; ++r) per[r] = "step " + counts[r][i];
    if (std::all_of(per.begin(), per.end(), [&](const std::string& x) { return x == per[0]; })) continue;
    throw_error(concat("[optim] ranks disagree at this step: parameter ", name(i), " is at ", texts_by_rank(per),
                       "; every rank must take the same steps and load the same checkpoint", tail));
  }
  // hyperparameters and policies, in the order of rank 0's fields
  std::vector<std::vector<std::string>> fields(w);
  for (size_t r = 0; r < w; ++r) fields[r] = split(parts[r][2], kItem);
  for (size_t k = 0; k < fields[0].size(); ++k) {
    const std::string key = fields[0][k].substr(0, fields[0][k].find('='));
    std::vector<std::string> per(w);
    for (size_t r = 0; r < w; ++r) {
      per[r] = "(absent)";
      for (const std::string& f : fields[r])
        if (f.compare(0, key.size() + 1, key + "=") == 0) per[r] = shorten(f.substr(key.size() + 1));
    }
    if (std::all_of(per.begin(), per.end(), [&](const std::string& x) { return x == per[0]; })) continue;
    throw_error(concat("[optim] ranks disagree at this step: ", key, " is ", texts_by_rank(per),
                       "; set hyperparameters and policies identically on every rank", tail));
  }
  throw_error(concat("[optim] ranks disagree at this step (", texts_by_rank(std::vector<std::string>(w, "a claim")),
                     ") but no single field differs; rebuild the optimizer on every rank", tail));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> step_fields(const std::vector<GroupOptions>& groups, NonFinitePolicy policy,
                                                             const std::vector<std::pair<int, const std::vector<float>*>>& logits) {
  std::vector<std::pair<std::string, std::string>> f;
  f.emplace_back("the non-finite policy", std::string(to_string(policy)));
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupOptions& o = groups[g];
    auto add = [&](const char* key, std::string value) { f.emplace_back(concat("group ", g, " option '", key, "'"), std::move(value)); };
    add("algorithm", std::string(to_string(o.algorithm)));
    add("lr", num(o.lr));
    add("weight_decay", num(o.weight_decay));
    if (o.algorithm == Algorithm::AdamW) {
      add("beta1", num(o.beta1)), add("beta2", num(o.beta2)), add("eps", num(o.eps));
      continue;
    }
    add("momentum", num(o.momentum)), add("nesterov", o.nesterov ? "true" : "false");
    add("momentum_kind", std::string(to_string(o.momentum_kind))), add("lr_rule", std::string(to_string(o.lr_rule)));
    add("cautious_wd", o.cautious_wd ? "true" : "false"), add("normuon", o.normuon ? "true" : "false");
    add("decay_lr", std::string(to_string(o.decay_lr)));
    add("normuon_beta2", num(o.normuon_beta2)), add("qk_clip_threshold", num(o.qk_clip_threshold));
    const NsOptions& ns = o.ns;
    add("ns.schedule", std::string(to_string(ns.schedule))), add("ns.steps", std::to_string(ns.steps));
    add("ns.method", std::string(to_string(ns.method))), add("ns.scale", num(ns.scale)), add("ns.eps", num(ns.eps));
    add("ns.eps_mode", std::to_string(static_cast<int>(ns.eps_mode)));
    add("ns.polar_express", num(ns.pe_l0) + "," + num(ns.pe_safety) + "," + num(ns.pe_cushion));
    std::string custom;
    for (const Coefficients& c : ns.custom) custom += num(c.a) + "," + num(c.b) + "," + num(c.c) + ";";
    add("ns.custom", custom);
    add("ns.bf16_rounding", ns.bf16_rounding ? "true" : "false");
    add("ns.matmul_dtype", std::string(to_string(ns.matmul_dtype)));
    add("ns.muon_eq", ns.muon_eq ? "true" : "false"), add("ns.muon_plus", ns.muon_plus ? "true" : "false");
  }
  for (const auto& [layer, values] : logits) {
    std::string v;
    for (float x : *values) v += (v.empty() ? "" : ",") + num(x);
    f.emplace_back(concat("qk_logits[", layer, "]"), "[" + v + "]");
  }
  return f;
}

bool agree_on_step(Communicator& comm, std::chrono::milliseconds timeout, const StepClaim& claim, NonFinitePolicy policy,
                   const std::vector<std::string>& names) {
  const int64_t w = comm.size(), r = comm.rank();
  Fnv1a grads, steps, fields;
  grads.pod(claim.has_grad.size()), grads.bytes(claim.has_grad.data(), claim.has_grad.size());
  steps.pod(claim.step_counts.size()), steps.bytes(claim.step_counts.data(), claim.step_counts.size() * sizeof(int64_t));
  for (const auto& [k, v] : claim.fields) fields.str(k), fields.str(v);
  const int64_t d[3] = {digest(grads), digest(steps), digest(fields)};
  int64_t flags[9] = {claim.error.empty() ? kNone : r, claim.bad_param < 0 ? kNone : claim.bad_param * w + r,
                      d[0], -d[0], d[1], -d[1], d[2], -d[2], claim.error.empty() || !claim.error_is_runtime ? kNone : r};
  Work a = comm.all_reduce(OutBuffer(flags, CommType::I64, 9), ReduceOp::Min, "optimizer step agreement");
  a.wait(timeout);
  if (flags[0] != kNone) {
    if (!claim.error.empty() && claim.error_is_runtime)
      throw_error(concat(claim.error, " (raised before this step changed anything; a device error may come from work "
                                      "queued earlier, such as the previous step's tail)"));
    if (!claim.error.empty()) throw std::invalid_argument(claim.error);
    if (flags[8] == flags[0])
      throw_error(concat("[optim] rank ", flags[0], " failed before the step (a runtime error, not its inputs: see its "
                         "error); this step changed nothing here"));
    throw_invalid_argument(concat("[optim] rank ", flags[0], " rejected its step inputs (see its error); nothing was modified on any rank"));
  }
  for (int k = 0; k < 3; ++k)
    if (flags[2 + 2 * k] != -flags[3 + 2 * k]) explain(comm, timeout, claim, names);
  if (flags[1] == kNone) return true;
  if (policy == NonFinitePolicy::Skip) return false;
  const int64_t param = flags[1] / w, rank = flags[1] % w;
  throw_error(concat("[optim] gradient of parameter ", param < static_cast<int64_t>(names.size()) ? "'" + names[static_cast<size_t>(param)] + "'" : std::to_string(param),
                     " is not finite on rank ", rank, "; nothing was modified on any rank (policy raise; use skip to skip such steps)"));
}

}  // namespace meshmuon::detail
