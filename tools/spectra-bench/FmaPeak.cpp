//===- FmaPeak.cpp - the CPU's f32 FMA peak, measured in the benchmark's run ==//
//
// Throughput figures are stated as a share of what this CPU does at best, measured in the same
// run (machines change from day to day): every intra-op thread runs independent chains of
// vector FMAs (enough of them to cover the FMA latency), AVX-512 and AVX2 where the CPU has
// them, and the faster is the peak. Where the kernels' contractions run on AMX tiles, the tile
// unit's own rate is measured the same way (measureAmxPeak).
//
//===----------------------------------------------------------------------===//

#include "FmaPeak.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <vector>
#include <immintrin.h>

namespace spectra::bench {
namespace {

constexpr int kChains = 12;  // independent accumulators per thread: latency 4 x 2 units, and more

// Each chain starts from its own value, so the compiler cannot merge them into one.
#define SPECTRA_FMA_CHAINS(FMA, V, START)                                                       \
  V a0 = START(1.0f), a1 = START(1.001f), a2 = START(1.002f), a3 = START(1.003f),              \
    a4 = START(1.004f), a5 = START(1.005f), a6 = START(1.006f), a7 = START(1.007f),            \
    a8 = START(1.008f), a9 = START(1.009f), a10 = START(1.010f), a11 = START(1.011f);          \
  for (int64_t i = 0; i < iterations; ++i) {                                                  \
    a0 = FMA(a0, b, c); a1 = FMA(a1, b, c); a2 = FMA(a2, b, c); a3 = FMA(a3, b, c);           \
    a4 = FMA(a4, b, c); a5 = FMA(a5, b, c); a6 = FMA(a6, b, c); a7 = FMA(a7, b, c);           \
    a8 = FMA(a8, b, c); a9 = FMA(a9, b, c); a10 = FMA(a10, b, c); a11 = FMA(a11, b, c);       \
  }                                                                                            \
  V total = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;

__attribute__((target("avx512f"))) float chains512(int64_t iterations) {
  __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  SPECTRA_FMA_CHAINS(_mm512_fmadd_ps, __m512, _mm512_set1_ps)
  return _mm512_reduce_add_ps(total);
}

__attribute__((target("avx2,fma"))) float chains256(int64_t iterations) {
  __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  SPECTRA_FMA_CHAINS(_mm256_fmadd_ps, __m256, _mm256_set1_ps)
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  return lanes[0] + lanes[7];
}

/// AMX's tile configuration: palette 1, tiles 0-7 of 16 rows x 64 bytes (the layout of
/// LDTILECFG's 64-byte operand).
struct alignas(64) TileConfig {
  uint8_t palette = 1, startRow = 0, reserved[14] = {};
  uint16_t bytesPerRow[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

/// `iterations` rounds of 8 tile products: four accumulator tiles (0-3), each taking two
/// products a round on operand tiles (4, 5 as A; 6, 7 as B) loaded once, so four chains cover
/// a product's latency. Returns a lane of the result, so nothing is optimised away.
__attribute__((target("amx-tile,amx-bf16"))) float tileProducts(int64_t iterations) {
  alignas(64) static thread_local uint16_t operands[4][16 * 32];
  alignas(64) static thread_local float out[16 * 16];
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 16 * 32; ++i)
      operands[t][i] = 0x3f80 + ((i + t) & 7);  // bf16 near 1
  TileConfig config;
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operands[0], 64);
  _tile_loadd(5, operands[1], 64);
  _tile_loadd(6, operands[2], 64);
  _tile_loadd(7, operands[3], 64);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_dpbf16ps(0, 5, 7);
    _tile_dpbf16ps(1, 5, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 4, 6);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
constexpr double kTileProductFlops = 2.0 * 16 * 16 * 32;

/// GFLOP/s of `threads` threads each running `kernel` (`flopsPerIteration` a round) for about
/// `seconds`.
double measure(float (*kernel)(int64_t), double flopsPerIteration, int threads,
               double seconds) {
  using Clock = std::chrono::steady_clock;
  kernel(1000);  // warm up (frequency, caches)
  int64_t iterations = 1 << 16;
  std::vector<float> results(threads);
  for (;;) {
    auto t0 = Clock::now();
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        results[t] = kernel(iterations);  // kept: the chains cannot be optimised away
    });
    double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    if (elapsed >= seconds || iterations > (int64_t(1) << 40))
      break;
    iterations *= 2;
  }
  // The best of three timed runs: a peak is what the machine can do, and a run that shares
  // a core with another process for a moment says less about that.
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    auto t0 = Clock::now();
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        results[t] = kernel(iterations);
    });
    double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, flopsPerIteration * static_cast<double>(iterations) * threads /
                              elapsed / 1e9);
  }
  return best;
}

} // namespace

FmaPeak measureFmaPeak(int threads, double seconds) {
  FmaPeak best;
  __builtin_cpu_init();
  double g256 = 0, g512 = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    g256 = measure(chains256, 2.0 * 8 * kChains, threads, seconds);
  if (__builtin_cpu_supports("avx512f"))
    g512 = measure(chains512, 2.0 * 16 * kChains, threads, seconds);
  best.gflops = std::max(g256, g512);
  if (best.gflops == 0)
    return best;
  // Within 3% of each other the two are one peak: the CPU runs a 512-bit FMA as two 256-bit
  // halves (Zen 4), and naming whichever won by noise would change from run to run.
  if (g256 > 0 && g512 > 0 && std::abs(g512 - g256) <= 0.03 * best.gflops)
    best.isa = "AVX-512 and AVX2 alike (512-bit FMAs as two 256-bit halves)";
  else
    best.isa = g512 >= g256 ? "AVX-512 (16 lanes)" : "AVX2 (8 lanes)";
  return best;
}

double measureAmxPeak(int threads, double seconds) {
  return measure(tileProducts, 8 * kTileProductFlops, threads, seconds);
}

} // namespace spectra::bench
