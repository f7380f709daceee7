//===- FmaPeak.h - the CPU's f32 FMA peak, measured in the benchmark's run --===//

#ifndef SPECTRA_TOOLS_SPECTRA_BENCH_FMAPEAK_H
#define SPECTRA_TOOLS_SPECTRA_BENCH_FMAPEAK_H

#include <string>

namespace spectra::bench {

struct FmaPeak {
  double gflops = 0;  ///< 0 when the CPU has neither AVX2+FMA nor AVX-512
  std::string isa;
};

/// f32 multiply-adds (2 flops each) per second over `threads` threads, measured for about
/// `seconds` per instruction set.
FmaPeak measureFmaPeak(int threads, double seconds = 0.3);

/// bf16 tile products (AMX's TDPBF16PS, 16 x 16 x 32, f32 accumulation; 2 flops per
/// multiply-add) per second over `threads` threads, in GFLOP/s: independent accumulator tiles
/// on operand tiles already loaded, the unit's throughput. Call it only where
/// spectra_cpu_amx() says the kernels run on AMX: the compiler has then checked the CPU and been
/// granted the process's tile data state (codegen's hostAmx), which the threads share.
double measureAmxPeak(int threads, double seconds = 0.3);

} // namespace spectra::bench

#endif // SPECTRA_TOOLS_SPECTRA_BENCH_FMAPEAK_H
