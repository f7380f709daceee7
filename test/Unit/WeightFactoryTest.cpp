//===- WeightFactoryTest.cpp - every weight matrix has its defining properties ===//
//
// Statistical checks use fixed seeds and tolerances of a few standard errors
// computed from the known distribution, so a wrong construction fails and a
// right one passes for every seed.
//
//===----------------------------------------------------------------------===//

#include "runtime/Compiler.h"
#include "runtime/WeightFactory.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>

using namespace spectra;

namespace {

WeightFactory factory(const std::string &variant, int64_t m, int64_t d) {
  VariantConfig config;
  config.m = m;
  config.d = d;
  return WeightFactory(describeVariant(variant, config));
}

double maxAbs(const torch::Tensor &t) { return t.abs().max().item<double>(); }

/// The gradient of sum(W(factors) * probe) for a random probe, taken by autograd through
/// WeightFactory::rebuild, against central differences in float64, at every `stride`-th entry
/// of each learnable factor of `w` (a draw of `seed`).
void expectFactorGradientsMatchCentralDifferences(const WeightFactory &f, int64_t seed, const Weights &w,
                                                  int64_t stride) {
  torch::Tensor probe = torch::randn(w.W.sizes(), torch::kFloat64);
  auto loss = [&](const std::vector<std::pair<std::string, torch::Tensor>> &factors) {
    return (f.rebuild(seed, factors).W * probe).sum();
  };
  loss(w.learnable).backward();
  for (size_t k = 0; k < w.learnable.size(); ++k) {
    torch::Tensor grad = w.learnable[k].second.grad();
    ASSERT_TRUE(grad.defined()) << w.learnable[k].first << " gets no gradient";
    for (int64_t i = 0; i < grad.size(0); i += stride) {
      auto shifted = [&](double h) {
        std::vector<std::pair<std::string, torch::Tensor>> factors;
        for (auto &[name, t] : w.learnable)
          factors.emplace_back(name, t.detach().clone());
        factors[k].second[i] += h;
        return loss(factors).item<double>();
      };
      double h = 1e-6, numeric = (shifted(h) - shifted(-h)) / (2 * h);
      EXPECT_NEAR(grad[i].item<double>(), numeric, 1e-6 * (1 + std::abs(numeric)))
          << w.learnable[k].first << "[" << i << "]";
    }
  }
}

TEST(WeightFactory, DrawsAreDeterministicPerSeedAndDifferAcrossSeeds) {
  for (const char *variant : {"posrf-base", "posrf-orf", "posrf-sorf", "posrf-qmc", "posrf-mm",
                              "posrf-fastfood", "posrf-qmc-sobol", "posrf-simrf-plus"}) {
    WeightFactory f = factory(variant, 64, 16);
    torch::Tensor a = f.draw(3).W, b = f.draw(3).W, c = f.draw(4).W;
    EXPECT_TRUE(torch::equal(a, b)) << variant;
    EXPECT_GT(maxAbs(a - c), 1e-3) << variant << ": a new seed must redraw";
    EXPECT_EQ(a.sizes(), (std::vector<int64_t>{64, 16})) << variant;
    EXPECT_EQ(a.scalar_type(), torch::kFloat64);
    // float32 is the float64 draw rounded once.
    torch::Tensor f32 = f.draw(3, torch::kFloat32).W;
    EXPECT_EQ(f32.scalar_type(), torch::kFloat32);
    EXPECT_LT(maxAbs(f32.to(torch::kFloat64) - a), 1e-5 * (1 + maxAbs(a))) << variant;
  }
}

TEST(WeightFactory, BaseEntriesAreStandardNormal) {
  WeightFactory f = factory("posrf-base", 256, 32);
  torch::Tensor w = f.draw(11).W;
  double n = static_cast<double>(w.numel());
  // Sample mean ~ N(0, 1/n), sample variance ~ N(1, 2/n).
  EXPECT_LT(std::abs(w.mean().item<double>()), 4.0 / std::sqrt(n));
  EXPECT_LT(std::abs(w.var().item<double>() - 1.0), 4.0 * std::sqrt(2.0 / n));
}

TEST(WeightFactory, OrfRowsAreOrthogonalWithinBlocksWithChiNorms) {
  const int64_t d = 16, m = 64;
  WeightFactory f = factory("posrf-orf", m, d);
  std::vector<torch::Tensor> squaredNorms;
  for (int64_t seed = 0; seed < 40; ++seed) {
    torch::Tensor w = f.draw(seed).W;
    for (int64_t b = 0; b < m / d; ++b) {
      torch::Tensor block = w.slice(0, b * d, (b + 1) * d);
      torch::Tensor gram = block.matmul(block.t());
      torch::Tensor offDiagonal = gram - torch::diag(torch::diagonal(gram));
      EXPECT_LT(maxAbs(offDiagonal), 1e-10) << "seed " << seed << " block " << b;
    }
    squaredNorms.push_back(w.square().sum(1));
  }
  // ||w||^2 ~ chi^2_d: mean d, variance 2d.
  torch::Tensor s = torch::cat(squaredNorms);
  double n = static_cast<double>(s.numel());
  EXPECT_LT(std::abs(s.mean().item<double>() - d), 4.0 * std::sqrt(2.0 * d / n));
  EXPECT_LT(std::abs(s.var().item<double>() - 2.0 * d), 0.25 * 2.0 * d);
  // Blocks are independent: two blocks are not orthogonal to each other.
  torch::Tensor w = f.draw(0).W;
  EXPECT_GT(maxAbs(w.slice(0, 0, d).matmul(w.slice(0, d, 2 * d).t())), 0.1);
}

/// E[w w^T] over the rows of many draws, minus the identity (each row marginally N(0, I)).
double isotropyError(WeightFactory &f, int64_t draws) {
  torch::Tensor second;
  int64_t rows = 0;
  for (int64_t seed = 0; seed < draws; ++seed) {
    torch::Tensor w = f.draw(seed).W;
    second = second.defined() ? second + w.t().matmul(w) : w.t().matmul(w);
    rows += w.size(0);
  }
  return maxAbs(second / static_cast<double>(rows) - torch::eye(second.size(0), torch::kFloat64));
}

TEST(WeightFactory, SimrfBlocksAreRotatedRegularSimplicesWithChiNorms) {
  const int64_t d = 8, m = 32;
  WeightFactory f = factory("posrf-simrf", m, d);
  std::vector<torch::Tensor> squaredNorms;
  for (int64_t seed = 0; seed < 200; ++seed) {
    torch::Tensor w = f.draw(seed).W;
    ASSERT_EQ(w.sizes(), (std::vector<int64_t>{m, d}));
    for (int64_t b = 0; b < m / d; ++b) {
      torch::Tensor block = w.slice(0, b * d, (b + 1) * d);
      torch::Tensor unit = block / block.norm(2, 1, true);
      // Every pair of directions in a block subtends the simplex angle: cosine -1/(d-1).
      torch::Tensor expected = torch::full({d, d}, -1.0 / (d - 1), torch::kFloat64) +
                               (1.0 + 1.0 / (d - 1)) * torch::eye(d, torch::kFloat64);
      EXPECT_LT(maxAbs(unit.matmul(unit.t()) - expected), 1e-10) << "seed " << seed << " block " << b;
    }
    squaredNorms.push_back(w.square().sum(1));
  }
  // ||w||^2 ~ chi^2_d (mean d, variance 2d), and the rotation makes each row isotropic: with the
  // chi norm, marginally N(0, I), so PosRF/OPRF/SADERF stay unbiased.
  torch::Tensor s = torch::cat(squaredNorms);
  double n = static_cast<double>(s.numel());
  EXPECT_LT(std::abs(s.mean().item<double>() - d), 4.0 * std::sqrt(2.0 * d / n));
  EXPECT_LT(std::abs(s.var().item<double>() - 2.0 * d), 0.15 * 2.0 * d);
  EXPECT_LT(isotropyError(f, 200), 0.1);
  // Different blocks are independent rotations: across two blocks the cosines are not the
  // simplex's (1 on the diagonal, -1/(d-1) elsewhere).
  torch::Tensor w = f.draw(0).W;
  torch::Tensor cross = w.slice(0, 0, d).matmul(w.slice(0, d, 2 * d).t()) /
                        (w.slice(0, 0, d).norm(2, 1, true) * w.slice(0, d, 2 * d).norm(2, 1).unsqueeze(0));
  torch::Tensor simplex = torch::full({d, d}, -1.0 / (d - 1), torch::kFloat64) +
                          (1.0 + 1.0 / (d - 1)) * torch::eye(d, torch::kFloat64);
  EXPECT_GT(maxAbs(cross - simplex), 0.5);
}

TEST(WeightFactory, SimrfPlusBlocksSumToZeroAndRowsStayStandardNormal) {
  const int64_t d = 8, m = 32;
  WeightFactory plus = factory("posrf-simrf-plus", m, d), indep = factory("posrf-simrf", m, d);
  std::vector<torch::Tensor> squaredNorms, firstCoords, positive;
  double plusPairs = 0, indepPairs = 0;
  torch::Tensor z = torch::full({d}, 1.0 / std::sqrt(static_cast<double>(d)), torch::kFloat64);
  for (int64_t seed = 0; seed < 400; ++seed) {
    torch::Tensor w = plus.draw(seed).W, v = indep.draw(seed).W;
    ASSERT_EQ(w.sizes(), (std::vector<int64_t>{m, d}));
    for (int64_t b = 0; b < m / d; ++b) {
      torch::Tensor block = w.slice(0, b * d, (b + 1) * d), other = v.slice(0, b * d, (b + 1) * d);
      // The defining property: each direction opposes the sum of the others, so (chi norms
      // satisfy the polygon inequality) the block sums to zero, where SimRF's does not.
      torch::Tensor norms = block.norm(2, 1);
      if (norms.max().item<double>() < (norms.sum() - norms.max()).item<double>()) {
        EXPECT_LT(block.sum(0).norm().item<double>(), 1e-9 * norms.sum().item<double>())
            << "seed " << seed << " block " << b;
      }
      plusPairs += (block.sum(0).square().sum() - block.square().sum()).item<double>() / 2;
      indepPairs += (other.sum(0).square().sum() - other.square().sum()).item<double>() / 2;
    }
    squaredNorms.push_back(w.square().sum(1));
    firstCoords.push_back(w.select(1, 0));
    // PosRF's feature of a unit-norm z: exp(w.z - |z|^2/2) has mean 1 for w ~ N(0, I).
    positive.push_back(torch::exp(w.matmul(z) - 0.5));
  }
  // sum_{i<j} w_i . w_j per block: SimRF+ makes it as negative as the norms allow (-sum |w_i|^2
  // / 2, about -d^2/2 = -32), SimRF's is about -sum_{i<j} |w_i||w_j| / (d-1) + noise.
  double blocks = 400.0 * (m / d);
  EXPECT_LT(plusPairs / blocks, -0.9 * d * d / 2) << "SimRF+ pairs " << plusPairs / blocks;
  EXPECT_LT(plusPairs / blocks, indepPairs / blocks - 1.0) << "SimRF " << indepPairs / blocks;
  // Norms unchanged by the coupling: chi_d (mean d, variance 2d of the square).
  torch::Tensor s = torch::cat(squaredNorms);
  double n = static_cast<double>(s.numel());
  EXPECT_LT(std::abs(s.mean().item<double>() - d), 4.0 * std::sqrt(2.0 * d / n));
  EXPECT_LT(std::abs(s.var().item<double>() - 2.0 * d), 0.15 * 2.0 * d);
  // Marginally N(0, I): second moments I, a coordinate's kurtosis 3, and the PosRF feature's
  // mean 1 (sd of one feature sqrt(e - 1) = 1.31; blocks are the independent units).
  EXPECT_LT(isotropyError(plus, 400), 0.1);
  torch::Tensor x = torch::cat(firstCoords);
  EXPECT_LT(std::abs(x.pow(4).mean().item<double>() - 3.0), 0.25);
  double meanFeature = torch::cat(positive).mean().item<double>();
  EXPECT_LT(std::abs(meanFeature - 1.0), 4.0 * 1.31 / std::sqrt(blocks)) << meanFeature;
}

TEST(WeightFactory, ScrfBlocksAreSignedCirculantGaussians) {
  const int64_t d = 8, m = 32;
  WeightFactory f = factory("posrf-scrf", m, d);
  std::vector<torch::Tensor> entries;
  for (int64_t seed = 0; seed < 200; ++seed) {
    torch::Tensor w = f.draw(seed).W;
    for (int64_t b = 0; b < m / d; ++b) {
      torch::Tensor block = w.slice(0, b * d, (b + 1) * d), first = block[0];
      for (int64_t i = 1; i < d; ++i) {
        // Row i is +-(row 0 rotated right by i): the same entries, shifted, one sign.
        torch::Tensor shifted = torch::roll(first, i);
        double sign = (block[i] * shifted).sum().item<double>() >= 0 ? 1.0 : -1.0;
        EXPECT_LT(maxAbs(block[i] - sign * shifted), 1e-12) << "seed " << seed << " row " << i;
      }
    }
    entries.push_back(w.flatten());
  }
  // Entries N(0, 1); rows marginally N(0, I).
  torch::Tensor e = torch::cat(entries);
  double n = static_cast<double>(e.numel()) / d;  // d entries per block share their values
  EXPECT_LT(std::abs(e.mean().item<double>()), 4.0 / std::sqrt(n));
  EXPECT_LT(std::abs(e.var().item<double>() - 1.0), 0.1);
  EXPECT_LT(isotropyError(f, 200), 0.1);
  // Blocks draw their own c: the first rows of two blocks do not share their entries.
  torch::Tensor w1 = f.draw(1).W;
  EXPECT_GT(maxAbs(std::get<0>(w1[0].abs().sort()) - std::get<0>(w1[d].abs().sort())), 1e-3);
  // Signs differ between rows of a block (a Rademacher diagonal, not one global sign).
  torch::Tensor block = f.draw(1).W.slice(0, 0, d);
  std::vector<double> signs;
  for (int64_t i = 0; i < d; ++i)
    signs.push_back((block[i] * torch::roll(block[0], i)).sum().item<double>() >= 0 ? 1.0 : -1.0);
  EXPECT_NE(*std::min_element(signs.begin(), signs.end()), *std::max_element(signs.begin(), signs.end()));
}

TEST(WeightFactory, SorfRowsHaveNormSqrtD) {
  WeightFactory f = factory("posrf-sorf", 64, 16);
  torch::Tensor w = f.draw(5).W;
  // sqrt(n) times an orthogonal matrix (normalised Hadamard): every row norm is sqrt(16) = 4.
  EXPECT_LT(maxAbs(w.norm(2, 1) - 4.0), 1e-10);
  torch::Tensor block = w.slice(0, 0, 16);
  EXPECT_LT(maxAbs(block.matmul(block.t()) - 16.0 * torch::eye(16, torch::kFloat64)), 1e-9);
  // The entries are not the unnormalised chain's (~sqrt(n)^3 times larger).
  EXPECT_LT(maxAbs(w), 4.0 + 1e-9);
}

TEST(WeightFactory, SorfWithPaddedDimensionKeepsExpectedSquaredNorm) {
  // d = 24 pads to n = 32 and keeps 24 columns: E||w||^2 = d.
  WeightFactory f = factory("posrf-sorf", 256, 24);
  torch::Tensor s = torch::cat({f.draw(1).W.square().sum(1), f.draw(2).W.square().sum(1)});
  EXPECT_NEAR(s.mean().item<double>(), 24.0, 2.0);
  EXPECT_LT(s.max().item<double>(), 32.0 + 1e-9);
}

/// The Halton point i (1-based) in base p, computed independently of the factory.
double radicalInverse(int64_t i, int64_t p) {
  double result = 0, f = 1.0 / p;
  for (; i > 0; i /= p, f /= p)
    result += f * (i % p);
  return result;
}

TEST(WeightFactory, QmcRowsAreShiftedHaltonPointsThroughNdtri) {
  const int64_t m = 50, d = 5;
  WeightFactory f = factory("posrf-qmc", m, d);
  torch::Tensor w = f.draw(9).W;
  torch::Tensor t = torch::special::ndtr(w);  // back to the unit cube
  const int64_t primes[] = {2, 3, 5, 7, 11};
  for (int64_t j = 0; j < d; ++j) {
    // Row i is point i+1 of the sequence; a random shift modulo 1 is common to the column.
    double shift0 = t[0][j].item<double>() - radicalInverse(1, primes[j]);
    for (int64_t i = 0; i < m; ++i) {
      double delta = t[i][j].item<double>() - radicalInverse(i + 1, primes[j]) - shift0;
      delta -= std::round(delta);
      EXPECT_NEAR(delta, 0.0, 1e-9) << "row " << i << " column " << j;
    }
  }
  // Rows are points (not the transposed layout): row 0 has one value per dimension.
  EXPECT_EQ(w.size(0), m);
}

TEST(WeightFactory, QmcSobolRowsAreInsideTheCube) {
  WeightFactory f = factory("posrf-qmc-sobol", 128, 8);
  torch::Tensor w = f.draw(2).W;
  EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
  // A randomised QMC rule in d dims: each column's points are well spread.
  torch::Tensor t = torch::special::ndtr(w);
  torch::Tensor hist = torch::histc(t.select(1, 0), 8, 0, 1);
  EXPECT_EQ(hist.min().item<double>(), 16.0);  // Sobol: exactly 128/8 per bin
}

TEST(WeightFactory, MomentMatchingIsExact) {
  WeightFactory f = factory("posrf-mm", 128, 32);
  torch::Tensor w = f.draw(4).W;
  EXPECT_LT(maxAbs(w.mean(0)), 1e-12);
  torch::Tensor centred = w - w.mean(0, true);
  torch::Tensor cov = centred.t().matmul(centred) / 127.0;
  EXPECT_LT(maxAbs(cov - torch::eye(32, torch::kFloat64)), 1e-10);
}

TEST(WeightFactory, SgqIsTheDegreeThreeSmolyakRule) {
  for (int64_t copies : {1, 2}) {
    const int64_t d = 32, m = copies * (2 * d + 1);
    WeightFactory f = factory("posrf-sgq", m, d);
    Weights w = f.draw(7);
    ASSERT_TRUE(w.rowWeights.has_value());
    torch::Tensor a = *w.rowWeights, p = w.W;
    EXPECT_NEAR(a.sum().item<double>(), 1.0, 1e-12);
    // Weights: centre 1 - d/3 (negative for d = 32), the rest 1/6, averaged over copies.
    EXPECT_NEAR(a[0].item<double>(), (1.0 - d / 3.0) / copies, 1e-12);
    EXPECT_NEAR(a[1].item<double>(), 1.0 / 6.0 / copies, 1e-12);
    // Exact moments of N(0, I): first and third vanish, second is I.
    torch::Tensor first = (a.unsqueeze(1) * p).sum(0);
    torch::Tensor second = (a.unsqueeze(1) * p).t().matmul(p);
    torch::Tensor third = (a * p.select(1, 0).pow(3)).sum();
    EXPECT_LT(maxAbs(first), 1e-10);
    EXPECT_LT(maxAbs(second - torch::eye(d, torch::kFloat64)), 1e-10);
    EXPECT_LT(std::abs(third.item<double>()), 1e-9);
    // Every copy is the rule rotated: points at radius sqrt(3) around the centre.
    torch::Tensor radii = p.norm(2, 1);
    EXPECT_NEAR(radii[0].item<double>(), 0.0, 1e-12);
    EXPECT_LT(maxAbs(radii.slice(0, 1, 2 * d + 1) - std::sqrt(3.0)), 1e-10);
  }
}

TEST(WeightFactory, FastFoodRowNormsAreTheChiFactors) {
  WeightFactory f = factory("posrf-fastfoodl", 64, 16);
  ASSERT_TRUE(f.hasLearnable());
  Weights w = f.draw(8);
  ASSERT_EQ(w.learnable.size(), 4u * 3u) << "s, g, b for each of 4 blocks";
  for (int64_t b = 0; b < 4; ++b) {
    const torch::Tensor &s = w.learnable[3 * b].second;  // chi draw comes first in each block
    EXPECT_EQ(w.learnable[3 * b].first.rfind("b" + std::to_string(b) + ".chi", 0), 0u)
        << w.learnable[3 * b].first;
    torch::Tensor norms = w.W.slice(0, 16 * b, 16 * (b + 1)).norm(2, 1);
    EXPECT_LT(maxAbs(norms - s.detach()), 1e-10) << "block " << b;
  }
  // Over many draws ||w||^2 has the chi^2_d mean d.
  torch::Tensor s = torch::cat({f.draw(1).W, f.draw(2).W, f.draw(3).W}).square().sum(1);
  EXPECT_LT(std::abs(s.mean().item<double>() - 16.0), 4.0 * std::sqrt(2.0 * 16 / 192));
}

TEST(WeightFactory, FastFoodLGradientsMatchFiniteDifferences) {
  WeightFactory f = factory("posrf-fastfoodl", 16, 8);
  Weights w = f.draw(2);
  expectFactorGradientsMatchCentralDifferences(f, 2, w, 3);
}

TEST(WeightFactory, NormCouplingIsDifferentiableInLearnableNorms) {
  // SimRF+ with trainable norms (a user recipe): the coupling keeps every row's norm, and the
  // gradient through its row-by-row updates matches central differences.
  const char *ir = R"mlir(
    spectra.weight_recipe @learned_simrf_plus(%m, %d) {
      %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
        %s = spectra.simplex [%d] : tensor<?x?xf32>
        %n = spectra.chi [%d] dof %d learnable : tensor<?xf32>
        %b = spectra.scale_rows %s, %n : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
        %c = spectra.norm_coupling %b sweeps 3 : tensor<?x?xf32>
        %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
        %q = spectra.orthogonalize %g : tensor<?x?xf32>
        %r = spectra.rotate %c by %q : tensor<?x?xf32>, tensor<?x?xf32>
        spectra.yield %r : tensor<?x?xf32>
      }
      spectra.yield %w : tensor<?x?xf32>
    }
    spectra.feature_map @f component @posrf weights @learned_simrf_plus m = 12 d = 6 seed = 0
  )mlir";
  WeightFactory f(describeIR(ir));
  Weights w = f.draw(4);
  ASSERT_EQ(w.learnable.size(), 2u);  // one chi draw per block
  for (int64_t b = 0; b < 2; ++b)
    EXPECT_LT(maxAbs(w.W.slice(0, 6 * b, 6 * (b + 1)).norm(2, 1) - w.learnable[b].second.detach()), 1e-10);
  expectFactorGradientsMatchCentralDifferences(f, 4, w, 1);
}

