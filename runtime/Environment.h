//===- Environment.h - what the LibTorch runtime runs on ------------------===//
//
// The first piece of the LibTorch-hosted runtime: a description of the torch
// build and devices the JIT will target. Tools print it with --version.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_ENVIRONMENT_H
#define SPECTRA_RUNTIME_ENVIRONMENT_H

#include <string>

namespace spectra::runtime {

/// Facts about the LibTorch the runtime is linked against.
struct Environment {
  std::string torchVersion;  ///< e.g. "2.11.0"
  int cudaDevices = 0;       ///< usable CUDA devices now (0 on CPU machines)
  int cpuThreads = 0;        ///< intra-op threads at::parallel_for will use
};

/// Queries torch; never throws (a broken CUDA driver counts as no devices).
Environment describeEnvironment();

/// One line for logs and --version output.
std::string formatEnvironment(const Environment &env);

} // namespace spectra::runtime

#endif // SPECTRA_RUNTIME_ENVIRONMENT_H
