//===- FusedCpuTest.cpp - the JIT-compiled fused forward against the reference ===//

#include "codegen/spectra_compiler.h"
#include "runtime/Compiler.h"
#include "runtime/FusedCpu.h"
#include "runtime/FusedEmulated.h"
#include "runtime/KernelLaunch.h"
#include "runtime/WeightFactory.h"
#include "test/Unit/CpuAmx.h"
#include "test/Unit/ParamsKernelsCheck.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <regex>
#include <mutex>
#include <thread>

using namespace spectra;

namespace {

/// A user component without ||x||^2 or ||w||^2 terms (both derived partials zero).
const char *const kPlainComponentIR = R"mlir(
    spectra.component @plain params(%m, %d) {
      %c = math.rsqrt %m : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %l = arith.mulf %wx, %half : f32
      spectra.feature_yield exp(%l : f32) scaled(%c : f32)
    }
    spectra.feature_map @plain_orf component @plain weights @orf m = 16 d = 8 seed = 2
  )mlir";

double maxAbs(const torch::Tensor &t) { return t.abs().max().item<double>(); }

struct Case {
  torch::Tensor q, k, v, mask;
};

Case makeCase(double scale, int seed) {
  torch::manual_seed(seed);
  Case c{torch::randn({2, 2, 12, 8}, torch::kFloat64) * scale,
         torch::randn({2, 2, 10, 8}, torch::kFloat64) * scale,
         torch::randn({2, 2, 10, 5}, torch::kFloat64), torch::ones({2, 10}, torch::kBool)};
  using torch::indexing::Slice;
  c.mask.index_put_({1, Slice(7)}, false);
  c.k.index_put_({1, Slice(), Slice(7)}, 4.0);  // junk under the padding
  return c;
}

/// Fused (f32) against the float64 reference with the same W.
void expectMatchesReference(FusedCpuAttention &fused, const Case &c, double tolerance,
                            const std::string &what) {
  const Descriptor &desc = fused.descriptor();
  Weights w64 = WeightFactory(desc).draw(desc.seed);
  torch::Tensor truth = ReferenceFeatureMap(desc).attention(c.q, c.k, c.v, w64, c.mask);
  FusedForward out = fused.forward(c.q.to(torch::kFloat32), c.k.to(torch::kFloat32),
                                   c.v.to(torch::kFloat32), WeightFactory(desc).draw(desc.seed, torch::kFloat32), c.mask);
  ASSERT_TRUE(torch::isfinite(out.out).all().item<bool>()) << what;
  EXPECT_LT(maxAbs(out.out.to(torch::kFloat64) - truth), tolerance * maxAbs(truth)) << what;
  EXPECT_EQ(out.S.sizes(), (std::vector<int64_t>{c.q.size(0), c.q.size(1), desc.numFeatures(),
                                                 c.v.size(3)}))
      << what;
}

// The CPU launches hand out their tasks one at a time: every task runs once, and a thread held
// up by one task leaves the rest to the others, where a split fixed in advance (what
// at::parallel_for does) would give it half of them. Another process on a core, or another
// guest on a virtual machine, holds a thread up in the same way.
TEST(FusedCpu, LaunchTasksGoToWhicheverThreadIsFree) {
  const int saved = at::get_num_threads();
  at::set_num_threads(2);
  for (int64_t total : {0, 1, 2, 7, 40}) {
    std::vector<std::atomic<int>> runs(total);
    runCpuTasks(total, [&](int64_t i) { runs[i]++; });
    for (int64_t i = 0; i < total; ++i)
      EXPECT_EQ(runs[i].load(), 1) << "task " << i << " of " << total;
  }
  // Task 0, the first claimed, holds its thread for 200 ms; the other 39 take 0.1 ms each.
  std::mutex mutex;
  std::map<std::thread::id, int> tasksOf;
  std::thread::id held;
  runCpuTasks(40, [&](int64_t i) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++tasksOf[std::this_thread::get_id()];
      if (i == 0)
        held = std::this_thread::get_id();
    }
    std::this_thread::sleep_for(i == 0 ? std::chrono::microseconds(200000)
                                       : std::chrono::microseconds(100));
  });
  at::set_num_threads(saved);
  ASSERT_EQ(tasksOf.size(), 2u) << "the tasks ran on two intra-op threads";
  EXPECT_EQ(tasksOf[held], 1) << "the held thread ran only its own task";
}

TEST(FusedCpu, RowMasksAreMadePerSliceOnce) {
  const int64_t B = 3, H = 2, N = 70;
  torch::Tensor mask = (torch::rand({B, N}) > 0.3).to(torch::kFloat64);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  torch::Tensor rows = keepPerSlice(mask, H, f32);
  EXPECT_EQ(rows.sizes(), (torch::IntArrayRef{B, H, N}));
  EXPECT_EQ(rows.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(rows.is_contiguous());
  for (int64_t h = 0; h < H; ++h)
    EXPECT_TRUE(torch::equal(rows.select(1, h), mask.to(torch::kFloat32))) << "head " << h;
  // A mask already per slice is the kernels' as it is: no copy.
  EXPECT_EQ(keepPerSlice(rows, H, f32).data_ptr(), rows.data_ptr());
  try {
    keepPerSlice(rows, H + 1, f32);
    ADD_FAILURE() << "a [B, H, N] mask for another head count was taken";
  } catch (const c10::Error &e) {
    EXPECT_NE(std::string(e.what()).find("a row mask must be [B, N] or [B, 3, N], got [3, 2, 70]"),
              std::string::npos)
        << e.what();
  }
  // The all-kept mask: ones, made again only when the shape changes.
  torch::Tensor all = keepAllPerSlice(B, H, N, f32);
  EXPECT_TRUE(torch::equal(all, torch::ones({B, H, N})));
  EXPECT_EQ(keepAllPerSlice(B, H, N, f32).data_ptr(), all.data_ptr());
  torch::Tensor other = keepAllPerSlice(B, H, N + 1, f32);
  EXPECT_EQ(other.sizes(), (torch::IntArrayRef{B, H, N + 1}));
  EXPECT_TRUE(torch::equal(other, torch::ones({B, H, N + 1})));
  // Under inference mode a fresh one, never cached: a training call after it saves its mask
  // for the backward, which an inference tensor cannot be.
  torch::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = keepAllPerSlice(B, H, N + 2, f32);
    EXPECT_TRUE(inference.is_inference());
  }
  torch::Tensor training = keepAllPerSlice(B, H, N + 2, f32);
  EXPECT_FALSE(training.is_inference());
  EXPECT_NE(training.data_ptr(), inference.data_ptr());
}

