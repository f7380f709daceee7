//===- FusedCpu.h - the JIT-compiled fused CPU kernels ---------------------===//
//
// Calls the kernels libspectra-compiler JIT-compiles (codegen/TileKernels.h,
// spectra-cpu-pipeline) on (batch, head, row chunk) tasks with
// at::parallel_for. The component parameters come from the params program
// over the data statistics (the moments_params kernel where the kernels have
// it, else evaluated with LibTorch here), the features themselves are
// computed inside the kernels, a tile at a time, and never stored.
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

struct DecodeConstants;

class KernelLauncher;


/// The fused kernels' inputs: q, k, v unscaled in the kernels' dtype, W in f32,
/// the parameters [B, H, P] from the params program, the key mask as 1/0 per slice
/// ([B, H, N], keepPerSlice), the row scales (m*a_i), and qscale/kscale [B, H, d]
/// f32: the d^-1/4 normaliser times SADERF's Psi or HCEXP's A, which the kernels
/// apply in f32 to each row they load (no scaled copy of q or k is made, and none
/// is rounded to bf16).
struct FusedInputs {
  torch::Tensor qs, ks, vs, W, params, keep, rowscale, qscale, kscale;
  /// With compiled statistics: each side's moments (sum and sum of squares per column,
  /// [B, H, d] f32), detached from q and k as leaves of the parameters' LibTorch graph, and
  /// the rows' keep weights per slice [B, H, N]. The autograd node carries the statistics'
  /// gradient back to q and k itself (moments_backward adds it to dq and dk in place), so
  /// autograd sums no second gradient path into q and k. Undefined without compiled
  /// statistics.
  torch::Tensor qsum, qsq, ksum, ksq, qkeep, kkeep;
  /// With compiled parameters (the moments_params kernel): the kept rows per side [B, H, 2]
  /// and the input scale the statistics apply; the parameters and scales are then the
  /// kernel's, not a LibTorch graph, and the backward runs moments_params_backward.
  /// Undefined (and 0) otherwise.
  torch::Tensor pcounts;
  double pscale = 0;
  /// Backward only: whether W's gradient is wanted (autograd's needs_input_grad for W). A
  /// fixed W (a buffer of the weight module) needs none: the backward kernels then skip the
  /// dW product (2 m d multiply-adds per row of the 9 m d a bidirectional backward does) and
  /// the combine, and dW comes back undefined.
  bool weightGrad = true;
};

/// Computes FusedInputs (autograd follows through the statistics, parameters and
/// transforms); q, k, v become `inputType`. The data statistics come from the compiled
/// moments kernels of `launcher` where it has them (else from LibTorch reductions).
/// `valuesAfterKernels`: the caller runs the bidirectional kernels and then
/// checkForwardValues (checkAttentionInputs' flag of the same name).
FusedInputs prepareFusedInputs(const ReferenceFeatureMap &reference, const torch::Tensor &q,
                               const torch::Tensor &k, const torch::Tensor &v,
                               const Weights &weights, const std::optional<torch::Tensor> &keyMask,
                               std::optional<double> scale,
                               torch::ScalarType inputType = torch::kFloat32,
                               const std::optional<torch::Tensor> &queryMask = std::nullopt,
                               const KernelLauncher *launcher = nullptr,
                               bool valuesAfterKernels = false);
