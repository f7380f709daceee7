//===- FusedCpu.cpp - calling the fused CPU kernel -------------------------===//

#include "runtime/FusedCpu.h"
#include "runtime/KernelLaunch.h"
#include "runtime/KernelCache.h"

#include "codegen/spectra_compiler.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace spectra {
namespace {

/// The kernel of `kind` and its generated ABI (codegen: spectra_cpu_kernel_abi).
std::pair<void *, KernelAbi> kernelOf(spectra_cpu_kernel *kernels, const char *kind,
                                      const std::string &name) {
  const char *why = nullptr;
  void *entry = spectra_cpu_kernel_entry(kernels, kind, &why);
  TORCH_CHECK(entry, "spectra fused CPU attention: no '", kind, "' kernel for '", name, "'",
              why && *why ? ": " : "", why ? why : "");
  KernelAbi abi = KernelAbi::parse(spectra_cpu_kernel_abi(kernels, kind));
  abi.kind = kind;
  return {entry, std::move(abi)};
}

/// Binds the kernel of `kind` to `buffers` by its ABI.
SliceCall bindKernel(spectra_cpu_kernel *kernels, const char *kind, const std::string &name,
               const std::map<std::string, torch::Tensor> &buffers) {
  auto [entry, abi] = kernelOf(kernels, kind, name);
  return SliceCall(entry, abi, buffers);
}

/// Row chunks of a sequence of n rows: [first, first + count) per chunk.
struct Chunks {
  int64_t n, count;
  explicit Chunks(int64_t n) : n(n), count(std::max<int64_t>(1, (n + FusedCpuAttention::kChunkRows - 1) /
                                                                     FusedCpuAttention::kChunkRows)) {}
  int64_t first(int64_t c) const { return c * FusedCpuAttention::kChunkRows; }
  int64_t rows(int64_t c) const {
    return std::max<int64_t>(0, std::min(FusedCpuAttention::kChunkRows, n - first(c)));
  }
};

/// Runs body(b, h, chunk) over every (batch, head, chunk) task on the intra-op threads.
void forTasks(int64_t B, int64_t H, int64_t chunks,
              const std::function<void(int64_t, int64_t, int64_t)> &body) {
  at::parallel_for(0, B * H * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task)
      body(task / (H * chunks), (task / chunks) % H, task % chunks);
  });
}

} // namespace

FusedCpuAttention::FusedCpuAttention(Descriptor desc, Compile c)
    : reference(std::move(desc)), compile(std::move(c)) {
  kernelsFor(descriptor().d);  // errors in the IR surface here, not on first use
}

FusedCpuAttention::FusedCpuAttention(const std::string &variant, const VariantConfig &config)
    : FusedCpuAttention(describeVariant(variant, config), [variant, config](int64_t dv) {
        char *error = nullptr;
        // Two statements: argument evaluation order is unspecified, and `error` is set by the call.
        spectra_cpu_kernel *k = spectra_cpu_compile_variant(
            variant.c_str(), config.m, config.d, config.seed, variantOptionsText(config).c_str(), dv, &error);
        return kernelOrThrow(k, error);
      }) {}

FusedCpuAttention FusedCpuAttention::fromIR(const std::string &ir, const std::string &sourceName,
                                            const std::string &featureMap) {
  return FusedCpuAttention(describeIR(ir, sourceName, featureMap), [=](int64_t dv) {
    char *error = nullptr;
    spectra_cpu_kernel *k = spectra_cpu_compile_ir(
        ir.c_str(), sourceName.c_str(), featureMap.empty() ? nullptr : featureMap.c_str(), dv, &error);
    return kernelOrThrow(k, error);
  });
}

spectra_cpu_kernel *FusedCpuAttention::kernelsFor(int64_t dv) const {
  std::lock_guard<std::mutex> lock(compiled->mutex);
  auto &kernel = compiled->byValueDim[dv];
  if (!kernel) {
    const Descriptor &desc = descriptor();
    std::string options = "m=" + std::to_string(desc.m) + "|d=" + std::to_string(desc.d) +
                          "|dv=" + std::to_string(dv);
    kernel = KernelCache::instance().cpu(desc.component.canonical, desc.name, options,
                                         [&] { return compile(dv); });
  }
  return kernel.get();
}

std::string FusedCpuAttention::kernelIR(const std::string &stage, int64_t dv) const {
  return spectra_cpu_kernel_ir(kernelsFor(dv > 0 ? dv : descriptor().d), stage.c_str());
}