TEST(FusedCpu, EveryPaperVariantMatchesTheReference) {
  for (const char *component : {"posrf", "oprf", "saderf"})
    for (const char *weights : {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"}) {
      std::string variant = std::string(component) + "-" + weights;
      VariantConfig config;
      config.m = std::string(weights) == "sgq" ? 17 : 16;
      config.d = 8;
      FusedCpuAttention fused(variant, config);
      expectMatchesReference(fused, makeCase(0.8, 1), 1e-4, variant);
    }
}

TEST(FusedCpu, ExtraComponentsMatchTheReference) {
  for (const char *variant : {"trigrf-orf", "posrf-hyp-base", "gerf-qmc-sobol", "hcexp-fastfood",
                              "posrf-simrf", "oprf-scrf"}) {
    VariantConfig config;
    config.m = 16;
    config.d = 8;
    FusedCpuAttention fused(variant, config);
    expectMatchesReference(fused, makeCase(0.6, 2), 2e-4, variant);
  }
}

TEST(FusedCpu, TheKernelsCatchEveryNonFiniteInput) {
  // The bidirectional kernels carry the input check (no LibTorch pass over q, k and v
  // first): kv's per-tile mark 0 x ||k||^2 and 0 x S reach zabs, the guard counts carry
  // 0 x ||q||^2, so one inf or NaN anywhere, in a kept or a masked row, must give the usual
  // error. The W here has a positive first column, so a kept key (-inf, 0, ...) has logits
  // -inf everywhere: by its features alone it would look masked and be dropped in silence.
  // The marks are in the shared tile layer: the GPU kernels, run by gpu-emulated in f32 and
  // bf16, carry them too.
  using torch::indexing::Slice;
  for (const char *variant : {"posrf-orf", "saderf-orf", "trigrf-orf"}) {
    VariantConfig config;
    config.m = 16;
    config.d = 8;
    FusedCpuAttention fused(variant, config);
    FusedEmulatedAttention emulated(variant, config), emulatedBf16(variant, config, "bf16");
    EXPECT_TRUE(emulated.kernelsCheckValues());
    Weights w = WeightFactory(fused.descriptor()).draw(0, torch::kFloat32);
    w.W = w.W.abs() + 0.1;
    Case c = makeCase(0.5, 21);
    torch::Tensor q = c.q.to(torch::kFloat32), k = c.k.to(torch::kFloat32),
                  v = c.v.to(torch::kFloat32);
    using Attend = std::function<void(const torch::Tensor &, const torch::Tensor &,
                                      const torch::Tensor &)>;
    const std::pair<const char *, Attend> paths[] = {
        {"cpu, autograd", [&](auto &a, auto &b, auto &d) { fused.attentionWithStats(a, b, d, w, c.mask); }},
        {"cpu, forward", [&](auto &a, auto &b, auto &d) { fused.forward(a, b, d, w, c.mask); }},
        {"gpu-emulated f32", [&](auto &a, auto &b, auto &d) { emulated.attentionWithStats(a, b, d, w, c.mask); }},
        {"gpu-emulated bf16", [&](auto &a, auto &b, auto &d) { emulatedBf16.attentionWithStats(a, b, d, w, c.mask); }}};
    // Finite inputs: no error, and finite guard counts.
    AttentionResult fine = fused.attentionWithStats(q, k, v, w, c.mask);
    EXPECT_TRUE(torch::isfinite(fine.guarded).all().item<bool>()) << variant;
    EXPECT_TRUE(torch::isfinite(emulated.attentionWithStats(q, k, v, w, c.mask).guarded)
                    .all()
                    .item<bool>())
        << variant;
    struct Bad {
      const char *what;
      int tensor;  // 0 q, 1 k, 2 v
      int64_t b, row, col;
      float value;
    };
    // Batch 1 masks keys 7..9.
    const Bad cases[] = {{"q row, +inf", 0, 0, 3, 2, INFINITY},
                         {"q row, NaN", 0, 1, 11, 0, NAN},
                         {"kept key, -inf (every logit -inf)", 1, 0, 4, 0, -INFINITY},
                         {"kept key, NaN", 1, 1, 2, 5, NAN},
                         {"masked key, +inf", 1, 1, 8, 3, INFINITY},
                         {"kept value, -inf", 2, 0, 9, 4, -INFINITY},
                         {"masked value, NaN", 2, 1, 9, 1, NAN}};
    for (const Bad &bad : cases) {
      torch::Tensor t[3] = {q.clone(), k.clone(), v.clone()};
      t[bad.tensor].index_put_({bad.b, 1, bad.row, bad.col}, bad.value);
      for (const auto &[path, attend] : paths) {
        try {
          attend(t[0], t[1], t[2]);
          ADD_FAILURE() << variant << ", " << path << ", " << bad.what << ": no error";
        } catch (const c10::Error &e) {
          EXPECT_NE(std::string(e.what()).find("q, k and v must be finite"), std::string::npos)
              << variant << ", " << path << ", " << bad.what << ": " << e.what();
        }
      }
    }
  }
}

TEST(FusedCpu, LargeLogitsStayFiniteAndCorrect) {
  VariantConfig config;
  config.m = 16;
  config.d = 8;
  FusedCpuAttention fused("posrf-orf", config);
  expectMatchesReference(fused, makeCase(6.0, 3), 5e-3, "posrf-orf with logits past fp32's exp range");
}

TEST(FusedCpu, UserDeclaredFeatureCompilesAndMatches) {
  const char *ir = R"mlir(
    spectra.component @tempered params(%m, %d) {
      %c = math.rsqrt %m : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %t = arith.constant 1.500000e+00 : f32
      %h = arith.mulf %xx, %half : f32
      %s = arith.divf %wx, %t : f32
      %th = math.tanh %s : f32
      %l = arith.subf %th, %h : f32
      spectra.feature_yield exp(%l : f32) scaled(%c : f32)
    }
    spectra.feature_map @tempered_orf component @tempered weights @orf m = 16 d = 8 seed = 3
  )mlir";
  FusedCpuAttention fused = FusedCpuAttention::fromIR(ir, "tempered.mlir");
  expectMatchesReference(fused, makeCase(0.8, 4), 1e-4, "user-declared tempered feature");
  // Fusion: phi lives in tile buffers of 32 rows; no kernel allocates on the heap or
  // sizes a buffer by the sequence.
  std::string tiles = fused.kernelIR("tiles");
  EXPECT_EQ(tiles.find("memref.alloc("), std::string::npos) << tiles;
  EXPECT_EQ(tiles.find("memref.alloca(%"), std::string::npos) << "a buffer sized by the sequence";
  std::regex stackBuffer(R"(memref.alloca\(\) : memref<(\d+)x?(\d*)xf32>)");
  for (auto it = std::sregex_iterator(tiles.begin(), tiles.end(), stackBuffer); it != std::sregex_iterator(); ++it)
    EXPECT_LE(std::stoll((*it)[1]), 32) << "a buffer larger than a tile: " << it->str();
  for (const char *kernel : {"kv", "readout", "query_backward", "key_backward"})
    EXPECT_NE(tiles.find(std::string("func.func @tempered_orf_") + kernel + "("), std::string::npos)
        << kernel;
  EXPECT_NE(tiles.find("math.tanh"), std::string::npos);
  // The vector stage: register-tiled contractions at the host's width (or the forced one:
  // ctest runs this suite again with SPECTRA_CPU_VECTOR_WIDTH=16 and 4).
  const char *forced = std::getenv("SPECTRA_CPU_VECTOR_WIDTH");
  std::string lanes = forced && *forced ? forced : "";
  std::string vectors = fused.kernelIR("vectors");
  EXPECT_NE(vectors.find("vector.fma"), std::string::npos);
  if (!lanes.empty()) {
    EXPECT_NE(vectors.find("vector<" + lanes + "xf32>"), std::string::npos) << lanes << " lanes";
    EXPECT_NE(std::string(spectra_cpu_host_target()).find("-vl" + lanes), std::string::npos)
        << "the kernel cache key names the width";
  }
  // The FMAs in flight choose the register tile, so the cache key names them too.
  if (const char *chains = std::getenv("SPECTRA_CPU_FMA_CHAINS"); chains && *chains) {
    EXPECT_NE(std::string(spectra_cpu_host_target()).find(std::string("-fma") + chains),
              std::string::npos)
        << spectra_cpu_host_target();
  }
}

