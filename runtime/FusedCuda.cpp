//===- FusedCuda.cpp - launching the fused GPU kernels --------------------===//

#include "runtime/FusedCuda.h"

#include "runtime/CudaDriver.h"
#include "runtime/KernelCache.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <stdexcept>

namespace spectra {

using json = nlohmann::json;

namespace {

[[noreturn]] void badArtifact(const std::string &what) {
  throw std::invalid_argument("GPU kernel artifact: " + what +
                              " (runtime and compiler library do not match?)");
}

std::vector<GpuKernelSpec> kernels(const json &list, const char *pass) {
  if (!list.is_array() || list.size() != 3)
    badArtifact(std::string("'") + pass + "' must list 3 kernels");
  std::vector<GpuKernelSpec> out;
  for (const json &k : list) {
    GpuKernelSpec s;
    s.name = k.at("name").get<std::string>();
    for (int i = 0; i < 3; ++i)
      s.block[i] = k.at("block").at(i).get<unsigned>();
    const json &grid = k.at("grid");
    s.rows = grid.at("x").at("rows").get<std::string>();
    s.perBlock = grid.at("x").at("per_block").get<int64_t>();
    s.gridZ = grid.at("z").get<int64_t>();
    if (grid.at("y").get<std::string>() != "batch_heads" || (s.rows != "keys" && s.rows != "queries") ||
        s.perBlock < 1 || s.gridZ < 1)
      badArtifact("kernel '" + s.name + "' has an unknown grid rule");
    s.sharedBytes = k.at("shared_bytes").get<unsigned>();
    s.args = k.at("args").get<std::vector<std::string>>();
    out.push_back(std::move(s));
  }
  return out;
}

/// Rank of each buffer as the kernels declare it (codegen/GpuKernel.cpp).
int64_t rankOf(const std::string &buffer) {
  static const std::map<std::string, int64_t> ranks = {
      {"q", 3},  {"k", 3},  {"v", 3},      {"out", 3},   {"gout", 3},   {"dq", 3},
      {"dk", 3}, {"dv", 3}, {"qstat", 3},  {"S", 3},     {"dS", 3},     {"dW", 3},
      {"z", 2},  {"dz", 2}, {"keep", 2},   {"W", 2},     {"params", 2}, {"dparams", 2},
      {"zabs", 2}, {"shift", 2}, {"qscale", 2}, {"kscale", 2}, {"rowscale", 1}, {"guarded", 1}};
  auto it = ranks.find(buffer);
  if (it == ranks.end())
    badArtifact("unknown kernel argument '" + buffer + "'");
  return it->second;
}

std::string dtypeName(torch::ScalarType t) {
  switch (t) {
  case torch::kBFloat16: return "bf16";
  case torch::kHalf: return "f16";
  default: return "f32";
  }
}

} // namespace

GpuArtifact GpuArtifact::fromJson(const std::string &text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error &e) {
    badArtifact(std::string("not valid JSON (") + e.what() + ")");
  }
  try {
    GpuArtifact a;
    if (root.at("version").get<int>() != 2)
      badArtifact("version " + root.at("version").dump() + " is not 2");
    a.featureMap = root.at("feature_map").get<std::string>();
    a.target = root.at("target").get<std::string>();
    a.dtype = root.at("dtype").get<std::string>();
    a.ptx = root.at("ptx").get<std::string>();
    a.m = root.at("m").get<int64_t>();
    a.d = root.at("d").get<int64_t>();
    a.dv = root.at("dv").get<int64_t>();
    a.outputs = root.at("outputs").get<int64_t>();
    a.params = root.at("params").get<int64_t>();
    a.forward = kernels(root.at("forward"), "forward");
    a.backward = kernels(root.at("backward"), "backward");
    for (const auto *pass : {&a.forward, &a.backward})
      for (const GpuKernelSpec &k : *pass)
        for (const std::string &arg : k.args)
          if (arg != "H")
            rankOf(arg);
    if (a.ptx.find(".entry " + a.forward[0].name) == std::string::npos)
      badArtifact("the PTX lacks kernel '" + a.forward[0].name + "'");
    return a;
  } catch (const json::exception &e) {
    badArtifact(e.what());
  }
}

