//===- FusedCpu.cpp - calling the fused CPU kernel -------------------------===//

#include "runtime/FusedCpu.h"
#include "runtime/KernelCache.h"

#include "codegen/spectra_compiler.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace spectra {
namespace {

/// MLIR's memref descriptor for a rank-R f32 memref (what the C interface takes).
template <int R>
struct MemRef {
  float *allocated;
  float *aligned;
  int64_t offset;
  int64_t sizes[R];
  int64_t strides[R];
};

template <int R>
MemRef<R> view(const torch::Tensor &t) {
  // The kernel's memrefs have unit inner stride and offset 0 (strided<[?, 1]>).
  TORCH_CHECK(t.stride(R - 1) == 1 || t.size(R - 1) == 1,
              "spectra fused CPU attention: internal error: a non-contiguous row reached the kernel");
  MemRef<R> m;
  m.allocated = m.aligned = t.data_ptr<float>();
  m.offset = 0;
  for (int i = 0; i < R; ++i) {
    m.sizes[i] = t.size(i);
    m.strides[i] = t.stride(i);
  }
  return m;
}

using ForwardFn = void (*)(MemRef<2> *q, MemRef<2> *k, MemRef<2> *v, MemRef<1> *keep, MemRef<2> *W,
                           MemRef<1> *rowscale, MemRef<1> *params, MemRef<2> *S, MemRef<1> *z,
                           MemRef<1> *zabs, MemRef<2> *out, MemRef<1> *shift, MemRef<2> *qstat);
using BackwardFn = void (*)(MemRef<2> *q, MemRef<2> *k, MemRef<2> *v, MemRef<1> *keep,
                            MemRef<2> *W, MemRef<1> *rowscale, MemRef<1> *params, MemRef<2> *S,
                            MemRef<1> *z, MemRef<2> *out, MemRef<1> *shift, MemRef<2> *qstat,
                            MemRef<2> *gout,
                            MemRef<2> *dq, MemRef<2> *dk, MemRef<2> *dv, MemRef<2> *dW,
                            MemRef<1> *dparams, MemRef<2> *dS, MemRef<1> *dz);

spectra_cpu_kernel *check(spectra_cpu_kernel *kernel, char *error) {
  if (!kernel) {
    std::string message = error ? error : "libspectra-compiler failed without a message";
    spectra_free(error);
    throw std::invalid_argument(message);
  }
  return kernel;
}

} // namespace

FusedCpuAttention::FusedCpuAttention(Descriptor desc, std::shared_ptr<spectra_cpu_kernel> k)
    : reference(std::move(desc)), kernel(std::move(k)) {}

FusedCpuAttention::FusedCpuAttention(const std::string &variant, const VariantConfig &config)
    : reference(describeVariant(variant, config)) {
  std::ostringstream options;
  options.precision(17);
  for (const auto &[key, value] : config.options)
    options << (options.tellp() > 0 ? "," : "") << key << "=" << value;
  kernel = KernelCache::instance().cpu(descriptor().component.canonical, descriptor().name, [&] {
    char *error = nullptr;
    // Two statements: argument evaluation order is unspecified, and `error` is set by the call.
    spectra_cpu_kernel *k = spectra_cpu_compile_variant(variant.c_str(), config.m, config.d,
                                                        config.seed, options.str().c_str(), &error);
    return check(k, error);
  });
}

FusedCpuAttention FusedCpuAttention::fromIR(const std::string &ir, const std::string &sourceName,
                                            const std::string &featureMap) {
  Descriptor desc = describeIR(ir, sourceName, featureMap);
  auto k = KernelCache::instance().cpu(desc.component.canonical, desc.name, [&] {
    char *error = nullptr;
    spectra_cpu_kernel *k = spectra_cpu_compile_ir(
        ir.c_str(), sourceName.c_str(), featureMap.empty() ? nullptr : featureMap.c_str(), &error);
    return check(k, error);
  });
  return FusedCpuAttention(std::move(desc), std::move(k));
}

FusedForward FusedCpuAttention::runForward(const FusedInputs &in) const {
  const torch::Tensor &qs = in.qs, &ks = in.ks, &vs = in.vs, &W = in.W, &params = in.params,
                      &keep = in.keep, &rowscale = in.rowscale;
  const int64_t B = qs.size(0), H = qs.size(1), Nq = qs.size(2), dv = vs.size(3);
  const int64_t F = descriptor().numFeatures();
  FusedForward result;
  result.out = torch::empty({B, H, Nq, dv}, torch::kFloat32);
  result.S = torch::empty({B, H, F, dv}, torch::kFloat32);
  result.z = torch::empty({B, H, F}, torch::kFloat32);
  result.zabs = torch::empty({B, H, F}, torch::kFloat32);
  result.shift = torch::empty({B, H, F}, torch::kFloat32);
  result.qstat = torch::empty({B, H, Nq, 3}, torch::kFloat32);
  auto fn = reinterpret_cast<ForwardFn>(spectra_cpu_kernel_forward(kernel.get()));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      int64_t b = bh / H, h = bh % H;
      MemRef<2> mq = view<2>(qs[b][h]), mk = view<2>(ks[b][h]), mv = view<2>(vs[b][h]);
      MemRef<2> mw = view<2>(W), mS = view<2>(result.S[b][h]), mo = view<2>(result.out[b][h]);
      MemRef<1> mkeep = view<1>(keep[b]), mrow = view<1>(rowscale), mp = view<1>(params[b][h]);
      MemRef<1> mz = view<1>(result.z[b][h]), mzabs = view<1>(result.zabs[b][h]);
      MemRef<1> mshift = view<1>(result.shift[b][h]);
      MemRef<2> mst = view<2>(result.qstat[b][h]);
      fn(&mq, &mk, &mv, &mkeep, &mw, &mrow, &mp, &mS, &mz, &mzabs, &mo, &mshift, &mst);
    }
  });
  result.guarded = result.qstat.select(3, 2).sum(2);
  return result;
}

