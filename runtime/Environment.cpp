//===- Environment.cpp - what the LibTorch runtime runs on ---------------===//

#include "runtime/Environment.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <sstream>

using namespace spectra::runtime;

Environment spectra::runtime::describeEnvironment() {
  Environment env;
  env.torchVersion = TORCH_VERSION;
  try {
    env.cudaDevices = static_cast<int>(torch::cuda::device_count());
  } catch (const std::exception &) {
    env.cudaDevices = 0;
  }
  env.cpuThreads = at::get_num_threads();
  return env;
}

std::string spectra::runtime::formatEnvironment(const Environment &env) {
  std::ostringstream os;
  os << "LibTorch " << env.torchVersion << ", " << env.cudaDevices << " CUDA device(s), "
     << env.cpuThreads << " CPU thread(s)";
  return os.str();
}
