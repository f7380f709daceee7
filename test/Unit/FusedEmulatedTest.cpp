//===- FusedEmulatedTest.cpp - the GPU kernels run on the CPU (gpu-emulated) ===//
//
// The GPU kernels come from the same tile layer as the CPU ones, mapped to
// blocks and threads (spectra-map-tiles-to-gpu); these tests run that mapped
// IR on the CPU through the launch plan a GPU follows (row-chunk partials,
// then the combine kernels) and compare it, forward and backward, with the
// float64 eager reference. No GPU is needed and nothing here is skipped.
//
//===----------------------------------------------------------------------===//

#include "codegen/spectra_compiler.h"
#include "runtime/FusedCuda.h"
#include "runtime/FusedEmulated.h"
#include "runtime/WeightFactory.h"

#include "test/Unit/ParamsKernelsCheck.h"
#include "test/Unit/TestFeatures.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

using namespace spectra;

namespace {

double maxAbs(const torch::Tensor &t) { return t.abs().max().item<double>(); }

struct Case {
  torch::Tensor q, k, v, mask;
};

/// Lengths that are no multiple of the GPU tile (8 rows) nor of the block's chunk when
/// `rows` is large; the second batch's keys are padded (masked) with junk under the mask.
Case makeCase(double scale, int seed, int64_t nq = 13, int64_t nk = 11) {
  torch::manual_seed(seed);
  Case c{torch::randn({2, 2, nq, 8}, torch::kFloat64) * scale,
         torch::randn({2, 2, nk, 8}, torch::kFloat64) * scale,
         torch::randn({2, 2, nk, 5}, torch::kFloat64), torch::ones({2, nk}, torch::kBool)};
  using torch::indexing::Slice;
  c.mask.index_put_({1, Slice(nk - 3)}, false);
  c.k.index_put_({1, Slice(), Slice(nk - 3)}, 4.0);
  return c;
}

/// Forward and backward of the emulated GPU kernels against the float64 reference's
/// autograd with the same W (q, k, v rounded to the kernels' dtype first, so the
/// comparison measures the kernels, not the input rounding).
/// `compared`: how many of out, dq, dk, dv (and the learnable factors' gradients) are
/// compared; every one is checked to be finite.
void expectMatches(const FusedEmulatedAttention &fused, const Case &c, double tol,
                   const std::string &what, size_t compared = SIZE_MAX) {
  const Descriptor &desc = fused.descriptor();
  torch::ScalarType dtype = scalarTypeOf(fused.dtype());
  torch::Tensor probe = torch::randn({2, 2, c.q.size(2), c.v.size(3)}, torch::kFloat64);
  auto run = [&](bool useFused) {
    auto in = [&](const torch::Tensor &t) {
      torch::Tensor r = t.to(dtype).to(torch::kFloat64);
      return (useFused ? r.to(dtype) : r).clone().set_requires_grad(true);
    };
    torch::Tensor q = in(c.q), k = in(c.k), v = in(c.v);
    Weights w = WeightFactory(desc).draw(desc.seed, useFused ? torch::kFloat32 : torch::kFloat64);
    torch::Tensor out = useFused ? fused.attention(q, k, v, w, c.mask)
                                 : ReferenceFeatureMap(desc).attention(q, k, v, w, c.mask);
    (out.to(torch::kFloat64) * probe).sum().backward();
    std::vector<torch::Tensor> r = {out.detach().to(torch::kFloat64), q.grad(), k.grad(), v.grad()};
    for (auto &[name, factor] : w.learnable)
      r.push_back(factor.grad());
    return r;
  };
  std::vector<torch::Tensor> got = run(true), want = run(false);
  ASSERT_EQ(got.size(), want.size()) << what;
  const char *names[] = {"out", "dq", "dk", "dv"};
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << what << " #" << i;
    ASSERT_TRUE(torch::isfinite(got[i]).all().item<bool>()) << what << " #" << i;
    if (i >= compared)
      continue;
    EXPECT_LT(maxAbs(got[i].to(torch::kFloat64) - want[i]), tol * (maxAbs(want[i]) + 1e-6))
        << what << " " << (i < 4 ? names[i] : "d(learnable factor)");
  }
}

