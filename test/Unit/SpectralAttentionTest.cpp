//===- SpectralAttentionTest.cpp - the torch module, fused against reference ===//

#include "runtime/KernelCache.h"
#include "runtime/SpectralAttention.h"

#include <gtest/gtest.h>

using namespace spectra;

namespace {

double maxAbs(const torch::Tensor &t) { return t.abs().max().item<double>(); }

struct Inputs {
  torch::Tensor q, k, v, mask;
};

/// q, k, v with a padded tail on the second batch (junk keys under the mask).
Inputs makeInputs(torch::Dtype dtype, int seed, double scale = 0.8) {
  torch::manual_seed(seed);
  Inputs in{torch::randn({2, 2, 12, 8}, dtype) * scale, torch::randn({2, 2, 10, 8}, dtype) * scale,
            torch::randn({2, 2, 10, 5}, dtype), torch::ones({2, 10}, torch::kBool)};
  using torch::indexing::Slice;
  in.mask.index_put_({1, Slice(6)}, false);
  in.k.index_put_({1, Slice(), Slice(6)}, 3.0);
  in.v.index_put_({1, Slice(), Slice(6)}, -5.0);
  return in;
}

SpectralAttentionOptions options(const std::string &variant, AttentionMode mode) {
  SpectralAttentionOptions o;
  o.variant = variant;
  o.config.m = variant.find("sgq") != std::string::npos ? 17 : 16;
  o.config.d = 8;
  o.config.seed = 5;
  o.mode = mode;
  return o;
}

/// Output and dq, dk, dv (and the learnable factors' gradients) of one module run.
std::vector<torch::Tensor> run(SpectralAttention &module, const Inputs &in,
                               const torch::Tensor &probe) {
  torch::Tensor q = in.q.clone().set_requires_grad(true), k = in.k.clone().set_requires_grad(true),
                v = in.v.clone().set_requires_grad(true);
  for (auto &p : module->parameters())
    p.mutable_grad() = torch::Tensor();
  torch::Tensor out = module->forward(q, k, v, in.mask);
  (out.to(torch::kFloat64) * probe).sum().backward();
  std::vector<torch::Tensor> r = {out.detach(), q.grad(), k.grad(), v.grad()};
  for (auto &p : module->parameters())
    r.push_back(p.grad());
  return r;
}

void expectModesAgree(const std::string &variant, torch::Dtype dtype, double tolerance) {
  SpectralAttention fused(options(variant, AttentionMode::Fused));
  SpectralAttention reference(options(variant, AttentionMode::Reference));
  Inputs in = makeInputs(dtype, 11);
  torch::Tensor probe = torch::randn({2, 2, 12, 5}, torch::kFloat64);
  std::vector<torch::Tensor> a = run(fused, in, probe), b = run(reference, in, probe);
  ASSERT_EQ(a.size(), b.size()) << variant;
  const char *names[] = {"out", "dq", "dk", "dv"};
  EXPECT_EQ(a[0].scalar_type(), dtype) << variant << ": the output keeps the input dtype";
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << variant << " #" << i;
    ASSERT_TRUE(torch::isfinite(a[i]).all().item<bool>()) << variant << " #" << i;
    double scale = maxAbs(b[i]) + 1e-8;
    EXPECT_LT(maxAbs(a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)), tolerance * scale)
        << variant << " " << (i < 4 ? names[i] : "d(learnable factor)") << " ("
        << torch::toString(dtype) << ")";
  }
  // Padded keys contribute nothing: their dk and dv are exactly zero.
  using torch::indexing::Slice;
  EXPECT_EQ(maxAbs(a[2].index({1, Slice(), Slice(6)})), 0.0) << variant;
  EXPECT_EQ(maxAbs(a[3].index({1, Slice(), Slice(6)})), 0.0) << variant;
}

