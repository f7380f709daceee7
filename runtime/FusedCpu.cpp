//===- FusedCpu.cpp - calling the fused CPU kernel -------------------------===//

#include "runtime/FusedCpu.h"
#include "runtime/KernelLaunch.h"
#include "runtime/KernelCache.h"

#include "codegen/spectra_compiler.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace spectra {
namespace {

/// The leading dimensions the launch plan's batched buffers add to a per-slice kernel
/// argument of `role` (as the GPU schedule batches them, codegen/MapTilesToGpu.cpp).
int64_t batchDims(const std::string &role) {
  if (role == "rows" || role == "mask" || role == "slice")
    return 1;
  return role == "partial" ? 2 : 0;
}

/// The launch plan (KernelLaunch.h) run by the CPU kernels: each kernel is per slice (the CPU
/// schedule of the tile layer), so a launch runs its (slice, row chunk) tasks on the intra-op
/// threads; the plan sees the kernels batched, with kChunkRows rows per chunk.
struct CpuLauncher : KernelLauncher {
  struct Kernel {
    void *entry = nullptr;
    KernelAbi perSlice, batched;
  };
  std::map<std::string, Kernel> kernels;
  std::string name, backwardError;

  CpuLauncher(spectra_cpu_kernel *compiled, const std::string &name) : name(name) {
    for (auto &[kind, host] : hostKernels(compiled, &backwardError)) {
      Kernel k{host.entry, host.abi, host.abi};
      // The causal keys' backward runs per slice on the CPU (the threads are busy with slices;
      // one chunk needs no suffix summaries), per row chunk on a GPU (KernelLaunch.cpp).
      k.batched.chunkRows = kind == "causal_suffix" || kind == "causal_key_backward"
                                ? FusedCpuAttention::kWholeSequence
                                : FusedCpuAttention::kChunkRows;
      for (KernelArgSpec &arg : k.batched.args)
        arg.rank += batchDims(arg.role);
      kernels.emplace(kind, std::move(k));
    }
  }
  const Kernel &get(const std::string &kind) const {
    return kernelOfKind(kernels, kind, "spectra fused CPU attention", name, backwardError);
  }
  const KernelAbi &abi(const std::string &kind) const override { return get(kind).batched; }
  // The intra-op threads are kept busy by the slices alone: one task per slice does no
  // chunk summaries and no prefix scan.
  bool wholeSequencePerSlice(int64_t slices) const override {
    return slices >= at::get_num_threads();
  }
  bool has(const std::string &kind) const override { return kernels.count(kind) != 0; }
  void launch(const KernelAbi &abi, const std::vector<torch::Tensor> &operands) const override {
    const Kernel &k = get(abi.kind);
    std::array<int64_t, 3> grid = launchGrid(abi, operands);
    if (abi.grid == "one") {
      callHostKernel(k.entry, k.perSlice, operands);
      return;
    }
    SliceCall call(k.entry, k.perSlice, operands);
    int64_t n = 0;
    for (size_t i = 0; i < abi.args.size(); ++i)
      if (abi.args[i].role == "rows") {
        n = operands[i].size(1);
        break;
      }
    if (abi.grid == "slices") {  // a task per slice, over all of its rows
      runCpuTasks(grid[0], [&](int64_t slice) { call(slice, 0, 0, n); });
      return;
    }
    const int64_t chunks = grid[0], slices = grid[1];  // a task per (slice, row chunk)
    runCpuTasks(slices * chunks, [&](int64_t task) {
      int64_t slice = task / chunks, chunk = task % chunks, first = chunk * abi.chunkRows;
      call(slice, chunk, first, std::min(abi.chunkRows, n - first));
    });
  }
};

} // namespace

void runCpuTasks(int64_t total, const std::function<void(int64_t)> &task) {
  if (total <= 0)
    return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), total);
  std::atomic<int64_t> next{0};
  // Called once per thread, or once in all (nested in a parallel region, one thread): every
  // call drains the queue.
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < total; i = next.fetch_add(1))
      task(i);
  });
}