TEST(WeightFactory, RebuildChecksTheFactors) {
  WeightFactory f = factory("posrf-fastfoodl", 16, 8);
  Weights w = f.draw(2);
  auto factors = w.learnable;
  factors[0].second = torch::ones({3}, torch::kFloat64);
  try {
    f.rebuild(2, factors);
    FAIL() << "a wrong-shaped factor must be rejected";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("has shape [3], expected [8]"), std::string::npos) << e.what();
  }
}

TEST(WeightFactory, UserRecipeFromIRAndItsErrors) {
  // A user-declared recipe: uniform points moment-matched (not in the library).
  const char *ir = R"mlir(
    spectra.weight_recipe @mc_mm(%m, %d) {
      %u = spectra.uniform [%m, %d] : tensor<?x?xf32>
      %p = spectra.inverse_normal_cdf %u : tensor<?x?xf32>
      %w = spectra.moment_match %p : tensor<?x?xf32>
      spectra.yield %w : tensor<?x?xf32>
    }
    spectra.feature_map @posrf_mc_mm component @posrf weights @mc_mm m = 40 d = 8 seed = 0
  )mlir";
  WeightFactory f(describeIR(ir, "user.mlir"));
  torch::Tensor w = f.draw(1).W;
  EXPECT_LT(maxAbs(w.mean(0)), 1e-12);

  // m <= d is caught when the recipe is drawn, with the reason.
  std::string small(ir);
  small.replace(small.find("m = 40"), 6, "m = 8");
  WeightFactory g(describeIR(small, "user.mlir"));
  try {
    g.draw(1);
    FAIL() << "moment matching 8 points in 8 dimensions must fail";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("moment matching needs more points than dimensions"),
              std::string::npos)
        << e.what();
  }
}

