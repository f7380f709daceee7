//===- FusedEmulated.cpp - the GPU kernels run on the CPU (gpu-emulated) ---===//

#include "runtime/FusedEmulated.h"

#include "codegen/spectra_compiler.h"

#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace spectra {

namespace {
/// The launch plan's kernels run on the CPU.
struct EmulatedLauncher : KernelLauncher {
  const std::map<std::string, HostKernel> &byKind;
  std::string name, backwardError;
  EmulatedLauncher(const std::map<std::string, HostKernel> &byKind, std::string name,
                   std::string backwardError)
      : byKind(byKind), name(std::move(name)), backwardError(std::move(backwardError)) {}
  const HostKernel &get(const std::string &kind) const {
    return kernelOfKind(byKind, kind, "spectra gpu-emulated attention", name, backwardError);
  }
  const KernelAbi &abi(const std::string &kind) const override { return get(kind).abi; }
  bool has(const std::string &kind) const override { return byKind.count(kind) != 0; }
  // The chunking a GPU would get: an H100 SXM's 132 SMs x kChunkBlocksPerSm, or
  // SPECTRA_GPU_BLOCKS (a positive count; read at each launch, so tests can vary it).
  int64_t targetBlocks() const override {
    return gpuBlocksFromEnvironment("spectra gpu-emulated attention").value_or(kChunkBlocksPerSm * 132);
  }
  void launch(const KernelAbi &abi, const std::vector<torch::Tensor> &operands) const override {
    callHostKernel(get(abi.kind).entry, abi, operands);
  }
};
} // namespace

struct FusedEmulatedAttention::Kernels {
  spectra_cpu_kernel *handle = nullptr;
  std::map<std::string, HostKernel> byKind;
  std::string backwardError;
  std::unique_ptr<EmulatedLauncher> launcher;  ///< over byKind
  ~Kernels() { spectra_cpu_kernel_free(handle); }
};



FusedEmulatedAttention::FusedEmulatedAttention(Descriptor desc, Compile c, std::string dtype,
                                               bool causal)
    : reference(std::move(desc)), compile(std::move(c)), inputType(std::move(dtype)),
      isCausal(causal), decodeConstants(std::make_shared<DecodeConstants>()) {
  scalarTypeOf(inputType);
  kernelsFor(descriptor().d);
}

FusedEmulatedAttention::FusedEmulatedAttention(const std::string &variant,
                                               const VariantConfig &config,
                                               const std::string &dtype, bool causal)
    : FusedEmulatedAttention(
          describeVariant(variant, config),
          [variant, config, dtype, causal](int64_t dv) {
            char *error = nullptr;
            spectra_cpu_kernel *k = spectra_emulated_compile_variant(
                variant.c_str(), config.m, config.d, config.seed, variantOptionsText(config).c_str(),
                dtype.c_str(), dv, causal, &error);
            return kernelOrThrow(k, error);
          },
          dtype, causal) {}

FusedEmulatedAttention FusedEmulatedAttention::fromIR(const std::string &ir,
                                                      const std::string &sourceName,
                                                      const std::string &featureMap,
                                                      const std::string &dtype, bool causal) {
  return FusedEmulatedAttention(
      describeIR(ir, sourceName, featureMap),
      [=](int64_t dv) {
        char *error = nullptr;
        spectra_cpu_kernel *k = spectra_emulated_compile_ir(
            ir.c_str(), sourceName.c_str(), featureMap.empty() ? nullptr : featureMap.c_str(),
            dtype.c_str(), dv, causal, &error);
        return kernelOrThrow(k, error);
      },
      dtype, causal);
}

const FusedEmulatedAttention::Kernels &FusedEmulatedAttention::kernelsFor(int64_t dv) const {
  std::lock_guard<std::mutex> lock(compiled->mutex);
  auto &kernels = compiled->byValueDim[dv];
  if (!kernels) {
    auto k = std::make_shared<Kernels>();
    k->handle = compile(dv);
    k->byKind = hostKernels(k->handle, &k->backwardError);
    k->launcher = std::make_unique<EmulatedLauncher>(k->byKind, descriptor().name, k->backwardError);
    kernels = std::move(k);
  }
  return *kernels;
}

const KernelLauncher &FusedEmulatedAttention::launcher(const torch::Tensor &, int64_t dv) const {
  return *kernelsFor(dv).launcher;
}

std::string FusedEmulatedAttention::kernelIR(const std::string &stage, int64_t dv) const {
  return spectra_cpu_kernel_ir(kernelsFor(dv > 0 ? dv : descriptor().d).handle, stage.c_str());
}


FusedForward FusedEmulatedAttention::runForward(const FusedInputs &in) const {
  const KernelLauncher &l = launcher(in.qs, in.vs.size(3));
  return isCausal ? launchCausalForward(l, in, descriptor().numFeatures())
                  : launchForward(l, in, descriptor().numFeatures());
}

std::vector<torch::Tensor> FusedEmulatedAttention::runBackward(const FusedInputs &in,
                                                               const FusedForward &saved,
                                                               const torch::Tensor &gout) const {
  const KernelLauncher &l = launcher(in.qs, in.vs.size(3));
  return isCausal ? launchCausalBackward(l, in, saved, gout, descriptor().numFeatures())
                  : launchBackward(l, in, saved, gout, descriptor().numFeatures());
}

AttentionResult FusedEmulatedAttention::attentionWithStats(
    const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
    const std::optional<torch::Tensor> &keyMask, std::optional<double> scale,
    const std::optional<torch::Tensor> &queryMask) const {
  TORCH_CHECK(q.device().is_cpu(),
              "spectra gpu-emulated attention runs on the CPU: inputs must be CPU tensors, got ",
              q.device());
  const bool checkAfter = kernelsCheckValues();
  FusedInputs p = prepareFusedInputs(reference, q, k, v, weights, keyMask, scale,
                                     scalarTypeOf(inputType), queryMask, &launcher(q, v.size(3)),
                                     checkAfter);
  auto out = FusedAttentionFunction<FusedEmulatedAttention>::run(p, this);
  if (checkAfter)
    checkForwardValues(out[1], q, k, v);
  return {out[0].to(q.scalar_type()), out[1]};
}

DecodeState FusedEmulatedAttention::prefill(const torch::Tensor &k, const torch::Tensor &v,
                                            const Weights &weights,
                                            const std::optional<torch::Tensor> &keyMask) const {
  TORCH_CHECK(isCausal, "spectra gpu-emulated attention: prefill/decode need the causal kernels");
  TORCH_CHECK(k.device().is_cpu(),
              "spectra gpu-emulated attention: inputs must be CPU tensors, got ", k.device());
  return causalPrefill(reference, launcher(k, v.size(3)), scalarTypeOf(inputType), k, v, weights,
                       keyMask);
}

torch::Tensor FusedEmulatedAttention::decode(const torch::Tensor &q, const torch::Tensor &k,
                                             const torch::Tensor &v, const Weights &weights,
                                             DecodeState &state) const {
  TORCH_CHECK(isCausal, "spectra gpu-emulated attention: prefill/decode need the causal kernels");
  TORCH_CHECK(q.device().is_cpu(),
              "spectra gpu-emulated attention: inputs must be CPU tensors, got ", q.device());
  return causalDecode(reference, launcher(q, v.size(3)), scalarTypeOf(inputType), q, k, v, weights,
                      state, std::nullopt, decodeConstants.get());
}

} // namespace spectra