TEST(SpectralAttention, FusedMatchesReferenceForEveryPaperVariantForwardAndBackward) {
  for (const char *component : {"posrf", "oprf", "saderf"})
    for (const char *weights : {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"})
      expectModesAgree(std::string(component) + "-" + weights, torch::kFloat32, 2e-3);
}

TEST(SpectralAttention, FusedMatchesReferenceInFloat64AndForExtraComponents) {
  for (const char *variant : {"posrf-mm", "saderf-orf", "trigrf-orf", "posrf-hyp-base",
                              "hcexp-qmc", "gerf-sorf"})
    expectModesAgree(variant, torch::kFloat64, 2e-3);
}

TEST(SpectralAttention, ReferenceGradientsMatchFiniteDifferencesInFloat64) {
  // The oracle itself: autograd of the float64 reference against central differences.
  for (const char *variant : {"posrf-orf", "oprf-mm", "saderf-sgq"}) {
    SpectralAttention module(options(variant, AttentionMode::Reference));
    Inputs in = makeInputs(torch::kFloat64, 3, 0.5);
    torch::Tensor probe = torch::randn({2, 2, 12, 5}, torch::kFloat64);
    auto loss = [&](const torch::Tensor &q) {
      return (module->forward(q, in.k, in.v, in.mask) * probe).sum().item<double>();
    };
    std::vector<torch::Tensor> g = run(module, in, probe);
    const double h = 1e-6;
    for (int64_t idx : {0, 17, 95, 190}) {
      torch::Tensor plus = in.q.clone(), minus = in.q.clone();
      plus.view(-1)[idx] += h;
      minus.view(-1)[idx] -= h;
      double numeric = (loss(plus) - loss(minus)) / (2 * h);
      double analytic = g[1].view(-1)[idx].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 * (1 + std::abs(numeric))) << variant << " dq[" << idx << "]";
    }
  }
}

TEST(SpectralAttention, UserDeclaredFeatureGetsDerivedGradients) {
  SpectralAttentionOptions o;
  o.ir = R"mlir(
    spectra.component @softplus_rf params(%m, %d) {
      %c = math.rsqrt %m : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 5.000000e-01 : f32
      %one = arith.constant 1.000000e+00 : f32
      %e = math.exp %wx : f32
      %sp = math.log1p %e : f32
      %h = arith.mulf %xx, %half : f32
      %l = arith.subf %sp, %h : f32
      spectra.feature_yield exp(%l : f32) scaled(%c : f32)
    }
    spectra.feature_map @softplus_orf component @softplus_rf weights @orf m = 16 d = 8 seed = 2
  )mlir";
  o.irSource = "softplus.mlir";
  SpectralAttention fused(o);
  o.mode = AttentionMode::Reference;
  SpectralAttention reference(o);
  Inputs in = makeInputs(torch::kFloat32, 4);
  torch::Tensor probe = torch::randn({2, 2, 12, 5}, torch::kFloat64);
  std::vector<torch::Tensor> a = run(fused, in, probe), b = run(reference, in, probe);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_LT(maxAbs(a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)),
              2e-3 * (maxAbs(b[i]) + 1e-8))
        << "user-declared softplus feature #" << i;
}

TEST(SpectralAttention, LearnableFactorsTrainAndRoundTripThroughStateDict) {
  SpectralAttention module(options("posrf-fastfoodl", AttentionMode::Fused));
  std::vector<torch::Tensor> params = module->parameters();
  ASSERT_EQ(params.size(), 6u) << "FastFoodL's S, G and B of each of the 2 blocks are parameters";
  Inputs in = makeInputs(torch::kFloat32, 6);
  std::vector<torch::Tensor> g = run(module, in, torch::ones({2, 2, 12, 5}, torch::kFloat64));
  ASSERT_EQ(g.size(), 4u + params.size());
  for (size_t i = 4; i < g.size(); ++i)
    EXPECT_GT(maxAbs(g[i]), 0.0) << "learnable factor #" << i - 4 << " gets a gradient";

  torch::Tensor before = module->forward(in.q, in.k, in.v, in.mask).detach();
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    module->save(archive);
    archive.save_to(saved);
  }
  SpectralAttention other(options("posrf-fastfoodl", AttentionMode::Fused));
  other->redraw(99);
  EXPECT_GT(maxAbs(other->forward(in.q, in.k, in.v, in.mask) - before), 1e-4);
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  other->load(archive);
  EXPECT_LT(maxAbs(other->forward(in.q, in.k, in.v, in.mask) - before), 1e-6);
}

TEST(SpectralAttention, RedrawChangesWeightsWithoutRecompiling) {
  SpectralAttention module(options("oprf-orf", AttentionMode::Fused));
  Inputs in = makeInputs(torch::kFloat32, 8);
  torch::Tensor first = module->forward(in.q, in.k, in.v, in.mask);
  int64_t compiles = KernelCache::instance().stats().compiles;
  module->redraw(1234);
  torch::Tensor second = module->forward(in.q, in.k, in.v, in.mask);
  EXPECT_EQ(KernelCache::instance().stats().compiles, compiles);
  EXPECT_GT(maxAbs(second - first), 1e-4);
}

