//===- FusedCpu.cpp - calling the fused CPU kernel -------------------------===//

#include "runtime/FusedCpu.h"
#include "runtime/KernelCache.h"

#include "codegen/spectra_compiler.h"

#include <ATen/Parallel.h>

#include <algorithm>
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
  TORCH_CHECK(t.dim() == R && t.scalar_type() == torch::kFloat32 && t.stride(R - 1) == 1,
              "spectra fused CPU attention: internal error: a rank-", R,
              " f32 view with unit inner stride was expected, got ", t.sizes(), " ", t.strides());
  MemRef<R> m;
  m.allocated = m.aligned = t.data_ptr<float>();
  m.offset = 0;
  for (int i = 0; i < R; ++i) {
    m.sizes[i] = t.size(i);
    m.strides[i] = t.stride(i);
  }
  return m;
}

using M1 = MemRef<1> *;
using M2 = MemRef<2> *;
// The kernels' C interfaces, in the argument order of codegen/TileKernels.h.
using KvFn = void (*)(M2 k, M2 v, M1 keep, M2 Wt, M1 ww, M1 rowscale, M1 params, M2 S, M1 z,
                      M1 zabs, M1 c, M1 kscale);
using ReadoutFn = void (*)(M2 q, M2 Wt, M1 ww, M1 params, M2 S, M1 z, M1 zabs, M1 c, M2 out,
                           M2 qstat, M1 qscale);
using QueryBackwardFn = void (*)(M2 q, M2 Wt, M2 W, M1 ww, M1 params, M2 S, M2 St, M1 z, M1 c,
                                 M2 out, M2 gout, M2 qstat, M2 dq, M2 dS, M1 dz, M2 dW,
                                 M1 dparams, M1 qscale);
using KeyBackwardFn = void (*)(M2 k, M2 v, M1 keep, M2 Wt, M2 W, M1 ww, M1 rowscale, M1 params,
                               M1 c, M2 dS, M2 dSt, M1 dz, M2 dk, M2 dv, M2 dW, M1 dparams,
                               M1 kscale);

spectra_cpu_kernel *check(spectra_cpu_kernel *kernel, char *error) {
  if (!kernel) {
    std::string message = error ? error : "libspectra-compiler failed without a message";
    spectra_free(error);
    throw std::invalid_argument(message);
  }
  return kernel;
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

std::string optionsText(const VariantConfig &config) {
  std::ostringstream options;
  options.precision(17);
  for (const auto &[key, value] : config.options)
    options << (options.tellp() > 0 ? "," : "") << key << "=" << value;
  return options.str();
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
            variant.c_str(), config.m, config.d, config.seed, optionsText(config).c_str(), dv, &error);
        return check(k, error);
      }) {}

