//===- FusedCpu.h - the JIT-compiled fused CPU kernels ---------------------===//
//
// Calls the kernels libspectra-compiler JIT-compiles (codegen/TileKernels.h,
// spectra-cpu-pipeline) on (batch, head, row chunk) tasks with
// at::parallel_for. The component parameters come from the params program
// over the data statistics (evaluated with LibTorch here), the features
// themselves are computed inside the kernels, a tile at a time, and never
// stored.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_FUSEDCPU_H
#define SPECTRA_RUNTIME_FUSEDCPU_H

#include "runtime/Compiler.h"
#include "runtime/Reference.h"

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>

struct spectra_cpu_kernel;

namespace spectra {

class KernelLauncher;


/// The fused kernels' inputs: q, k, v unscaled in the kernels' dtype, W in f32,
/// the parameters [B, H, P] from the params program, the key mask as 1/0, the
/// row scales (m*a_i), and qscale/kscale [B, H, d] f32: the d^-1/4 normaliser
/// times SADERF's Psi or HCEXP's A, which the kernels apply in f32 to each row
/// they load (no scaled copy of q or k is made, and none is rounded to bf16).
struct FusedInputs {
  torch::Tensor qs, ks, vs, W, params, keep, rowscale, qscale, kscale;
};

/// Computes FusedInputs (autograd follows through the statistics, parameters and
/// transforms); q, k, v become `inputType`. The data statistics come from the compiled
/// moments kernels of `launcher` where it has them (else from LibTorch reductions).
FusedInputs prepareFusedInputs(const ReferenceFeatureMap &reference, const torch::Tensor &q,
                               const torch::Tensor &k, const torch::Tensor &v,
                               const Weights &weights, const std::optional<torch::Tensor> &keyMask,
                               std::optional<double> scale,
                               torch::ScalarType inputType = torch::kFloat32,
                               const std::optional<torch::Tensor> &queryMask = std::nullopt,
                               const KernelLauncher *launcher = nullptr);

/// What the forward saves for a backward: S, z and the stabiliser constants.
struct FusedForward {
  torch::Tensor out;      ///< [B, H, Nq, dv]
  torch::Tensor S;        ///< [B, H, outputs*m, dv]
  torch::Tensor z;        ///< [B, H, outputs*m]
  torch::Tensor shift;    ///< [B, H, outputs*m] each feature's key constant
  torch::Tensor qstat;    ///< [B, H, Nq, 3] each query's constant, guarded denominator, guard fired
  torch::Tensor zabs;     ///< [B, H, outputs*m] sum of |phi(k)| (the guard's scale)
  torch::Tensor guarded;  ///< [B, H] float32: queries whose denominator the guard replaced
};

/// The fused kernels of either target as an autograd node: forward saves the
/// inputs and what the kernels keep (S, z, out, constants; never phi),
/// backward launches the compiler-built backward kernels. `Kernels` provides
/// runForward(FusedInputs) and runBackward(FusedInputs, FusedForward, gout).
template <typename Kernels>
class FusedAttentionFunction
    : public torch::autograd::Function<FusedAttentionFunction<Kernels>> {
public:
  /// Returns {out, guarded}: guarded [B, H] counts the queries whose denominator the
  /// guard replaced (not differentiable).
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext *ctx,
                                              torch::Tensor qs, torch::Tensor ks, torch::Tensor vs,
                                              torch::Tensor W, torch::Tensor params,
                                              torch::Tensor keep, torch::Tensor rowscale,
                                              torch::Tensor qscale, torch::Tensor kscale,
                                              const Kernels *self) {
    TORCH_CHECK(!rowscale.requires_grad(),
                "spectra fused attention: learnable quadrature row weights are not supported "
                "(their gradient is not computed); use mode 'reference'");
    FusedInputs in{qs, ks, vs, W, params, keep, rowscale, qscale, kscale};
    FusedForward saved = self->runForward(in);
    ctx->save_for_backward({qs, ks, vs, W, params, keep, rowscale, qscale, kscale, saved.S,
                            saved.z, saved.out, saved.shift, saved.qstat, saved.zabs});
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->mark_non_differentiable({saved.guarded});
    return {saved.out, saved.guarded};
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    auto s = ctx->get_saved_variables();
    auto *self = reinterpret_cast<const Kernels *>(ctx->saved_data["self"].toInt());
    FusedInputs in{s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]};
    FusedForward saved{s[11], s[9], s[10], s[12], s[13], s[14], torch::Tensor()};
    torch::Tensor gout = grads[0].defined() ? grads[0] : torch::zeros_like(s[11]);
    // dq, dk (with respect to the unscaled inputs), dv, dW, dparams, dqscale, dkscale.
    std::vector<torch::Tensor> g = self->runBackward(in, saved, gout);
    // The input scales' gradients (SADERF's Psi, HCEXP's A carry the statistics' gradient):
    // dL/dscale_c = sum_n dL/dx_nc q_nc with x = q scale, summed by the backward kernels.
    torch::Tensor dqscale = ctx->needs_input_grad(7) ? g[5] : torch::Tensor();
    torch::Tensor dkscale = ctx->needs_input_grad(8) ? g[6] : torch::Tensor();
    return {g[0], g[1], g[2], g[3], g[4], torch::Tensor(), torch::Tensor(), dqscale, dkscale,
            torch::Tensor()};
  }
};

