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

} // namespace spectra::bench

#endif // SPECTRA_TOOLS_SPECTRA_BENCH_FMAPEAK_H