VariantConfig small(const std::string &weights) {
  VariantConfig config;
  config.m = weights == "sgq" ? 17 : 16;
  config.d = 8;
  return config;
}

TEST(FusedEmulated, EveryPaperVariantForwardAndBackward) {
  for (const char *component : {"posrf", "oprf", "saderf"})
    for (const char *weights : {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"}) {
      std::string variant = std::string(component) + "-" + weights;
      FusedEmulatedAttention fused(variant, small(weights));
      expectMatches(fused, makeCase(0.8, 1), 2e-3, variant);
    }
}

TEST(FusedEmulated, OtherComponentsAndRecipes) {
  for (const char *variant : {"trigrf-orf", "posrf-hyp-base", "gerf-qmc-sobol", "hcexp-fastfood",
                              "posrf-simrf", "oprf-scrf"}) {
    FusedEmulatedAttention fused(variant, small("orf"));
    expectMatches(fused, makeCase(0.6, 2), 2e-3, variant);
  }
  VariantConfig gmm = small("gmm");
  gmm.options = {{"components", 3}};
  gmm.m = 15;
  FusedEmulatedAttention g("posrf-gmm", gmm);
  expectMatches(g, makeCase(0.6, 3), 2e-3, "posrf-gmm (dSigma_c, dmu_c through dW)");
  VariantConfig gerf = small("orf");
  gerf.options = {{"a", -0.2}};
  FusedEmulatedAttention o("gerf-orf", gerf);
  expectMatches(o, makeCase(0.6, 3), 2e-3, "gerf-orf a=-0.2");
}

// The params program compiled for the GPU (the vector code spread over threads,
// spectra-map-tiles-to-gpu) and run through the emulation: the kernels against their program
// in float64, then the whole pass of a declared component against the reference.
TEST(FusedEmulated, CompiledParamsMatchTheirProgram) {
  for (const char *variant : {"saderf-orf", "oprf-qmc", "hcexp-mm"}) {
    FusedEmulatedAttention fused(variant, small("orf"));
    test::expectParamsKernelsMatch(fused, std::string(variant) + " gpu-emulated");
  }
  FusedEmulatedAttention bf16("saderf-orf", small("orf"), "bf16");
  test::expectParamsKernelsMatch(bf16, "saderf-orf gpu-emulated bf16");
  FusedEmulatedAttention declared =
      FusedEmulatedAttention::fromIR(test::kStatisticsComponentIR, "stats.mlir");
  test::expectParamsKernelsMatch(declared, "a declared component with statistics, gpu-emulated");
  expectMatches(declared, makeCase(0.6, 4), 2e-3, "a declared component with statistics");
  EXPECT_FALSE(FusedEmulatedAttention("posrf-orf", small("orf")).launcher(torch::Tensor(), 5)
                   .has("moments_params"));
}

TEST(FusedEmulated, HalfPrecisionInputsAccumulateInF32) {
  for (const char *dtype : {"bf16", "f16"})
    for (const char *variant : {"posrf-mm", "saderf-orf", "trigrf-orf"}) {
      FusedEmulatedAttention fused(variant, small("mm"), dtype);
      // Outputs and gradients are rounded once, to the dtype, as they are stored.
      expectMatches(fused, makeCase(0.8, 4), std::string(dtype) == "bf16" ? 2e-2 : 4e-3,
                    std::string(variant) + " " + dtype);
    }
}

/// The contractions on tensor cores (MapContractionsToMma.h): with 16-bit inputs the
/// emulation runs the warp tiles, whose bodies round the operands as the mma does. Heads
/// whose tiles fill the 16 x 8 mma exactly (m = 32, d = 16, dv = 8, and 33 rows of SGQ
/// features padded), ones that pad it (dv = 5) and odd sizes in every dim stay within the
/// f16 inputs' tolerance: the default bf16x3 split keeps the products at 2^-16.
TEST(FusedEmulated, TensorCoreTilesFullAndPadded) {
  for (int64_t dv : {8, 5})
    for (const char *variant : {"posrf-orf", "oprf-mm", "saderf-sgq"}) {
      VariantConfig config;
      config.m = std::string(variant) == "saderf-sgq" ? 33 : 32;
      config.d = 16;
      FusedEmulatedAttention fused(variant, config, "f16");
      EXPECT_NE(fused.kernelIR("mapped", dv).find("spectra.mma = {"), std::string::npos) << variant;
      torch::manual_seed(11);
      Case c{torch::randn({2, 2, 37, 16}, torch::kFloat64) * 0.6,
             torch::randn({2, 2, 29, 16}, torch::kFloat64) * 0.6,
             torch::randn({2, 2, 29, dv}, torch::kFloat64), torch::ones({2, 29}, torch::kBool)};
      expectMatches(fused, c, 4e-3, std::string(variant) + " dv=" + std::to_string(dv));
    }
  // Odd sizes in every dim (m = 17, d = 12, dv = 7): every tile clipped, k padded.
  {
    VariantConfig odd;
    odd.m = 17;
    odd.d = 12;
    FusedEmulatedAttention fused("posrf-orf", odd, "f16");
    torch::manual_seed(13);
    Case c{torch::randn({2, 2, 23, 12}, torch::kFloat64) * 0.6,
           torch::randn({2, 2, 19, 12}, torch::kFloat64) * 0.6,
           torch::randn({2, 2, 19, 7}, torch::kFloat64), torch::ones({2, 19}, torch::kBool)};
    expectMatches(fused, c, 4e-3, "posrf-orf m=17 d=12 dv=7");
  }
  // f32 inputs keep the FMA thread nests.
  VariantConfig config;
  config.m = 32;
  config.d = 16;
  FusedEmulatedAttention f32("posrf-orf", config);
  EXPECT_EQ(f32.kernelIR("mapped").find("spectra.mma"), std::string::npos);
}

/// Warp chains (codegen/WarpChains.h): the logits, features and exponentials stay in
/// registers between two mma, the first mma's accumulators the second's A fragments. The
/// readout splits the features over the warps (m = 64 and 128 at 8 warps: one k8 or one k16
/// step of the second mma per warp; row maxima through quad shuffles and the warps'
/// partials); kv at m = 128 and 256 takes 16 features per warp at a time, transposed
/// (S += phi^T V from the registers; the running per-feature maximum, S and z rescaled,
/// across 2 key tiles; at m = 256 two 16-feature blocks per warp, one after the other). The
/// emulation runs those lane maps, shuffles and fragment reuses lane by lane: any mistake in
/// them shows here. 37 query rows: the last tile has 5 rows, the mma's other 11 padding;
/// dv = 5 pads the second mma's 8 columns.
TEST(FusedEmulated, WarpChainKeepsTheExponentialInRegisters) {
  struct Run {
    int64_t m;
    const char *dtype, *variant;
  };
  for (auto [m, dtype, variant] :
       {Run{128, "bf16", "posrf-orf"}, Run{128, "bf16", "oprf-mm"}, Run{128, "bf16", "saderf-orf"},
        Run{128, "f16", "posrf-orf"}, Run{64, "bf16", "posrf-orf"}, Run{256, "bf16", "posrf-orf"}}) {
    VariantConfig config;
    config.m = m;
    config.d = m == 64 ? 16 : 32;
    FusedEmulatedAttention fused(variant, config, dtype);
    std::string name = std::string(variant) + " " + dtype + " m=" + std::to_string(m);
    double tol = std::string(dtype) == "bf16" ? 2e-2 : 4e-3;
    // m = 256 (two feature blocks per warp in kv) once: its emulation is the slowest.
    for (int64_t dv : m == 256 ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 5}) {
      std::string what = name + " dv=" + std::to_string(dv);
      std::string mapped = fused.kernelIR("mapped", dv);
      size_t readout = mapped.find("_readout(");
      ASSERT_NE(readout, std::string::npos) << what;
      EXPECT_NE(mapped.find("transposed = false", readout), std::string::npos) << what;
      size_t kv = mapped.find("_kv(");
      ASSERT_NE(kv, std::string::npos) << what;
      if (m >= 128) {
        EXPECT_LT(mapped.find("transposed = true", kv), mapped.find("_kv_combine(")) << what;
      }
      if (m == 128) {
        // The backward kernels chain too (split: the logits and the features' gradient in
        // registers, the tiles read after the chain stored as it ends), 37 query rows
        // leaving a partial tile whose rows past the end the chain zeroes in registers.
        size_t qb = mapped.find("_query_backward("), kb = mapped.find("_key_backward(");
        ASSERT_NE(qb, std::string::npos) << what;
        ASSERT_NE(kb, std::string::npos) << what;
        EXPECT_LT(mapped.find("spectra.warp_chain", qb), kb) << what;
        EXPECT_NE(mapped.find("spectra.warp_chain", kb), std::string::npos) << what;
      }
      torch::manual_seed(17);
      Case c{torch::randn({2, 2, 37, config.d}, torch::kFloat64) * 0.7,
             torch::randn({2, 2, 29, config.d}, torch::kFloat64) * 0.7,
             torch::randn({2, 2, 29, dv}, torch::kFloat64), torch::ones({2, 29}, torch::kBool)};
      expectMatches(fused, c, tol, what);
    }
    // Query logits that differ by hundreds within a row (q at 40 times the unit scale): the
    // warps' maxima must be combined into one stabiliser per row, or some warp's
    // exponentials overflow. Only the output is compared; all are finite.
    if (m == 256)
      continue;
    torch::manual_seed(18);
    Case big{torch::randn({2, 2, 37, config.d}, torch::kFloat64) * 40,
             torch::randn({2, 2, 29, config.d}, torch::kFloat64) * 0.7,
             torch::randn({2, 2, 29, 8}, torch::kFloat64), torch::ones({2, 29}, torch::kBool)};
    expectMatches(fused, big, tol, name + " q scale 40", 1);
  }
}