FusedCpuAttention::FusedCpuAttention(Descriptor desc, Compile c, bool causal)
    : reference(std::move(desc)), compile(std::move(c)), isCausal(causal),
      decodeConstants(std::make_shared<DecodeConstants>()) {
  kernelsFor(descriptor().d);  // errors in the IR surface here, not on first use
}

FusedCpuAttention::FusedCpuAttention(const std::string &variant, const VariantConfig &config,
                                     bool causal)
    : FusedCpuAttention(
          describeVariant(variant, config),
          [variant, config, causal](int64_t dv) {
            char *error = nullptr;
            // Two statements: argument evaluation order is unspecified, and `error` is set by
            // the call.
            spectra_cpu_kernel *k = spectra_cpu_compile_variant(
                variant.c_str(), config.m, config.d, config.seed,
                variantOptionsText(config).c_str(), dv, causal, &error);
            return kernelOrThrow(k, error);
          },
          causal) {}

FusedCpuAttention FusedCpuAttention::fromIR(const std::string &ir, const std::string &sourceName,
                                            const std::string &featureMap, bool causal) {
  return FusedCpuAttention(
      describeIR(ir, sourceName, featureMap),
      [=](int64_t dv) {
        char *error = nullptr;
        spectra_cpu_kernel *k = spectra_cpu_compile_ir(
            ir.c_str(), sourceName.c_str(), featureMap.empty() ? nullptr : featureMap.c_str(), dv,
            causal, &error);
        return kernelOrThrow(k, error);
      },
      causal);
}

spectra_cpu_kernel *FusedCpuAttention::kernelsFor(int64_t dv) const {
  std::lock_guard<std::mutex> lock(compiled->mutex);
  auto &kernel = compiled->byValueDim[dv];
  if (!kernel) {
    const Descriptor &desc = descriptor();
    std::string options = "m=" + std::to_string(desc.m) + "|d=" + std::to_string(desc.d) +
                          "|dv=" + std::to_string(dv) + (isCausal ? "|causal" : "") +
                          // Kernels for antipodal weights contract half of W: not a dense
                          // map's, though the component and sizes are the same.
                          (desc.antipodalPairs > 0
                               ? "|antipodal=" + std::to_string(desc.antipodalPairs)
                               : "");
    kernel = KernelCache::instance().cpu(desc.component.canonical, desc.name, options,
                                         [&] { return compile(dv); });
  }
  return kernel.get();
}

const KernelLauncher &FusedCpuAttention::launcher(const torch::Tensor &, int64_t dv) const {
  spectra_cpu_kernel *kernels = kernelsFor(dv);
  std::lock_guard<std::mutex> lock(compiled->mutex);
  auto &launcher = compiled->launchers[dv];
  if (!launcher)
    launcher = std::make_shared<CpuLauncher>(kernels, descriptor().name);
  return *launcher;
}

std::string FusedCpuAttention::kernelIR(const std::string &stage, int64_t dv) const {
  return spectra_cpu_kernel_ir(kernelsFor(dv > 0 ? dv : descriptor().d), stage.c_str());
}

FusedForward FusedCpuAttention::runForward(const FusedInputs &in) const {
  const KernelLauncher &l = launcher(in.qs, in.vs.size(3));
  return isCausal ? launchCausalForward(l, in, descriptor().numFeatures())
                  : launchForward(l, in, descriptor().numFeatures());
}

std::vector<torch::Tensor> FusedCpuAttention::runBackward(const FusedInputs &in,
                                                          const FusedForward &saved,
                                                          const torch::Tensor &gout) const {
  const KernelLauncher &l = launcher(in.qs, in.vs.size(3));
  return isCausal ? launchCausalBackward(l, in, saved, gout, descriptor().numFeatures())
                  : launchBackward(l, in, saved, gout.to(torch::kFloat32),
                                   descriptor().numFeatures());
}

