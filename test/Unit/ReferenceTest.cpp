//===- ReferenceTest.cpp - the eager reference against closed forms and statistics ===//

#include "runtime/Compiler.h"
#include "runtime/Reference.h"
#include "runtime/WeightFactory.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace spectra;

namespace {

const auto f64 = torch::kFloat64;

Descriptor describe(const std::string &variant, int64_t m, int64_t d,
                    std::map<std::string, double> options = {}) {
  VariantConfig config;
  config.m = m;
  config.d = d;
  config.options = std::move(options);
  return describeVariant(variant, config);
}

double maxAbs(const torch::Tensor &t) { return t.abs().max().item<double>(); }
double maxRel(const torch::Tensor &a, const torch::Tensor &b) {
  return maxAbs(a - b) / std::max(1e-300, maxAbs(b));
}

/// phi(x)^T phi(y) for single vectors, parameters from (q = {x}, k = {y}).
double kernelEstimate(const ReferenceFeatureMap &fm, const Weights &w, const torch::Tensor &x,
                      const torch::Tensor &y) {
  int64_t d = x.size(0);
  torch::Tensor q = x.view({1, 1, 1, d}), k = y.view({1, 1, 1, d});
  ComponentParams p = fm.params(q, k);
  torch::Tensor a = fm.features(q, Side::Queries, p, w), b = fm.features(k, Side::Keys, p, w);
  return (a * b).sum().item<double>();
}

/// Estimates over `seeds` independent draws of W.
torch::Tensor estimates(const std::string &variant, int64_t m, const torch::Tensor &x,
                        const torch::Tensor &y, int64_t seeds) {
  Descriptor desc = describe(variant, m, x.size(0));
  WeightFactory factory(desc);
  ReferenceFeatureMap fm(desc);
  std::vector<double> out;
  for (int64_t s = 0; s < seeds; ++s)
    out.push_back(kernelEstimate(fm, factory.draw(s), x, y));
  return torch::tensor(out, f64);
}

TEST(Reference, FeaturesMatchClosedForms) {
  const int64_t m = 6, d = 3;
  torch::manual_seed(0);
  Weights w{torch::randn({m, d}, f64), std::nullopt, {}};
  torch::Tensor x = torch::randn({1, 1, 2, d}, f64) * 0.7;
  torch::Tensor wx = x.matmul(w.W.t()), xx = x.square().sum(-1, true);
  torch::Tensor ww = w.W.square().sum(-1);
  double rm = 1.0 / std::sqrt(static_cast<double>(m));
  auto phi = [&](const std::string &variant, std::map<std::string, double> options = {}) {
    ReferenceFeatureMap fm(describe(variant, m, d, options));
    return fm.features(x, Side::Queries, fm.params(x, x), w);
  };
  EXPECT_LT(maxRel(phi("posrf-base"), rm * torch::exp(wx - xx / 2)), 1e-14);
  EXPECT_LT(maxRel(phi("trigrf-base"), torch::cat({rm * torch::exp(xx / 2) * torch::cos(wx),
                                                   rm * torch::exp(xx / 2) * torch::sin(wx)}, -1)),
            1e-14);
  double r2m = 1.0 / std::sqrt(2.0 * m);
  EXPECT_LT(maxRel(phi("posrf-hyp-base"), torch::cat({r2m * torch::exp(wx - xx / 2),
                                                      r2m * torch::exp(-wx - xx / 2)}, -1)),
            1e-14);
  double A = -0.3, B = std::sqrt(1 - 4 * A), D = std::pow(1 - 4 * A, d / 4.0);
  EXPECT_LT(maxRel(phi("gerf-base", {{"a", A}}),
                   rm * D * torch::exp(A * ww + B * wx - xx / 2)),
            1e-6);  // the option travels as f32
}

TEST(Reference, OprfUsesAllQueryKeyPairs) {
  torch::manual_seed(1);
  torch::Tensor q = torch::randn({1, 1, 5, 4}, f64) * 0.5 + 0.2;
  torch::Tensor k = torch::randn({1, 1, 7, 4}, f64) * 0.5 - 0.1;
  ReferenceFeatureMap fm(describe("oprf-base", 8, 4));
  ComponentParams p = fm.params(q, k);
  // u = mean over ALL (i, j) of ||q_i + k_j||^2, by brute force.
  torch::Tensor pairs = q[0][0].unsqueeze(1) + k[0][0].unsqueeze(0);  // [5, 7, 4]
  double u = pairs.square().sum(-1).mean().item<double>(), d = 4;
  double rho = (std::sqrt((2 * u + d) * (2 * u + d) + 8 * d * u) - 2 * u - d) / (4 * u);
  double A = (1 - 1 / rho) / 8;
  EXPECT_NEAR(p.scalars[0].item<double>(), A, 1e-12);
  EXPECT_NEAR(p.scalars[1].item<double>(), std::sqrt(1 - 4 * A), 1e-12);
}

TEST(Reference, SaderfPsiIgnoresPaddedKeys) {
  torch::manual_seed(2);
  torch::Tensor q = torch::randn({1, 1, 6, 4}, f64), k = torch::randn({1, 1, 6, 4}, f64);
  torch::Tensor mask = torch::tensor({true, true, true, true, false, false}).view({1, 6});
  k.index_put_({0, 0, torch::indexing::Slice(4)}, 100.0);  // junk in the padding
  ReferenceFeatureMap fm(describe("saderf-base", 8, 4));
  ComponentParams p = fm.params(q, k, mask);
  torch::Tensor kept = k[0][0].slice(0, 0, 4);
  torch::Tensor psi = (kept.square().sum(0) / q[0][0].square().sum(0)).pow(0.25);
  EXPECT_LT(maxRel(p.queryScale[0][0], psi), 1e-12);
  EXPECT_LT(maxRel(p.keyScale[0][0], 1 / psi), 1e-12);
}

TEST(Reference, UnbiasedEstimatorsConvergeToTheSoftmaxKernel) {
  torch::Tensor x = torch::tensor({0.5, -0.3, 0.4, 0.2}, f64);
  torch::Tensor y = torch::tensor({0.3, 0.4, -0.2, 0.5}, f64);
  double target = std::exp(x.dot(y).item<double>());
  for (const char *component : {"posrf", "gerf", "oprf", "saderf", "trigrf", "posrf-hyp", "hcexp"})
    for (const char *weights : {"base", "orf"}) {
      std::string variant = std::string(component) + "-" + weights;
      torch::Tensor e = estimates(variant, 16, x, y, 500);
      double mean = e.mean().item<double>();
      double se = e.std().item<double>() / std::sqrt(500.0);
      EXPECT_LT(std::abs(mean - target), 5 * se + 1e-12)
          << variant << ": mean " << mean << " vs exp(x.y) " << target << " (se " << se << ")";
    }
}

double mse(const torch::Tensor &e, double target) {
  return (e - target).square().mean().item<double>();
}

TEST(Reference, MseFallsLikeOneOverM) {
  torch::Tensor x = torch::tensor({0.6, -0.2, 0.3, 0.1, 0.4, -0.5, 0.2, 0.3}, f64);
  torch::Tensor y = torch::tensor({0.2, 0.5, -0.4, 0.3, 0.1, 0.2, -0.3, 0.4}, f64);
  double target = std::exp(x.dot(y).item<double>());
  double small = mse(estimates("posrf-base", 8, x, y, 800), target);
  double large = mse(estimates("posrf-base", 64, x, y, 800), target);
  EXPECT_GT(small / large, 4.5) << "MSE ratio for 8x the features";
  EXPECT_LT(small / large, 14.0) << "MSE ratio for 8x the features";
}

TEST(Reference, OrfBeatsIidAtEqualM) {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({16}, f64), y = x + 0.3 * torch::randn({16}, f64);
  x = x / x.norm() * 1.3;
  y = y / y.norm() * 1.3;
  double target = std::exp(x.dot(y).item<double>());
  double iid = mse(estimates("posrf-base", 16, x, y, 600), target);
  double orf = mse(estimates("posrf-orf", 16, x, y, 600), target);
  EXPECT_LT(orf, 0.8 * iid) << "ORF " << orf << " vs iid " << iid;
}

TEST(Reference, PosrfBeatsTrigrfForSmallKernelValues) {
  torch::manual_seed(4);
  torch::Tensor x = torch::randn({8}, f64);
  x = x / x.norm() * 1.5;
  torch::Tensor y = -x;  // exp(x.y) = exp(-2.25): a small kernel value
  double target = std::exp(x.dot(y).item<double>());
  double pos = mse(estimates("posrf-base", 32, x, y, 400), target);
  double trig = mse(estimates("trigrf-base", 32, x, y, 400), target);
  EXPECT_LT(pos, trig) << "PosRF " << pos << " vs TrigRF " << trig;
}

struct AttentionCase {
  torch::Tensor q, k, v;
};

AttentionCase randomCase(int64_t B, int64_t H, int64_t N, int64_t d, double scale, int seed) {
  torch::manual_seed(seed);
  return {torch::randn({B, H, N, d}, f64) * scale, torch::randn({B, H, N, d}, f64) * scale,
          torch::randn({B, H, N, d}, f64)};
}

TEST(Reference, StabilisedAndUnstabilisedAttentionAgree) {
  AttentionCase c = randomCase(2, 2, 16, 8, 0.8, 5);
  for (const char *variant : {"posrf-orf", "oprf-orf", "saderf-mm", "trigrf-orf", "hcexp-qmc",
                              "posrf-sgq", "gerf-fastfood", "posrf-hyp-sorf"}) {
    Descriptor desc = describe(variant, variant == std::string("posrf-sgq") ? 17 : 32, 8);
    ReferenceFeatureMap fm(desc);
    Weights w = WeightFactory(desc).draw(1);
    torch::Tensor exact = fm.attention(c.q, c.k, c.v, w, std::nullopt, {Stabilizer::Exact, {}});
    torch::Tensor plain = fm.attention(c.q, c.k, c.v, w, std::nullopt, {Stabilizer::None, {}});
    EXPECT_LT(maxRel(exact, plain), 1e-9) << variant;
  }
}

TEST(Reference, LargeLogitsStayFiniteAndCorrectInFloat32) {
  AttentionCase c = randomCase(1, 2, 32, 8, 6.0, 6);
  Descriptor desc = describe("posrf-orf", 32, 8);
  ReferenceFeatureMap fm(desc);
  Weights w64 = WeightFactory(desc).draw(2), w32 = WeightFactory(desc).draw(2, torch::kFloat32);
  torch::Tensor q32 = c.q.to(torch::kFloat32), k32 = c.k.to(torch::kFloat32),
                v32 = c.v.to(torch::kFloat32);
  // The logits are large enough to overflow fp32 without the stabiliser ...
  torch::Tensor plain = fm.attention(q32, k32, v32, w32, std::nullopt, {Stabilizer::None, {}});
  EXPECT_FALSE(torch::isfinite(plain).all().item<bool>()) << "the case must overflow fp32";
  // ... and the exact stabiliser keeps fp32 finite and equal to fp64.
  torch::Tensor stable = fm.attention(q32, k32, v32, w32);
  torch::Tensor truth = fm.attention(c.q, c.k, c.v, w64);
  ASSERT_TRUE(torch::isfinite(stable).all().item<bool>());
  EXPECT_LT(maxAbs(stable.to(f64) - truth), 5e-3 * maxAbs(truth));
}

TEST(Reference, PaddedKeysChangeNothing) {
  for (const char *variant : {"posrf-orf", "oprf-orf", "saderf-orf", "hcexp-base", "posrf-sgq"}) {
    Descriptor desc = describe(variant, variant == std::string("posrf-sgq") ? 17 : 16, 8);
    ReferenceFeatureMap fm(desc);
    Weights w = WeightFactory(desc).draw(3);
    AttentionCase c = randomCase(2, 2, 12, 8, 0.7, 7);
    torch::Tensor mask = torch::ones({2, 12}, torch::kBool);
    mask.index_put_({1, torch::indexing::Slice(8)}, false);
    // Junk in the padded positions of batch 1.
    c.k.index_put_({1, torch::indexing::Slice(), torch::indexing::Slice(8)}, 3.0);
    c.v.index_put_({1, torch::indexing::Slice(), torch::indexing::Slice(8)}, -50.0);
    torch::Tensor padded = fm.attention(c.q, c.k, c.v, w, mask);
    using torch::indexing::Slice;
    torch::Tensor alone = fm.attention(c.q.slice(0, 1, 2), c.k.slice(0, 1, 2).slice(2, 0, 8),
                                       c.v.slice(0, 1, 2).slice(2, 0, 8), w);
    EXPECT_LT(maxRel(padded.slice(0, 1, 2), alone), 1e-10) << variant;
    // Batch 0 is unaffected by batch 1's mask.
    torch::Tensor first = fm.attention(c.q.slice(0, 0, 1), c.k.slice(0, 0, 1), c.v.slice(0, 0, 1), w);
    EXPECT_LT(maxRel(padded.slice(0, 0, 1), first), 1e-10) << variant;
  }
}

/// Central differences of `loss` w.r.t. a few entries of `input`.
void checkGradient(const std::function<torch::Tensor()> &loss, torch::Tensor input,
                   const std::string &what) {
  torch::Tensor grad = input.grad();
  ASSERT_TRUE(grad.defined()) << what << " gets no gradient";
  torch::Tensor flat = input.detach().view(-1), gflat = grad.view(-1);
  for (int64_t i = 0; i < flat.numel(); i += std::max<int64_t>(1, flat.numel() / 7)) {
    double saved = flat[i].item<double>(), h = 1e-6;
    torch::NoGradGuard guard;
    flat[i] = saved + h;
    double up = loss().item<double>();
    flat[i] = saved - h;
    double down = loss().item<double>();
    flat[i] = saved;
    double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(gflat[i].item<double>(), numeric, 1e-6 * (1 + std::abs(numeric)))
        << what << "[" << i << "]";
  }
}

TEST(Reference, GradientsMatchFiniteDifferences) {
  for (const char *variant : {"posrf-orf", "oprf-orf", "saderf-orf", "trigrf-base"}) {
    Descriptor desc = describe(variant, 8, 4);
    ReferenceFeatureMap fm(desc);
    Weights w = WeightFactory(desc).draw(4);
    AttentionCase c = randomCase(1, 2, 5, 4, 0.8, 8);
    torch::Tensor mask = torch::tensor({true, true, true, true, false}).view({1, 5});
    c.q.set_requires_grad(true);
    c.k.set_requires_grad(true);
    c.v.set_requires_grad(true);
    torch::Tensor probe = torch::randn({1, 2, 5, 4}, f64);
    auto loss = [&] { return (fm.attention(c.q, c.k, c.v, w, mask) * probe).sum(); };
    loss().backward();
    checkGradient(loss, c.q, std::string(variant) + " dq");
    checkGradient(loss, c.k, std::string(variant) + " dk");
    checkGradient(loss, c.v, std::string(variant) + " dv");
  }
}

TEST(Reference, FastFoodLFactorGradientsThroughAttention) {
  Descriptor desc = describe("posrf-fastfoodl", 8, 4);
  WeightFactory factory(desc);
  ReferenceFeatureMap fm(desc);
  Weights w = factory.draw(5);
  AttentionCase c = randomCase(1, 1, 6, 4, 0.8, 9);
  torch::Tensor probe = torch::randn({1, 1, 6, 4}, f64);
  auto loss = [&] { return (fm.attention(c.q, c.k, c.v, factory.rebuild(5, w.learnable)) * probe).sum(); };
  loss().backward();
  for (auto &[name, factor] : w.learnable)
    checkGradient(loss, factor, "d" + name);
}

TEST(Reference, BadInputsGiveClearErrors) {
  Descriptor desc = describe("posrf-orf", 16, 8);
  ReferenceFeatureMap fm(desc);
  Weights w = WeightFactory(desc).draw(0);
  torch::Tensor q = torch::randn({2, 2, 5, 8}, f64);
  auto expectError = [&](const std::function<void()> &f, const std::string &needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error containing: " << needle;
    } catch (const c10::Error &e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectError([&] { fm.attention(q[0], q, q, w); }, "q must be [batch, heads, length, dim], got 3 dimension(s)");
  expectError([&] { fm.attention(q.slice(3, 0, 4), q, q, w); },
              "q has head dimension 4 but the feature map was built for d = 8");
  expectError([&] { fm.attention(q, q.to(torch::kFloat32), q, w); }, "q, k and v must have one dtype");
  expectError([&] { fm.attention(q, q, q.slice(2, 0, 3), w); }, "v has 3 positions but k has 5");
  expectError([&] { fm.attention(q, q, q, w, torch::ones({2, 4}, torch::kBool)); },
              "the key mask must be [batch, key length] = [2, 5], got [2, 4]");
  expectError([&] { fm.attention(q, q, q, w, torch::ones({2, 5}, f64)); }, "the key mask must be bool");
  expectError([&] { fm.attention(q, q, q, w, torch::zeros({2, 5}, torch::kBool)); },
              "every sequence needs at least one unmasked key");
  torch::Tensor bad = q.clone();
  bad[0][0][0][0] = std::nan("");
  expectError([&] { fm.attention(bad, q, q, w); }, "must be finite");
  // +inf and -inf in one tensor (their sum is NaN), and in k or v alone.
  torch::Tensor infs = q.clone();
  infs[1][0][2][3] = INFINITY;
  infs[0][1][4][7] = -INFINITY;
  expectError([&] { fm.attention(q, infs, q, w); }, "must be finite");
  expectError([&] { fm.attention(q, q, infs, w); }, "must be finite");
  // Finite values whose float32 sum overflows (the check's fast path) are accepted: the
  // output, a convex combination of v's rows, is 1e38 everywhere.
  torch::Tensor huge = torch::full_like(q, 1e38);
  torch::Tensor out = fm.attention(q, q, huge, w);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  EXPECT_NEAR(out.min().item<double>() / 1e38, 1.0, 1e-9);
  EXPECT_NEAR(out.max().item<double>() / 1e38, 1.0, 1e-9);
  expectError([&] { fm.attention(q.to(torch::kLong), q, q, w); }, "must be a floating-point tensor");
}

TEST(Reference, DeferredChecksFlagValuesWithoutThrowing) {
  // Inside a DeferredInputChecks scope the value checks become device flags (the trainer reads
  // them once per window); shape errors stay immediate; outside, the errors are as before.
  Descriptor desc = describe("saderf-orf", 16, 8);
  ReferenceFeatureMap fm(desc);
  Weights w = WeightFactory(desc).draw(0);
  torch::Tensor q = torch::randn({2, 2, 5, 8}, f64), bad = q.clone();
  bad[1][0][3][2] = INFINITY;
  torch::Tensor keepAll = torch::ones({2, 5}, torch::kBool), emptyRow = keepAll.clone();
  emptyRow[1].fill_(false);
  {
    DeferredInputChecks checks;
    EXPECT_FALSE(checks.nonFinite().defined());
    fm.attention(q, q, q, w, keepAll);
    ASSERT_TRUE(checks.nonFinite().defined());
    EXPECT_FALSE(checks.nonFinite().item<bool>());
    EXPECT_FALSE(checks.emptyMask().item<bool>());
    EXPECT_NO_THROW(fm.attention(q, bad, q, w));
    EXPECT_TRUE(checks.nonFinite().item<bool>());
    {
      // The innermost scope collects; the outer one keeps its own flags.
      DeferredInputChecks inner;
      AttentionOptions masked;
      masked.queryMask = emptyRow;
      EXPECT_NO_THROW(fm.attention(q, q, q, w, keepAll, masked));
      EXPECT_TRUE(inner.emptyMask().item<bool>());
      EXPECT_FALSE(inner.nonFinite().item<bool>());
      EXPECT_EQ(DeferredInputChecks::active(), &inner);
    }
    EXPECT_FALSE(checks.emptyMask().item<bool>());
    EXPECT_NO_THROW(fm.attention(q, q, q, w, emptyRow));
    EXPECT_TRUE(checks.emptyMask().item<bool>());
    EXPECT_THROW(fm.attention(q, q, q, w, torch::ones({2, 4}, torch::kBool)), c10::Error);
  }
  EXPECT_EQ(DeferredInputChecks::active(), nullptr);
  EXPECT_THROW(fm.attention(q, bad, q, w), c10::Error);
  EXPECT_THROW(fm.attention(q, q, q, w, emptyRow), c10::Error);
}

TEST(Reference, HalfPrecisionInputsComputeInFloat32) {
  Descriptor desc = describe("posrf-orf", 16, 8);
  ReferenceFeatureMap fm(desc);
  AttentionCase c = randomCase(1, 1, 8, 8, 0.5, 10);
  torch::Tensor truth = fm.attention(c.q, c.k, c.v, WeightFactory(desc).draw(0));
  Weights w32 = WeightFactory(desc).draw(0, torch::kFloat32);
  torch::Tensor out = fm.attention(c.q.to(torch::kBFloat16), c.k.to(torch::kBFloat16),
                                   c.v.to(torch::kBFloat16), w32);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_LT(maxAbs(out.to(f64) - truth), 0.05 * maxAbs(truth));
}

} // namespace

namespace {

TEST(Reference, UserDeclaredComponentRunsFromIR) {
  // PosRF written another way by a user: the normaliser moved into the logit
  // (-log(m)/2) with a unit coefficient; a different program, the same phi.
  const char *ir = R"mlir(
    spectra.component @posrf_in_logit params(%m, %d) {
      %lm = math.log %m : f32
      %half = arith.constant -5.000000e-01 : f32
      %c = arith.mulf %lm, %half : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %one = arith.constant 1.000000e+00 : f32
      %h = arith.mulf %xx, %half : f32
      %l0 = arith.subf %wx, %h : f32
      %l = arith.addf %l0, %c : f32
      spectra.feature_yield exp(%l : f32) scaled(%one : f32)
    }
    spectra.feature_map @mine component @posrf_in_logit weights @orf m = 16 d = 4 seed = 2
  )mlir";
  Descriptor mine = describeIR(ir, "user.mlir");
  EXPECT_EQ(mine.component.name, "posrf_in_logit");
  Descriptor builtin = describe("posrf-orf", 16, 4);
  Weights w = WeightFactory(mine).draw(2);
  torch::manual_seed(11);
  torch::Tensor q = torch::randn({1, 2, 6, 4}, f64) * 0.5, k = torch::randn({1, 2, 6, 4}, f64) * 0.5,
                v = torch::randn({1, 2, 6, 3}, f64);
  torch::Tensor a = ReferenceFeatureMap(mine).attention(q, k, v, w);
  torch::Tensor b = ReferenceFeatureMap(builtin).attention(q, k, v, w);
  EXPECT_LT(maxRel(a, b), 1e-12);
  torch::Tensor x = q;
  ReferenceFeatureMap fm(mine), ref(builtin);
  EXPECT_LT(maxRel(fm.features(x, Side::Queries, fm.params(x, x), w),
                   ref.features(x, Side::Queries, ref.params(x, x), w)),
            1e-6);  // the log(m) constant travels as f32
}

TEST(Reference, UnsupportedOpsInAUserComponentAreNamed) {
  const char *ir = R"mlir(
    spectra.component @odd params(%m, %d) {
      spectra.params_yield scalars()
    } features(%wx, %xx, %ww) {
      %t = math.atan %wx : f32
      spectra.feature_yield exp(%t : f32) scaled(%xx : f32)
    }
    spectra.feature_map @f component @odd weights @base m = 4 d = 2 seed = 0
  )mlir";
  Descriptor desc = describeIR(ir);
  EXPECT_FALSE(desc.component.partials.has_value());
  EXPECT_NE(desc.component.partialsError.find("'math.atan' op cannot be differentiated"),
            std::string::npos)
      << desc.component.partialsError;
  ReferenceFeatureMap fm(desc);
  torch::Tensor x = torch::randn({1, 1, 3, 2}, f64);
  try {
    fm.features(x, Side::Queries, fm.params(x, x), WeightFactory(desc).draw(0));
    FAIL() << "math.atan is not interpreted";
  } catch (const std::invalid_argument &e) {
    EXPECT_EQ(std::string(e.what()),
              "component 'odd': op 'math.atan' is not supported by the reference interpreter");
  }
}

} // namespace

