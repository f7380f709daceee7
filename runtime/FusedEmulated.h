//===- FusedEmulated.h - the GPU kernels run on the CPU (gpu-emulated) ----===//
//
// The `gpu-emulated` device: the GPU kernels of a feature map, compiled to the
// GPU-mapped IR (codegen/MapTilesToGpu.h, the stage the PTX is lowered from)
// and run on the CPU with blocks and threads as loops, as Triton's interpreter
// mode runs Triton kernels without a GPU. The launch plan (KernelLaunch.h:
// which buffers each kernel gets, the per-chunk partials and the combine
// stage, in order) is the one the CUDA launcher follows; each kernel's
// argument order, roles and ranks are read from the ABI the compiler
// generated (spectra_cpu_kernel_abi), not restated here. q, k, v in f32, bf16
// or f16, accumulated in f32.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_FUSEDEMULATED_H
#define SPECTRA_RUNTIME_FUSEDEMULATED_H

#include "runtime/FusedCpu.h"
#include "runtime/KernelLaunch.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>

struct spectra_cpu_kernel;

namespace spectra {

struct DecodeConstants;

class FusedEmulatedAttention {
public:
  /// The GPU kernels of a named variant with q/k/v of `dtype` ("f32", "bf16", "f16").
  /// With `causal`, the causal kernels (as FusedCpuAttention's).
  FusedEmulatedAttention(const std::string &variant, const VariantConfig &config = {},
                         const std::string &dtype = "f32", bool causal = false);
  /// The GPU kernels of a feature map declared in IR.
  static FusedEmulatedAttention fromIR(const std::string &ir, const std::string &sourceName = "<ir>",
                                       const std::string &featureMap = "",
                                       const std::string &dtype = "f32", bool causal = false);
  bool causal() const { return isCausal; }
  /// Whether a call leaves the finiteness of q, k and v to the kernels, as the CPU kernels'
  /// (FusedCpuAttention::kernelsCheckValues): the shared tile layer's marks are in these
  /// kernels too.
  bool kernelsCheckValues() const { return !isCausal && !DeferredInputChecks::active(); }

  const Descriptor &descriptor() const { return reference.descriptor(); }
  const std::string &dtype() const { return inputType; }

  /// Attention with autograd (the emulated backward kernels); the result in q's dtype.
  AttentionResult attentionWithStats(const torch::Tensor &q, const torch::Tensor &k,
                                     const torch::Tensor &v, const Weights &weights,
                                     const std::optional<torch::Tensor> &keyMask = std::nullopt,
                                     std::optional<double> scale = std::nullopt,
                                     const std::optional<torch::Tensor> &queryMask = std::nullopt) const;
  torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt,
                          std::optional<double> scale = std::nullopt,
                          const std::optional<torch::Tensor> &queryMask = std::nullopt) const {
    return attentionWithStats(q, k, v, weights, keyMask, scale, queryMask).out;
  }

  /// Causal decoding by the compiled kernels (a causal kernel set; KernelLaunch.h's
  /// causalPrefill and causalDecode): the state a prompt k, v ends in, then one token per
  /// decode() call, the state (float32) advanced in place.
  DecodeState prefill(const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
                      const std::optional<torch::Tensor> &keyMask = std::nullopt) const;
  torch::Tensor decode(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const Weights &weights, DecodeState &state) const;

  /// The launch plan on prepared inputs (for FusedAttentionFunction).
  FusedForward runForward(const FusedInputs &in) const;
  std::vector<torch::Tensor> runBackward(const FusedInputs &in, const FusedForward &saved,
                                         const torch::Tensor &gout) const;

  /// The launch plan's launcher for value dimension dv (`like` unused; as FusedCpuAttention).
  const KernelLauncher &launcher(const torch::Tensor &like, int64_t dv) const;

  /// The kernels' IR at a stage ("mapped" or "llvm") for value dimension dv (0: d).
  std::string kernelIR(const std::string &stage, int64_t dv = 0) const;

private:
  using Compile = std::function<spectra_cpu_kernel *(int64_t dv)>;
  FusedEmulatedAttention(Descriptor desc, Compile compile, std::string dtype, bool causal);
  struct Kernels;
  const Kernels &kernelsFor(int64_t dv) const;

  ReferenceFeatureMap reference;
  Compile compile;
  std::string inputType;
  bool isCausal = false;
  struct Compiled {
    std::mutex mutex;
    std::map<int64_t, std::shared_ptr<Kernels>> byValueDim;
  };
  std::shared_ptr<Compiled> compiled = std::make_shared<Compiled>();
  /// causal_decode's constant operands between steps (KernelLaunch.h).
  std::shared_ptr<DecodeConstants> decodeConstants;
};


} // namespace spectra

#endif // SPECTRA_RUNTIME_FUSEDEMULATED_H