TEST(FusedEmulated, BackwardChainsLeaveThePaddedRowsOut) {
  // A declared feature of the direction x / ||x||, NaN at the zero rows that pad a partial
  // tile (rsqrt(||x||^2) = inf, w.x inf = NaN): the tile layer zeroes those rows of the query
  // backward's gradient tiles, which the warp chain (bf16, d = 32, m = 128: 16-row tiles) does
  // on its registers before it stores them. 13 queries: a partial tile.
  const char *ir = R"mlir(
    spectra.component @direction params(%m, %d) {
      %c = math.rsqrt %m : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %r = math.rsqrt %xx : f32
      %u = arith.mulf %wx, %r : f32
      %l = arith.subf %u, %half : f32
      spectra.feature_yield exp(%l : f32) scaled(%c : f32)
    }
    spectra.feature_map @direction_orf component @direction weights @orf m = 128 d = 32 seed = 1
  )mlir";
  FusedEmulatedAttention fused =
      FusedEmulatedAttention::fromIR(ir, "direction.mlir", "", "bf16");
  std::string mapped = fused.kernelIR("mapped");
  size_t qb = mapped.find("_query_backward(");
  ASSERT_NE(qb, std::string::npos);
  EXPECT_LT(mapped.find("spectra.warp_chain", qb), mapped.find("_key_backward(", qb));
  torch::manual_seed(21);
  Case c{torch::randn({2, 2, 13, 32}, torch::kFloat64), torch::randn({2, 2, 21, 32}, torch::kFloat64),
         torch::randn({2, 2, 21, 8}, torch::kFloat64), torch::ones({2, 21}, torch::kBool)};
  expectMatches(fused, c, 2e-2, "direction-orf bf16 m=128");
}