AttentionResult FusedCpuAttention::attentionWithStats(
    const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
    const Weights &weights, const std::optional<torch::Tensor> &keyMask,
    std::optional<double> scale, const std::optional<torch::Tensor> &queryMask) const {
  TORCH_CHECK(q.device().is_cpu(), "spectra fused CPU attention: inputs must be CPU tensors, got ",
              q.device());
  const bool checkAfter = kernelsCheckValues();
  FusedInputs p = prepareFusedInputs(reference, q, k, v, weights, keyMask, scale, torch::kFloat32,
                                     queryMask, &launcher(q, v.size(3)), checkAfter);
  auto out = FusedAttentionFunction<FusedCpuAttention>::run(p, this);
  if (checkAfter)
    checkForwardValues(out[1], q, k, v);
  return {out[0].to(q.scalar_type()), out[1]};
}

void checkForwardValues(const torch::Tensor &guarded, const torch::Tensor &q,
                        const torch::Tensor &k, const torch::Tensor &v) {
  // The counts are small integers: their sum is finite unless one of them is NaN.
  if (!std::isfinite(guarded.sum().item<double>()))
    checkAttentionValues(q, k, v);
}

FusedInputs prepareFusedInputs(const ReferenceFeatureMap &reference, const torch::Tensor &q,
                               const torch::Tensor &k, const torch::Tensor &v,
                               const Weights &weights, const std::optional<torch::Tensor> &keyMask,
                               std::optional<double> scale, torch::ScalarType inputType,
                               const std::optional<torch::Tensor> &queryMask,
                               const KernelLauncher *launcher, bool valuesAfterKernels) {
  const Descriptor &desc = reference.descriptor();
  checkAttentionInputs(desc, q, k, v, weights, keyMask, valuesAfterKernels);
  const int64_t B = q.size(0), H = q.size(1), Nk = k.size(2), m = desc.m;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(q.device());
  double s = scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  FusedInputs out;
  out.qs = q.to(inputType).contiguous();
  out.ks = k.to(inputType).contiguous();
  // With grad mode on, autograd follows the statistics, parameters and input transforms (the
  // normaliser enters the statistics; no scaled copy of q or k is made). The statistics' one
  // pass over q and k is the compiled moments kernels' where the launcher has them.
  ComponentParams p;
  if (launcher && reference.usesStatistics() && launcher->has("moments")) {
    const int64_t Nq = q.size(2);
    ReferenceFeatureMap::queryWeights(queryMask, B, Nq, f32);  // the mask's checks
    // The masks per slice, made once for the moments kernels, both passes' launches and the
    // backward's moments (keepPerSlice).
    out.qkeep = queryMask ? keepPerSlice(*queryMask, H, f32) : keepAllPerSlice(B, H, Nq, f32);
    out.kkeep = keyMask ? keepPerSlice(*keyMask, H, f32) : keepAllPerSlice(B, H, Nk, f32);
    // The moments, as leaves of the parameters' graph (FusedInputs: the autograd node takes
    // their gradient back to q and k).
    bool grad = torch::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad());
    auto side = [&](const torch::Tensor &x, const torch::Tensor &keep, bool masked,
                    torch::Tensor &sum, torch::Tensor &sq) {
      std::array<torch::Tensor, 2> moments;
      {
        torch::NoGradGuard noGrad;
        moments = launchMoments(*launcher, x, x, keep);
      }
      sum = moments[0].requires_grad_(grad);
      sq = moments[1].requires_grad_(grad);
      // The kept rows [B, H, 1]: all of them without a mask.
      torch::Tensor count = masked ? keep.sum(-1, /*keepdim=*/true)
                                   : torch::full({B, H, 1}, static_cast<double>(x.size(2)), f32);
      return RowMoments{sum, sq, count};
    };
    // The params program compiled (its adjoint runs in the backward): the parameters and
    // input scales come from one per-slice kernel, not a LibTorch graph.
    const bool compiled =
        launcher->has("moments_params") && launcher->has("moments_params_backward");
    grad = grad && !compiled;
    RowMoments qm = side(out.qs, out.qkeep, queryMask.has_value(), out.qsum, out.qsq);
    RowMoments km = side(out.ks, out.kkeep, keyMask.has_value(), out.ksum, out.ksq);
    if (compiled) {
      out.pcounts = torch::cat({qm.count, km.count}, -1).contiguous();  // [B, H, 2]
      out.pscale = s;
      const int64_t P = std::max<int64_t>(1, desc.component.scalars.size());
      auto [params, qscale, kscale] = launchMomentsParams(
          *launcher, {out.qsum, out.qsq, out.ksum, out.ksq}, out.pcounts, s, P);
      out.params = params;
      out.qscale = qscale;
      out.kscale = kscale;
    } else {
      p = reference.paramsFromMoments(qm, km, B, H, s, f32);
    }
  } else {
    p = reference.params(q.to(torch::kFloat32), k.to(torch::kFloat32), keyMask, queryMask, s);
  }
  if (!out.params.defined()) {  // the parameters from LibTorch
    std::vector<torch::Tensor> scalars;
    for (const torch::Tensor &t : p.scalars)
      scalars.push_back(t.to(torch::kFloat32));
    // The kernels scale rows in f32 after loading q and k in their own dtype.
    torch::Tensor qscale = torch::full({B, H, desc.d}, s, f32), kscale = qscale;
    if (p.queryScale.defined()) {
      qscale = qscale * p.queryScale.to(torch::kFloat32);
      kscale = kscale * p.keyScale.to(torch::kFloat32);
    }
    out.qscale = qscale.contiguous();
    out.kscale = kscale.contiguous();
    out.params = scalars.empty() ? torch::zeros({B, H, 1}, f32)
                                 : torch::stack(scalars, -1).contiguous();  // [B, H, P]
  }
  out.vs = v.to(inputType).contiguous();
  out.W = weights.W.to(f32).contiguous();
  out.keep = out.kkeep.defined() ? out.kkeep
             : keyMask         ? keepPerSlice(*keyMask, H, f32)
                               : keepAllPerSlice(B, H, Nk, f32);
  out.rowscale = weights.rowWeights
                     ? (weights.rowWeights->to(f32) * static_cast<float>(m)).contiguous()
                     : torch::ones({m}, f32);
  return out;
}

