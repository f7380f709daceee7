//===- CudaDriver.h - the CUDA driver API, loaded at run time -------------===//
//
// The fused GPU kernels are PTX; the driver JIT-assembles and launches them.
// libcuda.so.1 is opened with dlopen on first use, so the runtime builds,
// links and runs on machines without a driver (every CPU machine here): there
// the driver reports itself unavailable with the reason, and GPU tests skip.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_CUDADRIVER_H
#define SPECTRA_RUNTIME_CUDADRIVER_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spectra::cuda {

/// Opaque driver handles (CUmodule, CUfunction, CUstream).
using Module = void *;
using Function = void *;
using Stream = void *;

/// Whether the driver loaded and initialised; `why` says what failed.
bool available(std::string *why = nullptr);

/// Loads PTX into the current context of `device` (the primary context torch
/// uses); throws c10::Error with the driver's message and the JIT log.
Module loadPtx(int device, const std::string &ptx, const std::string &what);
Function getFunction(Module module, const std::string &name);

/// (major, minor) compute capability of `device`.
std::pair<int, int> computeCapability(int device);

/// The streaming multiprocessors of `device`.
int multiprocessors(int device);

/// Lets `function` (`name`, for messages) take `bytes` of dynamic shared memory per block
/// (above 48 KiB a kernel must opt in); throws when `device` allows less than `totalBytes`,
/// its static and dynamic shared memory together. 0 bytes: nothing to do.
void allowDynamicShared(int device, Function function, const std::string &name, int64_t bytes,
                        int64_t totalBytes);

/// Launches `name` (for messages) on `stream` in `device`'s primary context;
/// `params` as cuLaunchKernel takes them.
void launch(int device, Function function, const std::string &name, const unsigned grid[3],
            const unsigned block[3], unsigned sharedBytes, Stream stream, void **params);

/// A visible device and its memory.
struct DeviceInfo {
  std::string name;
  int64_t freeBytes = 0, totalBytes = 0;
};

/// The visible devices (cuda:0, cuda:1, ... in order), each with the free memory its primary
/// context reports; the context is retained for the query and released after, so a process
/// that only plans (spectra-train sweep) holds nothing on the devices. Empty when the driver is
/// unavailable or sees no device.
std::vector<DeviceInfo> devices();

} // namespace spectra::cuda

#endif // SPECTRA_RUNTIME_CUDADRIVER_H
