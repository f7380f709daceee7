//===- FusedCpu.cpp - calling the fused CPU kernel -------------------------===//

#include "runtime/FusedCpu.h"

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
                           MemRef<2> *out, MemRef<1> *shift);

spectra_cpu_kernel *check(spectra_cpu_kernel *kernel, char *error) {
  if (!kernel) {
    std::string message = error ? error : "libspectra-compiler failed without a message";
    spectra_free(error);
    throw std::invalid_argument(message);
  }
  return kernel;
}

} // namespace

FusedCpuAttention::FusedCpuAttention(Descriptor desc, spectra_cpu_kernel *k)
    : reference(std::move(desc)), kernel(k, spectra_cpu_kernel_free) {}

FusedCpuAttention::FusedCpuAttention(const std::string &variant, const VariantConfig &config)
    : reference(describeVariant(variant, config)) {
  std::ostringstream options;
  options.precision(17);
  for (const auto &[key, value] : config.options)
    options << (options.tellp() > 0 ? "," : "") << key << "=" << value;
  char *error = nullptr;
  kernel.reset(check(spectra_cpu_compile_variant(variant.c_str(), config.m, config.d, config.seed,
                                                 options.str().c_str(), &error),
                     error),
               spectra_cpu_kernel_free);
}

FusedCpuAttention FusedCpuAttention::fromIR(const std::string &ir, const std::string &sourceName,
                                            const std::string &featureMap) {
  Descriptor desc = describeIR(ir, sourceName, featureMap);
  char *error = nullptr;
  spectra_cpu_kernel *k = check(spectra_cpu_compile_ir(ir.c_str(), sourceName.c_str(),
                                                       featureMap.empty() ? nullptr
                                                                          : featureMap.c_str(),
                                                       &error),
                                error);
  return FusedCpuAttention(std::move(desc), k);
}

std::string FusedCpuAttention::kernelIR(const std::string &stage) const {
  return spectra_cpu_kernel_ir(kernel.get(), stage.c_str());
}

FusedForward FusedCpuAttention::forward(const torch::Tensor &q, const torch::Tensor &k,
                                        const torch::Tensor &v, const Weights &weights,
                                        const std::optional<torch::Tensor> &keyMask,
                                        std::optional<double> scale) const {
  const Descriptor &desc = descriptor();
  checkAttentionInputs(desc, q, k, v, weights, keyMask);
  TORCH_CHECK(q.device().is_cpu(), "spectra fused CPU attention: inputs must be CPU tensors, got ",
              q.device());
  torch::NoGradGuard noGrad;
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), Nk = k.size(2), dv = v.size(3);
  const int64_t m = desc.m, F = desc.numFeatures();
  double s = scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  torch::Tensor qs = q.to(torch::kFloat32) * s, ks = k.to(torch::kFloat32) * s;
  ComponentParams p = reference.params(qs, ks, keyMask);
  if (p.queryScale.defined()) {
    qs = qs * p.queryScale.to(torch::kFloat32).unsqueeze(2);
    ks = ks * p.keyScale.to(torch::kFloat32).unsqueeze(2);
  }
  qs = qs.contiguous();
  ks = ks.contiguous();
  torch::Tensor vs = v.to(torch::kFloat32).contiguous();
  torch::Tensor keep = keyMask ? keyMask->to(torch::kFloat32).contiguous()
                               : torch::ones({B, Nk}, torch::kFloat32);
  torch::Tensor W = weights.W.to(torch::kFloat32).contiguous();
  torch::Tensor rowscale = weights.rowWeights
                               ? (weights.rowWeights->to(torch::kFloat32) * static_cast<float>(m)).contiguous()
                               : torch::ones({m}, torch::kFloat32);
  std::vector<torch::Tensor> scalars;
  for (const torch::Tensor &t : p.scalars)
    scalars.push_back(t.to(torch::kFloat32));
  torch::Tensor params = scalars.empty() ? torch::zeros({B, H, 1}, torch::kFloat32)
                                         : torch::stack(scalars, -1).contiguous();  // [B, H, P]

  FusedForward result;
  result.out = torch::empty({B, H, Nq, dv}, torch::kFloat32);
  result.S = torch::empty({B, H, F, dv}, torch::kFloat32);
  result.z = torch::empty({B, H, F}, torch::kFloat32);
  result.shift = torch::empty({B, H}, torch::kFloat32);
  auto fn = reinterpret_cast<ForwardFn>(spectra_cpu_kernel_forward(kernel.get()));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      int64_t b = bh / H, h = bh % H;
      MemRef<2> mq = view<2>(qs[b][h]), mk = view<2>(ks[b][h]), mv = view<2>(vs[b][h]);
      MemRef<2> mw = view<2>(W), mS = view<2>(result.S[b][h]), mo = view<2>(result.out[b][h]);
      MemRef<1> mkeep = view<1>(keep[b]), mrow = view<1>(rowscale), mp = view<1>(params[b][h]);
      MemRef<1> mz = view<1>(result.z[b][h]), mshift = view<1>(result.shift[b].slice(0, h, h + 1));
      fn(&mq, &mk, &mv, &mkeep, &mw, &mrow, &mp, &mS, &mz, &mo, &mshift);
    }
  });
  result.out = result.out.to(q.scalar_type());
  return result;
}

} // namespace spectra