TEST(WeightFactory, WeightedBlocksMustNotBeTruncated) {
  const char *ir = R"mlir(
    spectra.weight_recipe @sgq_any(%m, %d) {
      %w, %a = spectra.stack_blocks rows %m average_weights : tensor<?x?xf32>, tensor<?xf32> {
        %p, %wt = spectra.sparse_grid [%d] degree 3 : tensor<?x?xf32>, tensor<?xf32>
        spectra.yield %p, %wt : tensor<?x?xf32>, tensor<?xf32>
      }
      spectra.yield %w, %a : tensor<?x?xf32>, tensor<?xf32>
    }
    spectra.feature_map @f component @posrf weights @sgq_any m = 20 d = 4 seed = 0
  )mlir";
  WeightFactory f(describeIR(ir));
  try {
    f.draw(0);
    FAIL() << "20 rows of a 9-point rule must be rejected";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("truncating a quadrature rule breaks its weights; use a "
                                         "multiple of 9"),
              std::string::npos)
        << e.what();
  }
}

TEST(Descriptor, UnknownVariantListsValidNamesAndBadJsonIsLocated) {
  try {
    describeVariant("posrf-orb");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'posrf-orf'?"), std::string::npos) << e.what();
  }
  try {
    Descriptor::fromJson("{\"version\": 1}");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_EQ(std::string(e.what()), "feature-map descriptor: root: missing field 'name'");
  }
  try {
    Descriptor::fromJson("{\"version\": 7}");
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("version 7 is not the supported version 1"),
              std::string::npos);
  }
}

} // namespace