/// SPECTRA_MMA picks the tensor cores' precision for the GPU kernels and their emulation
/// (a switch for a first run on a GPU): bf16 rounds the operands once, f16 rounds them to
/// f16, none keeps FMA thread nests; another value is ignored (the default, bf16x3).
TEST(FusedEmulated, SpectraMmaPicksTheTensorCorePath) {
  VariantConfig config;
  config.m = 32;
  config.d = 16;
  auto mapped = [&](const char *mode) {
    if (mode)
      setenv("SPECTRA_MMA", mode, 1);
    else
      unsetenv("SPECTRA_MMA");
    FusedEmulatedAttention fused("posrf-orf", config, "bf16");
    unsetenv("SPECTRA_MMA");
    return fused.kernelIR("mapped");
  };
  EXPECT_NE(mapped(nullptr).find("split = true"), std::string::npos);
  EXPECT_NE(mapped("bf16").find("split = false"), std::string::npos);
  EXPECT_EQ(mapped("none").find("spectra.mma"), std::string::npos);
  EXPECT_NE(mapped("tf32").find("split = true"), std::string::npos);
  EXPECT_NE(mapped("f16").find("type = f16"), std::string::npos);
  // f16 operands, one rounding each, within the f16 inputs' tolerance (posrf's features and
  // these short sums stay far inside f16's range).
  setenv("SPECTRA_MMA", "f16", 1);
  FusedEmulatedAttention f16("posrf-orf", config, "f16");
  unsetenv("SPECTRA_MMA");
  torch::manual_seed(12);
  Case c{torch::randn({2, 2, 37, 16}, torch::kFloat64) * 0.6,
         torch::randn({2, 2, 29, 16}, torch::kFloat64) * 0.6,
         torch::randn({2, 2, 29, 8}, torch::kFloat64), torch::ones({2, 29}, torch::kBool)};
  expectMatches(f16, c, 4e-3, "posrf-orf, f16 operands");
  setenv("SPECTRA_MMA", "none", 1);
  EXPECT_STREQ(spectra_gpu_mma_mode(), "none");
  unsetenv("SPECTRA_MMA");
  EXPECT_STREQ(spectra_gpu_mma_mode(), "bf16x3");
}

