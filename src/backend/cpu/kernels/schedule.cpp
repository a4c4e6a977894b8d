// Newton–Schulz coefficient schedules, method names, option validation and flop counts
// (REFERENCE.md section 1).
#include <cmath>
#include <string>

#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/ns_methods.h"

namespace meshmuon {
namespace {

// Keller Jordan's Muon quintic, also torch.optim.Muon's default.
constexpr Coefficients kJordan{3.4445, -4.7750, 2.0315};

// Five per-step quintics as used by Dion and Motif.
constexpr Coefficients kYou[5] = {{4.0848, -6.8946, 2.9270},
                                  {3.9505, -6.3029, 2.6377},
                                  {3.7418, -5.5913, 2.3037},
                                  {2.8769, -3.1427, 1.2046},
                                  {2.8366, -3.0525, 1.2012}};

// Emerging-Optimizers' tables (emerging_optimizers/orthogonalized_optimizers/muon_utils.py), as
// printed there; each with how a run longer than the table continues.
constexpr Coefficients kCans[5] = {{8.4703, -25.1081, 18.6293},
                                   {4.1828, -3.1087, 0.5806},
                                   {3.9619, -2.9541, 0.5630},
                                   {3.2866, -2.4647, 0.5074},
                                   {2.2737, -1.6447, 0.4162}};
constexpr Coefficients kAol[4] = {{4.0098, -7.0585, 2.4635},
                                  {3.4585, -5.5479, 2.5959},
                                  {2.7573, -3.2939, 1.4254},
                                  {2.7215, -3.0494, 1.3169}};
constexpr Coefficients kDeepSeekV4[10] = {kJordan, kJordan, kJordan, kJordan, kJordan,
                                          kJordan, kJordan, kJordan, {2.0, -1.5, 0.5}, {2.0, -1.5, 0.5}};
constexpr Coefficients kCubic5[5] = {{3.3656576, -3.3420992, 0.0},
                                     {2.5744352, -1.4957376, 0.0},
                                     {2.5368962, -1.4312570, 0.0},
                                     {2.4418906, -1.2764040, 0.0},
                                     {2.2230472, -0.9630650, 0.0}};

enum class Past { RepeatLast, Cycle };

template <size_t N>
std::vector<Coefficients> from_table(const Coefficients (&table)[N], int steps, Past past) {
  std::vector<Coefficients> out;
  for (int t = 0; t < steps; ++t)
    out.push_back(size_t(t) < N ? table[t] : past == Past::Cycle ? table[size_t(t) % N] : table[N - 1]);
  return out;
}

}  // namespace

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::Jordan: return "jordan";
    case Schedule::You: return "you";
    case Schedule::PolarExpress: return "polar_express";
    case Schedule::Custom: return "custom";
    case Schedule::Cans: return "cans";
    case Schedule::Aol: return "aol";
    case Schedule::DeepSeekV4: return "deepseekv4";
    case Schedule::Cubic5: return "cubic5";
  }
  return "unknown";
}

Schedule parse_schedule(std::string_view name) {
  if (name == "jordan") return Schedule::Jordan;
  if (name == "you") return Schedule::You;
  if (name == "polar_express") return Schedule::PolarExpress;
  if (name == "custom") return Schedule::Custom;
  if (name == "cans") return Schedule::Cans;
  if (name == "aol") return Schedule::Aol;
  if (name == "deepseekv4") return Schedule::DeepSeekV4;
  if (name == "cubic5") return Schedule::Cubic5;
  detail::throw_invalid_argument(detail::concat("[orth] unknown schedule '", name,
                                                "'; use jordan, you, polar_express, cans, aol, deepseekv4, "
                                                "cubic5 or custom"));
}

// Method names come from the method table (ns_methods.h): built-ins and registered methods alike.
std::string_view to_string(NsMethod m) {
  for (NsMethod k : cpu::ns_methods())
    if (k == m) return cpu::ns_method_spec(m).name;
  return "unknown";
}