#include "runtime/WeightModule.h"

namespace {

TEST(WeightModule, StateDictSavesAndRestoresFactorsAndSeed) {
  VariantConfig config;
  config.m = 16;
  config.d = 8;
  Descriptor desc = describeVariant("posrf-fastfoodl", config);
  RandomFeatureWeights trained(desc, 5);
  // A training step moves the learnable factors.
  torch::optim::SGD opt(trained->parameters(), 0.1);
  (trained->weights().W.square().sum()).backward();
  opt.step();
  torch::Tensor before = trained->weights().W.detach().clone();
  EXPECT_GT(maxAbs(before - WeightFactory(desc).draw(5).W), 1e-6) << "the step must change W";

  std::string path = ::testing::TempDir() + "/fastfoodl_weights.pt";
  torch::save(trained, path);
  RandomFeatureWeights restored(desc, 99);  // another seed: the checkpoint must win
  torch::load(restored, path);
  EXPECT_EQ(restored->seed(), 5);
  EXPECT_LT(maxAbs(restored->weights().W - before), 1e-15);
  EXPECT_EQ(restored->parameters().size(), 6u) << "s, g, b of 2 blocks";
}

TEST(WeightModule, RedrawAndDtypeMoves) {
  VariantConfig config;
  config.m = 64;
  config.d = 16;
  Descriptor desc = describeVariant("posrf-orf", config);
  RandomFeatureWeights module(desc, 1);
  EXPECT_TRUE(module->parameters().empty()) << "ORF has nothing to learn";
  torch::Tensor first = module->weights().W.clone();
  module->redraw(2);
  EXPECT_EQ(module->seed(), 2);
  EXPECT_TRUE(torch::equal(module->weights().W, WeightFactory(desc).draw(2).W));
  EXPECT_GT(maxAbs(module->weights().W - first), 1e-3);
  module->to(torch::kFloat32);
  EXPECT_EQ(module->weights().W.scalar_type(), torch::kFloat32);
  module->redraw(1);
  EXPECT_LT(maxAbs(module->weights().W.to(torch::kFloat64) - first), 1e-5);
}

TEST(WeightModule, DrawsAreIdenticalOnCuda) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device on this machine: cross-device determinism not checked";
  VariantConfig config;
  config.m = 64;
  config.d = 16;
  WeightFactory f(describeVariant("posrf-qmc", config));
  torch::Tensor cpu = f.draw(4).W;
  torch::Tensor cuda = f.draw(4, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat64)).W;
  EXPECT_TRUE(torch::equal(cpu, cuda.cpu()));
}

} // namespace

