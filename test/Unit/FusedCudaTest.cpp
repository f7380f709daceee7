//===- FusedCudaTest.cpp - the GPU launcher: host logic, and numerics on a GPU ===//
//
// The host side (artifact parsing, launch geometry, the memref argument ABI
// against the PTX's own parameter lists) runs everywhere. The numerics tests
// run the GPU kernels against the float64 reference: their PTX on a GPU, and
// where torch sees no CUDA device their mapped IR on the CPU (gpu-emulated),
// so they never skip.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"
#include "runtime/FusedCuda.h"
#include "runtime/SpectralAttention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <regex>

using namespace spectra;

namespace {

VariantConfig config(int64_t m, int64_t d) {
  VariantConfig c;
  c.m = m;
  c.d = d;
  return c;
}

/// Number of .param entries of `.entry name(` in the PTX.
int ptxParams(const std::string &ptx, const std::string &name) {
  size_t at = ptx.find(".entry " + name + "(");
  if (at == std::string::npos)
    return -1;
  size_t end = ptx.find(")", at);
  std::string list = ptx.substr(at, end - at);
  int count = 0;
  for (size_t p = list.find(".param"); p != std::string::npos; p = list.find(".param", p + 1))
    ++count;
  return count;
}

TEST(FusedCudaHost, ArtifactParsesAndItsArgumentsMatchThePtxSignatures) {
  for (const char *dtype : {"f32", "bf16"}) {
    GpuArtifact a =
        GpuArtifact::fromJson(compileGpuVariant("trigrf-orf", config(128, 32), "sm_80", dtype, 0));
    EXPECT_EQ(a.target, "sm_80");
    EXPECT_EQ(a.dtype, dtype);
    EXPECT_EQ(a.featureMap, "trigrf_orf");
    // The nine kinds of the tile layer (TrigRF reads no statistics: no moments kernels), the
    // same the CPU emulation runs.
    ASSERT_EQ(a.kernels.size(), 9u);
    const KernelAbi &kv = a.kernel("kv");
    EXPECT_EQ(kv.name, "trigrf_orf_kv");
    EXPECT_EQ(kv.grid, "keys");
    EXPECT_EQ(kv.chunkRows, 256);
    EXPECT_EQ(kv.threads, 256);
    EXPECT_GT(kv.sharedBytes, 0);
    EXPECT_LE(kv.sharedBytes, 48 * 1024);
    EXPECT_EQ(a.kernel("kv_combine").grid, "slices");
    EXPECT_EQ(a.kernel("dweights_chunk_combine").grid, "slices");
    EXPECT_EQ(a.kernel("dweights_combine").grid, "one");
    // The launcher passes each memref as (ptr, ptr, offset, sizes, strides): the count
    // must equal the kernel's PTX parameter list, whose order the description gives.
    for (const auto &[kind, k] : a.kernels) {
      int expected = 0;
      for (const KernelArgSpec &arg : k.args)
        expected += 3 + 2 * arg.rank;
      EXPECT_EQ(ptxParams(a.ptx, k.name), expected) << k.name << " (" << dtype << ")";
    }
    // The same kernels, arguments and roles as the emulation's generated ABI (a kernel
    // may take fewer arguments on the GPU: outlining drops those it does not read).
    EXPECT_EQ(a.kernel("readout").args.front().role, "rows");
    std::regex atomic(R"((^|\s)(atom|red)\.)");
    EXPECT_FALSE(std::regex_search(a.ptx, atomic)) << "no atomic instruction (" << dtype << ")";
  }
  // The causal set has no 'readout' (its queries read out through causal_readout): it parses,
  // and asking it for a readout names what it has. (The first GPU run found the loader
  // demanding 'readout' of every artifact, so causal attention never launched on a GPU.)
  GpuArtifact causal = GpuArtifact::fromJson(
      compileGpuVariant("posrf-orf", config(64, 32), "sm_90a", "bf16", 0, /*causal=*/true));
  EXPECT_EQ(causal.kernel("causal_readout").grid, "queries");
  EXPECT_EQ(causal.kernels.count("readout"), 0u);
  std::string error;
  try {
    causal.kernel("readout");
  } catch (const std::invalid_argument &e) {
    error = e.what();
  }
  EXPECT_NE(error.find("no 'readout' kernel for 'posrf_orf' (there are: causal_decode, "), std::string::npos)
      << error;
}

// The params program on the GPU: SADERF's parameters from its moments and their adjoint are
// kernels of the artifact (one block per slice), whose arguments match their PTX signatures,
// so the CUDA launcher runs them where it ran LibTorch's interpreter.
TEST(FusedCudaHost, TheParamsProgramIsCompiledForTheGpu) {
  for (const char *dtype : {"f32", "bf16"}) {
    GpuArtifact a =
        GpuArtifact::fromJson(compileGpuVariant("saderf-orf", config(64, 32), "sm_90a", dtype, 0));
    for (const char *kind : {"moments", "moments_params", "moments_params_backward",
                             "moments_backward"}) {
      ASSERT_EQ(a.kernels.count(kind), 1u) << kind << " (" << dtype << ")";
      const KernelAbi &k = a.kernel(kind);
      int expected = 0;
      for (const KernelArgSpec &arg : k.args)
        expected += 3 + 2 * arg.rank;
      EXPECT_EQ(ptxParams(a.ptx, k.name), expected) << k.name << " (" << dtype << ")";
    }
    EXPECT_EQ(a.kernel("moments_params").grid, "slices");
    EXPECT_EQ(a.kernel("moments_params_backward").grid, "slices");
    EXPECT_EQ(a.kernel("moments_params").name, "saderf_orf_moments_params");
  }
}

TEST(FusedCudaHost, TilesPastStaticSharedMemoryAreDynamicAndDescribed) {
  // d = 64, m = 512 on tensor cores: OPRF's backward tiles need more than the 48 KiB a block
  // has without opting in at 4 rows (at m = 256 they fit since their gradients of ||x||^2,
  // ||w||^2 and the parameters take no tiles of their own). They keep 4 rows on sm_80 and
  // take 8 on sm_90a (what fits two blocks per SM: 81 and 113 KiB). Every kernel's tiles are
  // one pool of dynamic shared memory: the launch description carries the bytes the launch
  // passes, and the PTX declares the one dynamic region.
  for (auto [chip, rows] : {std::pair<const char *, int64_t>{"sm_80", 4}, {"sm_90a", 8}}) {
    GpuArtifact a = GpuArtifact::fromJson(compileGpuVariant("oprf-orf", config(512, 64), chip, "bf16", 0));
    const KernelAbi &qb = a.kernel("query_backward");
    EXPECT_EQ(qb.tileRows, rows) << chip;
    EXPECT_GT(qb.dynamicSharedBytes, 48 * 1024) << chip;
    EXPECT_EQ(qb.dynamicSharedBytes, qb.sharedBytes) << chip << ": every tile in the dynamic region";
    EXPECT_LE(qb.dynamicSharedBytes, (strcmp(chip, "sm_80") == 0 ? 164 : 228) * 1024 / 2 - 1024) << chip;
    const KernelAbi &kv = a.kernel("kv");
    EXPECT_GT(kv.dynamicSharedBytes, 0) << chip << ": kv's tiles in the pool too";
    EXPECT_LE(kv.sharedBytes, 48 * 1024) << chip << ": kv needs no opt-in";
    EXPECT_NE(a.ptx.find(".extern .shared .align 16 .b8 __dynamic_shmem__0[];"), std::string::npos)
        << chip;
  }
  // f32 (no tensor cores) takes fewer rows within 48 KiB instead.
  GpuArtifact f = GpuArtifact::fromJson(compileGpuVariant("oprf-orf", config(512, 64), "sm_80", "f32", 0));
  EXPECT_EQ(f.kernel("query_backward").tileRows, 2);
  EXPECT_EQ(f.kernel("query_backward").dynamicSharedBytes, f.kernel("query_backward").sharedBytes);
  EXPECT_LE(f.kernel("query_backward").sharedBytes, 48 * 1024);
}

TEST(FusedCudaHost, LaunchGeometryFollowsTheSequenceLengths) {
  GpuArtifact a = GpuArtifact::fromJson(compileGpuVariant("posrf-mm", config(16, 8), "sm_90a", "f32", 0));
  const int64_t BH = 8, F = 16, D = 8;
  // Partial sums [BH, chunks, ...]: the chunk count the launch plan sized them with.
  auto operands = [&](const KernelAbi &abi, int64_t rows, int64_t chunks = 1) {
    std::map<std::string, torch::Tensor> buffers;
    for (const KernelArgSpec &arg : abi.args) {
      std::vector<int64_t> shape(arg.rank, 1);
      if (arg.role == "rows") {
        shape[0] = BH;
        shape[1] = rows;
        shape.back() = D;
      } else if (arg.role == "mask") {
        shape = {BH, rows};
      } else if (arg.role == "slice" || arg.role == "partial") {
        shape[0] = BH;
        if (arg.role == "partial")
          shape[1] = chunks;
      }
      buffers[arg.name] = torch::zeros(shape);
    }
    return kernelOperands(abi, buffers);
  };
  const KernelAbi &kv = a.kernel("kv"), &readout = a.kernel("readout"),
                  &combine = a.kernel("kv_combine");
  // kv: a block per (chunk, slice), as many chunks as its partial sums hold (the plan sizes
  // them, rowChunks); the readout: a block per (256-row chunk, slice); the combine a block
  // per slice.
  EXPECT_TRUE(kv.chunksFromPartials);
  EXPECT_FALSE(readout.chunksFromPartials);
  EXPECT_EQ(cudaGeometry(kv, operands(kv, 4096, 16)).grid, (std::array<unsigned, 3>{16, 8, 1}));
  EXPECT_EQ(cudaGeometry(kv, operands(kv, 4097, 5)).grid, (std::array<unsigned, 3>{5, 8, 1}));
  EXPECT_EQ(cudaGeometry(readout, operands(readout, 1000)).grid, (std::array<unsigned, 3>{4, 8, 1}));
  EXPECT_EQ(cudaGeometry(readout, operands(readout, 0)).grid[0], 0u) << "no queries: nothing to launch";
  EXPECT_EQ(cudaGeometry(combine, operands(combine, 0)).grid, (std::array<unsigned, 3>{8, 1, 1}));
  EXPECT_EQ(cudaGeometry(kv, operands(kv, 10)).block, (std::array<unsigned, 3>{256, 1, 1}));
  (void)F;
}

TEST(FusedCudaHost, CombinesSpreadTheirFeaturesOverBlocks) {
  // At m=128 d=32 a combine's rows (features) are independent: each block of a slice merges
  // 8 features' partial sums (8 x 32 summary elements, one per thread), 16 blocks a slice,
  // where one block per slice merged all 128 and left most of a GPU idle.
  GpuArtifact a = GpuArtifact::fromJson(compileGpuVariant("posrf-mm", config(128, 32), "sm_80", "f32", 0));
  const int64_t BH = 8;
  auto operands = [&](const KernelAbi &abi) {
    std::map<std::string, torch::Tensor> buffers;
    for (const KernelArgSpec &arg : abi.args) {
      std::vector<int64_t> shape(arg.rank, 1);
      if (arg.role == "slice")
        shape[0] = BH;
      buffers[arg.name] = torch::zeros(shape);
    }
    return kernelOperands(abi, buffers);
  };
  for (const char *kind : {"kv_combine", "dsummary_combine", "dweights_chunk_combine"}) {
    const KernelAbi &combine = a.kernel(kind);
    EXPECT_EQ(combine.grid, "slices") << kind;
    EXPECT_EQ(combine.sliceBlocks, 16) << kind;
    EXPECT_EQ(cudaGeometry(combine, operands(combine)).grid, (std::array<unsigned, 3>{16, 8, 1}))
        << kind;
  }
  // dW's merge over the slices (one kernel's work): 16 blocks of 8 rows of dW.
  EXPECT_EQ(a.kernel("dweights_combine").grid, "one");
  EXPECT_EQ(a.kernel("dweights_combine").sliceBlocks, 16);
  EXPECT_EQ(cudaGeometry(a.kernel("dweights_combine"), operands(a.kernel("dweights_combine"))).grid,
            (std::array<unsigned, 3>{16, 1, 1}));
  // dparams' one parameter per slice: nothing to split; the kernels over rows never split.
  EXPECT_EQ(a.kernel("dparams_combine").sliceBlocks, 1);
  EXPECT_EQ(cudaGeometry(a.kernel("dparams_combine"), operands(a.kernel("dparams_combine"))).grid,
            (std::array<unsigned, 3>{8, 1, 1}));
  EXPECT_EQ(a.kernel("kv").sliceBlocks, 1);
  // A split on a kernel over rows is a mismatched artifact.
  try {
    GpuArtifact::fromJson(R"({"version": 3, "feature_map": "x", "target": "sm_80", "dtype": "f32",
      "dv": 0, "ptx": ".entry x_kv(", "kernels": [{"kind": "kv", "name": "x_kv", "grid": "keys",
      "block": 256, "chunk_rows": 256, "shared_bytes": 0, "slice_blocks": 4, "args": []}]})");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("has 4 blocks per slice on grid 'keys'"), std::string::npos)
        << e.what();
  }
}

