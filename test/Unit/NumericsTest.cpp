//===- NumericsTest.cpp - attention stays finite and exact at any input scale ===//
//
// The stabiliser contract (runtime/Reference.h, codegen/spectra_compiler.h):
// for every paper variant and the extra components, the eager reference, the
// fused CPU kernels and the GPU kernels (on a GPU, or emulated on the CPU), at
// per-coordinate input scales 1 to 1000, forward and backward:
//  - outputs and gradients are finite;
//  - positive features give each output inside the range of the kept values;
//  - against an independent float64 computation in log space (the kernel
//    k(q, k_j) = sum_f phi_f(q) phi_f(k_j) summed per pair with its own max,
//    never through S and z), relative error below 1e-3 at scales 1 and 10 and
//    below 1e-2 at 30 (signed estimators: times the denominator's condition
//    number T / |den|, the bound of any summation of signed terms).
// A stabiliser with one key constant per slice (Stabilizer::PerSlice) must
// fail these checks: the test shows that it does.
//
//===----------------------------------------------------------------------===//

#include "runtime/FusedCpu.h"
#include "runtime/FusedCuda.h"
#include "runtime/FusedEmulated.h"
#include "runtime/WeightFactory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <sstream>

using namespace spectra;

namespace {

const auto f64 = torch::kFloat64;

/// The paper's 18 and the extra components.
std::vector<std::string> allVariants() {
  std::vector<std::string> out;
  for (const char *c : {"posrf", "oprf", "saderf"})
    for (const char *w : {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"})
      out.push_back(std::string(c) + "-" + w);
  for (const char *v : {"trigrf-orf", "posrf-hyp-base", "gerf-qmc", "hcexp-orf"})
    out.push_back(v);
  return out;
}

struct Inputs {
  torch::Tensor q, k, v, mask;  // float64
};

/// q, k ~ N(0, s^2) per coordinate (before the d^-1/4 inside attention), the
/// keys offset from the queries by s/2 per coordinate when `offset`, values
/// N(0, 1); the second sequence has 16 padded keys with junk under the padding.
Inputs makeInputs(double scale, bool offset, int seed) {
  const int64_t B = 2, H = 2, N = 64, d = 32;
  torch::manual_seed(seed);
  Inputs in{torch::randn({B, H, N, d}, f64) * scale, torch::randn({B, H, N, d}, f64) * scale,
            torch::randn({B, H, N, d}, f64), torch::ones({B, N}, torch::kBool)};
  if (offset)
    in.k = in.k + 0.5 * scale;
  using torch::indexing::Slice;
  in.mask.index_put_({1, Slice(N - 16)}, false);
  in.k.index_put_({1, Slice(), Slice(N - 16)}, 7.0 * scale);
  in.v.index_put_({1, Slice(), Slice(N - 16)}, 1e6);
  return in;
}

/// The float64 oracle: sum_j k(q, k_j) v_j / sum_j k(q, k_j), each pair's
/// kernel summed over features in log space, and the denominator guard as
/// the contract defines it. Also returns each query's condition number T / |den|.
struct Oracle {
  torch::Tensor out, condition;  // [B, H, Nq, dv], [B, H, Nq]
};
Oracle logSpaceOracle(const Descriptor &desc, const Weights &w64, const Inputs &in) {
  ReferenceFeatureMap fm(desc);
  double s = std::pow(static_cast<double>(desc.d), -0.25);
  torch::Tensor qs = in.q * s, ks = in.k * s;
  ComponentParams p = fm.params(qs, ks, in.mask);
  FeatureTerms tq = fm.featureTerms(qs, Side::Queries, p, w64);
  FeatureTerms tk = fm.featureTerms(ks, Side::Keys, p, w64);
  const int64_t B = qs.size(0), H = qs.size(1), Nq = qs.size(2), Nk = ks.size(2);
  auto flat = [](const torch::Tensor &t) { return t.reshape({t.size(0), t.size(1), t.size(2), -1}); };
  // a[b, h, n, j, f] = log|phi_f(q_n) phi_f(k_j)|, with its sign.
  torch::Tensor a = flat(tq.logits).unsqueeze(3) + flat(tk.logits).unsqueeze(2) +
                    flat(tq.coeffs).abs().log().unsqueeze(3) + flat(tk.coeffs).abs().log().unsqueeze(2);
  torch::Tensor sign = flat(tq.coeffs).sign().unsqueeze(3) * flat(tk.coeffs).sign().unsqueeze(2);
  torch::Tensor keep = in.mask.view({B, 1, 1, Nk, 1});
  a = a.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
  torch::Tensor top = std::get<0>(a.flatten(3).max(-1)).view({B, H, Nq, 1, 1});  // per query
  torch::Tensor e = torch::exp(a - top);                        // <= 1
  torch::Tensor kernel = (sign * e).sum(-1);                    // [B, H, Nq, Nk], scaled by exp(-top)
  torch::Tensor absKernel = e.sum(-1);
  torch::Tensor den = kernel.sum(-1, true), T = absKernel.sum(-1, true);
  torch::Tensor fired = den.abs() <= kDenominatorGuard * T;
  den = torch::where(fired, den + 2 * kDenominatorGuard * T, den);
  torch::Tensor v = in.v.masked_fill(in.mask.view({B, 1, Nk, 1}).logical_not(), 0.0);
  return {kernel.matmul(v) / den, (T / den.abs()).squeeze(-1)};
}

/// The worst relative error of positive features against the oracle, per scale (printed).
std::map<double, double> worstRelative;

/// What must hold for one variant at one scale; each violation as a line.
struct Check {
  std::string variant;
  double scale;
  bool offset;
  std::vector<std::string> failures;

  void fail(const std::string &what, const std::string &detail) {
    std::ostringstream os;
    os << variant << " at scale " << scale << (offset ? " (offset keys)" : "") << ", " << what
       << ": " << detail;
    failures.push_back(os.str());
  }

  /// Finite, within the kept values' range (positive features), and close to the oracle.
  void output(const std::string &what, const torch::Tensor &outIn, const Inputs &in,
              const Oracle &oracle, bool positive) {
    torch::Tensor out = outIn.to(f64);
    if (!torch::isfinite(out).all().item<bool>()) {
      fail(what, std::to_string(torch::isfinite(out).logical_not().sum().item<int64_t>()) +
                     " non-finite outputs");
      return;
    }
    const int64_t B = in.v.size(0);
    torch::Tensor keep = in.mask.view({B, 1, -1, 1});
    double inf = std::numeric_limits<double>::infinity();
    torch::Tensor lo = in.v.masked_fill(keep.logical_not(), inf).amin(2, true);
    torch::Tensor hi = in.v.masked_fill(keep.logical_not(), -inf).amax(2, true);
    double slack = 1e-5 * (hi - lo).max().item<double>();
    if (positive) {
      int64_t outside = ((out < lo - slack) | (out > hi + slack)).sum().item<int64_t>();
      if (outside > 0)
        fail(what, std::to_string(outside) + " outputs outside the range of the kept values");
    }
    double tolerance = scale <= 10 ? 1e-3 : scale <= 30 ? 1e-2 : -1;
    if (tolerance < 0)
      return;
    if (positive) {
      double rel = ((out - oracle.out).norm() / oracle.out.norm()).item<double>();
      worstRelative[scale] = std::max(worstRelative[scale], rel);
      if (!(rel < tolerance))
        fail(what, "relative error " + std::to_string(rel) + " against the float64 oracle (bound " +
                       std::to_string(tolerance) + ")");
    } else {
      // Per query: error relative to the values' range, over the condition number.
      torch::Tensor err = (out - oracle.out).abs().amax(-1) / (hi - lo).amax(-1);
      torch::Tensor bound = tolerance * oracle.condition.clamp_min(1);
      int64_t bad = (err > bound).sum().item<int64_t>();
      if (bad > 0)
        fail(what, std::to_string(bad) + " queries beyond " + std::to_string(tolerance) +
                       " x condition number against the float64 oracle (worst ratio " +
                       std::to_string((err / bound).max().item<double>()) + ")");
    }
  }

  void gradients(const std::string &what, const std::vector<torch::Tensor> &grads) {
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined() || !torch::isfinite(grads[i]).all().item<bool>())
        fail(what, std::string("gradient of ") + "qkv"[i] + " is not finite");
  }
};

bool isPositive(const Descriptor &desc, const Weights &w) {
  return desc.component.name != "trigrf" && !desc.rowWeights;
}

VariantConfig configFor(const std::string &variant) {
  VariantConfig config;
  config.m = variant.find("sgq") != std::string::npos ? 130 : 128;  // SGQ: 2 copies of 2d+1 points
  config.d = 32;
  return config;
}

/// Runs `attend` (f32 inputs, the key mask) forward and backward at every scale.
std::vector<std::string> sweep(
    const std::string &variant, const std::string &mode,
    const std::function<torch::Tensor(const Inputs &, const Weights &)> &attend) {
  VariantConfig config = configFor(variant);
  Descriptor desc = describeVariant(variant, config);
  Weights w64 = WeightFactory(desc).draw(desc.seed);
  Weights w32 = WeightFactory(desc).draw(desc.seed, torch::kFloat32);
  w32.W = w32.W.detach();  // FastFoodL's W is a function of its factors: one graph per draw
  bool positive = isPositive(desc, w64);
  std::vector<std::string> failures;
  int seed = 0;
  for (double scale : {1.0, 10.0, 30.0, 100.0, 1000.0})
    for (bool offset : {false, true}) {
      Inputs in = makeInputs(scale, offset, ++seed);
      // The oracle sees the float32-rounded inputs the kernels see.
      Inputs rounded{in.q.to(torch::kFloat32).to(f64), in.k.to(torch::kFloat32).to(f64),
                     in.v.to(torch::kFloat32).to(f64), in.mask};
      Oracle oracle = logSpaceOracle(desc, w64, rounded);
      Check check{variant, scale, offset, {}};
      torch::Tensor q = in.q.to(torch::kFloat32).requires_grad_(),
                    k = in.k.to(torch::kFloat32).requires_grad_(),
                    v = in.v.to(torch::kFloat32).requires_grad_();
      torch::Tensor out = attend(Inputs{q, k, v, in.mask}, w32);
      check.output(mode, out.detach(), rounded, oracle, positive);
      torch::manual_seed(seed);
      (out * torch::randn_like(out)).sum().backward();
      check.gradients(mode, {q.grad(), k.grad(), v.grad()});
      failures.insert(failures.end(), check.failures.begin(), check.failures.end());
    }
  return failures;
}

void printWorst(const std::string &what) {
  std::cout << what << ": worst relative error of positive features against the float64 oracle:";
  for (const auto &[scale, rel] : worstRelative)
    std::cout << " scale " << scale << ": " << rel << ";";
  std::cout << "\n";
  worstRelative.clear();
}

std::string join(const std::vector<std::string> &lines) {
  std::string s;
  for (const std::string &l : lines)
    s += "  " + l + "\n";
  return s;
}

TEST(Numerics, ReferenceIsFiniteAndExactAtEveryScale) {
  std::vector<std::string> failures;
  for (const std::string &variant : allVariants()) {
    ReferenceFeatureMap fm(describeVariant(variant, configFor(variant)));
    auto more = sweep(variant, "reference", [&](const Inputs &in, const Weights &w) {
      return fm.attention(in.q, in.k, in.v, w, in.mask);
    });
    failures.insert(failures.end(), more.begin(), more.end());
  }
  printWorst("reference");
  EXPECT_TRUE(failures.empty()) << failures.size() << " violations:\n" << join(failures);
}

TEST(Numerics, FusedCpuKernelsAreFiniteAndExactAtEveryScale) {
  std::vector<std::string> failures;
  for (const std::string &variant : allVariants()) {
    FusedCpuAttention fused(variant, configFor(variant));
    auto more = sweep(variant, "fused cpu", [&](const Inputs &in, const Weights &w) {
      return fused.attention(in.q, in.k, in.v, w, in.mask);
    });
    failures.insert(failures.end(), more.begin(), more.end());
  }
  printWorst("fused cpu");
  EXPECT_TRUE(failures.empty()) << failures.size() << " violations:\n" << join(failures);
}

TEST(Numerics, GpuKernelsAreFiniteAndExactAtEveryScale) {
  // Their PTX on a GPU; without one, their mapped IR on the CPU (gpu-emulated), never a skip.
  const bool gpu = torch::cuda::is_available();
  const std::string what = gpu ? "fused cuda" : "gpu-emulated";
  std::vector<std::string> failures;
  for (const std::string &variant : allVariants()) {
    std::shared_ptr<FusedCudaAttention> cudaKernels;
    std::shared_ptr<FusedEmulatedAttention> emulated;
    if (gpu)
      cudaKernels = FusedCudaAttention::forVariant(variant, configFor(variant));
    else
      emulated = std::make_shared<FusedEmulatedAttention>(variant, configFor(variant));
    auto more = sweep(variant, what, [&](const Inputs &in, const Weights &w) {
      if (!gpu)
        return emulated->attention(in.q, in.k, in.v, w, in.mask);
      Weights wd = w;
      wd.W = w.W.cuda();
      if (w.rowWeights)
        wd.rowWeights = w.rowWeights->cuda();
      return cudaKernels->attention(in.q.cuda(), in.k.cuda(), in.v.cuda(), wd, in.mask.cuda()).cpu();
    });
    failures.insert(failures.end(), more.begin(), more.end());
  }
  printWorst(what);
  EXPECT_TRUE(failures.empty()) << failures.size() << " violations:\n" << join(failures);
}

TEST(Numerics, OneKeyConstantPerSliceFailsTheChecks) {
  // The scheme this contract replaced: exact, but S and z underflow once logits spread
  // over more than float32's exp range. The checks above must catch it.
  size_t caught = 0;
  for (const char *variant : {"posrf-orf", "oprf-mm", "saderf-qmc"}) {
    ReferenceFeatureMap fm(describeVariant(variant, configFor(variant)));
    AttentionOptions perSlice;
    perSlice.stabilizer = Stabilizer::PerSlice;
    std::vector<std::string> failures = sweep(variant, "per-slice reference", [&](const Inputs &in, const Weights &w) {
      return fm.attention(in.q, in.k, in.v, w, in.mask, perSlice);
    });
    caught += !failures.empty();
    if (!failures.empty())
      std::cout << "per-slice stabiliser, " << failures.size() << " violations, e.g. " << failures.front() << "\n";
  }
  worstRelative.clear();
  EXPECT_EQ(caught, 3u) << "a per-slice key constant must fail the numerics checks for every variant";
}

TEST(Numerics, TheGuardFiresOnlyForSignedEstimatorsAndIsCounted) {
  // TrigRF with W = [0; e_1]: phi(q).phi(k) = e^{(|q|^2+|k|^2)/2}/m (cos(0) + cos(e_1.(q-k))).
  // One key at 0; query 0 at pi e_1 makes the estimate cos 0 + cos pi = 0 (the guard must
  // fire), query 1 at (pi/2) e_1 makes it 1 (it must not).
  VariantConfig config;
  config.m = 2;
  config.d = 8;
  Descriptor desc = describeVariant("trigrf-base", config);
  ReferenceFeatureMap fm(desc);
  FusedCpuAttention fused("trigrf-base", config);
  torch::Tensor W = torch::zeros({2, 8});
  W.index_put_({1, 0}, 1.0);
  Weights w{W, std::nullopt, {}};
  torch::Tensor q = torch::zeros({1, 2, 2, 8}), k = torch::zeros({1, 2, 1, 8});
  q.index_put_({0, torch::indexing::Slice(), 0, 0}, M_PI);
  q.index_put_({0, torch::indexing::Slice(), 1, 0}, M_PI / 2);
  torch::Tensor v = torch::full({1, 2, 1, 3}, 2.0);
  AttentionOptions unscaled;
  unscaled.scale = 1.0;
  AttentionResult ref = fm.attentionWithStats(q, k, v, w, std::nullopt, unscaled);
  AttentionResult fus = fused.attentionWithStats(q, k, v, w, std::nullopt, 1.0);
  for (const auto &[what, r] : {std::pair<const char *, AttentionResult>{"reference", ref}, {"fused", fus}}) {
    EXPECT_TRUE(torch::equal(r.guarded, torch::ones({1, 2}))) << what << ": one query per head guarded, got " << r.guarded;
    // The guarded query: den = 2 guard T with T = 2 e^{pi^2/2}/m and num = den_raw v, so
    // out = (1 + cos pi) / (2 guard 2) v (0 here up to cos's rounding); bounded by |v| / guard.
    EXPECT_TRUE(torch::isfinite(r.out).all().item<bool>()) << what;
    EXPECT_LE(r.out.abs().max().item<double>(), 2.0 / kDenominatorGuard) << what;
    // The other query is exact: a single key gives out = v.
    EXPECT_TRUE(torch::allclose(r.out.select(2, 1), torch::full({1, 2, 3}, 2.0), 1e-5, 1e-5)) << what;
  }
  // Positive features never fire, whatever the inputs.
  for (const char *variant : {"posrf-orf", "oprf-mm", "hcexp-orf"}) {
    Descriptor pd = describeVariant(variant, configFor(variant));
    Inputs in = makeInputs(100.0, true, 7);
    AttentionResult r = ReferenceFeatureMap(pd).attentionWithStats(
        in.q.to(torch::kFloat32), in.k.to(torch::kFloat32), in.v.to(torch::kFloat32),
        WeightFactory(pd).draw(0, torch::kFloat32), in.mask);
    EXPECT_EQ(r.guarded.sum().item<double>(), 0) << variant;
  }
}

TEST(Numerics, TheGuardSeesSignedRowWeightsAndNegativeCoefficients) {
  // Invariant coefficients take short cuts in the kernels: kv writes zabs = |z| and the
  // readout sums phi_f (sign(coeff) zabs_f) for |phi_f| zabs_f. Two identical rows of W
  // (both 0) with row weights +1/2 and -1/2 give z_0 = -z_1, so every query's denominator
  // cancels to rounding and the guard must fire, with T = sum |phi_f| zabs_f > 0. A zabs
  // taken as z would make T = 0 (0 / 0 out); a coefficient's sign left out of the readout's
  // sum would make T < 0 (the guard silent, out divided by rounding). Both for PosRF and for
  // a declared PosRF with a negative coefficient, in the reference, the CPU kernels and the
  // GPU kernels run on the CPU.
  const char *negated = R"mlir(
    spectra.component @negated params(%m, %d) {
      %r = math.rsqrt %m : f32
      %c = arith.negf %r : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %h = arith.mulf %xx, %half : f32
      %l = arith.subf %wx, %h : f32
      spectra.feature_yield exp(%l : f32) scaled(%c : f32)
    }
    spectra.feature_map @negated_orf component @negated weights @orf m = 2 d = 8 seed = 0
  )mlir";
  VariantConfig config;
  config.m = 2;
  config.d = 8;
  torch::manual_seed(5);
  torch::Tensor q = 0.5 * torch::randn({1, 2, 5, 8}), k = 0.5 * torch::randn({1, 2, 7, 8}),
                v = torch::randn({1, 2, 7, 3});
  Weights w{torch::zeros({2, 8}), torch::tensor({0.5f, -0.5f}), {}};
  // Without the cancellation (row weights 1/2, 1/2) nothing fires and the kernels match.
  Weights same{torch::zeros({2, 8}), torch::tensor({0.5f, 0.5f}), {}};
  auto check = [&](const char *what, const Descriptor &desc, const FusedCpuAttention &cpu,
                   const FusedEmulatedAttention &gpu) {
    ReferenceFeatureMap fm(desc);
    AttentionResult ref = fm.attentionWithStats(q, k, v, w);
    AttentionResult c = cpu.attentionWithStats(q, k, v, w);
    AttentionResult g = gpu.attentionWithStats(q, k, v, w);
    for (const auto &[who, r] : {std::pair<const char *, AttentionResult>{"reference", ref},
                                 {"cpu kernels", c}, {"gpu kernels (emulated)", g}}) {
      EXPECT_TRUE(torch::equal(r.guarded, torch::full({1, 2}, 5.0f)))
          << what << ", " << who << ": every query guarded, got " << r.guarded;
      EXPECT_TRUE(torch::isfinite(r.out).all().item<bool>()) << what << ", " << who;
      EXPECT_LE(r.out.abs().max().item<double>(), v.abs().max().item<double>() / kDenominatorGuard)
          << what << ", " << who;
    }
    AttentionResult plain = fm.attentionWithStats(q, k, v, same);
    for (const auto &[who, r] :
         {std::pair<const char *, AttentionResult>{"cpu kernels", cpu.attentionWithStats(q, k, v, same)},
          {"gpu kernels (emulated)", gpu.attentionWithStats(q, k, v, same)}}) {
      EXPECT_EQ(r.guarded.sum().item<double>(), 0) << what << ", " << who;
      EXPECT_TRUE(torch::allclose(r.out, plain.out, 1e-5, 1e-5)) << what << ", " << who;
    }
    EXPECT_EQ(plain.guarded.sum().item<double>(), 0) << what;
  };
  FusedCpuAttention posrf("posrf-orf", config);
  check("posrf-orf", posrf.descriptor(), posrf, FusedEmulatedAttention("posrf-orf", config));
  FusedCpuAttention neg = FusedCpuAttention::fromIR(negated, "negated.mlir");
  check("negated coefficient", neg.descriptor(), neg,
        FusedEmulatedAttention::fromIR(negated, "negated.mlir"));
}

} // namespace