TEST(FusedEmulated, ScalesFromOneToAThousandStayFinite) {
  FusedEmulatedAttention fused("posrf-orf", small("orf"));
  for (double scale : {1.0, 10.0, 100.0, 1000.0}) {
    Case c = makeCase(scale, 6);
    Weights w = WeightFactory(fused.descriptor()).draw(0, torch::kFloat32);
    torch::Tensor out = fused.attention(c.q.to(torch::kFloat32), c.k.to(torch::kFloat32),
                                        c.v.to(torch::kFloat32), w, c.mask);
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>()) << "scale " << scale;
  }
}

TEST(FusedEmulated, ManyBlocksAndChunksMatchTheReference) {
  // 600 keys and 520 queries: three row chunks per slice (the keys' three of 200, sized by
  // the launch plan; the queries' readout in chunks of 256, the last ragged), so the
  // combine kernels merge several blocks' partials.
  FusedEmulatedAttention fused("posrf-orf", small("orf"));
  expectMatches(fused, makeCase(0.7, 7, 520, 600), 2e-3, "posrf-orf, 3 chunks");
}

/// Sets an environment variable for a scope (the emulated launcher reads SPECTRA_GPU_BLOCKS at
/// each launch).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char *name, const char *value) : name(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

TEST(FusedEmulated, ChunksSizedFromTheTargetBlocksMatchTheReference) {
  // kv, the backward kernels and their combines with the chunk count the launcher picks
  // (rowChunks): one block for all 600 keys and 520 queries of a slice (a target of 1 block),
  // then 2 chunks of 300 key rows and 260 query rows (6 blocks over 4 slices), not 256-row chunks.
  FusedEmulatedAttention fused("posrf-orf", small("orf"));
  for (const char *blocks : {"1", "6"}) {
    ScopedEnv env("SPECTRA_GPU_BLOCKS", blocks);
    expectMatches(fused, makeCase(0.7, 7, 520, 600), 2e-3,
                  std::string("posrf-orf, a target of ") + blocks + " blocks");
  }
  // saderf reads statistics (the moments kernels are chunked the same way).
  FusedEmulatedAttention saderf("saderf-mm", small("mm"));
  ScopedEnv env("SPECTRA_GPU_BLOCKS", "6");
  expectMatches(saderf, makeCase(0.7, 8, 520, 600), 2e-3, "saderf-mm, a target of 6 blocks");
}