FusedCpuAttention FusedCpuAttention::fromIR(const std::string &ir, const std::string &sourceName,
                                            const std::string &featureMap) {
  return FusedCpuAttention(describeIR(ir, sourceName, featureMap), [=](int64_t dv) {
    char *error = nullptr;
    spectra_cpu_kernel *k = spectra_cpu_compile_ir(
        ir.c_str(), sourceName.c_str(), featureMap.empty() ? nullptr : featureMap.c_str(), dv, &error);
    return check(k, error);
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
  const torch::Tensor &qs = in.qs, &ks = in.ks, &vs = in.vs, &params = in.params,
                      &keep = in.keep, &rowscale = in.rowscale;
  const int64_t B = qs.size(0), H = qs.size(1), Nq = qs.size(2), Nk = ks.size(2), dv = vs.size(3);
  const int64_t F = descriptor().numFeatures();
  spectra_cpu_kernel *kernels = kernelsFor(dv);
  auto kv = reinterpret_cast<KvFn>(spectra_cpu_kernel_entry(kernels, "kv", nullptr));
  auto readout = reinterpret_cast<ReadoutFn>(spectra_cpu_kernel_entry(kernels, "readout", nullptr));
  torch::Tensor Wt = in.W.t().contiguous(), ww = in.W.square().sum(1).contiguous();
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);

  // Keys: S, z, zabs and the feature constants per row chunk, then merged.
  Chunks keys(Nk);
  torch::Tensor Sp = torch::empty({B, H, keys.count, F, dv}, f32),
                zp = torch::empty({B, H, keys.count, F}, f32), zabsp = torch::empty_like(zp),
                cp = torch::empty_like(zp);
  forTasks(B, H, keys.count, [&](int64_t b, int64_t h, int64_t c) {
    int64_t first = keys.first(c), rows = keys.rows(c);
    MemRef<2> mk = view<2>(ks[b][h].narrow(0, first, rows)), mv = view<2>(vs[b][h].narrow(0, first, rows)),
              mWt = view<2>(Wt), mS = view<2>(Sp[b][h][c]);
    MemRef<1> mkeep = view<1>(keep[b].narrow(0, first, rows)), mww = view<1>(ww),
              mrow = view<1>(rowscale), mp = view<1>(params[b][h]), mz = view<1>(zp[b][h][c]),
              mzabs = view<1>(zabsp[b][h][c]), mc = view<1>(cp[b][h][c]);
    MemRef<1> mscale = view<1>(in.kscale[b][h]);
    kv(&mk, &mv, &mkeep, &mWt, &mww, &mrow, &mp, &mS, &mz, &mzabs, &mc, &mscale);
  });
  FusedForward result;
  if (keys.count == 1) {
    result.S = Sp.select(2, 0);
    result.z = zp.select(2, 0);
    result.zabs = zabsp.select(2, 0);
    result.shift = cp.select(2, 0);
  } else {
    // c = max over chunks; a chunk no kept key reached (-inf) weighs 0.
    result.shift = cp.amax(2);
    torch::Tensor w = torch::where(torch::isinf(cp), torch::zeros_like(cp),
                                   torch::exp(cp - result.shift.unsqueeze(2)));
    result.S = (Sp * w.unsqueeze(-1)).sum(2);
    result.z = (zp * w).sum(2);
    result.zabs = (zabsp * w).sum(2);
  }
  // A feature no kept key reached (refused by checkAttentionInputs) keeps the constant 0.
  result.shift = torch::where(torch::isinf(result.shift), torch::zeros_like(result.shift),
                              result.shift)
                     .contiguous();
  result.S = result.S.contiguous();
  result.z = result.z.contiguous();
  result.zabs = result.zabs.contiguous();

  // Queries: independent rows.
  Chunks queries(Nq);
  result.out = torch::empty({B, H, Nq, dv}, f32);
  result.qstat = torch::empty({B, H, Nq, 3}, f32);
  forTasks(B, H, queries.count, [&](int64_t b, int64_t h, int64_t c) {
    int64_t first = queries.first(c), rows = queries.rows(c);
    MemRef<2> mq = view<2>(qs[b][h].narrow(0, first, rows)), mWt = view<2>(Wt),
              mS = view<2>(result.S[b][h]), mo = view<2>(result.out[b][h].narrow(0, first, rows)),
              mst = view<2>(result.qstat[b][h].narrow(0, first, rows));
    MemRef<1> mww = view<1>(ww), mp = view<1>(params[b][h]), mz = view<1>(result.z[b][h]),
              mzabs = view<1>(result.zabs[b][h]), mc = view<1>(result.shift[b][h]);
    MemRef<1> mscale = view<1>(in.qscale[b][h]);
    readout(&mq, &mWt, &mww, &mp, &mS, &mz, &mzabs, &mc, &mo, &mst, &mscale);
  });
  result.guarded = result.qstat.select(3, 2).sum(2);
  return result;
}

std::vector<torch::Tensor> FusedCpuAttention::runBackward(const FusedInputs &in,
                                                          const FusedForward &saved,
                                                          const torch::Tensor &goutIn) const {
  const torch::Tensor &qs = in.qs, &ks = in.ks, &vs = in.vs, &params = in.params,
                      &keep = in.keep, &rowscale = in.rowscale;
  const int64_t B = qs.size(0), H = qs.size(1), Nq = qs.size(2), Nk = ks.size(2), dv = vs.size(3);
  const int64_t F = descriptor().numFeatures(), M = in.W.size(0), D = in.W.size(1),
                P = params.size(2);
  spectra_cpu_kernel *kernels = kernelsFor(dv);
  const char *why = nullptr;
  auto queryBackward = reinterpret_cast<QueryBackwardFn>(
      spectra_cpu_kernel_entry(kernels, "query_backward", &why));
  auto keyBackward =
      reinterpret_cast<KeyBackwardFn>(spectra_cpu_kernel_entry(kernels, "key_backward", nullptr));
  TORCH_CHECK(queryBackward && keyBackward, "spectra fused CPU attention: no backward kernels for '",
              descriptor().name, "': ", why ? why : "");
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  torch::Tensor gout = goutIn.to(torch::kFloat32).contiguous();
  torch::Tensor W = in.W.contiguous(), Wt = in.W.t().contiguous(),
                ww = in.W.square().sum(1).contiguous();
  torch::Tensor St = saved.S.transpose(-1, -2).contiguous();

  // Queries: dq, and per chunk dS, dz and the query share of dW and dparams.
  Chunks queries(Nq);
  torch::Tensor dq = torch::empty_like(qs);
  torch::Tensor dSp = torch::empty({B, H, queries.count, F, dv}, f32),
                dzp = torch::empty({B, H, queries.count, F}, f32),
                dWq = torch::empty({B, H, queries.count, M, D}, f32),
                dpq = torch::empty({B, H, queries.count, P}, f32);
  forTasks(B, H, queries.count, [&](int64_t b, int64_t h, int64_t c) {
    int64_t first = queries.first(c), rows = queries.rows(c);
    auto rowsOf = [&](const torch::Tensor &t) { return view<2>(t[b][h].narrow(0, first, rows)); };
    MemRef<2> mq = rowsOf(qs), mWt = view<2>(Wt), mW = view<2>(W), mS = view<2>(saved.S[b][h]),
              mSt = view<2>(St[b][h]), mo = rowsOf(saved.out), mg = rowsOf(gout),
              mst = rowsOf(saved.qstat), mdq = rowsOf(dq), mdS = view<2>(dSp[b][h][c]),
              mdW = view<2>(dWq[b][h][c]);
    MemRef<1> mww = view<1>(ww), mp = view<1>(params[b][h]), mz = view<1>(saved.z[b][h]),
              mc = view<1>(saved.shift[b][h]), mdz = view<1>(dzp[b][h][c]),
              mdp = view<1>(dpq[b][h][c]);
    MemRef<1> mscale = view<1>(in.qscale[b][h]);
    queryBackward(&mq, &mWt, &mW, &mww, &mp, &mS, &mSt, &mz, &mc, &mo, &mg, &mst, &mdq, &mdS, &mdz,
                  &mdW, &mdp, &mscale);
  });
  torch::Tensor dS = dSp.sum(2), dz = dzp.sum(2).contiguous();
  torch::Tensor dSt = dS.transpose(-1, -2).contiguous();
  dS = dS.contiguous();

  // Keys: dk, dv, and the key share of dW and dparams.
  Chunks keys(Nk);
  torch::Tensor dk = torch::empty_like(ks), dvOut = torch::empty_like(vs);
  torch::Tensor dWk = torch::empty({B, H, keys.count, M, D}, f32),
                dpk = torch::empty({B, H, keys.count, P}, f32);
  forTasks(B, H, keys.count, [&](int64_t b, int64_t h, int64_t c) {
    int64_t first = keys.first(c), rows = keys.rows(c);
    auto rowsOf = [&](const torch::Tensor &t) { return view<2>(t[b][h].narrow(0, first, rows)); };
    MemRef<2> mk = rowsOf(ks), mv = rowsOf(vs), mWt = view<2>(Wt), mW = view<2>(W),
              mdS = view<2>(dS[b][h]), mdSt = view<2>(dSt[b][h]), mdk = rowsOf(dk),
              mdv = rowsOf(dvOut), mdW = view<2>(dWk[b][h][c]);
    MemRef<1> mkeep = view<1>(keep[b].narrow(0, first, rows)), mww = view<1>(ww),
              mrow = view<1>(rowscale), mp = view<1>(params[b][h]), mc = view<1>(saved.shift[b][h]),
              mdz = view<1>(dz[b][h]), mdp = view<1>(dpk[b][h][c]);
    MemRef<1> mscale = view<1>(in.kscale[b][h]);
    keyBackward(&mk, &mv, &mkeep, &mWt, &mW, &mww, &mrow, &mp, &mc, &mdS, &mdSt, &mdz, &mdk, &mdv,
                &mdW, &mdp, &mscale);
  });
  torch::Tensor dW = dWq.sum({0, 1, 2}) + dWk.sum({0, 1, 2});
  torch::Tensor dparams = dpq.sum(2) + dpk.sum(2);
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