namespace {

WeightFactory gmmFactory(int64_t m, int64_t d, std::map<std::string, double> options = {}) {
  VariantConfig config;
  config.m = m;
  config.d = d;
  config.options = std::move(options);
  return WeightFactory(describeVariant("posrf-gmm", config));
}

TEST(WeightFactory, GmmHasAMeanAndAScalePerComponentAndRowsSigmaNPlusMu) {
  // C = 3 over m = 10: components of ceil(10/3) = 4, 4 and 2 rows.
  WeightFactory f = gmmFactory(10, 4, {{"components", 3}});
  Weights w = f.draw(2);
  ASSERT_EQ(w.learnable.size(), 6u) << "Sigma_c and mu_c for each of 3 components";
  for (size_t c = 0; c < 3; ++c) {
    const auto &[sigmaName, sigma] = w.learnable[2 * c];
    const auto &[muName, mu] = w.learnable[2 * c + 1];
    EXPECT_EQ(sigmaName.rfind("b" + std::to_string(c) + ".eye", 0), 0u) << sigmaName;
    EXPECT_EQ(muName.rfind("b" + std::to_string(c) + ".zeros", 0), 0u) << muName;
    EXPECT_TRUE(torch::equal(sigma, torch::eye(4, torch::kFloat64))) << "Sigma_c starts at I";
    EXPECT_TRUE(torch::equal(mu, torch::zeros({4}, torch::kFloat64))) << "mu_c starts at 0";
    EXPECT_TRUE(sigma.requires_grad() && mu.requires_grad());
  }
  // At the initial values W is the fixed noise n; with other values each row is Sigma_c n + mu_c.
  torch::Tensor n = w.W.detach();
  torch::manual_seed(1);
  std::vector<std::pair<std::string, torch::Tensor>> factors;
  std::vector<torch::Tensor> sigmas, mus;
  for (size_t c = 0; c < 3; ++c) {
    sigmas.push_back(torch::randn({4, 4}, torch::kFloat64));
    mus.push_back(torch::randn({4}, torch::kFloat64));
    factors.emplace_back(w.learnable[2 * c].first, sigmas.back());
    factors.emplace_back(w.learnable[2 * c + 1].first, mus.back());
  }
  torch::Tensor rebuilt = f.rebuild(2, factors).W;
  const int64_t starts[] = {0, 4, 8, 10};
  for (int64_t c = 0; c < 3; ++c) {
    torch::Tensor rows = n.slice(0, starts[c], starts[c + 1]);
    torch::Tensor expected = rows.matmul(sigmas[c].t()) + mus[c];
    EXPECT_LT(maxAbs(rebuilt.slice(0, starts[c], starts[c + 1]) - expected), 1e-12) << "component " << c;
  }
  // The default is the paper's C = 2.
  EXPECT_EQ(gmmFactory(10, 4).draw(0).learnable.size(), 4u);
}

TEST(WeightFactory, GmmWithOneComponentAtItsInitialValuesIsBaseInDistribution) {
  // C = 1, mu = 0, Sigma = I: rows N(0, I) like Base. Moments within a few standard errors.
  const int64_t m = 8192, d = 8;
  torch::Tensor w = gmmFactory(m, d, {{"components", 1}}).draw(11).W.detach();
  double se = 1.0 / std::sqrt(static_cast<double>(m));
  EXPECT_LT(maxAbs(w.mean(0)), 5 * se) << "mean 0";
  torch::Tensor cov = w.t().matmul(w) / static_cast<double>(m);
  // Var of an entry of the sample second moment: 2/m on the diagonal, 1/m off it.
  EXPECT_LT(maxAbs(cov - torch::eye(d, torch::kFloat64)), 5 * std::sqrt(2.0) * se) << "covariance I";
  EXPECT_LT(std::abs(w.pow(4).mean().item<double>() - 3.0), 5 * std::sqrt(96.0) * se / std::sqrt(double(d)))
      << "Gaussian fourth moment";
  // The entries' empirical CDF against Phi at a few points (Kolmogorov bound ~1.36 / sqrt(N)).
  torch::Tensor flat = w.flatten();
  for (double x : {-1.5, -0.5, 0.0, 0.7, 2.0}) {
    double empirical = (flat <= x).to(torch::kFloat64).mean().item<double>();
    double phi = 0.5 * std::erfc(-x / std::sqrt(2.0));
    EXPECT_LT(std::abs(empirical - phi), 1.63 / std::sqrt(static_cast<double>(m))) << "at " << x;
  }
  // Base's own draw of the same size passes the same checks (sanity of the bounds).
  torch::Tensor base = factory("posrf-base", m, d).draw(11).W;
  EXPECT_LT(maxAbs(base.mean(0)), 5 * se);
}

} // namespace