TEST(FusedCpu, AComponentThatIgnoresTheNormCompilesWithItsBackward) {
  // No ||x||^2 and no ||w||^2 term: both derived partials are zero (the kernels must still
  // build dq and dk from the wx partial alone).
  const char *ir = kPlainComponentIR;
  FusedCpuAttention fused = FusedCpuAttention::fromIR(ir, "plain.mlir");
  expectMatchesReference(fused, makeCase(0.5, 6), 1e-4, "a component without ||x||^2");
  EXPECT_NE(fused.kernelIR("tiles").find("func.func @plain_orf_key_backward("), std::string::npos);
}

TEST(FusedCpu, BadInputsAreReported) {
  VariantConfig config;
  config.m = 16;
  config.d = 8;
  FusedCpuAttention fused("posrf-orf", config);
  Weights w = WeightFactory(fused.descriptor()).draw(0, torch::kFloat32);
  torch::Tensor q = torch::randn({1, 1, 4, 6});
  try {
    fused.forward(q, q, q, w);
    FAIL();
  } catch (const c10::Error &e) {
    EXPECT_NE(std::string(e.what()).find("q has head dimension 6 but the feature map was built for d = 8"),
              std::string::npos);
  }
}

TEST(FusedCpu, TheCompilerNamesAMissingFeatureMap) {
  // Both targets' C API entry points compile one feature map of a module; a name that is not
  // there is reported, not a crash or the first map.
  const char *ir = "spectra.feature_map @pm component @posrf weights @orf m = 16 d = 8 seed = 1";
  char *error = nullptr;
  EXPECT_EQ(spectra_cpu_compile_ir(ir, "two.mlir", "nope", 0, 0, &error), nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(std::string(error), "no spectra.feature_map named 'nope'");
  spectra_free(error);
  error = nullptr;
  EXPECT_EQ(spectra_gpu_compile_ir(ir, "two.mlir", "nope", "sm_80", "f32", 0, 0, &error), nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(std::string(error), "no spectra.feature_map named 'nope'");
  spectra_free(error);
}

} // namespace

namespace {

/// Gradients of the fused kernels (autograd Function over the compiler-built
/// backward) against autograd of the float64 reference.
void expectGradientsMatch(FusedCpuAttention &fused, const std::string &what, double tol = 2e-3,
                          const Case &c = makeCase(0.7, 5)) {
  const Descriptor &desc = fused.descriptor();
  torch::Tensor probe =
      torch::randn({c.q.size(0), c.q.size(1), c.q.size(2), c.v.size(3)}, torch::kFloat64);
  auto grads = [&](bool useFused) {
    torch::Tensor q = c.q.clone().set_requires_grad(true), k = c.k.clone().set_requires_grad(true),
                  v = c.v.clone().set_requires_grad(true);
    WeightFactory factory(desc);
    Weights w = factory.draw(desc.seed, useFused ? torch::kFloat32 : torch::kFloat64);
    torch::Tensor out = useFused ? fused.attention(q, k, v, w, c.mask)
                                 : ReferenceFeatureMap(desc).attention(q, k, v, w, c.mask);
    (out.to(torch::kFloat64) * probe).sum().backward();
    std::vector<torch::Tensor> g = {q.grad(), k.grad(), v.grad()};
    for (auto &[name, factor] : w.learnable)
      g.push_back(factor.grad());
    return g;
  };
  std::vector<torch::Tensor> fusedGrads = grads(true), refGrads = grads(false);
  ASSERT_EQ(fusedGrads.size(), refGrads.size()) << what;
  const char *names[] = {"dq", "dk", "dv"};
  // A factor whose exact gradient vanishes (a hidden bias in front of batch normalisation) is
  // compared on the scale of the largest factor gradient: f32 leaves ~1e-7 of roundoff there.
  double factorScale = 0;
  for (size_t i = 3; i < refGrads.size(); ++i)
    factorScale = std::max(factorScale, maxAbs(refGrads[i]));
  for (size_t i = 0; i < refGrads.size(); ++i) {
    ASSERT_TRUE(fusedGrads[i].defined()) << what << " gradient #" << i << " missing";
    double scale = maxAbs(refGrads[i]);
    if (i >= 3)
      scale = std::max(scale, 1e-3 * factorScale);
    EXPECT_LT(maxAbs(fusedGrads[i].to(torch::kFloat64) - refGrads[i]), tol * (scale + 1e-6))
        << what << " " << (i < 3 ? names[i] : "d(learnable factor)") << " #" << i;
  }
}

// A few features past the last whole vector at d = 32 (SGQ's 65 at 8 and 16 lanes, m = 66 and
// 67): the vector stage forms their logits as dot products along d (VectorizeTiles'
// dotTail) and folds each row's tail into the row groups of its reductions. m = 72 at 16
// lanes (8 past 64) keeps the register tile. Rows past a whole tile, and masked keys.
TEST(FusedCpuBackward, FeatureTailsAtAFullHead) {
  torch::manual_seed(11);
  Case c{torch::randn({2, 2, 45, 32}, torch::kFloat64) * 0.3,
         torch::randn({2, 2, 38, 32}, torch::kFloat64) * 0.3,
         torch::randn({2, 2, 38, 32}, torch::kFloat64), torch::ones({2, 38}, torch::kBool)};
  c.mask.index_put_({1, torch::indexing::Slice(33)}, false);
  for (auto [variant, m] : std::vector<std::pair<const char *, int64_t>>{
           {"posrf-sgq", 65}, {"saderf-sgq", 65}, {"posrf-mm", 66}, {"oprf-mm", 67},
           {"posrf-mm", 72}}) {
    VariantConfig config;
    config.m = m;
    config.d = 32;
    FusedCpuAttention fused(variant, config);
    std::string what = std::string(variant) + " m=" + std::to_string(m);
    ASSERT_EQ(fused.descriptor().numFeatures(), m) << what;
    expectMatchesReference(fused, c, 2e-5, what);
    expectGradientsMatch(fused, what, 2e-4, c);
  }
}

// SGQ's weights are antipodal blocks (a zero row, P, then -P), and its CPU kernels contract P
// only (codegen/TileBuilder.h, Dims::pairs; FeatureTailsAtAFullHead and the numerics tests
// check their values against float64). Their ABI says so, and a W of another form is refused,
// naming the first row that breaks it, before any kernel reads it; a dense variant takes any W.
TEST(FusedCpu, AntipodalKernelsRefuseAnotherW) {
  VariantConfig config;
  config.m = 34;  // two blocks of 2 x 8 + 1
  config.d = 8;
  FusedCpuAttention fused("posrf-sgq", config);
  const Descriptor &desc = fused.descriptor();
  char *compileError = nullptr;
  spectra_cpu_kernel *k =
      spectra_cpu_compile_variant("posrf-sgq", 34, 8, 0, "", 8, 0, &compileError);
  ASSERT_NE(k, nullptr) << (compileError ? compileError : "");
  for (const char *kind : {"kv", "readout", "query_backward", "key_backward"})
    EXPECT_EQ(KernelAbi::parse(spectra_cpu_kernel_abi(k, kind)).antipodalPairs, 8) << kind;
  spectra_cpu_kernel_free(k);
  EXPECT_EQ(KernelAbi::parse("grid=keys;antipodal=8;k:rows:3:f32;").antipodalPairs, 8);
  EXPECT_THROW(KernelAbi::parse("grid=keys;antipodal=;k:rows:3:f32;"), std::invalid_argument);

  torch::manual_seed(5);
  torch::Tensor q = torch::randn({1, 2, 20, 8}) * 0.3, kk = torch::randn({1, 2, 20, 8}) * 0.3,
                v = torch::randn({1, 2, 20, 8});
  Weights drawn = WeightFactory(desc).draw(desc.seed, torch::kFloat32);
  EXPECT_NO_THROW(fused.forward(q, kk, v, drawn, std::nullopt));
  auto refused = [&](int64_t row, double by, const std::string &message) {
    Weights w = drawn;
    w.W = drawn.W.clone();
    w.W[row][3] += by;
    try {
      fused.forward(q, kk, v, w, std::nullopt);
      ADD_FAILURE() << "a W changed at row " << row << " was taken";
    } catch (const c10::Error &e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  refused(17 + 12, 1e-3, "row 29 of W is not minus row 21; pass the W the variant draws");
  refused(17, 0.5, "blocks of 17 (a zero row, 8 rows P, then -P: its weight recipe's points), "
                   "but row 17 of W is not zero");
  FusedCpuAttention dense("posrf-mm", config);
  Weights any = WeightFactory(dense.descriptor()).draw(0, torch::kFloat32);
  EXPECT_NO_THROW(dense.forward(q, kk, v, any, std::nullopt));
}

// The statistics' kernels (moments and their backward) read and write a whole tile's rows in
// place, a short tile through its staged copy (spectra-full-tiles-in-place): 70 queries and
// 90 keys are two whole 32-row tiles and a short one each (at 32-row tiles; smaller tiles
// divide 32 too), with masked keys (and junk under them) inside a whole tile and inside the
// short one; the moments' backward adds into dq and dk in place (dx is dxin).
TEST(FusedCpuBackward, StatisticsOverWholeAndShortTiles) {
  torch::manual_seed(31);
  using torch::indexing::Slice;
  Case c{torch::randn({2, 2, 70, 32}, torch::kFloat64) * 0.3,
         torch::randn({2, 2, 90, 32}, torch::kFloat64) * 0.3,
         torch::randn({2, 2, 90, 32}, torch::kFloat64), torch::ones({2, 90}, torch::kBool)};
  c.mask.index_put_({0, Slice(10, 21)}, false);
  c.mask.index_put_({1, Slice(70)}, false);
  c.k.index_put_({0, Slice(), Slice(10, 21)}, 3.0);
  c.k.index_put_({1, Slice(), Slice(70)}, 3.0);
  for (const char *variant : {"oprf-qmc", "saderf-orf", "hcexp-qmc"}) {
    VariantConfig config;
    config.m = 32;
    config.d = 32;
    FusedCpuAttention fused(variant, config);
    expectMatchesReference(fused, c, 2e-5, variant);
    expectGradientsMatch(fused, variant, 2e-4, c);
  }
}

// SPECTRA_CPU_AMX=1: the contractions on AMX tiles, each f32 operand split in two bf16 parts
// (three tile products per 32 k, f32 accumulation), on a host that has them. At d = 32,
// m = 128 every contraction of these variants' kernels fits the tiles (cpu-amx.test counts
// them): the logits, the summary, the readout and the backward's products, and the compiled
// statistics' kernels beside them for OPRF and SADERF. Rows past a whole tile, masked keys.
TEST(FusedCpuBackward, AmxContractionsMatchTheReference) {
  test::ScopedCpuAmx amx;
  if (std::string why; !test::ScopedCpuAmx::on(why))
    GTEST_SKIP() << why;
  torch::manual_seed(21);
  Case c{torch::randn({2, 2, 70, 32}, torch::kFloat64) * 0.3,
         torch::randn({2, 2, 64, 32}, torch::kFloat64) * 0.3,
         torch::randn({2, 2, 64, 32}, torch::kFloat64), torch::ones({2, 64}, torch::kBool)};
  c.mask.index_put_({1, torch::indexing::Slice(50)}, false);
  for (const char *variant : {"posrf-mm", "saderf-orf", "oprf-qmc"}) {
    VariantConfig config;
    config.m = 128;
    config.d = 32;
    FusedCpuAttention fused(variant, config);
    // bf16x3 carries each product to about 2^-16 of it (f32's FMAs: 2^-24).
    std::string what = std::string(variant) + " on AMX tiles";
    expectMatchesReference(fused, c, 1e-4, what);
    expectGradientsMatch(fused, what, 1e-3, c);
  }
}

TEST(FusedCpuBackward, MatchesReferenceAutograd) {
  for (const char *variant : {"posrf-orf", "oprf-orf", "saderf-mm", "trigrf-orf", "posrf-hyp-base",
                              "hcexp-qmc", "gerf-sorf"}) {
    VariantConfig config;
    config.m = 16;
    config.d = 8;
    FusedCpuAttention fused(variant, config);
    expectGradientsMatch(fused, variant);
  }
}

/// 12 queries fill 12 of a 32-row tile: query_backward takes M = +inf past them, so their
/// e = exp(l + c - M) is 0 with no select, whatever the key constants c. At d = 256 ORF's rows
/// have ||w||^2 near 256, and keys placed on them (k' = w) give each feature its largest
/// logit ||w||^2 / 2, near 128: past exp's f32 range (88.7). A zero query's PosRF logit is 0,
/// so a finite M of 0 past the rows would give exp(c) = inf there, and inf x 0 = NaN in dS,
/// then in dk and dv. The gradients must match float64 autograd.
TEST(FusedCpuBackward, QueriesPastTheLastTileGiveNothingAtLargeKeyConstants) {
  using torch::indexing::Slice;
  VariantConfig config;
  config.m = 16;
  config.d = 256;
  FusedCpuAttention fused("posrf-orf", config);
  const Descriptor &desc = fused.descriptor();
  const double s = std::pow(256.0, -0.25);  // the default scale of q and k
  torch::manual_seed(3);
  torch::Tensor q0 = torch::randn({1, 1, 12, 256}, torch::kFloat64) * 0.3;
  torch::Tensor k0 = torch::randn({1, 1, 16, 256}, torch::kFloat64) * 0.3;
  torch::Tensor W = WeightFactory(desc).draw(desc.seed).W;
  k0.index_put_({0, 0, Slice(0, 16)}, W / s);
  torch::Tensor v0 = torch::randn({1, 1, 16, 5}, torch::kFloat64);
  torch::Tensor probe = torch::randn({1, 1, 12, 5}, torch::kFloat64);
  torch::Tensor mask = torch::ones({1, 16}, torch::kBool);
  auto grads = [&](bool useFused) {
    torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                  v = v0.clone().requires_grad_();
    Weights w = WeightFactory(desc).draw(desc.seed, useFused ? torch::kFloat32 : torch::kFloat64);
    torch::Tensor out = useFused ? fused.attention(q, k, v, w, mask)
                                 : ReferenceFeatureMap(desc).attention(q, k, v, w, mask);
    (out.to(torch::kFloat64) * probe).sum().backward();
    return std::vector<torch::Tensor>{q.grad(), k.grad(), v.grad()};
  };
  FusedForward f = fused.forward(q0.to(torch::kFloat32), k0.to(torch::kFloat32),
                                 v0.to(torch::kFloat32),
                                 WeightFactory(desc).draw(desc.seed, torch::kFloat32), mask);
  EXPECT_GT(f.shift.max().item<double>(), 88.8)
      << "no key constant past exp's range: the case tests nothing";
  std::vector<torch::Tensor> fusedGrads = grads(true), refGrads = grads(false);
  const char *names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(torch::isfinite(fusedGrads[i]).all().item<bool>()) << names[i];
    EXPECT_LT(maxAbs(fusedGrads[i].to(torch::kFloat64) - refGrads[i]),
              2e-3 * (maxAbs(refGrads[i]) + 1e-6))
        << names[i];
  }
}

TEST(FusedCpuBackward, AFeatureNotFiniteAtZeroLeavesThePaddedRowsOut) {
  // A declared feature of the direction x / ||x||: at the zero rows that pad a partial tile,
  // rsqrt(||x||^2) = inf and w.x rsqrt(||x||^2) = 0 inf = NaN. The query backward zeroes
  // those rows of its outputs after the chain (its loop runs only in a partial tile): nothing
  // of them may reach dq, dk, dv or dW (summed over every row of the tile).
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
    spectra.feature_map @direction_orf component @direction weights @orf m = 16 d = 8 seed = 1
  )mlir";
  FusedCpuAttention fused = FusedCpuAttention::fromIR(ir, "direction.mlir");
  // The GPU kernels (run on the CPU) come from the same tile code.
  FusedEmulatedAttention gpu = FusedEmulatedAttention::fromIR(ir, "direction.mlir");
  const Descriptor &desc = fused.descriptor();
  torch::manual_seed(9);
  // 12 queries and 20 keys: both sides end in a partial 32-row tile.
  torch::Tensor q0 = torch::randn({2, 2, 12, 8}, torch::kFloat64),
                k0 = torch::randn({2, 2, 20, 8}, torch::kFloat64),
                v0 = torch::randn({2, 2, 20, 5}, torch::kFloat64),
                probe = torch::randn({2, 2, 12, 5}, torch::kFloat64);
  enum Run { Reference, Cpu, Gpu };
  auto grads = [&](Run run) {
    auto type = run == Reference ? torch::kFloat64 : torch::kFloat32;
    torch::Tensor q = q0.clone().to(type).requires_grad_(),
                  k = k0.clone().to(type).requires_grad_(),
                  v = v0.clone().to(type).requires_grad_();
    Weights w = WeightFactory(desc).draw(desc.seed, type);
    w.W = w.W.detach().clone().requires_grad_();
    torch::Tensor out = run == Cpu   ? fused.attention(q, k, v, w)
                        : run == Gpu ? gpu.attention(q, k, v, w)
                                     : ReferenceFeatureMap(desc).attention(q, k, v, w);
    (out.to(torch::kFloat64) * probe).sum().backward();
    return std::vector<torch::Tensor>{out.detach().to(torch::kFloat64), q.grad(), k.grad(),
                                      v.grad(), w.W.grad()};
  };
  std::vector<torch::Tensor> want = grads(Reference);
  for (Run run : {Cpu, Gpu}) {
    std::vector<torch::Tensor> got = grads(run);
    const char *who = run == Cpu ? "cpu kernels" : "gpu kernels (emulated)";
    const char *names[] = {"out", "dq", "dk", "dv", "dW"};
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(got[i].defined() && want[i].defined()) << who << ": " << names[i];
      ASSERT_TRUE(torch::isfinite(got[i]).all().item<bool>())
          << who << ": " << names[i] << " is not finite";
      EXPECT_LT(maxAbs(got[i].to(torch::kFloat64) - want[i]), 1e-4 * (maxAbs(want[i]) + 1e-6))
          << who << ": " << names[i];
    }
  }
}

using AttendFn = std::function<torch::Tensor(const torch::Tensor &, const torch::Tensor &,
                                             const torch::Tensor &, const Weights &)>;

/// A drawn W (no gradient wanted) and the same W as a leaf that wants one: dq, dk and dv
/// come out bit for bit the same, dW only in the second run (its combines launched only
/// there), and there it matches float64 autograd of the reference. The backward kernels skip
/// the dW product for a fixed W.
void expectWeightGradientOnlyWhenAsked(const Descriptor &desc, const AttendFn &attend,
                                       bool causal, const std::string &what) {
  Case c = makeCase(0.7, 11);
  torch::Tensor k = causal ? c.q.clone() : c.k, v = causal ? torch::randn({2, 2, 12, 5}, torch::kFloat64) : c.v;
  torch::Tensor probe = torch::randn({2, 2, 12, 5}, torch::kFloat64);
  auto run = [&](bool wantW) {
    torch::Tensor q32 = c.q.to(torch::kFloat32).requires_grad_(),
                  k32 = k.to(torch::kFloat32).requires_grad_(),
                  v32 = v.to(torch::kFloat32).requires_grad_();
    Weights w = WeightFactory(desc).draw(desc.seed, torch::kFloat32);
    EXPECT_FALSE(w.W.requires_grad()) << what;
    if (wantW)
      w.W = w.W.detach().clone().requires_grad_();
    KernelTimer launches;  // the plan's launches by kind
    (attend(q32, k32, v32, w).to(torch::kFloat64) * probe).sum().backward();
    auto kinds = launches.totals();
    EXPECT_EQ(kinds.count(causal ? "causal_key_backward" : "key_backward"), 1u) << what;
    EXPECT_EQ(kinds.count("dweights_chunk_combine") + kinds.count("dweights_combine"),
              wantW ? 2u : 0u)
        << what << (wantW ? ": dW asked for but not combined" : ": dW combined for a drawn W");
    return std::vector<torch::Tensor>{q32.grad(), k32.grad(), v32.grad(), w.W.grad()};
  };
  std::vector<torch::Tensor> fixed = run(false), learnt = run(true);
  const char *names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fixed[i].defined() && learnt[i].defined()) << what << " " << names[i];
    EXPECT_TRUE(torch::equal(fixed[i], learnt[i])) << what << " " << names[i]
                                                   << " changed with W's gradient";
  }
  EXPECT_FALSE(fixed[3].defined()) << what << ": dW for a W that wants no gradient";
  ASSERT_TRUE(learnt[3].defined()) << what << ": no dW for a W that wants one";
  torch::Tensor W64 = WeightFactory(desc).draw(desc.seed).W.clone().requires_grad_();
  Weights w64 = WeightFactory(desc).draw(desc.seed);
  w64.W = W64;
  AttentionOptions options;
  options.causal = causal;
  torch::Tensor truth = ReferenceFeatureMap(desc).attention(c.q, k, v, w64, std::nullopt, options);
  (truth * probe).sum().backward();
  EXPECT_LT(maxAbs(learnt[3].to(torch::kFloat64) - W64.grad()), 2e-3 * maxAbs(W64.grad())) << what;
}