std::array<unsigned, 3> GpuArtifact::grid(const GpuKernelSpec &kernel, int64_t batchHeads,
                                          int64_t queries, int64_t keys) {
  int64_t rows = kernel.rows == "keys" ? keys : queries;
  int64_t x = (rows + kernel.perBlock - 1) / kernel.perBlock;
  TORCH_CHECK(x <= std::numeric_limits<int32_t>::max() && batchHeads <= 65535,
              "spectra: ", rows, " rows or ", batchHeads, " batch-heads exceed the CUDA grid of kernel '",
              kernel.name, "'");
  return {static_cast<unsigned>(x), static_cast<unsigned>(batchHeads),
          static_cast<unsigned>(kernel.gridZ)};
}

std::string gpuTargetFor(int major, int minor) {
  TORCH_CHECK(major >= 8, "spectra: the fused GPU kernels need compute capability 8.0 or newer, "
                          "this device has ", major, ".", minor);
  // sm_90a PTX runs on 9.0 only; sm_80 PTX is compiled forward by the driver for any newer GPU.
  return major == 9 && minor == 0 ? "sm_90a" : "sm_80";
}

void MemrefParams::append(std::vector<void *> &params) {
  params.push_back(&allocated);
  params.push_back(&aligned);
  params.push_back(&offset);
  for (int64_t &s : sizes)
    params.push_back(&s);
  for (int64_t &s : strides)
    params.push_back(&s);
}

MemrefParams memrefOf(const torch::Tensor &t, int64_t rank) {
  TORCH_CHECK(t.is_contiguous(), "spectra: internal error: a non-contiguous buffer reached a GPU kernel");
  TORCH_CHECK(t.dim() >= rank, "spectra: internal error: buffer of rank ", t.dim(), " for a rank-",
              rank, " argument");
  MemrefParams m;
  m.allocated = m.aligned = t.data_ptr();
  int64_t lead = 1;
  for (int64_t i = 0; i <= t.dim() - rank; ++i)
    lead *= t.size(i);
  m.sizes.push_back(lead);
  for (int64_t i = t.dim() - rank + 1; i < t.dim(); ++i)
    m.sizes.push_back(t.size(i));
  m.strides.assign(rank, 1);
  for (int64_t i = rank - 2; i >= 0; --i)
    m.strides[i] = m.strides[i + 1] * m.sizes[i + 1];
  return m;
}

FusedCudaAttention::FusedCudaAttention(Descriptor desc, Compile compileFn)
    : reference(std::move(desc)), compile(std::move(compileFn)) {}

/// Compiles through the cache: the GPU kernels depend on the component, m, d,
/// the target, the dtype and the value dimension (not on the weights).
static FusedCudaAttention::Compile cached(const Descriptor &desc,
                                          std::function<std::string(const std::string &,
                                                                    const std::string &, int64_t)>
                                              compile) {
  std::string canonical = desc.component.canonical + "|m=" + std::to_string(desc.m) +
                          "|d=" + std::to_string(desc.d);
  return [canonical, name = desc.name, compile](const std::string &target,
                                                const std::string &dtype, int64_t dv) {
    return KernelCache::instance().gpu(canonical, name, target, dtype + "|dv=" + std::to_string(dv),
                                       [&] { return compile(target, dtype, dv); });
  };
}

std::shared_ptr<FusedCudaAttention> FusedCudaAttention::forVariant(const std::string &variant,
                                                                   const VariantConfig &config) {
  Descriptor desc = describeVariant(variant, config);
  auto compile = cached(desc, [variant, config](const std::string &target,
                                                const std::string &dtype, int64_t dv) {
    return compileGpuVariant(variant, config, target, dtype, dv);
  });
  return std::make_shared<FusedCudaAttention>(std::move(desc), std::move(compile));
}

std::shared_ptr<FusedCudaAttention> FusedCudaAttention::fromIR(const std::string &ir,
                                                               const std::string &sourceName,
                                                               const std::string &featureMap) {
  Descriptor desc = describeIR(ir, sourceName, featureMap);
  auto compile = cached(desc, [ir, sourceName, featureMap](const std::string &target,
                                                           const std::string &dtype, int64_t dv) {
    return compileGpuIR(ir, sourceName, featureMap, target, dtype, dv);
  });
  return std::make_shared<FusedCudaAttention>(std::move(desc), std::move(compile));
}

