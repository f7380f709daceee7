//===- SpectralAttention.cpp - random-feature attention as a torch module -===//

#include "runtime/SpectralAttention.h"
#include "runtime/KernelLaunch.h"


#include <stdexcept>

namespace spectra {

AttentionMode parseAttentionMode(const std::string &name) {
  if (name == "fused")
    return AttentionMode::Fused;
  if (name == "reference")
    return AttentionMode::Reference;
  if (name == "gpu-emulated")
    return AttentionMode::GpuEmulated;
  throw std::invalid_argument("unknown attention mode '" + name +
                              "'; modes: fused (JIT-compiled kernels), reference (eager LibTorch), "
                              "gpu-emulated (the GPU kernels run on the CPU)");
}

std::string attentionModeName(AttentionMode mode) {
  switch (mode) {
  case AttentionMode::Fused: return "fused";
  case AttentionMode::Reference: return "reference";
  case AttentionMode::GpuEmulated: return "gpu-emulated";
  }
  return "fused";
}

static Descriptor describe(const SpectralAttentionOptions &o) {
  return o.ir.empty() ? describeVariant(o.variant, o.config)
                      : describeIR(o.ir, o.irSource, o.featureMap);
}

SpectralAttentionImpl::SpectralAttentionImpl(SpectralAttentionOptions opts)
    : options(std::move(opts)), reference(describe(options)), currentMode(options.mode) {
  TORCH_CHECK(!options.causal || !reference.usesStatistics(), "spectra causal attention: component '",
              descriptor().component.name, "' ", kCausalStatistics);
  weights = register_module("weights", RandomFeatureWeights(descriptor(), descriptor().seed));
}

const FusedCpuAttention &SpectralAttentionImpl::fusedCpu() {
  std::lock_guard<std::mutex> lock(compileMutex);
  if (!fused)
    fused = std::make_shared<FusedCpuAttention>(
        options.ir.empty()
            ? FusedCpuAttention(options.variant, options.config, options.causal)
            : FusedCpuAttention::fromIR(options.ir, options.irSource, options.featureMap,
                                        options.causal));
  return *fused;
}

torch::Tensor SpectralAttentionImpl::forward(const torch::Tensor &q, const torch::Tensor &k,
                                             const torch::Tensor &v,
                                             const std::optional<torch::Tensor> &keyMask,
                                             const std::optional<torch::Tensor> &queryMask) {
  return forwardWith(weights->weights(), q, k, v, keyMask, queryMask);
}

torch::Tensor SpectralAttentionImpl::forwardWith(const Weights &given, const torch::Tensor &q,
                                                 const torch::Tensor &k, const torch::Tensor &v,
                                                 const std::optional<torch::Tensor> &keyMask,
                                                 const std::optional<torch::Tensor> &queryMask) {
  Weights w = given;
  if (w.W.device() != q.device()) {
    // The weights follow the module's .to(); inputs elsewhere get a copy (differentiable).
    w.W = w.W.to(q.device());
    if (w.rowWeights)
      w.rowWeights = w.rowWeights->to(q.device());
  }
  AttentionResult result;
  if (currentMode == AttentionMode::Reference) {
    AttentionOptions attention;
    attention.queryMask = queryMask;
    attention.causal = options.causal;
    result = reference.attentionWithStats(q, k, v, w, keyMask, attention);
  } else if (currentMode == AttentionMode::GpuEmulated) {
    TORCH_CHECK(q.device().is_cpu(), "spectra: mode gpu-emulated runs the GPU kernels on the CPU; "
                "inputs are on ", q.device(), " (use mode fused on a GPU)");
    result = fusedEmulated(q.scalar_type()).attentionWithStats(q, k, v, w, keyMask, std::nullopt,
                                                               queryMask);
  } else if (q.is_cuda()) {
    result = fusedCuda().attentionWithStats(q, k, v, w, keyMask, std::nullopt, queryMask);
  } else {
    result = fusedCpu().attentionWithStats(q, k, v, w, keyMask, std::nullopt, queryMask);
  }
  torch::Tensor fired = result.guarded.sum().detach();
  std::lock_guard<std::mutex> lock(guardMutex);
  guard.guarded = guard.guarded.defined() && guard.guarded.device() == fired.device()
                      ? guard.guarded + fired
                      : fired;
  guard.queries += q.size(0) * q.size(1) * q.size(2);
  return result.out;
}

const FusedCudaAttention &SpectralAttentionImpl::fusedCuda() {
  std::lock_guard<std::mutex> lock(compileMutex);
  if (!fusedGpu)
    fusedGpu = options.ir.empty()
                   ? FusedCudaAttention::forVariant(options.variant, options.config, options.causal)
                   : FusedCudaAttention::fromIR(options.ir, options.irSource, options.featureMap,
                                                options.causal);
  return *fusedGpu;
}

const FusedEmulatedAttention &SpectralAttentionImpl::fusedEmulated(torch::ScalarType type) {
  // bf16 and f16 inputs run as such (accumulating in f32), everything else in f32.
  std::string dtype = elementName(type);
  std::lock_guard<std::mutex> lock(compileMutex);
  auto &kernels = emulated[dtype];
  if (!kernels)
    kernels = std::make_shared<FusedEmulatedAttention>(
        options.ir.empty()
            ? FusedEmulatedAttention(options.variant, options.config, dtype, options.causal)
            : FusedEmulatedAttention::fromIR(options.ir, options.irSource, options.featureMap,
                                             dtype, options.causal));
  return *kernels;
}

void SpectralAttentionImpl::redraw(int64_t seed) { weights->redraw(seed); }

namespace {
Weights weightsOn(const Weights &w, const torch::Device &device) {
  Weights out = w;
  out.W = w.W.detach().to(device);
  if (w.rowWeights)
    out.rowWeights = w.rowWeights->detach().to(device);
  return out;
}
} // namespace

DecodeState SpectralAttentionImpl::prefill(const torch::Tensor &k, const torch::Tensor &v,
                                           const std::optional<torch::Tensor> &keyMask) {
  return prefillWith(weights->weights(), k, v, keyMask);
}

torch::Tensor SpectralAttentionImpl::decode(const torch::Tensor &q, const torch::Tensor &k,
                                            const torch::Tensor &v, DecodeState &state) {
  return decodeWith(weights->weights(), q, k, v, state);
}

DecodeState SpectralAttentionImpl::prefillWith(const Weights &given, const torch::Tensor &k,
                                               const torch::Tensor &v,
                                               const std::optional<torch::Tensor> &keyMask) {
  TORCH_CHECK(options.causal, "spectra: prefill/decode need a causal module (options.causal)");
  Weights w = weightsOn(given, k.device());
  if (currentMode == AttentionMode::Reference)
    return reference.prefill(k, v, w, keyMask);
  if (currentMode == AttentionMode::GpuEmulated)
    return fusedEmulated(k.scalar_type()).prefill(k, v, w, keyMask);
  return k.is_cuda() ? fusedCuda().prefill(k, v, w, keyMask) : fusedCpu().prefill(k, v, w, keyMask);
}

torch::Tensor SpectralAttentionImpl::decodeWith(const Weights &given, const torch::Tensor &q,
                                                const torch::Tensor &k, const torch::Tensor &v,
                                                DecodeState &state) {
  TORCH_CHECK(options.causal, "spectra: prefill/decode need a causal module (options.causal)");
  Weights w = weightsOn(given, q.device());
  if (currentMode == AttentionMode::Reference)
    return reference.decode(q, k, v, w, state);
  if (currentMode == AttentionMode::GpuEmulated)
    return fusedEmulated(q.scalar_type()).decode(q, k, v, w, state);
  return q.is_cuda() ? fusedCuda().decode(q, k, v, w, state) : fusedCpu().decode(q, k, v, w, state);
}

} // namespace spectra