TEST(FusedCpuBackward, AFixedWeightMatrixGetsNoGradientAndNothingElseChanges) {
  VariantConfig config;
  config.m = 16;
  config.d = 8;
  for (bool causal : {false, true})
    for (const char *variant : {"posrf-orf", "saderf-mm"}) {
      if (causal && std::string(variant) == "saderf-mm")
        continue;  // causal attention refuses data-dependent parameters
      FusedCpuAttention cpu(variant, config, causal);
      FusedEmulatedAttention gpu(variant, config, "f32", causal);
      std::string what = std::string(variant) + (causal ? " causal" : "");
      expectWeightGradientOnlyWhenAsked(
          cpu.descriptor(),
          [&](const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
              const Weights &w) { return cpu.attention(q, k, v, w); },
          causal, what + " cpu");
      expectWeightGradientOnlyWhenAsked(
          gpu.descriptor(),
          [&](const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
              const Weights &w) { return gpu.attention(q, k, v, w); },
          causal, what + " gpu-emulated");
    }
}

TEST(FusedCpuBackward, QuadratureWeightsAndLearnableFactors) {
  VariantConfig sgq;
  sgq.m = 17;
  sgq.d = 8;
  FusedCpuAttention a("posrf-sgq", sgq);
  expectGradientsMatch(a, "posrf-sgq");
  // SSR: the spherical-radial rule's signed weights (centre 1 - d/rho^2 may be negative).
  VariantConfig ssr;
  ssr.m = 2 * (2 * 8 + 3);
  ssr.d = 8;
  for (const char *variant : {"posrf-ssr", "trigrf-ssr"}) {
    FusedCpuAttention c(variant, ssr);
    expectGradientsMatch(c, variant);
  }
  VariantConfig ff;
  ff.m = 16;
  ff.d = 8;
  FusedCpuAttention b("posrf-fastfoodl", ff);
  expectGradientsMatch(b, "posrf-fastfoodl (dS, dG, dB)");
  // GMM-PRF / GMM-RKS: dSigma_c and dmu_c reach the mixture through the kernels' dW.
  VariantConfig gmm;
  gmm.m = 15;
  gmm.d = 8;
  gmm.options = {{"components", 3}};
  for (const char *variant : {"posrf-gmm", "trigrf-gmm"}) {
    FusedCpuAttention c(variant, gmm);
    expectGradientsMatch(c, std::string(variant) + " (dSigma_c, dmu_c)");
  }
  // Generative-PRF / -RKS: the generator's weights and biases through the kernels' dW.
  VariantConfig generative;
  generative.m = 16;
  generative.d = 8;
  generative.options = {{"hidden", 8}};
  for (const char *variant : {"posrf-generative", "trigrf-generative"}) {
    FusedCpuAttention c(variant, generative);
    expectGradientsMatch(c, std::string(variant) + " (generator weights)");
  }
}

} // namespace