NsMethod parse_ns_method(std::string_view name) {
  for (NsMethod k : cpu::ns_methods())
    if (cpu::ns_method_spec(k).name == name) return k;
  detail::throw_invalid_argument(
      detail::concat("[orth] unknown method '", name, "'; use ", cpu::ns_method_names()));
}

std::vector<Coefficients> make_schedule(const NsOptions& o) {
  MESHMUON_CHECK(o.steps >= 1, "[orth] steps must be >= 1, got ", o.steps);
  MESHMUON_CHECK(std::isfinite(o.scale) && o.scale > 0,
              "[orth] scale (normalization s in |G|_F*s) must be finite and > 0, got ", o.scale);
  MESHMUON_CHECK(std::isfinite(o.eps) && o.eps >= 0, "[orth] eps must be finite and >= 0, got ", o.eps);
  MESHMUON_CHECK(!(o.bf16_rounding && (o.muon_eq || o.muon_plus)), "[orth] ", o.muon_eq ? "muon_eq" : "muon_plus",
              " is not combined with bf16_rounding (the emulation of torch.optim.Muon's bf16 iteration, which has "
              "neither); turn bf16_rounding off (matmul_dtype bf16 gives bf16 products) or turn ",
              o.muon_eq ? "muon_eq" : "muon_plus", " off");
  std::vector<Coefficients> out;
  switch (o.schedule) {
    case Schedule::Jordan:
      out.assign(static_cast<size_t>(o.steps), kJordan);
      break;
    case Schedule::You:
      MESHMUON_CHECK(o.steps == 5, "[orth] schedule 'you' has exactly 5 steps, got steps=", o.steps,
                  "; set steps=5 or use polar_express for other step counts");
      out.assign(std::begin(kYou), std::end(kYou));
      break;
    case Schedule::PolarExpress:
      out = polar_express_coefficients(o.steps, o.pe_l0, o.pe_safety, o.pe_cushion);
      break;
    case Schedule::Cans:
      out = from_table(kCans, o.steps, Past::RepeatLast);
      break;
    case Schedule::Aol:
      out = from_table(kAol, o.steps, Past::Cycle);
      break;
    case Schedule::DeepSeekV4:
      out = from_table(kDeepSeekV4, o.steps, Past::RepeatLast);
      break;
    case Schedule::Cubic5:
      MESHMUON_CHECK(o.steps == 5, "[orth] schedule 'cubic5' is a fixed 5-step schedule, got steps=", o.steps,
                     "; set steps=5, or give its coefficients as a custom schedule");
      out.assign(std::begin(kCubic5), std::end(kCubic5));
      break;
    case Schedule::Custom:
      MESHMUON_CHECK(static_cast<int>(o.custom.size()) == o.steps, "[orth] custom schedule has ",
                  o.custom.size(), " coefficient triples but steps=", o.steps,
                  "; give one (a, b, c) per step");
      out = o.custom;
      break;
  }
  for (size_t t = 0; t < out.size(); ++t) {
    const Coefficients& c = out[t];
    MESHMUON_CHECK(std::isfinite(c.a) && std::isfinite(c.b) && std::isfinite(c.c),
                "[orth] coefficients of step ", t, " are not finite (a=", c.a, ", b=", c.b,
                ", c=", c.c, ")");
  }
  return out;
}

double ns_flops(int64_t m, int64_t n, const NsOptions& options) {
  const double s = static_cast<double>(std::min(m, n));  // Gram side
  const double l = static_cast<double>(std::max(m, n));
  const int steps = options.steps;
  if (s == 0 || steps < 1) return 0;
  // the emulation forms plain products; otherwise the method's own count (its table entry)
  const NsMethod method = options.bf16_rounding ? NsMethod::Plain : options.method;
  return cpu::ns_method_spec(method).flops(s, l, steps);
}

}  // namespace meshmuon