FusedForward FusedCpuAttention::runForward(const FusedInputs &in) const {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2),
                dv = in.vs.size(3);
  const int64_t F = descriptor().numFeatures();
  const std::string &name = descriptor().name;
  spectra_cpu_kernel *kernels = kernelsFor(dv);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  std::map<std::string, torch::Tensor> buf = {
      {"k", in.ks}, {"v", in.vs}, {"q", in.qs}, {"keep", in.keep}, {"Wt", in.W.t().contiguous()},
      {"ww", in.W.square().sum(1).contiguous()}, {"rowscale", in.rowscale}, {"params", in.params},
      {"kscale", in.kscale}, {"qscale", in.qscale}};

  // Keys: S, z, zabs and the feature constants per row chunk, then merged in chunk order by
  // the compiled combine kernel (the split reduction's second stage, as on the GPU).
  Chunks keys(Nk);
  torch::Tensor Sp = torch::empty({B, H, keys.count, F, dv}, f32),
                zp = torch::empty({B, H, keys.count, F}, f32), zabsp = torch::empty_like(zp),
                cp = torch::empty_like(zp);
  std::map<std::string, torch::Tensor> kvBuf = buf;
  kvBuf.insert({{"S", Sp}, {"z", zp}, {"zabs", zabsp}, {"c", cp}});
  SliceCall kv = bindKernel(kernels, "kv", name, kvBuf);
  forTasks(B, H, keys.count, [&](int64_t b, int64_t h, int64_t c) {
    kv(b, h, c, keys.first(c), keys.rows(c));
  });
  FusedForward result;
  result.S = torch::empty({B, H, F, dv}, f32);
  result.z = torch::empty({B, H, F}, f32);
  result.zabs = torch::empty({B, H, F}, f32);
  result.shift = torch::empty({B, H, F}, f32);
  SliceCall combine = bindKernel(kernels, "kv_combine", name,
                           {{"Sp", Sp}, {"zp", zp}, {"zabsp", zabsp}, {"cp", cp}, {"S", result.S},
                            {"z", result.z}, {"zabs", result.zabs}, {"c", result.shift}});
  forTasks(B, H, 1, [&](int64_t b, int64_t h, int64_t) { combine(b, h, 0, 0, 0); });

  // Queries: independent rows.
  Chunks queries(Nq);
  result.out = torch::empty({B, H, Nq, dv}, f32);
  result.qstat = torch::empty({B, H, Nq, 3}, f32);
  buf.insert({{"S", result.S}, {"z", result.z}, {"zabs", result.zabs}, {"c", result.shift},
              {"out", result.out}, {"qstat", result.qstat}});
  SliceCall readout = bindKernel(kernels, "readout", name, buf);
  forTasks(B, H, queries.count, [&](int64_t b, int64_t h, int64_t c) {
    readout(b, h, c, queries.first(c), queries.rows(c));
  });
  result.guarded = result.qstat.select(3, 2).sum(2);
  return result;
}

std::vector<torch::Tensor> FusedCpuAttention::runBackward(const FusedInputs &in,
                                                          const FusedForward &saved,
                                                          const torch::Tensor &goutIn) const {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2),
                dv = in.vs.size(3);
  const int64_t F = descriptor().numFeatures(), M = in.W.size(0), D = in.W.size(1),
                P = in.params.size(2);
  const std::string &name = descriptor().name;
  spectra_cpu_kernel *kernels = kernelsFor(dv);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  Chunks queries(Nq), keys(Nk);
  const int64_t Cq = queries.count, Ck = keys.count;
  std::map<std::string, torch::Tensor> buf = {
      {"q", in.qs}, {"k", in.ks}, {"v", in.vs}, {"keep", in.keep}, {"W", in.W.contiguous()},
      {"Wt", in.W.t().contiguous()}, {"ww", in.W.square().sum(1).contiguous()},
      {"rowscale", in.rowscale}, {"params", in.params}, {"qscale", in.qscale},
      {"kscale", in.kscale}, {"S", saved.S}, {"St", saved.S.transpose(-1, -2).contiguous()},
      {"z", saved.z}, {"c", saved.shift}, {"out", saved.out}, {"qstat", saved.qstat},
      {"gout", goutIn.to(torch::kFloat32).contiguous()}};
  torch::Tensor dq = torch::empty_like(in.qs), dk = torch::empty_like(in.ks),
                dvOut = torch::empty_like(in.vs);
  // Every (slice, chunk) share of dW and dparams, the queries' chunks first, in one buffer each.
  torch::Tensor dWp = torch::empty({B, H, Cq + Ck, M, D}, f32),
                dpp = torch::empty({B, H, Cq + Ck, P}, f32);

  // Queries: dq, and per chunk dS, dz and the query share of dW and dparams.
  torch::Tensor dSp = torch::empty({B, H, Cq, F, dv}, f32), dzp = torch::empty({B, H, Cq, F}, f32);
  std::map<std::string, torch::Tensor> qBuf = buf;
  qBuf.insert({{"dq", dq}, {"dS", dSp}, {"dz", dzp}, {"dW", dWp.narrow(2, 0, Cq)},
               {"dparams", dpp.narrow(2, 0, Cq)}});
  SliceCall queryBackward = bindKernel(kernels, "query_backward", name, qBuf);
  forTasks(B, H, Cq, [&](int64_t b, int64_t h, int64_t c) {
    queryBackward(b, h, c, queries.first(c), queries.rows(c));
  });
  torch::Tensor dS = torch::empty({B, H, F, dv}, f32), dz = torch::empty({B, H, F}, f32);
  SliceCall dsummary = bindKernel(kernels, "dsummary_combine", name,
                            {{"dSp", dSp}, {"dzp", dzp}, {"dS", dS}, {"dz", dz}});
  forTasks(B, H, 1, [&](int64_t b, int64_t h, int64_t) { dsummary(b, h, 0, 0, 0); });

  // Keys: dk, dv, and the key share of dW and dparams.
  buf.insert({{"dS", dS}, {"dSt", dS.transpose(-1, -2).contiguous()}, {"dz", dz}, {"dk", dk},
              {"dv", dvOut}, {"dW", dWp.narrow(2, Cq, Ck)}, {"dparams", dpp.narrow(2, Cq, Ck)}});
  SliceCall keyBackward = bindKernel(kernels, "key_backward", name, buf);
  forTasks(B, H, Ck, [&](int64_t b, int64_t h, int64_t c) {
    keyBackward(b, h, c, keys.first(c), keys.rows(c));
  });
  // The shares summed in a fixed order by the compiled combine kernels.
  torch::Tensor dW = torch::empty({M, D}, f32), dparams = torch::empty({B, H, P}, f32);
  auto [dwEntry, dwAbi] = kernelOf(kernels, "dweights_combine", name);
  callHostKernel(dwEntry, dwAbi,
                 kernelOperands(dwAbi, {{"dWp", dWp.view({B * H * (Cq + Ck), M, D})}, {"dW", dW}}));
  SliceCall dparamsCombine =
      bindKernel(kernels, "dparams_combine", name, {{"dparamsp", dpp}, {"dparams", dparams}});
  forTasks(B, H, 1, [&](int64_t b, int64_t h, int64_t) { dparamsCombine(b, h, 0, 0, 0); });
  return {dq, dk, dvOut, dW, dparams};
}