/// After the bidirectional kernels ran on inputs prepared with valuesAfterKernels: their
/// guard counts [B, H] are NaN where some row of q, k or v was not (or, rarely, a finite
/// square overflowed); then the exact check of q, k and v (checkAttentionValues) decides.
void checkForwardValues(const torch::Tensor &guarded, const torch::Tensor &q,
                        const torch::Tensor &k, const torch::Tensor &v);

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
  /// Runs the node on prepared inputs: {out, guarded}.
  static torch::autograd::tensor_list run(const FusedInputs &p, const Kernels *self) {
    // Without compiled statistics, empty tensors stand for the moments (an autograd node's
    // tensor inputs must be defined).
    auto given = [](const torch::Tensor &t) { return t.defined() ? t : torch::empty({0}); };
    return FusedAttentionFunction::apply(p.qs, p.ks, p.vs, p.W, p.params, p.keep, p.rowscale,
                                         p.qscale, p.kscale, given(p.qsum), given(p.qsq),
                                         given(p.ksum), given(p.ksq), given(p.qkeep),
                                         given(p.kkeep), given(p.pcounts), p.pscale, self);
  }

  /// Returns {out, guarded}: guarded [B, H] counts the queries whose denominator the
  /// guard replaced (not differentiable).
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext *ctx,
                                              torch::Tensor qs, torch::Tensor ks, torch::Tensor vs,
                                              torch::Tensor W, torch::Tensor params,
                                              torch::Tensor keep, torch::Tensor rowscale,
                                              torch::Tensor qscale, torch::Tensor kscale,
                                              torch::Tensor qsum, torch::Tensor qsq,
                                              torch::Tensor ksum, torch::Tensor ksq,
                                              torch::Tensor qkeep, torch::Tensor kkeep,
                                              torch::Tensor pcounts, double pscale,
                                              const Kernels *self) {
    TORCH_CHECK(!rowscale.requires_grad(),
                "spectra fused attention: learnable quadrature row weights are not supported "
                "(their gradient is not computed); use mode 'reference'");
    FusedInputs in{qs, ks, vs, W, params, keep, rowscale, qscale, kscale};
    FusedForward saved = self->runForward(in);
    ctx->save_for_backward({qs, ks, vs, W, params, keep, rowscale, qscale, kscale, saved.S,
                            saved.z, saved.out, saved.shift, saved.qstat, saved.zabs, qsum, qsq,
                            ksum, ksq, qkeep, kkeep, pcounts});
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->saved_data["pscale"] = pscale;
    ctx->mark_non_differentiable({saved.guarded});
    return {saved.out, saved.guarded};
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "spectra fused attention: double backward (create_graph=True) is not supported; "
                "use mode 'reference'");
    auto s = ctx->get_saved_variables();
    auto *self = reinterpret_cast<const Kernels *>(ctx->saved_data["self"].toInt());
    FusedInputs in{s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]};
    in.weightGrad = ctx->needs_input_grad(3);
    FusedForward saved{s[11], s[9], s[10], s[12], s[13], s[14], torch::Tensor()};
    torch::Tensor gout = grads[0].defined() ? grads[0] : torch::zeros_like(s[11]);
    // dq, dk (with respect to the unscaled inputs), dv, dW, dparams, dqscale, dkscale; the
    // input scales' gradients (SADERF's Psi, HCEXP's A) summed by the backward kernels:
    // dL/dscale_c = sum_n dL/dx_nc q_nc with x = q scale.
    std::vector<torch::Tensor> g = self->runBackward(in, saved, gout);
    torch::Tensor dparams = ctx->needs_input_grad(4) ? g[4] : torch::Tensor();
    torch::Tensor dqscale = ctx->needs_input_grad(7) ? g[5] : torch::Tensor();
    torch::Tensor dkscale = ctx->needs_input_grad(8) ? g[6] : torch::Tensor();
    const torch::Tensor &qsum = s[15], &pcounts = s[21];
    if (pcounts.numel() > 0 && (ctx->needs_input_grad(0) || ctx->needs_input_grad(1))) {
      // Compiled parameters: their adjoint kernel gives the moments' gradients, which
      // moments_backward adds to dq and dk in place.
      const auto &launcher = self->launcher(s[0], s[2].size(3));
      std::array<torch::Tensor, 4> dm = launchMomentsParamsBackward(
          launcher, {s[15], s[16], s[17], s[18]}, pcounts, ctx->saved_data["pscale"].toDouble(),
          s[4].size(2), g[4], g[5], g[6]);
      if (ctx->needs_input_grad(0))
        launchMomentsBackward(launcher, s[0], s[19], dm[0], dm[1] * 2, g[0]);
      if (ctx->needs_input_grad(1))
        launchMomentsBackward(launcher, s[1], s[20], dm[2], dm[3] * 2, g[1]);
      dparams = dqscale = dkscale = torch::Tensor();  // consumed here
    } else if (qsum.numel() > 0 && qsum.requires_grad() &&
        (ctx->needs_input_grad(0) || ctx->needs_input_grad(1))) {
      // Compiled statistics: the parameters' gradient back through their small LibTorch
      // graph to the moments, then the moments' gradient added to dq and dk by the
      // moments_backward kernel (in place; no second gradient path into q and k). The
      // parameters' graph ends at the moments, not at q and k, so a backward asked for q or k
      // alone does not mark params, qscale and kscale as needed: their gradients are taken
      // from the kernels' results, not gated by needs_input_grad.
      std::vector<torch::Tensor> outputs, outputGrads;
      for (auto [t, gt] : {std::pair{s[4], g[4]}, {s[7], g[5]}, {s[8], g[6]}})
        if (t.requires_grad() && gt.defined()) {
          outputs.push_back(t);
          outputGrads.push_back(gt);
        }
      std::vector<torch::Tensor> leaves = {s[15], s[16], s[17], s[18]};
      std::vector<torch::Tensor> dm(4);
      if (!outputs.empty())
        dm = torch::autograd::grad(outputs, leaves, outputGrads, /*retain_graph=*/true,
                                   /*create_graph=*/false, /*allow_unused=*/true);
      const auto &launcher = self->launcher(s[0], s[2].size(3));  // a KernelLauncher
      auto addMoments = [&](torch::Tensor &dx, const torch::Tensor &x, const torch::Tensor &keep,
                            const torch::Tensor &dsum, const torch::Tensor &dsq) {
        if (!dx.defined() || (!dsum.defined() && !dsq.defined()))
          return;
        torch::Tensor zero = torch::zeros_like(leaves[0]);
        launchMomentsBackward(launcher, x, keep, dsum.defined() ? dsum : zero,
                              dsq.defined() ? dsq * 2 : zero, dx);
      };
      if (ctx->needs_input_grad(0))
        addMoments(g[0], s[0], s[19], dm[0], dm[1]);
      if (ctx->needs_input_grad(1))
        addMoments(g[1], s[1], s[20], dm[2], dm[3]);
      dparams = dqscale = dkscale = torch::Tensor();  // consumed here
    }
    return {g[0],    g[1],          g[2],          g[3],    dparams,         torch::Tensor(),
            torch::Tensor(), dqscale, dkscale, torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

/// Runs task(i) for every i in [0, total) on the intra-op threads, each thread claiming the
/// next task when it has finished one (the CPU launches' tasks: slices, or slices x row
/// chunks). A core that runs slower for a while (another process or guest on it, an
/// efficiency core) then takes fewer tasks, where a split fixed in advance leaves the other
/// threads waiting at the launch's end. Each task writes only its own outputs, so which
/// thread runs it does not change the result.
void runCpuTasks(int64_t total, const std::function<void(int64_t)> &task);

/// The fused CPU kernels (codegen/TileKernels.h), JIT-compiled by
/// libspectra-compiler for this host and run over (batch, head, row chunk)
/// tasks with runCpuTasks: row chunks of kChunkRows keys or queries, so
/// small batch-head counts still keep every thread busy; key chunks' S, z and
/// constants are merged in a fixed order (the bidirectional result does not
/// depend on the thread count; the causal plan runs each slice as one task when
/// there are at least as many slices as threads, which changes its rounding).
class FusedCpuAttention {
public:
  /// Rows of q or k per task.
  static constexpr int64_t kChunkRows = 1024;
  /// The rows per task of the causal keys' backward: the whole sequence.
  static constexpr int64_t kWholeSequence = int64_t(1) << 40;

  /// JIT-compiles the kernels of a named variant (for dv = d; other value
  /// dimensions compile on first use).
  /// With `causal`, the causal kernel set (CausalKernels.cpp): attention() is then causal
  /// attention, out_i over the keys j <= i (q and k of one length).
  FusedCpuAttention(const std::string &variant, const VariantConfig &config = {},
                    bool causal = false);
  /// JIT-compiles the kernels of a feature map declared in IR.
  static FusedCpuAttention fromIR(const std::string &ir, const std::string &sourceName = "<ir>",
                                  const std::string &featureMap = "", bool causal = false);

  /// Whether these are the causal kernels.
  bool causal() const { return isCausal; }
  /// Whether a call leaves the finiteness of q, k and v to the kernels (checkForwardValues):
  /// the bidirectional kernels carry the check, the causal ones do not, and a
  /// DeferredInputChecks scope keeps its own flags.
  bool kernelsCheckValues() const { return !isCausal && !DeferredInputChecks::active(); }

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

  /// Causal decoding by the compiled kernels (a causal kernel set; KernelLaunch.h's
  /// causalPrefill and causalDecode): the state a prompt k, v ends in, then one token per
  /// decode() call, the state (float32) advanced in place.
  DecodeState prefill(const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
                      const std::optional<torch::Tensor> &keyMask = std::nullopt) const;
  torch::Tensor decode(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const Weights &weights, DecodeState &state) const;

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
  FusedCpuAttention(Descriptor desc, Compile compile, bool causal);
  /// The kernels for value dimension dv (through the KernelCache, once per dv).
  spectra_cpu_kernel *kernelsFor(int64_t dv) const;


  struct Compiled {
    std::mutex mutex;
    std::map<int64_t, std::shared_ptr<spectra_cpu_kernel>> byValueDim;
    std::map<int64_t, std::shared_ptr<const KernelLauncher>> launchers;
  };
  ReferenceFeatureMap reference;
  Compile compile;
  bool isCausal = false;
  std::shared_ptr<Compiled> compiled = std::make_shared<Compiled>();
  /// causal_decode's constant operands between steps (KernelLaunch.h).
  std::shared_ptr<DecodeConstants> decodeConstants;
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_FUSEDCPU_H
