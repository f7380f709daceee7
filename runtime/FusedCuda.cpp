//===- FusedCuda.cpp - launching the fused GPU kernels --------------------===//

#include "runtime/FusedCuda.h"

#include "runtime/CudaDriver.h"
#include "runtime/KernelCache.h"
#include "codegen/spectra_compiler.h"

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

KernelAbi kernelOf(const json &k) {
  KernelAbi abi;
  abi.kind = k.at("kind").get<std::string>();
  abi.name = k.at("name").get<std::string>();
  abi.grid = k.at("grid").get<std::string>();
  abi.threads = k.at("block").get<int64_t>();
  abi.chunkRows = k.at("chunk_rows").get<int64_t>();
  abi.tileRows = k.value("tile_rows", int64_t(0));
  if (k.contains("chunks")) {
    if (k.at("chunks").get<std::string>() != "partials" || abi.tileRows <= 0)
      badArtifact("kernel '" + abi.name + "' has an unknown chunk rule or no tile_rows");
    abi.chunksFromPartials = true;
  }
  abi.sliceBlocks = k.value("slice_blocks", int64_t(1));
  if (abi.sliceBlocks < 1 || (abi.sliceBlocks > 1 && abi.grid != "slices" && abi.grid != "one"))
    badArtifact("kernel '" + abi.name + "' has " + std::to_string(abi.sliceBlocks) +
                " blocks per slice on grid '" + abi.grid + "'");
  abi.sharedBytes = k.at("shared_bytes").get<int64_t>();
  abi.dynamicSharedBytes = k.value("dynamic_shared_bytes", int64_t(0));
  if (abi.dynamicSharedBytes < 0 || abi.dynamicSharedBytes > abi.sharedBytes)
    badArtifact("kernel '" + abi.name + "' has " + std::to_string(abi.dynamicSharedBytes) +
                " dynamic shared bytes of " + std::to_string(abi.sharedBytes));
  if (abi.grid != "keys" && abi.grid != "queries" && abi.grid != "slices" && abi.grid != "one")
    badArtifact("kernel '" + abi.name + "' has an unknown grid rule '" + abi.grid + "'");
  if (abi.threads < 1 || abi.threads > 1024)
    badArtifact("kernel '" + abi.name + "' has " + std::to_string(abi.threads) + " threads per block");
  for (const json &arg : k.at("args"))
    abi.args.push_back({arg.at("name").get<std::string>(), arg.at("role").get<std::string>(),
                        arg.at("rank").get<int64_t>(), arg.at("element").get<std::string>()});
  return abi;
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
    if (root.at("version").get<int>() != 3)
      badArtifact("version " + root.at("version").dump() + " is not 3");
    a.featureMap = root.at("feature_map").get<std::string>();
    a.target = root.at("target").get<std::string>();
    a.dtype = root.at("dtype").get<std::string>();
    a.dv = root.at("dv").get<int64_t>();
    a.ptx = root.at("ptx").get<std::string>();
    a.backwardError = root.value("backward_error", std::string());
    for (const json &k : root.at("kernels")) {
      KernelAbi abi = kernelOf(k);
      if (a.ptx.find(".entry " + abi.name + "(") == std::string::npos)
        badArtifact("the PTX lacks kernel '" + abi.name + "'");
      std::string kind = abi.kind;
      if (!a.kernels.emplace(kind, std::move(abi)).second)
        badArtifact("two kernels of kind '" + kind + "'");
    }
    // The causal set reads out through causal_readout (its prefix scan between the chunks).
    const bool causal = a.kernels.count("causal_readout") != 0;
    for (const char *kind : {"kv", "kv_combine", causal ? "causal_readout" : "readout"})
      a.kernel(kind);
    return a;
  } catch (const json::exception &e) {
    badArtifact(e.what());
  }
}