FusedForward FusedCpuAttention::forward(const torch::Tensor &q, const torch::Tensor &k,
                                        const torch::Tensor &v, const Weights &weights,
                                        const std::optional<torch::Tensor> &keyMask,
                                        std::optional<double> scale) const {
  torch::NoGradGuard noGrad;
  TORCH_CHECK(q.device().is_cpu(), "spectra fused CPU attention: inputs must be CPU tensors, got ",
              q.device());
  const bool checkAfter = kernelsCheckValues();
  FusedInputs p = prepareFusedInputs(reference, q, k, v, weights, keyMask, scale, torch::kFloat32,
                                     std::nullopt, &launcher(q, v.size(3)), checkAfter);
  FusedForward result = runForward(p);
  if (checkAfter)
    checkForwardValues(result.guarded, q, k, v);
  result.out = result.out.to(q.scalar_type());
  return result;
}

DecodeState FusedCpuAttention::prefill(const torch::Tensor &k, const torch::Tensor &v,
                                       const Weights &weights,
                                       const std::optional<torch::Tensor> &keyMask) const {
  TORCH_CHECK(isCausal, "spectra fused CPU attention: prefill/decode need the causal kernels");
  TORCH_CHECK(k.device().is_cpu(), "spectra fused CPU attention: inputs must be CPU tensors, got ",
              k.device());
  return causalPrefill(reference, launcher(k, v.size(3)), torch::kFloat32, k, v, weights, keyMask);
}

torch::Tensor FusedCpuAttention::decode(const torch::Tensor &q, const torch::Tensor &k,
                                        const torch::Tensor &v, const Weights &weights,
                                        DecodeState &state) const {
  TORCH_CHECK(isCausal, "spectra fused CPU attention: prefill/decode need the causal kernels");
  TORCH_CHECK(q.device().is_cpu(), "spectra fused CPU attention: inputs must be CPU tensors, got ",
              q.device());
  return causalDecode(reference, launcher(q, v.size(3)), torch::kFloat32, q, k, v, weights, state,
                      std::nullopt, decodeConstants.get());
}

} // namespace spectra