namespace {

TEST(Reference, OprfStaysFiniteWhenQueriesAndKeysVanish) {
  // u = 0 makes rho 0/0; the library floors u, where A* tends to 0 (PosRF).
  for (const char *variant : {"oprf-orf", "saderf-orf"}) {
    Descriptor desc = describe(variant, 16, 4);
    ReferenceFeatureMap fm(desc);
    // SADERF's Psi divides by the query energy, so it gets tiny (not zero) inputs.
    double level = variant == std::string("oprf-orf") ? 0.0 : 1e-3;
    torch::Tensor q = torch::full({1, 1, 4, 4}, level, f64), k = q.clone();
    torch::Tensor v = torch::randn({1, 1, 4, 2}, f64);
    torch::Tensor out = fm.attention(q, k, v, WeightFactory(desc).draw(0));
    ASSERT_TRUE(torch::isfinite(out).all().item<bool>()) << variant;
    // Identical keys: every query attends uniformly.
    EXPECT_LT(maxAbs(out - v.mean(2, true)), 1e-9) << variant;
  }
}

} // namespace

namespace {

/// Checks the compiler-derived partials of `desc` against autograd of its
/// features program at random points.
void checkPartialsAgainstAutograd(const Descriptor &desc, double scale = 0.7) {
  ASSERT_TRUE(desc.component.partials.has_value()) << desc.name;
  torch::manual_seed(12);
  const int64_t n = 7;
  size_t numParams = desc.component.scalars.size();
  std::vector<torch::Tensor> inputs;
  inputs.push_back(torch::randn({n}, f64) * scale);                  // wx
  inputs.push_back(torch::rand({n}, f64) * scale + 0.1);             // xx >= 0
  inputs.push_back(torch::rand({n}, f64) * scale * 4 + 0.1);         // ww >= 0
  for (size_t i = 0; i < numParams; ++i)
    inputs.push_back(torch::rand({n}, f64) * 0.2 + 0.05);            // parameters
  for (auto &t : inputs)
    t.set_requires_grad(true);
  std::vector<torch::Tensor> params(inputs.begin() + 3, inputs.end());
  FeatureValues values = evaluateFeatures(desc, inputs[0], inputs[1], inputs[2], params);
  auto partials = evaluatePartials(desc, inputs[0].detach(), inputs[1].detach(),
                                   inputs[2].detach(), [&] {
                                     std::vector<torch::Tensor> p;
                                     for (auto &t : params)
                                       p.push_back(t.detach());
                                     return p;
                                   }());
  for (size_t o = 0; o < values.logits.size(); ++o)
    for (int which = 0; which < 2; ++which) {
      torch::Tensor y = (which == 0 ? values.logits[o] : values.coeffs[o]).expand({n});
      auto grads = torch::autograd::grad({y.sum()}, inputs, {}, /*retain_graph=*/true,
                                         /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t v = 0; v < inputs.size(); ++v) {
        torch::Tensor expected = grads[v].defined() ? grads[v] : torch::zeros({n}, f64);
        torch::Tensor derived = (which == 0 ? partials[o][v].first : partials[o][v].second).expand({n});
        EXPECT_LT(maxAbs(derived - expected), 1e-10 * (1 + maxAbs(expected)))
            << desc.component.name << " output " << o << (which ? " coeff" : " logit")
            << " d/d arg " << v;
      }
    }
}

TEST(DerivedPartials, MatchAutogradForEveryBuiltInComponent) {
  for (const char *component : {"posrf", "oprf", "saderf", "trigrf", "posrf-hyp", "gerf", "hcexp"})
    checkPartialsAgainstAutograd(describe(std::string(component) + "-base", 8, 4));
}

TEST(DerivedPartials, UserDeclaredComponentGetsItsDerivatives) {
  // A feature no library ships: a tempered, softly clipped PosRF with sqrt/pow/tanh/max/div.
  const char *ir = R"mlir(
    spectra.component @tempered params(%m, %d) {
      %t = spectra.option "temperature" default 1.500000e+00 : f32
      %c = math.rsqrt %m : f32
      spectra.params_yield scalars(%t, %c : f32, f32)
    } features(%wx, %xx, %ww, %t, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %floor = arith.constant -3.000000e+00 : f32
      %h = arith.mulf %xx, %half : f32
      %s = arith.divf %wx, %t : f32
      %th = math.tanh %s : f32
      %l0 = arith.subf %th, %h : f32
      %l = arith.maximumf %l0, %floor : f32
      %r = math.sqrt %ww : f32
      %p = math.powf %r, %t : f32
      %e = math.log1p %p : f32
      %k = arith.mulf %c, %e : f32
      spectra.feature_yield exp(%l : f32) scaled(%k : f32)
    }
    spectra.feature_map @tempered_orf component @tempered weights @orf m = 8 d = 4 seed = 0
  )mlir";
  checkPartialsAgainstAutograd(describeIR(ir, "tempered.mlir"));
}

} // namespace