TEST(FusedCudaHost, MemrefDescriptorsKeepSizesAndStrides) {
  torch::Tensor t = torch::zeros({6, 5, 7});
  MemrefParams m = memrefOf(t);
  EXPECT_EQ(m.sizes, (std::vector<int64_t>{6, 5, 7}));
  EXPECT_EQ(m.strides, (std::vector<int64_t>{35, 7, 1}));
  EXPECT_EQ(m.aligned, t.data_ptr());
  std::vector<void *> params;
  m.append(params);
  ASSERT_EQ(params.size(), 9u);
  EXPECT_EQ(*static_cast<int64_t *>(params[3]), 6);
  EXPECT_EQ(*static_cast<int64_t *>(params[8]), 1);
  // A window of a partials buffer (the backward's shares) keeps its outer stride.
  torch::Tensor shares = torch::zeros({4, 5, 3});
  EXPECT_EQ(memrefOf(shares.narrow(1, 2, 3)).strides, (std::vector<int64_t>{15, 3, 1}));
  EXPECT_EQ(memrefOf(shares.narrow(1, 2, 3)).aligned, shares.narrow(1, 2, 3).data_ptr());
}

TEST(FusedCudaHost, TargetsByComputeCapability) {
  EXPECT_EQ(gpuTargetFor(9, 0), "sm_90a");
  EXPECT_EQ(gpuTargetFor(8, 0), "sm_80");
  EXPECT_EQ(gpuTargetFor(8, 9), "sm_80");
  EXPECT_EQ(gpuTargetFor(10, 0), "sm_80") << "sm_90a PTX does not run on Blackwell; sm_80 PTX does";
  EXPECT_THROW(gpuTargetFor(7, 5), c10::Error);
}