const FusedCudaAttention::Loaded &FusedCudaAttention::kernelsFor(const torch::Tensor &t,
                                                                 int64_t dv) const {
  int device = t.device().index();
  auto [major, minor] = cuda::computeCapability(device);
  std::string target = gpuTargetFor(major, minor);
  std::string dtype = dtypeName(t.scalar_type());
  std::string key = std::to_string(device) + "/" + target + "/" + dtype + "/" + std::to_string(dv);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(key);
  if (it != loaded.end())
    return it->second;
  Loaded l;
  l.artifact = GpuArtifact::fromJson(compile(target, dtype, dv));
  l.module = cuda::loadPtx(device, l.artifact.ptx, descriptor().name + " (" + target + ")");
  for (const auto *pass : {&l.artifact.forward, &l.artifact.backward})
    for (const GpuKernelSpec &k : *pass)
      l.functions[k.name] = cuda::getFunction(l.module, k.name);
  return loaded.emplace(key, std::move(l)).first->second;
}

void FusedCudaAttention::run(const Loaded &k, const std::vector<GpuKernelSpec> &kernels,
                             const std::map<std::string, torch::Tensor> &buffers, int64_t B,
                             int64_t H, int64_t Nq, int64_t Nk, int device) const {
  cuda::Stream stream = c10::cuda::getCurrentCUDAStream(device).stream();
  for (const GpuKernelSpec &kernel : kernels) {
    std::vector<MemrefParams> memrefs;
    memrefs.reserve(kernel.args.size());
    int64_t heads = H;
    std::vector<void *> params;
    for (const std::string &arg : kernel.args) {
      if (arg == "H") {
        params.push_back(&heads);
        continue;
      }
      auto it = buffers.find(arg);
      TORCH_CHECK(it != buffers.end(), "spectra: internal error: no buffer '", arg, "' for kernel '",
                  kernel.name, "'");
      memrefs.push_back(memrefOf(it->second, rankOf(arg)));
      memrefs.back().append(params);
    }
    std::array<unsigned, 3> grid = GpuArtifact::grid(kernel, B * H, Nq, Nk);
    cuda::launch(device, k.functions.at(kernel.name), kernel.name, grid.data(), kernel.block.data(),
                 /*sharedBytes=*/0, stream, params.data());
  }
}

/// The kernels' static shapes (W [m, d], rowscale [m], params [., P]) and
/// dtype must be the tensors': a mismatch would read out of bounds.
static void checkAgainstArtifact(const GpuArtifact &a, const FusedInputs &in) {
  TORCH_CHECK(in.W.size(0) == a.m && in.W.size(1) == a.d && in.rowscale.numel() == a.m &&
                  in.params.size(2) == a.params && in.qs.size(3) == a.d,
              "spectra: the GPU kernels of ", a.featureMap, " were built for m = ", a.m, ", d = ",
              a.d, ", ", a.params, " parameters; got W ", in.W.sizes(), ", rowscale ",
              in.rowscale.sizes(), ", params ", in.params.sizes(), ", q ", in.qs.sizes());
  TORCH_CHECK(a.dtype == dtypeName(in.qs.scalar_type()), "spectra: GPU kernels for ", a.dtype,
              " received ", in.qs.scalar_type(), " inputs");
}

