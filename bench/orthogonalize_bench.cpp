// Micro-benchmarks of the orthogonalization kernels and the BLAS calls under them (SGEMM vs SSYRK vs
// SSYMM at the sizes Newton–Schulz uses). Not tests. Run:
//   build/bin/meshmuon_bench --benchmark_filter='Blas|Orthogonalize' --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/products.h"
#include "backend/cpu/kernels/ns_kernels.h"

namespace {

std::vector<float> random_matrix(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = normal(rng);
  return v;
}

void set_rate(benchmark::State& state, double flops) {
  state.counters["GFLOP"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["GFLOP"].value /= 1e9;
}

// X·Xᵀ for X s×l: SGEMM (2s²l flops) vs SSYRK (s²l useful flops).
void BM_BlasGramSgemm(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0)), l = static_cast<int>(state.range(1));
  const auto x = random_matrix(int64_t(s) * l, 1);
  std::vector<float> g(size_t(s) * s);
  for (auto _ : state) meshmuon::cpu::sgemm(false, true, s, s, l, 1.0f, x.data(), l, x.data(), l, 0.0f, g.data(), s);
  set_rate(state, 2.0 * s * s * l);
}
void BM_BlasGramSsyrk(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0)), l = static_cast<int>(state.range(1));
  const auto x = random_matrix(int64_t(s) * l, 1);
  std::vector<float> g(size_t(s) * s);
  for (auto _ : state) meshmuon::cpu::ssyrk_lower(false, s, l, 1.0f, x.data(), l, 0.0f, g.data(), s);
  set_rate(state, 1.0 * s * s * l);  // useful flops: the time is what matters
}

// Z·X for Z s×s symmetric: SGEMM on the full matrix vs SSYMM reading one triangle.
void BM_BlasApplySgemm(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0)), l = static_cast<int>(state.range(1));
  const auto z = random_matrix(int64_t(s) * s, 2), x = random_matrix(int64_t(s) * l, 3);
  std::vector<float> y(size_t(s) * l);
  for (auto _ : state) meshmuon::cpu::sgemm(false, false, s, l, s, 1.0f, z.data(), s, x.data(), l, 0.0f, y.data(), l);
  set_rate(state, 2.0 * s * s * l);
}
void BM_BlasApplySsymm(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0)), l = static_cast<int>(state.range(1));
  const auto z = random_matrix(int64_t(s) * s, 2), x = random_matrix(int64_t(s) * l, 3);
  std::vector<float> y(size_t(s) * l);
  for (auto _ : state) meshmuon::cpu::ssymm_lower(true, s, l, 1.0f, z.data(), s, x.data(), l, 0.0f, y.data(), l);
  set_rate(state, 2.0 * s * s * l);
}

// The O(s²) pass that turns a SYRK triangle into the full matrix.
void BM_Symmetrize(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0));
  auto a = random_matrix(int64_t(s) * s, 4);
  for (auto _ : state) {
    meshmuon::cpu::symmetrize_lower(a.data(), s);
    benchmark::ClobberMemory();
  }
}

// Whole orthogonalization: range(2) = method (0 plain, 1 symmetric, 2 gram).
void BM_Orthogonalize(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1);
  meshmuon::NsOptions o;
  o.schedule = meshmuon::Schedule::PolarExpress;
  o.method = static_cast<meshmuon::NsMethod>(state.range(2));
  meshmuon::Orthogonalizer orth(o);
  const auto g = random_matrix(m * n, 5);
  std::vector<float> out(g.size());
  for (auto _ : state) orth.run(g.data(), out.data(), m, n);
  set_rate(state, meshmuon::ns_flops(m, n, o));
  state.SetLabel(std::string(meshmuon::to_string(o.method)));
}

void blas_sizes(benchmark::internal::Benchmark* b) {
  b->Args({1024, 4096})->Args({2048, 2048})->Args({1024, 1024})->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_BlasGramSgemm)->Apply(blas_sizes);
BENCHMARK(BM_BlasGramSsyrk)->Apply(blas_sizes);
BENCHMARK(BM_BlasApplySgemm)->Apply(blas_sizes);
BENCHMARK(BM_BlasApplySsymm)->Apply(blas_sizes);
BENCHMARK(BM_Symmetrize)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Orthogonalize)
    ->ArgsProduct({{1024}, {4096}, {0, 1, 2}})
    ->Args({2048, 2048, 0})->Args({2048, 2048, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