/// A tiny model: projections, spectral attention, mean pooling, a linear head.
struct TinyModelImpl : torch::nn::Module {
  TinyModelImpl(AttentionMode mode) {
    torch::manual_seed(0);
    qkv = register_module("qkv", torch::nn::Linear(16, 3 * 2 * 8));
    head = register_module("head", torch::nn::Linear(2 * 8, 1));
    SpectralAttentionOptions o = options("posrf-orf", mode);
    attention = register_module("attention", SpectralAttention(o));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &mask) {
    auto parts = qkv->forward(x).view({x.size(0), x.size(1), 3, 2, 8}).permute({2, 0, 3, 1, 4});
    torch::Tensor out = attention->forward(parts[0], parts[1], parts[2], mask);  // [B, H, N, 8]
    out = out.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(1), 16}).mean(1);
    return head->forward(out).squeeze(-1);
  }
  torch::nn::Linear qkv{nullptr}, head{nullptr};
  SpectralAttention attention{nullptr};
};
TORCH_MODULE(TinyModel);

TEST(SpectralAttention, TrainingFusedAndReferenceGiveTheSameLosses) {
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({4, 10, 16}), y = torch::randn({4});
  torch::Tensor mask = torch::ones({4, 10}, torch::kBool);
  mask.index_put_({2, torch::indexing::Slice(7)}, false);
  auto train = [&](AttentionMode mode) {
    TinyModel model(mode);
    torch::optim::SGD opt(model->parameters(), 0.1);
    std::vector<double> losses;
    for (int step = 0; step < 6; ++step) {
      opt.zero_grad();
      torch::Tensor loss = (model->forward(x, mask) - y).pow(2).mean();
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  std::vector<double> fused = train(AttentionMode::Fused), reference = train(AttentionMode::Reference);
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_NEAR(fused[i], reference[i], 1e-4 * (1 + reference[i])) << "step " << i;
  EXPECT_LT(fused.back(), fused.front()) << "the loss falls";
}

TEST(SpectralAttention, ErrorsNameWhatIsWrong) {
  try {
    SpectralAttention bad(options("posrf-orff", AttentionMode::Fused));
    FAIL() << "an unknown variant must throw";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("valid weights: base, orf, sorf"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parseAttentionMode("fast"), std::invalid_argument);
  SpectralAttention module(options("posrf-orf", AttentionMode::Fused));
  Inputs in = makeInputs(torch::kFloat32, 9);
  try {
    module->forward(in.q.narrow(3, 0, 6), in.k, in.v, in.mask);
    FAIL() << "a head dimension other than d must throw";
  } catch (const c10::Error &e) {
    EXPECT_NE(std::string(e.what()).find("8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(module->forward(in.q, in.k, in.v, torch::ones({2, 9}, torch::kBool)), c10::Error);
  EXPECT_THROW(module->forward(in.q.to(torch::kInt64), in.k, in.v, in.mask), c10::Error);
  if (!torch::cuda::is_available())
    GTEST_LOG_(INFO) << "no CUDA device: the CUDA-tensor error path is covered on GPU machines";
}

} // namespace

namespace {

TEST(SpectralAttention, PaddedQueriesStayOutOfTheStatisticsWithAQueryMask) {
  // Self-attention over a padded sequence: more padding must change nothing for
  // components whose parameters come from statistics (SADERF's Psi, OPRF's A*).
  for (const char *variant : {"saderf-orf", "oprf-mm", "hcexp-qmc"})
    for (AttentionMode mode : {AttentionMode::Fused, AttentionMode::Reference}) {
      SpectralAttention module(options(variant, mode));
      torch::manual_seed(12);
      torch::Tensor x = torch::randn({1, 2, 9, 8}), v = torch::randn({1, 2, 9, 5});
      torch::Tensor keep = torch::ones({1, 9}, torch::kBool);
      torch::Tensor base = module->forward(x, x, v, keep, keep);
      torch::Tensor xp = torch::cat({x, torch::randn({1, 2, 4, 8}) * 3}, 2);
      torch::Tensor vp = torch::cat({v, torch::randn({1, 2, 4, 5})}, 2);
      torch::Tensor keepP = torch::cat({keep, torch::zeros({1, 4}, torch::kBool)}, 1);
      torch::Tensor padded = module->forward(xp, xp, vp, keepP, keepP).narrow(2, 0, 9);
      EXPECT_LT(maxAbs(padded - base), 1e-4 * maxAbs(base))
          << variant << " (" << attentionModeName(mode) << ")";
      // Without the query mask the padding would leak into the statistics.
      torch::Tensor leaky = module->forward(xp, xp, vp, keepP).narrow(2, 0, 9);
      EXPECT_GT(maxAbs(leaky - base), 1e-4 * maxAbs(base)) << variant << ": the test has teeth";
    }
}

} // namespace

namespace {
TEST(SpectralAttention, UserDeclaredLearnableRecipeTrainsThroughTheFusedKernels) {
  // The README's learned recipe: ORF directions under a learnable affine map (per block).
  SpectralAttentionOptions o;
  o.ir = R"mlir(
    spectra.weight_recipe @learned_orf(%m, %d) {
      %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
        %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
        %q = spectra.orthogonalize %g : tensor<?x?xf32>
        %s = spectra.chi [%d] dof %d : tensor<?xf32>
        %o = spectra.scale_rows %q, %s : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
        %a = spectra.eye [%d] learnable : tensor<?x?xf32>
        %b = spectra.zeros [%d] learnable : tensor<?xf32>
        %r = spectra.affine %o by %a plus %b : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>
        spectra.yield %r : tensor<?x?xf32>
      }
      spectra.yield %w : tensor<?x?xf32>
    }
    spectra.feature_map @mine component @posrf weights @learned_orf m = 16 d = 8 seed = 3
  )mlir";
  o.irSource = "learned-recipe.mlir";
  SpectralAttention fused(o);
  o.mode = AttentionMode::Reference;
  SpectralAttention reference(o);
  ASSERT_EQ(fused->parameters().size(), 4u) << "A and b of each of the 2 ORF blocks";
  Inputs in = makeInputs(torch::kFloat32, 8);
  torch::Tensor probe = torch::randn({2, 2, 12, 5}, torch::kFloat64);
  std::vector<torch::Tensor> a = run(fused, in, probe), b = run(reference, in, probe);
  ASSERT_EQ(a.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GT(maxAbs(b[i]), 0.0) << "#" << i;
    EXPECT_LT(maxAbs(a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)), 2e-3 * maxAbs(b[i]))
        << "output, dq, dk, dv, dA_0, db_0, dA_1, db_1: #" << i;
  }
  // With A = 0 and b = 0 every feature of key j is m^-1/2 exp(-||k_j||^2 / 2) (k scaled by
  // d^-1/4): attention weighs the kept keys by exp(-||k_j||^2 / 2) alone.
  {
    torch::NoGradGuard noGrad;
    for (auto &p : fused->parameters())
      p.zero_();
  }
  torch::Tensor out = fused->forward(in.q, in.k, in.v, in.mask).to(torch::kFloat64);
  torch::Tensor k = in.k.to(torch::kFloat64) * std::pow(8.0, -0.25);
  torch::Tensor weight = torch::exp(-0.5 * k.square().sum(-1)) *
                         in.mask.to(torch::kFloat64).view({2, 1, 10});  // [B, H, Nk]
  torch::Tensor expected = torch::einsum("bhj,bhjv->bhv", {weight, in.v.to(torch::kFloat64)}) /
                           weight.sum(-1, true);
  EXPECT_LT(maxAbs(out - expected.unsqueeze(2).expand_as(out)), 1e-5);
}
} // namespace

namespace {
TEST(SpectralAttention, TrainingTheGeneratorAloneBringsGenerativeRksCloserToSoftmax) {
  // Generative-RKS (fused kernels): fit the generator so that the attention matches softmax
  // attention on fixed inputs. A few Adam steps on the generator's parameters alone must move
  // them and lower the error.
  SpectralAttentionOptions o = options("trigrf-generative", AttentionMode::Fused);
  o.config.m = 32;
  o.config.options = {{"hidden", 16}};
  SpectralAttention module(o);
  torch::manual_seed(3);
  torch::Tensor q = torch::randn({2, 2, 24, 8}) * 1.5, k = torch::randn({2, 2, 24, 8}) * 1.5,
                v = torch::randn({2, 2, 24, 5});
  torch::Tensor target = at::scaled_dot_product_attention(q, k, v);
  std::vector<torch::Tensor> params = module->parameters(), before;
  ASSERT_EQ(params.size(), 10u);
  for (auto &p : params)
    before.push_back(p.detach().clone());
  torch::optim::Adam adam(params, torch::optim::AdamOptions(0.01));
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    adam.zero_grad();
    torch::Tensor loss = (module->forward(q, k, v) - target).square().mean();
    loss.backward();
    ASSERT_TRUE(torch::isfinite(loss).item<bool>());
    (step == 0 ? first : last) = loss.item<double>();
    adam.step();
  }
  EXPECT_LT(last, 0.8 * first) << "first " << first << ", last " << last;
  EXPECT_GT((params[0].detach() - before[0]).abs().max().item<double>(), 1e-3);
  EXPECT_GT((params[8].detach() - before[8]).abs().max().item<double>(), 1e-3);
}
} // namespace