/// The fused CPU kernels (codegen/TileKernels.h), JIT-compiled by
/// libspectra-compiler for this host and run over (batch, head, row chunk)
/// tasks with at::parallel_for: row chunks of kChunkRows keys or queries, so
/// small batch-head counts still keep every thread busy; key chunks' S, z and
/// constants are merged in a fixed order (the result does not depend on the
/// thread count).
class FusedCpuAttention {
public:
  /// Rows of q or k per task.
  static constexpr int64_t kChunkRows = 1024;

  /// JIT-compiles the kernels of a named variant (for dv = d; other value
  /// dimensions compile on first use).
  FusedCpuAttention(const std::string &variant, const VariantConfig &config = {});
  /// JIT-compiles the kernels of a feature map declared in IR.
  static FusedCpuAttention fromIR(const std::string &ir, const std::string &sourceName = "<ir>",
                                  const std::string &featureMap = "");

  const Descriptor &descriptor() const { return reference.descriptor(); }

  /// Fused non-causal attention on CPU tensors (computed in float32).
  FusedForward forward(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const Weights &weights,
                       const std::optional<torch::Tensor> &keyMask = std::nullopt,
                       std::optional<double> scale = std::nullopt) const;

  /// Fused attention with autograd: the forward kernels run in a
  /// torch::autograd::Function whose backward is the compiler-built backward
  /// kernels (dq, dk, dv, dW and the parameters' gradient); LibTorch autograd
  /// carries these on through the normaliser, the input transforms, the
  /// statistics and W's learnable factors. Computed in float32.
  torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt,
                          std::optional<double> scale = std::nullopt,
                          const std::optional<torch::Tensor> &queryMask = std::nullopt) const {
    return attentionWithStats(q, k, v, weights, keyMask, scale, queryMask).out;
  }
  /// attention() and the denominator guard's count per (batch, head).
  AttentionResult attentionWithStats(const torch::Tensor &q, const torch::Tensor &k,
                                     const torch::Tensor &v, const Weights &weights,
                                     const std::optional<torch::Tensor> &keyMask = std::nullopt,
                                     std::optional<double> scale = std::nullopt,
                                     const std::optional<torch::Tensor> &queryMask = std::nullopt) const;

  /// Runs the kernels on prepared inputs (see attention()); used by its autograd Function.
  FusedForward runForward(const FusedInputs &in) const;
  /// Gradients w.r.t. qs, ks, vs, W (summed over slices), params [B, H, P], qscale and kscale.
  std::vector<torch::Tensor> runBackward(const FusedInputs &in, const FusedForward &saved,
                                         const torch::Tensor &gout) const;

  /// The launch plan's CPU launcher for value dimension dv (its kernels enumerated once;
  /// `like` is unused: the launchers of every target are found the same way).
  const KernelLauncher &launcher(const torch::Tensor &like, int64_t dv) const;

  /// The kernels' IR at a stage of spectra-cpu-pipeline ("tiles", "vectors", "llvm") for
  /// value dimension dv (0: d).
  std::string kernelIR(const std::string &stage, int64_t dv = 0) const;

private:
  using Compile = std::function<spectra_cpu_kernel *(int64_t dv)>;
  FusedCpuAttention(Descriptor desc, Compile compile);
  /// The kernels for value dimension dv (through the KernelCache, once per dv).
  spectra_cpu_kernel *kernelsFor(int64_t dv) const;


  struct Compiled {
    std::mutex mutex;
    std::map<int64_t, std::shared_ptr<spectra_cpu_kernel>> byValueDim;
    std::map<int64_t, std::shared_ptr<const KernelLauncher>> launchers;
  };
  ReferenceFeatureMap reference;
  Compile compile;
  std::shared_ptr<Compiled> compiled = std::make_shared<Compiled>();
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_FUSEDCPU_H
