//===- SpectralAttention.h - random-feature attention as a torch module ---===//
//
// What a model calls: `spectra::SpectralAttention` built from a variant name
// (`posrf-mm`, any `<component>-<weights>`) or from a user's IR declaring a
// new random feature. It owns the weights (RandomFeatureWeights: learnable
// factors are parameters, so state_dict and optimisers see them) and runs in
// one of three modes: `fused` (the JIT-compiled kernels, compiled on first use
// and cached by KernelCache, with the compiler-built backward), `reference`
// (the eager LibTorch oracle) or `gpu-emulated` (the GPU kernels on the CPU). `redraw(seed)` draws new weights without
// recompiling anything.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_SPECTRALATTENTION_H
#define SPECTRA_RUNTIME_SPECTRALATTENTION_H

#include "runtime/Compiler.h"
#include "runtime/FusedCpu.h"
#include "runtime/FusedCuda.h"
#include "runtime/FusedEmulated.h"
#include "runtime/Reference.h"
#include "runtime/WeightModule.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace spectra {

/// fused: the JIT-compiled kernels of the inputs' device (CPU kernels, or the GPU
/// kernels' PTX on CUDA); reference: eager LibTorch; gpu-emulated: the GPU kernels run
/// on the CPU (their mapped IR, the launch plan the CUDA launcher follows).
enum class AttentionMode { Fused, Reference, GpuEmulated };

/// "fused", "reference" or "gpu-emulated"; anything else throws std::invalid_argument
/// listing them.
AttentionMode parseAttentionMode(const std::string &name);
std::string attentionModeName(AttentionMode mode);

struct SpectralAttentionOptions {
  /// `<component>-<weights>`; ignored when `ir` is set.
  std::string variant = "posrf-mm";
  /// A user's spectra IR declaring the feature map (and its own component or recipe).
  std::string ir;
  std::string irSource = "<ir>";  ///< names `ir` in diagnostics
  std::string featureMap;         ///< which map of `ir` (empty: the only one)
  VariantConfig config;           ///< m, d, seed, component options (variants only)
  AttentionMode mode = AttentionMode::Fused;
  /// Causal attention (out_i over keys j <= i; q and k of one length): the causal kernels
  /// (CAUSAL-NOTES.md) in modes fused (CPU, CUDA) and gpu-emulated, the chunked reference in
  /// mode reference.
  /// Components whose parameters read sequence statistics are refused.
  bool causal = false;
};

class SpectralAttentionImpl : public torch::nn::Module {
public:
  explicit SpectralAttentionImpl(SpectralAttentionOptions options = {});

  /// Attention (causal when the options say so). q [B, H, Nq, d], k [B, H, Nk, d], v [B, H, Nk, dv],
  /// keyMask [B, Nk] bool (true = keep). q and k are scaled by d^(-1/4) inside,
  /// so the target kernel is softmax's. Returns [B, H, Nq, dv] in q's dtype.
  /// queryMask [B, Nq] (self-attention: the same padding) keeps padded queries
  /// out of the statistics that OPRF, SADERF and HCEXP parameters use.
  torch::Tensor forward(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                        const std::optional<torch::Tensor> &keyMask = std::nullopt,
                        const std::optional<torch::Tensor> &queryMask = std::nullopt);
  /// forward() with given weights (W [m, d], SGQ's row weights) in place of the module's own:
  /// what a caller that holds the weights itself (the Python package's modules) runs.
  /// Gradients reach `weights.W` when it requires grad.
  torch::Tensor forwardWith(const Weights &weights, const torch::Tensor &q, const torch::Tensor &k,
                            const torch::Tensor &v,
                            const std::optional<torch::Tensor> &keyMask = std::nullopt,
                            const std::optional<torch::Tensor> &queryMask = std::nullopt);

  /// Recurrent decoding (causal modules): the state after a prompt's keys and values
  /// [B, H, N, .] (what a causal pass over them ends in), then one token per decode() call:
  /// q, k [B, H, 1, d], v [B, H, 1, dv] -> [B, H, 1, dv], equal to forward() of the whole
  /// sequence at that position, in O(m (d + dv)) work per token whatever the length. The
  /// module's mode picks who runs them: the compiled kernels (kv + kv_combine for the prompt,
  /// causal_decode per token; float32 state, advanced in place) in modes fused and
  /// gpu-emulated, eager LibTorch in mode reference (float64 for float64 inputs).
  DecodeState prefill(const torch::Tensor &k, const torch::Tensor &v,
                      const std::optional<torch::Tensor> &keyMask = std::nullopt);
  torch::Tensor decode(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       DecodeState &state);
  /// prefill() and decode() with given weights (as forwardWith: the Python package's modules
  /// hold their own).
  DecodeState prefillWith(const Weights &weights, const torch::Tensor &k, const torch::Tensor &v,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt);
  torch::Tensor decodeWith(const Weights &weights, const torch::Tensor &q, const torch::Tensor &k,
                           const torch::Tensor &v, DecodeState &state);

  /// New weights from `seed`; the compiled kernels are kept.
  void redraw(int64_t seed);

  /// How often the denominator guard (kDenominatorGuard, Reference.h) fired since the last
  /// reset: queries guarded (a tensor on the inputs' device, so forward never synchronises;
  /// undefined before the first call) and queries computed.
  struct GuardStats {
    torch::Tensor guarded;
    int64_t queries = 0;
  };
  GuardStats guardStats() const {
    std::lock_guard<std::mutex> lock(guardMutex);
    return guard;
  }
  void resetGuardStats() {
    std::lock_guard<std::mutex> lock(guardMutex);
    guard = {};
  }
  void setMode(AttentionMode mode) { currentMode = mode; }
  AttentionMode mode() const { return currentMode; }
  bool causal() const { return options.causal; }
  const Descriptor &descriptor() const { return reference.descriptor(); }
  /// The fused CPU kernels, JIT-compiled (or loaded from the cache) on first use.
  const FusedCpuAttention &fusedCpu();
  /// The fused GPU kernels (PTX per device target and dtype, compiled or cached on first use).
  const FusedCudaAttention &fusedCuda();
  /// The GPU kernels run on the CPU for inputs of `type` (bf16, f16; others as f32).
  const FusedEmulatedAttention &fusedEmulated(torch::ScalarType type);

  RandomFeatureWeights weights{nullptr};

private:
  SpectralAttentionOptions options;
  ReferenceFeatureMap reference;
  AttentionMode currentMode;
  std::shared_ptr<FusedCpuAttention> fused;
  std::shared_ptr<FusedCudaAttention> fusedGpu;
  std::map<std::string, std::shared_ptr<FusedEmulatedAttention>> emulated;  // by dtype
  std::mutex compileMutex;  ///< first-use compilation from several threads
  mutable std::mutex guardMutex;  ///< forward() from several threads (torch.ops callers)
  GuardStats guard;
};
TORCH_MODULE(SpectralAttention);

} // namespace spectra

#endif // SPECTRA_RUNTIME_SPECTRALATTENTION_H