namespace {
TEST(FusedCpuBackward, AComponentThatIgnoresTheNorm) {
  FusedCpuAttention fused = FusedCpuAttention::fromIR(kPlainComponentIR, "plain.mlir");
  expectGradientsMatch(fused, "a component without ||x||^2");
}
} // namespace

namespace {

/// The compiled statistics' prologue of one launcher against float64 LibTorch: the column
/// sums and sums of squares under a mask over several row chunks (the last one partial), the
/// cross moment, and the backward (moments_backward adding keep (a + b x) to a gradient in
/// place) against float64 autograd.
void expectMomentsMatch(const KernelLauncher &l, torch::ScalarType type, double tol,
                        double gradTol, const std::string &what) {
  ASSERT_TRUE(l.has("moments") && l.has("moments_combine") && l.has("moments_backward")) << what;
  torch::manual_seed(3);
  const int64_t B = 2, H = 3, N = 2500, D = 8;  // 1024-row chunks on the CPU: three
  torch::Tensor x = (torch::randn({B, H, N, D}) * 2 + 0.5).to(type);
  torch::Tensor y = torch::randn({B, H, N, D}).to(type);
  torch::Tensor keep = torch::ones({B, N});
  keep[1].narrow(0, 1900, 600).zero_();
  torch::Tensor w = keep.to(torch::kFloat64).view({B, 1, N, 1});
  torch::Tensor x64 = x.to(torch::kFloat64).requires_grad_(true), y64 = y.to(torch::kFloat64);
  torch::Tensor sum64 = (x64 * w).sum(2), sumsq64 = (x64.square() * w).sum(2);

  std::array<torch::Tensor, 2> m = launchMoments(l, x, x, keep);
  EXPECT_EQ(m[0].scalar_type(), torch::kFloat32) << what;
  EXPECT_LT(maxAbs(m[0].to(torch::kFloat64) - sum64), tol * maxAbs(sum64)) << what << " sum";
  EXPECT_LT(maxAbs(m[1].to(torch::kFloat64) - sumsq64), tol * maxAbs(sumsq64)) << what << " sumsq";

  torch::Tensor ps = torch::randn({B, H, D}), pq = torch::randn({B, H, D});
  ((sum64 * ps.to(torch::kFloat64)).sum() + (sumsq64 * pq.to(torch::kFloat64)).sum()).backward();
  // Added to an existing gradient, in place.
  torch::Tensor before = torch::randn({B, H, N, D}).to(type);
  torch::Tensor dx = before.clone();
  launchMomentsBackward(l, x, keep, ps, pq * 2, dx);
  EXPECT_EQ(dx.scalar_type(), type) << what;
  torch::Tensor expected = before.to(torch::kFloat64) + x64.grad();
  EXPECT_LT(maxAbs(dx.to(torch::kFloat64) - expected), gradTol * maxAbs(expected))
      << what << " d(moments)/dx";
  // Masked rows get nothing added.
  EXPECT_EQ(maxAbs((dx - before)[1].narrow(1, 1900, 600).to(torch::kFloat64)), 0.0) << what;

  std::array<torch::Tensor, 2> c = launchMoments(l, x, y, keep);
  torch::Tensor cross64 = (x64.detach() * y64 * w).sum(2);
  EXPECT_LT(maxAbs(c[1].to(torch::kFloat64) - cross64), tol * maxAbs(cross64)) << what << " cross";
}

TEST(FusedCpu, CompiledStatisticsMatchLibTorch) {
  VariantConfig config;
  config.m = 16;
  config.d = 8;
  // Only components whose parameters read statistics get the prologue.
  EXPECT_FALSE(FusedCpuAttention("posrf-orf", config).launcher(torch::Tensor(), 8).has("moments"));
  for (const char *variant : {"saderf-orf", "oprf-qmc", "hcexp-mm"}) {
    FusedCpuAttention fused(variant, config);
    expectMomentsMatch(fused.launcher(torch::Tensor(), 8), torch::kFloat32, 1e-5, 4e-5, variant);
  }
  FusedEmulatedAttention emulated("saderf-orf", config, "bf16");
  // The gradient is written in bf16 (one rounding, 2^-8 relative).
  expectMomentsMatch(emulated.launcher(torch::Tensor(), 8), torch::kBFloat16, 1e-5, 8e-3,
                     "saderf-orf gpu-emulated bf16");
}

} // namespace

