//===- Devices.h - the trainer's device, precision and memory figures -----===//
//
// --device and --precision as the trainer reads them (errors name the valid
// choices and what this machine has), autocast for CUDA's mixed precision, and
// the peak memory a report gives (the CUDA allocator's peak, or the process's
// peak RSS on the CPU).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_DEVICES_H
#define SPECTRA_MODELS_DEVICES_H

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace spectra::models {

/// auto | cpu | cuda[:N]. Throws std::invalid_argument naming the valid choices, or what the
/// machine has.
torch::Device pickDevice(const std::string &name);

/// auto (bf16 on CUDA, fp32 on the CPU) | fp32 | bf16 | fp16 (the last two CUDA only).
torch::ScalarType pickPrecision(const std::string &name, const torch::Device &device);

/// "fp32", "bf16" or "fp16".
std::string precisionName(torch::ScalarType t);

/// The CUDA allocator's peak on a CUDA device, else the process's peak RSS (bytes).
int64_t peakBytes(const torch::Device &device);

/// Autocast on CUDA for bf16/fp16; fp32 runs plain.
class AutocastScope {
public:
  AutocastScope(const torch::Device &device, torch::ScalarType dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope &) = delete;
  AutocastScope &operator=(const AutocastScope &) = delete;

private:
  bool active = false, previous = false;
  at::ScalarType previousType = at::kFloat;
};

} // namespace spectra::models

#endif // SPECTRA_MODELS_DEVICES_H