FusedForward FusedCudaAttention::runForward(const FusedInputs &in) const {
  c10::cuda::CUDAGuard guard(in.qs.device());
  const Loaded &k = kernelsFor(in.qs, in.vs.size(3));
  checkAgainstArtifact(k.artifact, in);
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2);
  const int64_t F = descriptor().numFeatures(), dv = in.vs.size(3);
  TORCH_CHECK(dv == k.artifact.dv, "spectra: the GPU kernels of ", descriptor().name,
              " were built for value dimension ", k.artifact.dv, ", got ", dv);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device());
  FusedForward out;
  out.out = torch::empty({B, H, Nq, dv}, in.qs.options());
  out.S = torch::zeros({B, H, F, dv}, f32);
  out.z = torch::zeros({B, H, F}, f32);
  out.zabs = torch::zeros({B, H, F}, f32);
  out.shift = torch::full({B, H, F}, -std::numeric_limits<float>::infinity(), f32);
  out.guarded = torch::zeros({B, H}, f32);
  run(k, k.artifact.forward,
      {{"q", in.qs}, {"k", in.ks}, {"v", in.vs}, {"keep", in.keep}, {"W", in.W},
       {"rowscale", in.rowscale}, {"params", in.params}, {"shift", out.shift}, {"S", out.S},
       {"z", out.z}, {"zabs", out.zabs}, {"out", out.out}, {"guarded", out.guarded},
       {"qscale", in.qscale}, {"kscale", in.kscale}},
      B, H, Nq, Nk, in.qs.device().index());
  return out;
}

std::vector<torch::Tensor> FusedCudaAttention::runBackward(const FusedInputs &in,
                                                           const FusedForward &saved,
                                                           const torch::Tensor &goutIn) const {
  c10::cuda::CUDAGuard guard(in.qs.device());
  const Loaded &k = kernelsFor(in.qs, in.vs.size(3));
  checkAgainstArtifact(k.artifact, in);
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device());
  torch::Tensor gout = goutIn.to(in.qs.scalar_type()).contiguous();
  torch::Tensor dq = torch::zeros(in.qs.sizes(), f32), dk = torch::zeros(in.ks.sizes(), f32),
                dv = torch::zeros(in.vs.sizes(), f32);
  torch::Tensor dW = torch::zeros({B * H, in.W.size(0), in.W.size(1)}, f32);
  torch::Tensor dparams = torch::zeros(in.params.sizes(), f32);
  torch::Tensor dS = torch::zeros(saved.S.sizes(), f32), dz = torch::zeros(saved.z.sizes(), f32);
  torch::Tensor qstat = torch::empty({B, H, Nq, 3}, f32);
  run(k, k.artifact.backward,
      {{"q", in.qs}, {"k", in.ks}, {"v", in.vs}, {"keep", in.keep}, {"W", in.W},
       {"rowscale", in.rowscale}, {"params", in.params}, {"shift", saved.shift}, {"S", saved.S},
       {"z", saved.z}, {"zabs", saved.zabs}, {"out", saved.out}, {"gout", gout},
       {"qstat", qstat}, {"dS", dS}, {"qscale", in.qscale}, {"kscale", in.kscale},
       {"dz", dz}, {"dq", dq}, {"dk", dk}, {"dv", dv}, {"dW", dW}, {"dparams", dparams}},
      B, H, Nq, Nk, in.qs.device().index());
  // The kernels' dq and dk are with respect to the scaled rows x = q * qscale.
  return {(dq * in.qscale.unsqueeze(2)).to(in.qs.scalar_type()),
          (dk * in.kscale.unsqueeze(2)).to(in.ks.scalar_type()), dv.to(in.vs.scalar_type()),
          dW.sum(0), dparams};
}

AttentionResult FusedCudaAttention::attentionWithStats(
    const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
    const Weights &weights, const std::optional<torch::Tensor> &keyMask,
    std::optional<double> scale, const std::optional<torch::Tensor> &queryMask) const {
  TORCH_CHECK(q.is_cuda(), "spectra fused CUDA attention: inputs must be CUDA tensors, got ",
              q.device());
  torch::ScalarType type = q.scalar_type();
  if (type != torch::kBFloat16 && type != torch::kHalf)
    type = torch::kFloat32;
  Weights w = weights;
  w.W = w.W.to(q.device());
  if (w.rowWeights)
    w.rowWeights = w.rowWeights->to(q.device());
  FusedInputs in = prepareFusedInputs(reference, q, k, v, w, keyMask, scale, type, queryMask);
  auto out = FusedAttentionFunction<FusedCudaAttention>::apply(
      in.qs, in.ks, in.vs, in.W, in.params, in.keep, in.rowscale, in.qscale, in.kscale, this);
  return {out[0].to(q.scalar_type()), out[1]};
}

} // namespace spectra
