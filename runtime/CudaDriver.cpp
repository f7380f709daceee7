//===- CudaDriver.cpp - the CUDA driver API, loaded at run time -----------===//

#include "runtime/CudaDriver.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <map>
#include <mutex>

namespace spectra::cuda {
namespace {

// The few driver entry points used, with their C signatures (cuda.h).
using CUresult = int;
using CUdevice = int;
using CUcontext = void *;
constexpr int kJitErrorLogBuffer = 5, kJitErrorLogBufferSize = 6;
constexpr int kComputeCapabilityMajor = 75, kComputeCapabilityMinor = 76;
constexpr int kMultiprocessorCount = 16;
constexpr int kMaxSharedPerBlockOptin = 97;      // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kMaxDynamicSharedSizeBytes = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuModuleLoadDataEx)(Module *, const void *, unsigned, int *, void **);
  CUresult (*cuModuleGetFunction)(Function *, Module, const char *);
  CUresult (*cuLaunchKernel)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, Stream, void **, void **);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuFuncSetAttribute)(Function, int, int);
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuGetErrorString)(CUresult, const char **);
  // For devices() only: bound when present, never required.
  CUresult (*cuDeviceGetCount)(int *) = nullptr;
  CUresult (*cuDeviceGetName)(char *, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = nullptr;
  CUresult (*cuMemGetInfo)(size_t *, size_t *) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  std::string error;  // why the driver is unavailable ("" when it is)
};

template <typename F>
bool bind(void *lib, const char *name, F &fn, std::string &error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn)
    error = std::string("libcuda.so.1 has no ") + name;
  return fn != nullptr;
}

const Api &api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char *e = dlerror();
      a.error = std::string("the CUDA driver (libcuda.so.1) is not installed: ") + (e ? e : "");
      return;
    }
    if (!(bind(lib, "cuInit", a.cuInit, a.error) && bind(lib, "cuDeviceGet", a.cuDeviceGet, a.error) &&
          bind(lib, "cuCtxGetCurrent", a.cuCtxGetCurrent, a.error) &&
          bind(lib, "cuCtxSetCurrent", a.cuCtxSetCurrent, a.error) &&
          bind(lib, "cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain, a.error) &&
          bind(lib, "cuModuleLoadDataEx", a.cuModuleLoadDataEx, a.error) &&
          bind(lib, "cuModuleGetFunction", a.cuModuleGetFunction, a.error) &&
          bind(lib, "cuLaunchKernel", a.cuLaunchKernel, a.error) &&
          bind(lib, "cuDeviceGetAttribute", a.cuDeviceGetAttribute, a.error) &&
          bind(lib, "cuFuncSetAttribute", a.cuFuncSetAttribute, a.error) &&
          bind(lib, "cuGetErrorName", a.cuGetErrorName, a.error) &&
          bind(lib, "cuGetErrorString", a.cuGetErrorString, a.error)))
      return;
    std::string optional;
    bind(lib, "cuDeviceGetCount", a.cuDeviceGetCount, optional);
    bind(lib, "cuDeviceGetName", a.cuDeviceGetName, optional);
    bind(lib, "cuDeviceTotalMem_v2", a.cuDeviceTotalMem, optional);
    bind(lib, "cuMemGetInfo_v2", a.cuMemGetInfo, optional);
    bind(lib, "cuDevicePrimaryCtxRelease_v2", a.cuDevicePrimaryCtxRelease, optional);
    if (CUresult r = a.cuInit(0); r != 0)
      a.error = "cuInit failed with CUDA error " + std::to_string(r) + " (no usable GPU?)";
  });
  return a;
}

std::string describe(CUresult r) {
  const char *name = nullptr, *text = nullptr;
  api().cuGetErrorName(r, &name);
  api().cuGetErrorString(r, &text);
  return std::string(name ? name : "CUDA_ERROR_?") + " (" + (text ? text : "no description") + ")";
}

void check(CUresult r, const std::string &what) {
  TORCH_CHECK(r == 0, "spectra: ", what, " failed: ", describe(r));
}

/// Makes `device`'s primary context (the one torch's runtime calls use)
/// current on this thread, whatever context was current before.
void ensureContext(int device) {
  static std::mutex mutex;
  static std::map<int, CUcontext> primaries;  // retained once per device, never released
  CUcontext primary = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = primaries.find(device);
    if (it == primaries.end()) {
      CUdevice dev;
      check(api().cuDeviceGet(&dev, device), "cuDeviceGet");
      check(api().cuDevicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain");
      it = primaries.emplace(device, primary).first;
    }
    primary = it->second;
  }
  CUcontext current = nullptr;
  check(api().cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != primary)
    check(api().cuCtxSetCurrent(primary), "cuCtxSetCurrent");
}

} // namespace

bool available(std::string *why) {
  const Api &a = api();
  if (why)
    *why = a.error;
  return a.error.empty();
}