namespace {

// The row kernels write out, dq, dk and dv with streaming (non-temporal) stores where their
// rows span whole vectors, and their ABI asks for those buffers aligned to the vector's bytes;
// the launcher refuses a misaligned one by name instead of faulting, and rows narrower than a
// vector (d = 8 at 16 lanes) are written with ordinary stores and ask nothing.
TEST(FusedCpu, StreamedOutputsAreAlignedAndNamed) {
  VariantConfig config;  // d = 32: whole vectors at 4, 8 and 16 lanes
  FusedCpuAttention fused("posrf-orf", config);
  char *compileError = nullptr;
  spectra_cpu_kernel *k =
      spectra_cpu_compile_variant("posrf-orf", 128, 32, 0, "", 32, 0, &compileError);
  ASSERT_NE(k, nullptr) << (compileError ? compileError : "");
  auto abiOf = [&](const char *kind) { return KernelAbi::parse(spectra_cpu_kernel_abi(k, kind)); };
  KernelAbi readout = abiOf("readout");
  const int64_t bytes = readout.alignedBytes;
  ASSERT_TRUE(bytes == 16 || bytes == 32 || bytes == 64) << bytes;  // 4, 8 or 16 lanes
  EXPECT_EQ(readout.alignedArgs, (std::vector<std::string>{"out"}));
  EXPECT_EQ(abiOf("query_backward").alignedArgs, (std::vector<std::string>{"dq"}));
  std::vector<std::string> key = abiOf("key_backward").alignedArgs;
  std::sort(key.begin(), key.end());
  EXPECT_EQ(key, (std::vector<std::string>{"dk", "dv"}));
  EXPECT_TRUE(abiOf("kv").alignedArgs.empty());
  EXPECT_TRUE(abiOf("kv_combine").alignedArgs.empty());
  // A misaligned output is refused with its name (a view one float into a buffer); the
  // other operands are placeholders of the right rank (the check precedes any call).
  torch::Tensor storage = torch::empty({64 * 32 + 16});
  torch::Tensor out = storage.narrow(0, 1, 64 * 32).view({1, 64, 32});
  std::vector<torch::Tensor> operands;
  for (const KernelArgSpec &arg : readout.args) {
    std::vector<int64_t> shape(arg.rank + (arg.role == "shared" ? 0 : 1), 1);
    operands.push_back(arg.name == "out" ? out : torch::zeros(shape));
  }
  std::string error;
  try {
    SliceCall call(spectra_cpu_kernel_entry(k, "readout", nullptr), readout, operands);
  } catch (const c10::Error &e) {
    error = e.what();
  }
  EXPECT_NE(error.find("buffer 'out' must start on a multiple of " + std::to_string(bytes) +
                       " bytes"),
            std::string::npos)
      << error;
  spectra_cpu_kernel_free(k);
  // A pass whose outputs the runtime allocates runs and matches the float64 reference (rows
  // past the last full tile included).
  {
    torch::manual_seed(3);
    torch::Tensor q0 = torch::randn({2, 2, 100, 32}, torch::kFloat64) * 0.5,
                  k0 = torch::randn({2, 2, 90, 32}, torch::kFloat64) * 0.5,
                  v0 = torch::randn({2, 2, 90, 32}, torch::kFloat64),
                  probe = torch::randn({2, 2, 100, 32}, torch::kFloat64);
    const Descriptor &desc = fused.descriptor();
    auto run = [&](bool useFused) {
      torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
                    v = v0.clone().requires_grad_(true);
      Weights w = WeightFactory(desc).draw(desc.seed, useFused ? torch::kFloat32 : torch::kFloat64);
      torch::Tensor o = useFused ? fused.attention(q, k, v, w)
                                 : ReferenceFeatureMap(desc).attention(q, k, v, w);
      (o.to(torch::kFloat64) * probe).sum().backward();
      return std::vector<torch::Tensor>{o.detach().to(torch::kFloat64), q.grad(), k.grad(),
                                        v.grad()};
    };
    std::vector<torch::Tensor> got = run(true), want = run(false);
    for (int i = 0; i < 4; ++i)
      EXPECT_LT(maxAbs(got[i].to(torch::kFloat64) - want[i]), 1e-4 * maxAbs(want[i])) << i;
  }
  // Rows of 8 floats: whole vectors at 4 and 8 lanes, at 16 ordinary stores with nothing asked.
  spectra_cpu_kernel *k8 =
      spectra_cpu_compile_variant("posrf-orf", 16, 8, 0, "", 8, 0, &compileError);
  ASSERT_NE(k8, nullptr) << (compileError ? compileError : "");
  EXPECT_EQ(KernelAbi::parse(spectra_cpu_kernel_abi(k8, "readout")).alignedArgs.empty(),
            8 % (bytes / 4) != 0);
  spectra_cpu_kernel_free(k8);
  EXPECT_THROW(KernelAbi::parse("grid=keys;k:rows:3:f32;aligned=x:k;"), std::invalid_argument);
  KernelAbi parsed = KernelAbi::parse("grid=keys;k:rows:3:f32;aligned=64:k,v;");
  EXPECT_EQ(parsed.alignedBytes, 64);
  EXPECT_EQ(parsed.alignedArgs, (std::vector<std::string>{"k", "v"}));
}

TEST(FusedCpu, CompiledParamsMatchTheirProgram) {
  using test::expectParamsKernelsMatch;
  using test::kStatisticsComponentIR;
  VariantConfig config;
  config.m = 16;
  config.d = 8;
  for (const char *variant : {"saderf-orf", "oprf-qmc", "hcexp-mm"}) {
    FusedCpuAttention fused(variant, config);
    expectParamsKernelsMatch(fused, variant);
  }
  FusedCpuAttention declared = FusedCpuAttention::fromIR(kStatisticsComponentIR, "stats.mlir");
  expectParamsKernelsMatch(declared, "a declared component with statistics");
  // Its whole fused pass, gradients included, against the float64 reference.
  expectGradientsMatch(declared, "a declared component with statistics");
  // Components without statistics have no params kernels.
  EXPECT_FALSE(FusedCpuAttention("posrf-orf", config).launcher(torch::Tensor(), 8)
                   .has("moments_params"));
}

} // namespace

