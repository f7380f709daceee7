// Where to issue the next tile's prefetches: a microbenchmark of the CPU kernels' staging.
//
// The kernels copy each 32-row tile of k and v (4 KiB each at d = 32, f32) into a tile buffer
// (k times its scale), then compute on the tile for some thousands of cycles. The vector stage
// prefetched the same rows of the next tile while it staged this one (`burst`); since this
// measurement it issues them through the tile's logits contraction, a register tile's rows at
// a time (`spread`; VectorizeTiles.cpp, spreadableBase and prefetchRow), and in one burst only
// where no such contraction follows (AMX hosts, B transposed). This program stages tiles of
// two 8 MiB streams, as kv does at
// B=8 H=2 N=4096, with a register-only FMA loop as the compute, and prints the staging's
// share of the time and its cycles (rdtsc ticks) per tile for:
//   none      no software prefetch;
//   burst     the next tile's lines prefetched (prefetcht2) during the staging (before);
//   burst2    the same, two tiles ahead;
//   spread    the next tile's lines prefetched (prefetcht2) a few at a time through the compute
//             (what the vector stage does now);
//   spread0   the same with prefetcht0;
//   hot       the same tile every time (the data in cache: the staging's floor).
//
//   gcc -O2 -mavx512f -o /tmp/staging-prefetch scripts/staging-prefetch.c
//   /tmp/staging-prefetch burst; /tmp/staging-prefetch spread
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

enum { ROWS = 32, D = 32, SLICES = 64 };
static float tk[ROWS * D] __attribute__((aligned(64))), tv[ROWS * D] __attribute__((aligned(64)));
static __m512 acc[16];

// About iters x 8 cycles of FMAs on registers (16 chains at two FMAs per cycle).
static void compute(int iters) {
  __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_load_ps(tk);
  for (int i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j)
      acc[j] = _mm512_fmadd_ps(acc[j], a, b);
}

int main(int argc, char **argv) {
  const char *modes[] = {"none", "burst", "burst2", "spread", "spread0", "hot"};
  int mode = -1;
  for (int m = 0; m < 6 && argc > 1; ++m)
    if (!strcmp(argv[1], modes[m]))
      mode = m;
  if (mode < 0) {
    fprintf(stderr, "usage: %s none|burst|burst2|spread|spread0|hot\n", argv[0]);
    return 2;
  }
  const long N = 8L * 2 * 4096;
  float *k = aligned_alloc(4096, N * D * 4), *v = aligned_alloc(4096, N * D * 4);
  for (long i = 0; i < N * D; ++i)
    k[i] = v[i] = 1.0f;
  char *evict = malloc(64 << 20);  // past the caches before the first tile
  memset(evict, 1, 64 << 20);
  const __m512 scale = _mm512_set1_ps(0.42f);
  const long tiles = N / ROWS;
  unsigned long staging = 0, start = __rdtsc();
  for (long t = 0; t < tiles; ++t) {
    unsigned long s0 = __rdtsc();
    long at = mode == 5 ? 0 : t, next = t + (mode == 2 ? 2 : 1);
    next = next < tiles ? next : tiles - 1;
    const float *kr = k + at * ROWS * D, *vr = v + at * ROWS * D;
    const char *nk = (const char *)(k + next * ROWS * D), *nv = (const char *)(v + next * ROWS * D);
    for (int r = 0; r < ROWS; ++r) {
      if (mode == 1 || mode == 2) {
        _mm_prefetch(nk + r * 128, _MM_HINT_T2);
        _mm_prefetch(nk + r * 128 + 64, _MM_HINT_T2);
      }
      _mm512_store_ps(tk + r * D, _mm512_mul_ps(_mm512_loadu_ps(kr + r * D), scale));
      _mm512_store_ps(tk + r * D + 16, _mm512_mul_ps(_mm512_loadu_ps(kr + r * D + 16), scale));
    }
    for (int r = 0; r < ROWS; ++r) {
      if (mode == 1 || mode == 2) {
        _mm_prefetch(nv + r * 128, _MM_HINT_T2);
        _mm_prefetch(nv + r * 128 + 64, _MM_HINT_T2);
      }
      _mm512_store_ps(tv + r * D, _mm512_loadu_ps(vr + r * D));
      _mm512_store_ps(tv + r * D + 16, _mm512_loadu_ps(vr + r * D + 16));
    }
    staging += __rdtsc() - s0;
    if (mode == 3 || mode == 4) {
      for (int c = 0; c < SLICES; ++c) {  // one line of each stream per slice of the compute
        if (mode == 3) {
          _mm_prefetch(nk + c * 64, _MM_HINT_T2);
          _mm_prefetch(nv + c * 64, _MM_HINT_T2);
        } else {
          _mm_prefetch(nk + c * 64, _MM_HINT_T0);
          _mm_prefetch(nv + c * 64, _MM_HINT_T0);
        }
        compute(512 / SLICES);
      }
    } else {
      compute(512);
    }
  }
  unsigned long total = __rdtsc() - start;
  float sum = 0;
  for (int j = 0; j < 16; ++j)
    sum += _mm512_reduce_add_ps(acc[j]);
  printf("%-8s staging %4.1f%% of the time, %4.0f ticks per tile%s\n", modes[mode],
         100.0 * staging / total, (double)staging / tiles, sum > 0 ? "" : " ");
  free(evict);
  free(k);
  free(v);
  return 0;
}