TEST(FusedEmulated, RowChunksFillTheTargetWithNoEmptyChunk) {
  struct Target : KernelLauncher {
    int64_t blocks;
    explicit Target(int64_t blocks) : blocks(blocks) {}
    const KernelAbi &abi(const std::string &) const override { throw std::logic_error("unused"); }
    bool has(const std::string &) const override { return false; }
    void launch(const KernelAbi &, const std::vector<torch::Tensor> &) const override {}
    int64_t targetBlocks() const override { return blocks; }
  };
  KernelAbi abi;
  abi.chunkRows = 256;
  abi.tileRows = 16;
  abi.chunksFromPartials = true;
  // An H100's wave (264 blocks) over 16 slices of 65536 rows: 17 chunks of 3856 rows, not
  // 256 chunks of 256 (the partial sums the combines read shrink 15x).
  EXPECT_EQ(rowChunks(Target(264), abi, 65536, 16), 17);
  // Never more than 256-row chunks give: 8 slices of 4096 rows keep 16.
  EXPECT_EQ(rowChunks(Target(264), abi, 4096, 8), 16);
  EXPECT_EQ(rowChunks(Target(1), abi, 4096, 8), 1);
  // 20 rows in 8-row chunks (3), 3 blocks wanted: 7 rows each round up to one 16-row tile,
  // so the third chunk would be empty; the count shrinks to the 2 that hold rows.
  abi.chunkRows = 8;
  EXPECT_EQ(rowChunks(Target(3), abi, 20, 1), 2);
  // No preference, or a fixed-chunk kernel: ceil(rows / chunk_rows).
  EXPECT_EQ(rowChunks(Target(0), abi, 20, 1), 3);
  abi.chunksFromPartials = false;
  EXPECT_EQ(rowChunks(Target(3), abi, 20, 1), 3);
  EXPECT_EQ(rowChunks(Target(3), abi, 0, 1), 0);
}