AttentionResult FusedCpuAttention::attentionWithStats(
    const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
    const Weights &weights, const std::optional<torch::Tensor> &keyMask,
    std::optional<double> scale, const std::optional<torch::Tensor> &queryMask) const {
  TORCH_CHECK(q.device().is_cpu(), "spectra fused CPU attention: inputs must be CPU tensors, got ",
              q.device());
  FusedInputs p = prepareFusedInputs(reference, q, k, v, weights, keyMask, scale, torch::kFloat32,
                                     queryMask);
  auto out = FusedAttentionFunction<FusedCpuAttention>::apply(
      p.qs, p.ks, p.vs, p.W, p.params, p.keep, p.rowscale, p.qscale, p.kscale, this);
  return {out[0].to(q.scalar_type()), out[1]};
}

FusedInputs prepareFusedInputs(const ReferenceFeatureMap &reference, const torch::Tensor &q,
                               const torch::Tensor &k, const torch::Tensor &v,
                               const Weights &weights, const std::optional<torch::Tensor> &keyMask,
                               std::optional<double> scale, torch::ScalarType inputType,
                               const std::optional<torch::Tensor> &queryMask) {
  const Descriptor &desc = reference.descriptor();
  checkAttentionInputs(desc, q, k, v, weights, keyMask);
  const int64_t B = q.size(0), H = q.size(1), Nk = k.size(2), m = desc.m;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(q.device());
  double s = scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  // With grad mode on, autograd follows these LibTorch ops: statistics, parameters and input
  // transforms (the normaliser enters the statistics; no scaled copy of q or k is made).
  ComponentParams p = reference.params(q.to(torch::kFloat32), k.to(torch::kFloat32), keyMask,
                                       queryMask, s);
  std::vector<torch::Tensor> scalars;
  for (const torch::Tensor &t : p.scalars)
    scalars.push_back(t.to(torch::kFloat32));
  FusedInputs out;
  // The kernels scale rows in f32 after loading q and k in their own dtype.
  torch::Tensor qscale = torch::full({B, H, desc.d}, s, f32), kscale = qscale;
  if (p.queryScale.defined()) {
    qscale = qscale * p.queryScale.to(torch::kFloat32);
    kscale = kscale * p.keyScale.to(torch::kFloat32);
  }
  out.qs = q.to(inputType).contiguous();
  out.ks = k.to(inputType).contiguous();
  out.qscale = qscale.contiguous();
  out.kscale = kscale.contiguous();
  out.vs = v.to(inputType).contiguous();
  out.W = weights.W.to(f32).contiguous();
  out.params = scalars.empty() ? torch::zeros({B, H, 1}, f32)
                               : torch::stack(scalars, -1).contiguous();  // [B, H, P]
  out.keep = keyMask ? keyMask->to(f32).contiguous() : torch::ones({B, Nk}, f32);
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
  FusedInputs p = prepareFusedInputs(reference, q, k, v, weights, keyMask, scale);
  FusedForward result = runForward(p);
  result.out = result.out.to(q.scalar_type());
  return result;
}

} // namespace spectra
