//===- Devices.cpp - the trainer's device, precision and memory figures ---===//

#include "models/Devices.h"

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <stdexcept>
#include <sys/resource.h>

namespace spectra::models {

torch::Device pickDevice(const std::string &name) {
  if (name == "auto")
    return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::Device d(torch::kCPU);
  try {
    d = torch::Device(name);
  } catch (const std::exception &) {
    throw std::invalid_argument("unknown device '" + name + "'; use auto, cpu, gpu-emulated or cuda[:N]");
  }
  if (d.is_cuda() && !torch::cuda::is_available())
    throw std::invalid_argument("--device " + name + ": no CUDA device is available here (use cpu)");
  if (d.is_cuda() && !d.has_index())
    d = torch::Device(torch::kCUDA, 0);
  if (d.is_cuda() && d.index() >= static_cast<int64_t>(torch::cuda::device_count()))
    throw std::invalid_argument("--device " + name + ": this machine has " +
                                std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  if (!d.is_cuda() && !d.is_cpu())
    throw std::invalid_argument("unknown device '" + name + "'; use auto, cpu or cuda[:N]");
  return d;
}

torch::ScalarType pickPrecision(const std::string &name, const torch::Device &device) {
  if (name == "auto")
    return device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  if (name == "fp32")
    return torch::kFloat32;
  if (name == "bf16" || name == "fp16") {
    if (!device.is_cuda())
      throw std::invalid_argument("--precision " + name + " is mixed precision on CUDA; the CPU "
                                  "trains in fp32 (use --precision fp32 or auto)");
    return name == "bf16" ? torch::kBFloat16 : torch::kHalf;
  }
  throw std::invalid_argument("unknown precision '" + name + "'; use auto, fp32, bf16 or fp16");
}

std::string precisionName(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bf16" : t == torch::kHalf ? "fp16" : "fp32";
}

int64_t peakBytes(const torch::Device &device) {
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

AutocastScope::AutocastScope(const torch::Device &device, torch::ScalarType dtype) {
  active = device.is_cuda() && dtype != torch::kFloat32;
  if (!active)
    return;
  previous = at::autocast::is_autocast_enabled(at::kCUDA);
  previousType = at::autocast::get_autocast_dtype(at::kCUDA);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
}

AutocastScope::~AutocastScope() {
  if (!active)
    return;
  at::autocast::set_autocast_enabled(at::kCUDA, previous);
  at::autocast::set_autocast_dtype(at::kCUDA, previousType);
  at::autocast::clear_cache();
}

} // namespace spectra::models