Module loadPtx(int device, const std::string &ptx, const std::string &what) {
  std::string why;
  TORCH_CHECK(available(&why), "spectra: cannot load the GPU kernels of ", what, ": ", why);
  ensureContext(device);
  char log[8192] = {0};
  int options[] = {kJitErrorLogBuffer, kJitErrorLogBufferSize};
  void *values[] = {log, reinterpret_cast<void *>(sizeof(log))};
  Module module = nullptr;
  CUresult r = api().cuModuleLoadDataEx(&module, ptx.c_str(), 2, options, values);
  TORCH_CHECK(r == 0, "spectra: loading the PTX of ", what, " on cuda:", device,
              " failed: ", describe(r), log[0] ? "\nptx JIT log:\n" : "", log);
  return module;
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  const Api &a = api();
  int count = 0;
  if (!a.error.empty() || !a.cuDeviceGetCount || a.cuDeviceGetCount(&count) != 0)
    return out;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    if (a.cuDeviceGet(&dev, i) != 0)
      continue;
    DeviceInfo info;
    char name[256] = {0};
    if (a.cuDeviceGetName && a.cuDeviceGetName(name, sizeof(name) - 1, dev) == 0)
      info.name = name;
    size_t total = 0, free = 0;
    if (a.cuDeviceTotalMem && a.cuDeviceTotalMem(&total, dev) == 0)
      info.totalBytes = static_cast<int64_t>(total);
    info.freeBytes = info.totalBytes;
    CUcontext primary = nullptr, previous = nullptr;
    if (a.cuMemGetInfo && a.cuDevicePrimaryCtxRelease && a.cuDevicePrimaryCtxRetain(&primary, dev) == 0) {
      a.cuCtxGetCurrent(&previous);
      if (a.cuCtxSetCurrent(primary) == 0 && a.cuMemGetInfo(&free, &total) == 0)
        info.freeBytes = static_cast<int64_t>(free);
      a.cuCtxSetCurrent(previous);
      a.cuDevicePrimaryCtxRelease(dev);
    }
    out.push_back(info);
  }
  return out;
}

std::pair<int, int> computeCapability(int device) {
  std::string why;
  TORCH_CHECK(available(&why), "spectra: ", why);
  CUdevice dev;
  check(api().cuDeviceGet(&dev, device), "cuDeviceGet");
  int major = 0, minor = 0;
  check(api().cuDeviceGetAttribute(&major, kComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
  check(api().cuDeviceGetAttribute(&minor, kComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
  return {major, minor};
}

int multiprocessors(int device) {
  // Asked at every launch plan: the driver is queried once per device.
  static std::mutex mutex;
  static std::map<int, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(device); it != known.end())
    return it->second;
  std::string why;
  TORCH_CHECK(available(&why), "spectra: ", why);
  CUdevice dev;
  check(api().cuDeviceGet(&dev, device), "cuDeviceGet");
  int count = 0;
  check(api().cuDeviceGetAttribute(&count, kMultiprocessorCount, dev), "cuDeviceGetAttribute");
  known[device] = count;
  return count;
}

Function getFunction(Module module, const std::string &name) {
  Function f = nullptr;
  check(api().cuModuleGetFunction(&f, module, name.c_str()), "looking up kernel '" + name + "'");
  return f;
}

void allowDynamicShared(int device, Function function, const std::string &name, int64_t bytes,
                        int64_t totalBytes) {
  if (bytes <= 0)
    return;
  ensureContext(device);
  CUdevice dev;
  check(api().cuDeviceGet(&dev, device), "cuDeviceGet");
  int most = 0;
  check(api().cuDeviceGetAttribute(&most, kMaxSharedPerBlockOptin, dev), "cuDeviceGetAttribute");
  TORCH_CHECK(totalBytes <= most, "spectra: kernel '", name, "' needs ", totalBytes,
              " bytes of shared memory per block, more than cuda:", device, "'s opt-in maximum of ",
              most, "; use fewer features (m) or a smaller head");
  check(api().cuFuncSetAttribute(function, kMaxDynamicSharedSizeBytes, int(bytes)),
        "allowing kernel '" + name + "' " + std::to_string(bytes) + " bytes of dynamic shared memory");
}

void launch(int device, Function function, const std::string &name, const unsigned grid[3],
            const unsigned block[3], unsigned sharedBytes, Stream stream, void **params) {
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
    return;  // empty sequence or batch: nothing to do
  ensureContext(device);
  CUresult r = api().cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1],
                                    block[2], sharedBytes, stream, params, nullptr);
  TORCH_CHECK(r == 0, "spectra: launching kernel '", name, "' (grid ", grid[0], "x", grid[1], "x",
              grid[2], ", block ", block[0], ", ", sharedBytes, " B shared) failed: ", describe(r));
}

} // namespace spectra::cuda