TEST(FusedCudaHost, BadArtifactsAreRejectedWithTheField) {
  try {
    GpuArtifact::fromJson(R"({"version": 2, "feature_map": "x"})");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("version 2 is not 3"), std::string::npos) << e.what();
  }
  try {
    GpuArtifact::fromJson(R"({"version": 3, "feature_map": "x", "target": "sm_80", "dtype": "f32",
      "dv": 0, "ptx": ".entry x_kv(", "kernels": [{"kind": "kv", "name": "x_kv", "grid": "rows",
      "block": 256, "chunk_rows": 256, "shared_bytes": 0, "args": []}]})");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("unknown grid rule 'rows'"), std::string::npos) << e.what();
  }
  try {
    GpuArtifact::fromJson(R"({"version": 3, "feature_map": "x", "target": "sm_80", "dtype": "f32",
      "dv": 0, "ptx": ".entry x_kv(", "kernels": [{"kind": "kv", "name": "x_kv", "grid": "keys",
      "block": 256, "chunk_rows": 256, "shared_bytes": 1024, "dynamic_shared_bytes": 65536,
      "args": []}]})");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("has 65536 dynamic shared bytes of 1024"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(GpuArtifact::fromJson("{"), std::invalid_argument);
}

TEST(FusedCudaHost, DriverAvailabilityIsReportedNotFatal) {
  std::string why;
  bool ok = cuda::available(&why);
  if (!ok) {
    EXPECT_FALSE(why.empty());
  }
  EXPECT_EQ(ok, why.empty());
}