namespace {

/// Components whose parameters read statistics, with a query mask and a key mask: the fused
/// gradients (the statistics' gradient carried back by the node itself, added to dq and dk by
/// moments_backward) against autograd of the float64 reference; masked queries' statistics
/// terms vanish, and self-attention shapes (Nq = Nk) with padding on both sides.
TEST(FusedCpuBackward, StatisticsWithQueryAndKeyMasks) {
  torch::manual_seed(11);
  const int64_t B = 2, H = 2, N = 1300, D = 8;  // two 1024-row chunks, the second partial
  torch::Tensor q0 = torch::randn({B, H, N, D}, torch::kFloat64) * 0.8,
                k0 = torch::randn({B, H, N, D}, torch::kFloat64) * 0.8,
                v0 = torch::randn({B, H, N, 5}, torch::kFloat64);
  torch::Tensor mask = torch::ones({B, N}, torch::kBool);
  mask[1].narrow(0, 1000, 300).fill_(false);
  torch::Tensor probe = torch::randn({B, H, N, 5}, torch::kFloat64);
  for (const char *variant : {"saderf-orf", "oprf-qmc", "hcexp-mm"}) {
    VariantConfig config;
    config.m = 16;
    config.d = D;
    FusedCpuAttention fused(variant, config);
    const Descriptor &desc = fused.descriptor();
    auto grads = [&](bool useFused) {
      torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
                    v = v0.clone().requires_grad_(true);
      Weights w = WeightFactory(desc).draw(desc.seed, useFused ? torch::kFloat32 : torch::kFloat64);
      torch::Tensor out;
      if (useFused) {
        out = fused.attention(q, k, v, w, mask, std::nullopt, mask);
      } else {
        AttentionOptions o;
        o.queryMask = mask;
        out = ReferenceFeatureMap(desc).attention(q, k, v, w, mask, o);
      }
      // Padded queries' outputs are not part of the loss (as in training).
      (out.to(torch::kFloat64) * probe * mask.view({B, 1, N, 1})).sum().backward();
      return std::vector<torch::Tensor>{q.grad(), k.grad(), v.grad()};
    };
    std::vector<torch::Tensor> f = grads(true), r = grads(false);
    const char *names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i)
      EXPECT_LT(maxAbs(f[i].to(torch::kFloat64) - r[i]), 2e-3 * maxAbs(r[i]))
          << variant << " " << names[i];
    // A backward asked for q alone (torch::autograd::grad) carries the statistics' term too.
    torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
    Weights w = WeightFactory(desc).draw(desc.seed, torch::kFloat32);
    torch::Tensor out = fused.attention(q, k, v0, w, mask, std::nullopt, mask);
    torch::Tensor loss = (out.to(torch::kFloat64) * probe * mask.view({B, 1, N, 1})).sum();
    torch::Tensor dqAlone = torch::autograd::grad({loss}, {q})[0];
    EXPECT_LT(maxAbs(dqAlone.to(torch::kFloat64) - r[0]), 2e-3 * maxAbs(r[0]))
        << variant << " dq from a backward asked for q alone";
  }
}

} // namespace