namespace {

WeightFactory generativeFactory(int64_t m, int64_t d, int64_t hidden) {
  VariantConfig config;
  config.m = m;
  config.d = d;
  config.options = {{"hidden", static_cast<double>(hidden)}};
  return WeightFactory(describeVariant("trigrf-generative", config));
}

TEST(WeightFactory, GenerativeIsAFiveLayerGeneratorWithBatchNormAndTanhRows) {
  const int64_t m = 32, d = 4, h = 6;
  WeightFactory f = generativeFactory(m, d, h);
  Weights w = f.draw(3);
  // Five dense layers: weights [h,d], [h,h] x 3, [d,h], each with a bias; Glorot-uniform weights,
  // zero biases, all learnable.
  ASSERT_EQ(w.learnable.size(), 10u);
  const std::vector<std::vector<int64_t>> shapes = {{h, d}, {h}, {h, h}, {h}, {h, h},
                                                    {h}, {h, h}, {h}, {d, h}, {d}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto &[name, value] = w.learnable[i];
    EXPECT_EQ(value.sizes().vec(), shapes[i]) << name;
    EXPECT_TRUE(value.requires_grad()) << name;
    if (i % 2 == 0) {
      EXPECT_NE(name.find("glorot"), std::string::npos) << name;
      double bound = std::sqrt(6.0 / static_cast<double>(shapes[i][0] + shapes[i][1]));
      EXPECT_LE(maxAbs(value), bound) << name << ": Glorot-uniform bound";
      EXPECT_GT(maxAbs(value), 0.3 * bound) << name << ": not degenerate";
    } else {
      EXPECT_NE(name.find("zeros"), std::string::npos) << name;
      EXPECT_EQ(maxAbs(value), 0.0) << name;
    }
  }
  EXPECT_EQ(w.W.sizes().vec(), (std::vector<int64_t>{m, d}));
  EXPECT_LT(maxAbs(w.W), 1.0) << "tanh output";
  EXPECT_GT(w.W.std().item<double>(), 0.05) << "rows differ (the noise reaches the output)";
  // Deterministic per seed, different across seeds.
  EXPECT_TRUE(torch::equal(w.W, f.draw(3).W));
  EXPECT_FALSE(torch::equal(w.W, f.draw(4).W));

  std::vector<std::pair<std::string, torch::Tensor>> factors;
  for (auto &[name, value] : w.learnable) factors.emplace_back(name, value.detach().clone());
  EXPECT_LT(maxAbs(f.rebuild(3, factors).W - w.W), 1e-12) << "rebuild at the drawn factors";
  // Batch normalisation removes a hidden layer's bias and (up to its epsilon) its scale: shifting
  // b1..b4 and scaling layer 1 by 3 leaves W unchanged.
  auto shifted = factors;
  for (size_t i : {1u, 3u, 5u, 7u}) shifted[i].second = shifted[i].second + 0.7;
  shifted[0].second = shifted[0].second * 3;
  EXPECT_LT(maxAbs(f.rebuild(3, shifted).W - w.W), 1e-4) << "batch norm invariance";
  // With the last layer's weight at zero every row is tanh(b5).
  auto constant = factors;
  constant[8].second = torch::zeros({d, h}, torch::kFloat64);
  constant[9].second = torch::tensor({0.5, -1.0, 2.0, 0.0}, torch::kFloat64);
  torch::Tensor rows = f.rebuild(3, constant).W;
  EXPECT_LT(maxAbs(rows - torch::tanh(constant[9].second).unsqueeze(0).expand({m, d})), 1e-15);
  // The default width is the paper's 64.
  VariantConfig config;
  config.m = m;
  config.d = d;
  EXPECT_EQ(WeightFactory(describeVariant("posrf-generative", config)).draw(0).learnable[0].second.size(0),
            64);
}

} // namespace