//===----------------------------------------------------------------------===//
// The GPU kernels' numerics: on a GPU when there is one, else through gpu-emulated
// (the same mapped IR and launch plan, run on the CPU), so they never skip.
//===----------------------------------------------------------------------===//

bool onGpu() { return torch::cuda::is_available(); }

double maxAbs(const torch::Tensor &t) { return t.abs().max().item<double>(); }

/// The fused CUDA kernels against the float64 reference on the same (dtype-rounded) inputs, so
/// only the kernels' own arithmetic is measured. Variants whose features change sign (SGQ's
/// negative quadrature weights, TrigRF) have normalisers that cancel, and any float32 summation
/// loses digits there: in float32 the bound is also four times the error of the CPU fused
/// kernels (the same compiler, another summation order), and the measured errors are printed.
void expectCudaMatchesReference(const std::string &variant, torch::Dtype dtype, double tolerance,
                                bool causal = false) {
  SpectralAttentionOptions o;
  o.variant = variant;
  o.causal = causal;
  o.config = config(variant.find("sgq") != std::string::npos ? 65 : 64, 32);
  SpectralAttention cpuFused(o);
  o.mode = onGpu() ? AttentionMode::Fused : AttentionMode::GpuEmulated;
  SpectralAttention fused(o);
  o.mode = AttentionMode::Reference;
  SpectralAttention reference(o);
  const torch::Device gpuDevice = onGpu() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  torch::manual_seed(0);
  torch::Tensor q = (torch::randn({2, 2, 300, 32}, torch::kFloat64) * 0.8).to(dtype).to(torch::kFloat64),
                k = (torch::randn({2, 2, 300, 32}, torch::kFloat64) * 0.8).to(dtype).to(torch::kFloat64),
                v = torch::randn({2, 2, 300, 32}, torch::kFloat64).to(dtype).to(torch::kFloat64);
  torch::Tensor mask = torch::ones({2, 300}, torch::kBool);
  mask.index_put_({1, torch::indexing::Slice(250)}, false);
  torch::Tensor probe = torch::randn({2, 2, 300, 32}, torch::kFloat64);
  auto grads = [&](SpectralAttention &m, torch::Device device, torch::Dtype type) {
    torch::Tensor qd = q.to(device, type).detach().requires_grad_(),
                  kd = k.to(device, type).detach().requires_grad_(),
                  vd = v.to(device, type).detach().requires_grad_();
    m->to(device);
    torch::Tensor out = m->forward(qd, kd, vd, mask.to(device));
    (out.to(torch::kFloat64) * probe.to(device)).sum().backward();
    return std::vector<torch::Tensor>{out.detach().cpu().to(torch::kFloat64), qd.grad().cpu().to(torch::kFloat64),
                                      kd.grad().cpu().to(torch::kFloat64), vd.grad().cpu().to(torch::kFloat64)};
  };
  auto a = grads(fused, gpuDevice, dtype), b = grads(reference, torch::kCPU, torch::kFloat64);
  std::vector<torch::Tensor> c;
  if (dtype == torch::kFloat32)
    c = grads(cpuFused, torch::kCPU, torch::kFloat32);
  const char *names[] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    double error = maxAbs(a[i] - b[i]), scale = maxAbs(b[i]) + 1e-8;
    double allowed = tolerance * scale, cpuError = c.empty() ? 0 : maxAbs(c[i] - b[i]);
    allowed = std::max(allowed, 4 * cpuError);
    std::cout << (onGpu() ? "[cuda " : "[gpu-emulated ") << torch::toString(dtype) << "] " << variant
              << (causal ? " causal " : " ") << names[i]
              << ": max error " << error << " (relative " << error / scale << "), CPU fused "
              << cpuError << ", allowed " << allowed << "\n";
    EXPECT_LT(error, allowed) << variant << " " << names[i] << " (" << torch::toString(dtype) << ")";
  }
}

