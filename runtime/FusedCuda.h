//===- FusedCuda.h - launching the fused GPU kernels ----------------------===//
//
// Runs the PTX of a feature map's GPU kernels (the tile layer through
// spectra-gpu-pipeline, codegen/MapTilesToGpu.h) on CUDA tensors: the artifact
// (generated launch description + PTX, from KernelCache) is parsed once, its
// module loaded per device through the driver API, and the kernels launched on
// torch's current stream in the launch plan that gpu-emulated follows on the
// CPU (KernelLaunch.h: per-chunk partials, combine kernels, no atomics). An
// autograd Function saves S, z, out and the constants (never phi) and
// launches the backward kernels. The host side (artifact parsing, launch
// geometry, memref argument packing) is tested without a GPU; the kernels'
// arithmetic is tested on the CPU through gpu-emulated.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_FUSEDCUDA_H
#define SPECTRA_RUNTIME_FUSEDCUDA_H

#include "runtime/Compiler.h"
#include "runtime/FusedCpu.h"
#include "runtime/KernelLaunch.h"
#include "runtime/Reference.h"

#include <torch/torch.h>

#include <array>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace spectra {

struct DecodeConstants;

/// The compiler's KernelArtifact (version 3) for one (feature map, target, dtype, dv):
/// the launch description generated from the outlined kernels, and their PTX.
struct GpuArtifact {
  std::string featureMap, target, dtype, ptx;
  std::string backwardError;  ///< why there are no backward kernels (the component's derivative)
  int64_t dv = 0;
  std::map<std::string, KernelAbi> kernels;  ///< by kind

  /// Parses the JSON libspectra-compiler returns; throws std::invalid_argument naming the field.
  static GpuArtifact fromJson(const std::string &text);
  /// The kernel of `kind`; throws std::invalid_argument naming the kinds there are.
  const KernelAbi &kernel(const std::string &kind) const;
};

/// The PTX target for a device of compute capability major.minor: sm_90a on
/// Hopper (9.0), sm_80 PTX (JIT-compiled forward by the driver) on other
/// sm_80+ devices; throws below sm_80.
std::string gpuTargetFor(int major, int minor);

/// An MLIR memref descriptor as the kernels take it: (allocated, aligned,
/// offset, sizes[R], strides[R]) flattened into launch parameters.
struct MemrefParams {
  void *allocated = nullptr, *aligned = nullptr;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  /// Appends pointers to each field to `params` (they must outlive the launch).
  void append(std::vector<void *> &params);
};
/// The descriptor of `t` with its own sizes and strides (the launch plan gives each
/// kernel operand the rank its ABI names).
MemrefParams memrefOf(const torch::Tensor &t);

/// The launch geometry of a kernel on its operands: launchGrid (KernelLaunch.h) checked
/// against CUDA's grid limits, and the ABI's threads as block.x.
struct CudaLaunchGeometry {
  std::array<unsigned, 3> grid{1, 1, 1}, block{1, 1, 1};
};
CudaLaunchGeometry cudaGeometry(const KernelAbi &abi, const std::vector<torch::Tensor> &operands);

class FusedCudaAttention {
public:
  /// Compiles (or loads from the cache) the kernels for `target` and q/k/v of `dtype`.
  using Compile = std::function<std::string(const std::string &target, const std::string &dtype,
                                             int64_t valueDim)>;
  FusedCudaAttention(Descriptor desc, Compile compile, bool causal = false);
  /// The kernels of a named variant / of a feature map in IR, compiled on first
  /// use per device target, dtype and value dimension through KernelCache; with `causal`,
  /// the causal kernels (as FusedCpuAttention's).
  static std::shared_ptr<FusedCudaAttention> forVariant(const std::string &variant,
                                                        const VariantConfig &config,
                                                        bool causal = false);
  static std::shared_ptr<FusedCudaAttention> fromIR(const std::string &ir,
                                                    const std::string &sourceName,
                                                    const std::string &featureMap = "",
                                                    bool causal = false);
  bool causal() const { return isCausal; }

  const Descriptor &descriptor() const { return reference.descriptor(); }

  /// Fused attention with autograd on CUDA tensors; f32, bf16 and f16 inputs
  /// run natively (f32 accumulation), f64 inputs run in f32.
  torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt,
                          std::optional<double> scale = std::nullopt,
                          const std::optional<torch::Tensor> &queryMask = std::nullopt) const {
    return attentionWithStats(q, k, v, weights, keyMask, scale, queryMask).out;
  }
  /// attention() and the denominator guard's count per (batch, head), on the device.
  AttentionResult attentionWithStats(const torch::Tensor &q, const torch::Tensor &k,
                                     const torch::Tensor &v, const Weights &weights,
                                     const std::optional<torch::Tensor> &keyMask = std::nullopt,
                                     std::optional<double> scale = std::nullopt,
                                     const std::optional<torch::Tensor> &queryMask = std::nullopt) const;

  /// Causal decoding by the compiled kernels (a causal kernel set; KernelLaunch.h's
  /// causalPrefill and causalDecode): the state a prompt k, v ends in, then one token per
  /// decode() call, the state (float32) advanced in place.
  DecodeState prefill(const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
                      const std::optional<torch::Tensor> &keyMask = std::nullopt) const;
  torch::Tensor decode(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const Weights &weights, DecodeState &state) const;

  FusedForward runForward(const FusedInputs &in) const;
  std::vector<torch::Tensor> runBackward(const FusedInputs &in, const FusedForward &saved,
                                         const torch::Tensor &gout) const;

  /// The launch plan's launcher for the device and dtype of `like` and value dimension dv.
  const KernelLauncher &launcher(const torch::Tensor &like, int64_t dv) const;

private:
  struct Loaded {
    GpuArtifact artifact;
    void *module = nullptr;
    std::map<std::string, void *> functions;  ///< by kind
    std::shared_ptr<const KernelLauncher> launcher;  ///< over artifact and functions
  };
  /// The artifact and module for the device and dtype of `t` and value dim `dv` (compiled/loaded once).
  const Loaded &kernelsFor(const torch::Tensor &t, int64_t dv) const;

  ReferenceFeatureMap reference;
  Compile compile;
  bool isCausal = false;
  mutable std::mutex mutex;
  mutable std::map<std::string, Loaded> loaded;  // by "device/target/dtype/dv"
  /// causal_decode's constant operands between steps (KernelLaunch.h).
  std::shared_ptr<DecodeConstants> decodeConstants;
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_FUSEDCUDA_H