namespace {

TEST(WeightFactory, SsrIsTheStochasticSphericalRadialRule) {
  const int64_t d = 6, block = 2 * d + 3, copies = 3, m = copies * block;
  WeightFactory f = factory("posrf-ssr", m, d);
  Weights w = f.draw(4);
  ASSERT_TRUE(w.rowWeights.has_value());
  torch::Tensor a = *w.rowWeights, p = w.W;
  ASSERT_EQ(p.sizes().vec(), (std::vector<int64_t>{m, d}));
  // Exact moments of N(0, I) for every radius and rotation: weights sum to 1, first and third
  // moments vanish, the second is I.
  EXPECT_NEAR(a.sum().item<double>(), 1.0, 1e-12);
  torch::Tensor ap = a.unsqueeze(1) * p;
  EXPECT_LT(maxAbs(ap.sum(0)), 1e-10);
  EXPECT_LT(maxAbs(ap.t().matmul(p) - torch::eye(d, torch::kFloat64)), 1e-10);
  EXPECT_LT(std::abs((a * p.select(1, 0).pow(2) * p.select(1, 1)).sum().item<double>()), 1e-10);
  EXPECT_LT(std::abs((a * p.select(1, 2).pow(3)).sum().item<double>()), 1e-10);
  for (int64_t b = 0; b < copies; ++b) {
    torch::Tensor rows = p.slice(0, b * block, (b + 1) * block), wt = a.slice(0, b * block, (b + 1) * block);
    // The origin, then +-rho v_j at one radius rho.
    EXPECT_LT(maxAbs(rows[0]), 1e-12);
    torch::Tensor norms = rows.slice(0, 1).norm(2, 1);
    double rho = norms[0].item<double>();
    EXPECT_LT(maxAbs(norms - rho), 1e-10) << "block " << b;
    EXPECT_LT(maxAbs(rows.slice(0, 1, d + 2) + rows.slice(0, d + 2)), 1e-12) << "+- pairs";
    // The d+1 directions are a regular simplex: pairwise cosine -1/d.
    torch::Tensor v = rows.slice(0, 1, d + 2) / rho;
    torch::Tensor gram = v.matmul(v.t());
    torch::Tensor expected = torch::full({d + 1, d + 1}, -1.0 / d, torch::kFloat64) +
                             (1.0 + 1.0 / d) * torch::eye(d + 1, torch::kFloat64);
    EXPECT_LT(maxAbs(gram - expected), 1e-10) << "block " << b;
    // Weights 1 - d/rho^2 and d / (2 (d+1) rho^2), averaged over the copies.
    EXPECT_NEAR(wt[0].item<double>() * copies, 1.0 - d / (rho * rho), 1e-10);
    EXPECT_LT(maxAbs(wt.slice(0, 1) * copies - d / (2.0 * (d + 1) * rho * rho)), 1e-10);
  }
  // rho ~ chi_{d+2}: over many blocks E[rho^2] = d + 2 (variance 2 (d + 2)).
  const int64_t many = 4000;
  Weights big = factory("posrf-ssr", many * block, d).draw(9);
  torch::Tensor rho2 = big.W.slice(0, 1, many * block, block).square().sum(1);
  EXPECT_NEAR(rho2.mean().item<double>(), d + 2.0, 5 * std::sqrt(2.0 * (d + 2) / many));
  // m is rounded down to whole rules (one at least).
  EXPECT_EQ(factory("posrf-ssr", 2 * block + 5, d).draw(0).W.size(0), 2 * block);
  EXPECT_EQ(factory("posrf-ssr", 4, d).draw(0).W.size(0), block);
}

} // namespace