TEST(FusedCuda, EveryPaperVariantMatchesTheReferenceOnTheGpu) {
  for (const char *component : {"posrf", "oprf", "saderf"})
    for (const char *weights : {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"})
      expectCudaMatchesReference(std::string(component) + "-" + weights, torch::kFloat32, 2e-3);
  // Beyond the paper: sign-changing features (cancelling normalisers) and the hyperbolic form.
  for (const char *variant : {"trigrf-orf", "posrf-hyp-base", "gerf-qmc-sobol", "hcexp-fastfood"})
    expectCudaMatchesReference(variant, torch::kFloat32, 2e-3);
}

TEST(FusedCuda, HalfPrecisionInputsAccumulateInFloat32) {
  // TrigRF too: the kernels load q and k in bf16 and apply d^-1/4 (and SADERF's Psi) in f32,
  // so no scaled input is rounded to bf16 (that rounding, amplified by TrigRF's cancelling
  // normaliser, was 0.2-0.4 off relative on an H100 when SpectralAttention scaled q before the
  // kernels). In fp16 TrigRF's dq (about 1e5 here) is past the format's range (65504).
  // SPECTRA_MMA=bf16 (one bf16 mma per step, features rounded to bf16) is a lower-precision
  // mode that TrigRF's cancelling normaliser does not survive: 0.6 relative error in its output
  // on an H200 and in the emulation alike. The positive features stay within the bound.
  const char *mma = std::getenv("SPECTRA_MMA");
  const bool singleBf16 = mma && std::string(mma) == "bf16";
  for (const char *variant : {"posrf-mm", "saderf-orf", "oprf-orf", "trigrf-orf"}) {
    if (singleBf16 && std::string(variant) == "trigrf-orf") {
      std::cout << "[skipped] trigrf-orf bf16 under SPECTRA_MMA=bf16: its normaliser cancels, "
                   "and one bf16 mma per step loses what bf16x3 keeps\n";
      continue;
    }
    expectCudaMatchesReference(variant, torch::kBFloat16, 5e-2);
  }
  for (const char *variant : {"posrf-mm", "saderf-orf", "oprf-orf"})
    expectCudaMatchesReference(variant, torch::kHalf, 2e-2);
}

TEST(FusedCuda, CausalForwardAndBackwardMatchTheReference) {
  // The causal set (kv per chunk, the prefix scan, the masked in-tile products, both backward
  // kernels) over 300 rows with a key mask, against the float64 causal reference.
  for (const char *variant : {"posrf-orf", "posrf-mm", "posrf-sgq"})
    expectCudaMatchesReference(variant, torch::kFloat32, 2e-3, /*causal=*/true);
  expectCudaMatchesReference("posrf-orf", torch::kBFloat16, 5e-2, /*causal=*/true);
}

TEST(FusedCuda, CausalDecodingEqualsTheCausalForward) {
  // A 300-token prompt through prefill (kv + kv_combine), then 40 tokens through causal_decode,
  // each equal to the causal forward of the whole sequence at its position.
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    SpectralAttentionOptions o;
    o.variant = "posrf-orf";
    o.config = config(64, 32);
    o.causal = true;
    o.mode = onGpu() ? AttentionMode::Fused : AttentionMode::GpuEmulated;
    SpectralAttention attn(o);
    const torch::Device device = onGpu() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
    attn->to(device);
    torch::manual_seed(3);
    auto make = [&] { return (torch::randn({2, 2, 340, 32}) * 0.8).to(device, dtype); };
    torch::Tensor q = make(), k = make(), v = make();
    torch::NoGradGuard noGrad;
    torch::Tensor full = attn->forward(q, k, v).to(torch::kFloat64).cpu();
    DecodeState st = attn->prefill(k.narrow(2, 0, 300), v.narrow(2, 0, 300));
    double worst = 0;
    for (int64_t t = 300; t < 340; ++t) {
      torch::Tensor y = attn->decode(q.narrow(2, t, 1), k.narrow(2, t, 1), v.narrow(2, t, 1), st);
      worst = std::max(worst, maxAbs(y.to(torch::kFloat64).cpu() - full.narrow(2, t, 1)) /
                                  maxAbs(full.narrow(2, t, 1)));
    }
    std::cout << (onGpu() ? "[cuda " : "[gpu-emulated ") << torch::toString(dtype)
              << "] decoding against the causal forward: worst relative error " << worst << "\n";
    EXPECT_EQ(st.length, 340);
    EXPECT_LT(worst, dtype == torch::kFloat32 ? 1e-5 : 2e-2) << torch::toString(dtype);
  }
}

} // namespace