// spectra_cpu_work_variant (codegen/KernelWork.h): each kernel's vector work per row tile at
// this host's vector width, against the contractions' closed forms, and the bound it implies.
TEST(FusedCpu, KernelWorkCountsTheContractionsAtTheHostWidth) {
  VariantConfig config;  // m = 128, d = 32
  KernelWorkTable posrf = cpuKernelWork("posrf-orf", config, false);
  KernelWorkTable saderf = cpuKernelWork("saderf-orf", config, false);
  ASSERT_EQ(posrf.count("kv"), 1u);
  double width = posrf["kv"]["width"];
  ASSERT_TRUE(width == 4 || width == 8 || width == 16) << width;
  // 32-row tiles, or 24 where the host's FMAs in flight take a 6-row register tile
  // (spectra-compile --host; ctest runs this suite again with SPECTRA_CPU_FMA_CHAINS=10).
  double rows = posrf["kv"]["tile_rows"];
  ASSERT_TRUE(rows == 32 || (rows == 24 && width <= 8)) << rows;
  const char *chains = std::getenv("SPECTRA_CPU_FMA_CHAINS");
  if (chains && *chains) {
    EXPECT_EQ(rows, std::atoi(chains) > (width >= 16 ? 16 : 8) ? 24 : 32) << chains;
  }
  for (auto &[kind, v] : posrf)
    EXPECT_EQ(v["tile_rows"], rows) << kind;
  const double product = rows * 32 * 128 / width;  // one tile's m x d contraction
  for (const char *kind : {"kv", "readout"}) {
    EXPECT_EQ(posrf[kind]["fma"], 2 * product) << kind;
    EXPECT_EQ(posrf[kind]["if_fma"], 0) << kind;
  }
  for (const char *kind : {"query_backward", "key_backward"}) {
    EXPECT_EQ(posrf[kind]["fma"], 4 * product) << kind;
    EXPECT_EQ(posrf[kind]["if_fma"], product) << kind;  // dW, where W is learnable
  }
  EXPECT_EQ(posrf["readout"]["exp"], rows * 128 / width);
  for (auto &[kind, v] : posrf) {
    EXPECT_EQ(v["exact"], 1) << kind;
    double bound = v["fma"] / (v["fma"] + v["exp"] * v["exp_ops"] + v["other"]);
    EXPECT_NEAR(v["bound"], bound, 1e-3) << kind;
    EXPECT_GT(v["bound"], 0.3) << kind;
    EXPECT_LT(v["bound"], 1.0) << kind;
  }
  // SADERF's features and backward do more elementwise work than PosRF's on the same products.
  for (const char *kind : {"kv", "query_backward", "key_backward"}) {
    EXPECT_EQ(saderf[kind]["fma"], posrf[kind]["fma"]) << kind;
    EXPECT_GT(saderf[kind]["other"], posrf[kind]["other"]) << kind;
  }
  try {
    cpuKernelWork("posrf-nope", config, false);
    FAIL() << "an unknown variant was accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("unknown weight matrix 'nope'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid weights: base, orf"), std::string::npos) << e.what();
  }
}