const KernelAbi &GpuArtifact::kernel(const std::string &kind) const {
  auto it = kernels.find(kind);
  if (it == kernels.end()) {
    std::string kinds;
    for (const auto &[k, abi] : kernels)
      kinds += (kinds.empty() ? "" : ", ") + k;
    throw std::invalid_argument("spectra fused CUDA attention: no '" + kind + "' kernel for '" +
                                featureMap + "'" +
                                (backwardError.empty() ? " (there are: " + kinds + ")"
                                                       : ": " + backwardError));
  }
  return it->second;
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

MemrefParams memrefOf(const torch::Tensor &t) {
  MemrefParams m;
  m.allocated = m.aligned = t.data_ptr();
  m.sizes = t.sizes().vec();
  m.strides = t.strides().vec();
  return m;
}

CudaLaunchGeometry cudaGeometry(const KernelAbi &abi, const std::vector<torch::Tensor> &operands) {
  std::array<int64_t, 3> grid = launchGrid(abi, operands);
  TORCH_CHECK(grid[0] <= std::numeric_limits<int32_t>::max() && grid[1] <= 65535,
              "spectra: a grid of ", grid[0], " x ", grid[1], " blocks exceeds CUDA's limits for kernel '",
              abi.name, "' (at most 2^31-1 x 65535: fewer batch-heads per call)");
  CudaLaunchGeometry g;
  for (int i = 0; i < 3; ++i)
    g.grid[i] = static_cast<unsigned>(grid[i]);
  g.block[0] = static_cast<unsigned>(abi.threads);
  return g;
}

FusedCudaAttention::FusedCudaAttention(Descriptor desc, Compile compileFn, bool causal)
    : reference(std::move(desc)), compile(std::move(compileFn)), isCausal(causal),
      decodeConstants(std::make_shared<DecodeConstants>()) {}

/// Compiles through the cache: the GPU kernels depend on the component, m, d,
/// the target, the dtype and the value dimension (not on the weights).
static FusedCudaAttention::Compile cached(const Descriptor &desc,
                                          std::function<std::string(const std::string &,
                                                                    const std::string &, int64_t)>
                                              compile,
                                          bool causal) {
  std::string canonical = desc.component.canonical + "|m=" + std::to_string(desc.m) +
                          "|d=" + std::to_string(desc.d) + (causal ? "|causal" : "");
  return [canonical, name = desc.name, compile](const std::string &target,
                                                const std::string &dtype, int64_t dv) {
    // SPECTRA_MMA changes the kernels: part of the key.
    std::string options = dtype + "|dv=" + std::to_string(dv) + "|mma=" + spectra_gpu_mma_mode();
    return KernelCache::instance().gpu(canonical, name, target, options,
                                       [&] { return compile(target, dtype, dv); });
  };
}

std::shared_ptr<FusedCudaAttention> FusedCudaAttention::forVariant(const std::string &variant,
                                                                   const VariantConfig &config,
                                                                   bool causal) {
  Descriptor desc = describeVariant(variant, config);
  auto compile = cached(
      desc,
      [variant, config, causal](const std::string &target, const std::string &dtype, int64_t dv) {
        return compileGpuVariant(variant, config, target, dtype, dv, causal);
      },
      causal);
  return std::make_shared<FusedCudaAttention>(std::move(desc), std::move(compile), causal);
}

std::shared_ptr<FusedCudaAttention> FusedCudaAttention::fromIR(const std::string &ir,
                                                               const std::string &sourceName,
                                                               const std::string &featureMap,
                                                               bool causal) {
  Descriptor desc = describeIR(ir, sourceName, featureMap);
  auto compile = cached(
      desc,
      [ir, sourceName, featureMap, causal](const std::string &target, const std::string &dtype,
                                           int64_t dv) {
        return compileGpuIR(ir, sourceName, featureMap, target, dtype, dv, causal);
      },
      causal);
  return std::make_shared<FusedCudaAttention>(std::move(desc), std::move(compile), causal);
}

namespace {
/// The launch plan's kernels launched on torch's current stream.
struct CudaLauncher : KernelLauncher {
  const GpuArtifact &artifact;
  const std::map<std::string, void *> &functions;
  int device;
  CudaLauncher(const GpuArtifact &artifact, const std::map<std::string, void *> &functions, int device)
      : artifact(artifact), functions(functions), device(device) {}
  const KernelAbi &abi(const std::string &kind) const override { return artifact.kernel(kind); }
  bool has(const std::string &kind) const override { return artifact.kernels.count(kind) != 0; }
  // Four waves of the device (kChunkBlocksPerSm); SPECTRA_GPU_BLOCKS overrides it, as in the
  // emulation.
  int64_t targetBlocks() const override {
    return gpuBlocksFromEnvironment("spectra fused CUDA attention")
        .value_or(kChunkBlocksPerSm * int64_t(cuda::multiprocessors(device)));
  }
  void launch(const KernelAbi &abi, const std::vector<torch::Tensor> &operands) const override {
    CudaLaunchGeometry g = cudaGeometry(abi, operands);
    if (g.grid[0] == 0 || g.grid[1] == 0)
      return;  // no rows: nothing to launch
    std::vector<MemrefParams> memrefs;
    memrefs.reserve(operands.size());
    std::vector<void *> params;
    for (const torch::Tensor &t : operands) {
      TORCH_CHECK(t.is_cuda() && t.device().index() == device, "spectra: internal error: buffer on ",
                  t.device(), " for kernel '", abi.name, "' on cuda:", device);
      memrefs.push_back(memrefOf(t));
      memrefs.back().append(params);
    }
    cuda::Stream stream = c10::cuda::getCurrentCUDAStream(device).stream();
    // The tiles are one pool of dynamic shared memory (the function opted in at load).
    cuda::launch(device, functions.at(abi.kind), abi.name, g.grid.data(), g.block.data(),
                 unsigned(abi.dynamicSharedBytes), stream, params.data());
  }
};

} // namespace

const FusedCudaAttention::Loaded &FusedCudaAttention::kernelsFor(const torch::Tensor &t,
                                                                 int64_t dv) const {
  int device = t.device().index();
  auto [major, minor] = cuda::computeCapability(device);
  std::string target = gpuTargetFor(major, minor);
  std::string dtype = elementName(t.scalar_type());
  std::string key = std::to_string(device) + "/" + target + "/" + dtype + "/" + std::to_string(dv);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(key);
  if (it != loaded.end())
    return it->second;
  Loaded l;
  l.artifact = GpuArtifact::fromJson(compile(target, dtype, dv));
  l.module = cuda::loadPtx(device, l.artifact.ptx, descriptor().name + " (" + target + ")");
  for (const auto &[kind, abi] : l.artifact.kernels) {
    l.functions[kind] = cuda::getFunction(l.module, abi.name);
    cuda::allowDynamicShared(device, l.functions[kind], abi.name, abi.dynamicSharedBytes,
                             abi.sharedBytes);
  }
  Loaded &stored = loaded.emplace(key, std::move(l)).first->second;
  stored.launcher = std::make_shared<CudaLauncher>(stored.artifact, stored.functions, device);
  return stored;
}

namespace {
/// The kernels were compiled for the inputs' dtype and value dimension.
void checkAgainstArtifact(const GpuArtifact &a, const FusedInputs &in, const std::string &dtype) {
  TORCH_CHECK(a.dtype == dtype, "spectra: GPU kernels for ", a.dtype, " received ",
              in.qs.scalar_type(), " inputs");
  TORCH_CHECK(a.dv == 0 || a.dv == in.vs.size(3), "spectra: the GPU kernels of ", a.featureMap,
              " were built for value dimension ", a.dv, ", got ", in.vs.size(3));
}
} // namespace

FusedForward FusedCudaAttention::runForward(const FusedInputs &in) const {
  c10::cuda::CUDAGuard guard(in.qs.device());
  const Loaded &k = kernelsFor(in.qs, in.vs.size(3));
  checkAgainstArtifact(k.artifact, in, elementName(in.qs.scalar_type()));
  return isCausal ? launchCausalForward(*k.launcher, in, descriptor().numFeatures())
                  : launchForward(*k.launcher, in, descriptor().numFeatures());
}

std::vector<torch::Tensor> FusedCudaAttention::runBackward(const FusedInputs &in,
                                                           const FusedForward &saved,
                                                           const torch::Tensor &gout) const {
  c10::cuda::CUDAGuard guard(in.qs.device());
  const Loaded &k = kernelsFor(in.qs, in.vs.size(3));
  return isCausal ? launchCausalBackward(*k.launcher, in, saved, gout, descriptor().numFeatures())
                  : launchBackward(*k.launcher, in, saved, gout, descriptor().numFeatures());
}

const KernelLauncher &FusedCudaAttention::launcher(const torch::Tensor &like, int64_t dv) const {
  return *kernelsFor(like, dv).launcher;
}

namespace {
torch::ScalarType cudaInputType(const torch::Tensor &x) {
  torch::ScalarType type = x.scalar_type();
  return type == torch::kBFloat16 || type == torch::kHalf ? type : torch::kFloat32;
}
Weights weightsOnDevice(const Weights &weights, const torch::Device &device) {
  Weights w = weights;
  w.W = w.W.to(device);
  if (w.rowWeights)
    w.rowWeights = w.rowWeights->to(device);
  return w;
}
} // namespace

AttentionResult FusedCudaAttention::attentionWithStats(
    const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
    const Weights &weights, const std::optional<torch::Tensor> &keyMask,
    std::optional<double> scale, const std::optional<torch::Tensor> &queryMask) const {
  TORCH_CHECK(q.is_cuda(), "spectra fused CUDA attention: inputs must be CUDA tensors, got ",
              q.device());
  torch::ScalarType type = cudaInputType(q);
  FusedInputs in = prepareFusedInputs(reference, q, k, v, weightsOnDevice(weights, q.device()),
                                      keyMask, scale, type, queryMask,
                                      &launcher(q.to(type), v.size(3)));
  auto out = FusedAttentionFunction<FusedCudaAttention>::run(in, this);
  return {out[0].to(q.scalar_type()), out[1]};
}

DecodeState FusedCudaAttention::prefill(const torch::Tensor &k, const torch::Tensor &v,
                                        const Weights &weights,
                                        const std::optional<torch::Tensor> &keyMask) const {
  TORCH_CHECK(isCausal, "spectra fused CUDA attention: prefill/decode need the causal kernels");
  TORCH_CHECK(k.is_cuda(), "spectra fused CUDA attention: inputs must be CUDA tensors, got ",
              k.device());
  c10::cuda::CUDAGuard guard(k.device());
  torch::ScalarType type = cudaInputType(k);
  return causalPrefill(reference, launcher(k.to(type), v.size(3)), type, k, v,
                       weightsOnDevice(weights, k.device()), keyMask);
}

torch::Tensor FusedCudaAttention::decode(const torch::Tensor &q, const torch::Tensor &k,
                                         const torch::Tensor &v, const Weights &weights,
                                         DecodeState &state) const {
  TORCH_CHECK(isCausal, "spectra fused CUDA attention: prefill/decode need the causal kernels");
  TORCH_CHECK(q.is_cuda(), "spectra fused CUDA attention: inputs must be CUDA tensors, got ",
              q.device());
  c10::cuda::CUDAGuard guard(q.device());
  torch::ScalarType type = cudaInputType(q);
  return causalDecode(reference, launcher(q.to(type), v.size(3)), type, q, k, v,
                      weightsOnDevice(weights, q.device()), state, std::nullopt,
                      decodeConstants.get());
}

} // namespace spectra