TEST(FusedEmulated, SameInputsGiveTheSameBits) {
  FusedEmulatedAttention fused("saderf-mm", small("mm"));
  Case c = makeCase(0.9, 8, 300, 530);
  Weights w = WeightFactory(fused.descriptor()).draw(0, torch::kFloat32);
  auto once = [&] {
    return fused.attention(c.q.to(torch::kFloat32), c.k.to(torch::kFloat32),
                           c.v.to(torch::kFloat32), w, c.mask);
  };
  torch::Tensor a = once(), b = once();
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(FusedEmulated, LargerHeadsFitTheirTileRowsToSharedMemory) {
  // d = 64, m = 256: OPRF's and SADERF's backward kernels keep their tiles within the 48 KiB
  // a block has without opting in at the default 4 rows per tile in f32, since their wx,
  // ||x||^2, ||w||^2 and parameter gradients stopped taking tiles of their own
  // (factoredArguments: SADERF's query_backward writes three [T, m] tiles where it wrote
  // eight; f32 took 2 rows before). On tensor cores (bf16, the sm_90a schedule the emulation
  // runs) they take 16 rows, the most that keep two blocks per SM, so the mma's 16 rows are
  // all rows (8 while they also summed a gradient for the constant coefficient m^(-1/2): its
  // [T, m] tile took them past what two blocks leave at 16 rows). The launch description
  // says so, and both match the float64 reference.
  char *error = nullptr;
  spectra_cpu_kernel *k =
      spectra_emulated_compile_variant("oprf-orf", 256, 64, 0, "", "f32", 0, 0, &error);
  ASSERT_NE(k, nullptr) << (error ? error : "");
  auto rows = [&](const char *kind) {
    return KernelAbi::parse(spectra_cpu_kernel_abi(k, kind)).tileRows;
  };
  EXPECT_EQ(rows("kv"), 4);
  EXPECT_EQ(rows("readout"), 4);
  EXPECT_EQ(rows("query_backward"), 4);
  EXPECT_EQ(rows("key_backward"), 4);
  spectra_cpu_kernel_free(k);
  k = spectra_emulated_compile_variant("saderf-mm", 256, 64, 0, "", "bf16", 0, 0, &error);
  ASSERT_NE(k, nullptr) << (error ? error : "");
  EXPECT_EQ(rows("query_backward"), 16);
  EXPECT_EQ(rows("key_backward"), 16);
  spectra_cpu_kernel_free(k);
  VariantConfig config;
  config.m = 256;
  config.d = 64;
  // posrf-orf bf16 too: at this head the warp chains' register budget (64 values a lane, a
  // row contraction's or column reduction's accumulators counted beside the tiles) decides
  // how much of its backward the chains take (WarpChains.cpp).
  for (auto [variant, dtype] : {std::pair{"oprf-orf", "f32"}, std::pair{"saderf-mm", "bf16"},
                                std::pair{"posrf-orf", "bf16"}}) {
    FusedEmulatedAttention fused(variant, config, dtype);
    torch::manual_seed(7);
    Case c{torch::randn({2, 2, 21, 64}, torch::kFloat64) * 0.3,
           torch::randn({2, 2, 19, 64}, torch::kFloat64) * 0.3,
           torch::randn({2, 2, 19, 64}, torch::kFloat64), torch::ones({2, 19}, torch::kBool)};
    c.mask.index_put_({1, torch::indexing::Slice(16)}, false);
    expectMatches(fused, c, std::string(dtype) == "f32" ? 2e-3 : 2e-2,
                  std::string(variant) + " d=64 m=256 " + dtype);
  }
}

TEST(FusedEmulated, TheKernelAbiIsGeneratedAndChecked) {
  char *error = nullptr;
  spectra_cpu_kernel *k =
      spectra_emulated_compile_variant("posrf-orf", 16, 8, 0, "", "f32", 0, 0, &error);
  ASSERT_NE(k, nullptr) << (error ? error : "");
  KernelAbi abi = KernelAbi::parse(spectra_cpu_kernel_abi(k, "kv"));
  EXPECT_EQ(abi.grid, "keys");
  EXPECT_EQ(abi.chunkRows, 256);
  EXPECT_TRUE(abi.chunksFromPartials);  // the launcher picks kv's chunk count
  EXPECT_GT(abi.tileRows, 0);
  ASSERT_EQ(abi.args.size(), 12u);
  EXPECT_EQ(abi.args[0].name, "k");
  EXPECT_EQ(abi.args[0].role, "rows");
  EXPECT_EQ(abi.args[0].rank, 3);
  EXPECT_EQ(abi.args[7].name, "S");
  EXPECT_EQ(abi.args[7].role, "partial");
  EXPECT_EQ(abi.args[7].rank, 4);
  // The launch grid is the host function's: a block per (256-row chunk, slice).
  std::map<std::string, torch::Tensor> rows = {
      {"k", torch::zeros({6, 600, 8})}, {"v", torch::zeros({6, 600, 8})},
      {"keep", torch::zeros({6, 600})}, {"Wt", torch::zeros({8, 16})}, {"ww", torch::zeros({16})},
      {"rowscale", torch::zeros({16})}, {"params", torch::zeros({6, 1})},
      {"S", torch::zeros({6, 3, 16, 8})}, {"z", torch::zeros({6, 3, 16})},
      {"zabs", torch::zeros({6, 3, 16})}, {"c", torch::zeros({6, 3, 16})},
      {"kscale", torch::zeros({6, 8})}};
  abi.kind = "kv";
  EXPECT_EQ(launchGrid(abi, kernelOperands(abi, rows)), (std::array<int64_t, 3>{3, 6, 1}));
  // The chunk count is the partial sums': 2 chunks (of 300 rows) when they hold 2.
  for (const char *partial : {"S", "z", "zabs", "c"}) {
    std::vector<int64_t> shape = rows[partial].sizes().vec();
    shape[1] = 2;
    rows[partial] = torch::zeros(shape);
  }
  EXPECT_EQ(launchGrid(abi, kernelOperands(abi, rows)), (std::array<int64_t, 3>{2, 6, 1}));
  EXPECT_THROW(KernelAbi::parse("grid=keys;chunks=rows;k:rows:3:f32;"), std::invalid_argument);
  EXPECT_THROW(KernelAbi::parse("grid=keys;chunks=partials;k:rows:3:f32;"), std::invalid_argument);
  // A launch plan that disagrees with the ABI is refused with the buffer named.
  KernelAbi combine = KernelAbi::parse(spectra_cpu_kernel_abi(k, "kv_combine"));
  combine.kind = "kv_combine";
  EXPECT_EQ(combine.grid, "slices");
  try {
    kernelOperands(combine, {{"Sp", torch::zeros({1, 16, 8})}});
    ADD_FAILURE() << "a rank-3 Sp was accepted";
  } catch (const c10::Error &e) {
    EXPECT_NE(std::string(e.what()).find("buffer 'Sp' has rank 3, the kernel takes rank 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(KernelAbi::parse("nonsense"), std::invalid_argument);
  spectra_cpu_kernel_free(k);
}

TEST(FusedEmulated, AComponentWithoutABackwardIsTheSameOnEveryTarget) {
  // math.erf has no derivative rule: the forward kernels exist on every target, the backward
  // ones on none, and each target says why in the same words.
  const std::string ir = spectra::test::kUndifferentiableFeature;
  const std::string why = "'math.erf' op cannot be differentiated by spectra-derive-partials";
  FusedCpuAttention cpu = FusedCpuAttention::fromIR(ir, "erfy.mlir");
  FusedEmulatedAttention emulated = FusedEmulatedAttention::fromIR(ir, "erfy.mlir");
  Case c = makeCase(1.0, 5);
  Weights w = WeightFactory(cpu.descriptor()).draw(0, torch::kFloat32);
  auto q = c.q.to(torch::kFloat32), k = c.k.to(torch::kFloat32), v = c.v.to(torch::kFloat32);
  {
    torch::NoGradGuard g;
    torch::Tensor a = cpu.attention(q, k, v, w, c.mask), b = emulated.attention(q, k, v, w, c.mask);
    EXPECT_LT(maxAbs(a - b), 1e-5) << "the forward agrees across targets";
  }
  auto backwardError = [&](auto &fused) -> std::string {
    torch::Tensor qg = q.clone().requires_grad_();
    try {
      fused.attention(qg, k, v, w, c.mask).sum().backward();
    } catch (const std::exception &e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(backwardError(cpu).find(why), std::string::npos) << backwardError(cpu);
  EXPECT_NE(backwardError(emulated).find(why), std::string::npos) << backwardError(emulated);
  // The CUDA launcher's artifact (host side, no GPU): forward kernels only, and the reason.
  GpuArtifact artifact = GpuArtifact::fromJson(compileGpuIR(ir, "erfy.mlir", "", "sm_80", "f32", 0));
  EXPECT_EQ(artifact.kernels.count("kv"), 1u);
  EXPECT_EQ(artifact.kernels.count("query_backward"), 0u);
  try {
    artifact.kernel("query_backward");
    ADD_FAILURE() << "a missing backward kernel was found";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(FusedEmulated, UnknownDtypeAndVariantAreNamed) {
  EXPECT_THROW(FusedEmulatedAttention("posrf-orf", small("orf"), "f64"), std::invalid_argument);
  try {
    FusedEmulatedAttention("posrf-orff", small("orf"));
    ADD_FAILURE() << "an unknown variant was accepted";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("orff"), std::string::npos) << e.what();
  }
}

} // namespace