std::vector<torch::Tensor> FusedCpuAttention::runBackward(const FusedInputs &in,
                                                          const FusedForward &saved,
                                                          const torch::Tensor &goutIn) const {
  const torch::Tensor &qs = in.qs, &ks = in.ks, &vs = in.vs, &W = in.W, &params = in.params,
                      &keep = in.keep, &rowscale = in.rowscale;
  const char *why = nullptr;
  auto fn = reinterpret_cast<BackwardFn>(spectra_cpu_kernel_backward(kernel.get(), &why));
  TORCH_CHECK(fn, "spectra fused CPU attention: no backward kernel for '", descriptor().name,
              "': ", why ? why : "");
  const int64_t B = qs.size(0), H = qs.size(1), F = descriptor().numFeatures();
  torch::Tensor gout = goutIn.to(torch::kFloat32).contiguous();
  torch::Tensor dq = torch::empty_like(qs), dk = torch::empty_like(ks), dv = torch::empty_like(vs);
  torch::Tensor dW = torch::empty({B * H, W.size(0), W.size(1)}, torch::kFloat32);
  torch::Tensor dparams = torch::empty_like(params);
  torch::Tensor dS = torch::empty({B * H, F, vs.size(3)}, torch::kFloat32);
  torch::Tensor dz = torch::empty({B * H, F}, torch::kFloat32);
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      int64_t b = bh / H, h = bh % H;
      MemRef<2> mq = view<2>(qs[b][h]), mk = view<2>(ks[b][h]), mv = view<2>(vs[b][h]);
      MemRef<2> mw = view<2>(W), mS = view<2>(saved.S[b][h]), mo = view<2>(saved.out[b][h]);
      MemRef<1> mkeep = view<1>(keep[b]), mrow = view<1>(rowscale), mp = view<1>(params[b][h]);
      MemRef<1> mz = view<1>(saved.z[b][h]), mshift = view<1>(saved.shift[b][h]);
      MemRef<2> mg = view<2>(gout[b][h]), mdq = view<2>(dq[b][h]), mdk = view<2>(dk[b][h]);
      MemRef<2> mdv = view<2>(dv[b][h]), mdW = view<2>(dW[bh]), mdS = view<2>(dS[bh]);
      MemRef<1> mdp = view<1>(dparams[b][h]), mdz = view<1>(dz[bh]);
      MemRef<2> mst = view<2>(saved.qstat[b][h]);
      fn(&mq, &mk, &mv, &mkeep, &mw, &mrow, &mp, &mS, &mz, &mo, &mshift, &mst, &mg, &mdq, &mdk,
         &mdv, &mdW, &mdp, &mdS, &mdz);
    }
  });
  return {dq, dk, dv, dW.sum(0), dparams};
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

std::string FusedCpuAttention::kernelIR(const std::string &stage) const {
  return spectra_cpu_kernel_ir(kernel.get(), stage.c_str());
}

FusedInputs prepareFusedInputs(const ReferenceFeatureMap &reference, const torch::Tensor &q,
                               const torch::Tensor &k, const torch::Tensor &v,
                               const Weights &weights, const std::optional<torch::Tensor> &keyMask,
                               std::optional<double> scale, torch::ScalarType inputType,
                               const std::optional<torch::Tensor> &queryMask, bool foldScales) {
  const Descriptor &desc = reference.descriptor();
  checkAttentionInputs(desc, q, k, v, weights, keyMask);
  const int64_t B = q.size(0), H = q.size(1), Nk = k.size(2), m = desc.m;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(q.device());
  double s = scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  // With grad mode on, autograd follows these LibTorch ops: normaliser, statistics,
  // parameters and input transforms.
  torch::Tensor qs = q.to(torch::kFloat32) * s, ks = k.to(torch::kFloat32) * s;
  ComponentParams p = reference.params(qs, ks, keyMask, queryMask);
  std::vector<torch::Tensor> scalars;
  for (const torch::Tensor &t : p.scalars)
    scalars.push_back(t.to(torch::kFloat32));
  FusedInputs out;
  if (foldScales) {
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
  } else {
    if (p.queryScale.defined()) {
      qs = qs * p.queryScale.to(torch::kFloat32).unsqueeze(2);
      ks = ks * p.keyScale.to(torch::kFloat32).unsqueeze(2);
    }
    out.qs = qs.to(inputType).contiguous();
    out.ks = ks.to(inputType).contiguous();
    // Empty, not undefined: autograd Function inputs must have a device.
    out.qscale = out.kscale = torch::empty({0}, f32);
  }
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