namespace {
/// d(loss)/d(every learnable factor of `variant`) by autograd through the float64 reference
/// against central differences, at factors moved away from their initial values.
void expectFactorGradientsMatchCentralDifferences(const std::string &variant,
                                                  std::map<std::string, double> options,
                                                  size_t factorCount) {
  Descriptor desc = describe(variant, 8, 4, std::move(options));
  WeightFactory factory(desc);
  ReferenceFeatureMap fm(desc);
  Weights w = factory.draw(5);
  torch::manual_seed(4);
  std::vector<std::pair<std::string, torch::Tensor>> factors;
  for (auto &[name, value] : w.learnable)
    factors.emplace_back(name, (value.detach() + 0.2 * torch::randn_like(value)).set_requires_grad(true));
  AttentionCase c = randomCase(1, 1, 6, 4, 0.8, 9);
  torch::Tensor probe = torch::randn({1, 1, 6, 4}, f64);
  auto loss = [&] { return (fm.attention(c.q, c.k, c.v, factory.rebuild(5, factors)) * probe).sum(); };
  loss().backward();
  ASSERT_EQ(factors.size(), factorCount) << variant;
  for (auto &[name, factor] : factors)
    checkGradient(loss, factor, variant + " d" + name);
}

TEST(Reference, GmmFactorGradientsThroughAttentionAgreeWithCentralDifferences) {
  // GMM-PRF and GMM-RKS: Sigma_c and mu_c of 2 components, away from Sigma = I, mu = 0.
  for (const char *variant : {"posrf-gmm", "trigrf-gmm"})
    expectFactorGradientsMatchCentralDifferences(variant, {{"components", 2}}, 4);
}

TEST(Reference, GenerativeNetworkGradientsThroughAttentionAgreeWithCentralDifferences) {
  // Generative-PRF and Generative-RKS: every generator weight and bias (batch norm, LeakyReLU,
  // tanh on the way).
  for (const char *variant : {"posrf-generative", "trigrf-generative"})
    expectFactorGradientsMatchCentralDifferences(variant, {{"hidden", 5}}, 10);
}
} // namespace
