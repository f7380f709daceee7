//===- LraModelTest.cpp - the LRA Transformer with each attention ---------===//

#include "models/LraModel.h"
#include "runtime/Compiler.h"
#include "runtime/WeightFactory.h"

#include <gtest/gtest.h>

using namespace spectra::models;

namespace {

LraConfig small(const std::string &attention, bool dual = false) {
  LraConfig c;
  c.vocab = 20;
  c.maxLength = 64;
  c.classes = dual ? 2 : 10;
  c.embed = 16;
  c.heads = 2;
  c.headDim = 8;
  c.ffn = 32;
  c.features = 16;
  c.attention = attention;
  c.dualEncoder = dual;
  return c;
}

torch::Tensor tokens(int64_t B, int64_t N, int seed) {
  torch::manual_seed(seed);
  torch::Tensor t = torch::randint(1, 20, {B, N}, torch::kInt64);
  t.index_put_({1, torch::indexing::Slice(N - 5)}, 0);  // padding on the second row
  return t;
}

TEST(LraModel, EveryAttentionGivesLogitsAndIgnoresPadding) {
  for (const char *attention : {"softmax", "spectra:posrf-mm", "spectra-reference:posrf-mm",
                                "spectra:saderf-orf"}) {
    torch::manual_seed(0);
    LraModel model(small(attention));
    model->eval();
    torch::Tensor x = tokens(3, 24, 1);
    torch::Tensor logits = model->forward(x);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10})) << attention;
    ASSERT_TRUE(torch::isfinite(logits).all().item<bool>()) << attention;
    // More padding changes nothing: masked keys, masked mean pooling.
    torch::Tensor padded = torch::cat({x, torch::zeros({3, 9}, torch::kInt64)}, 1);
    EXPECT_LT((model->forward(padded) - logits).abs().max().item<double>(), 1e-4) << attention;
  }
}

TEST(LraModel, FusedAndReferenceAttentionGiveTheSameModel) {
  torch::manual_seed(3);
  LraModel fused(small("spectra:oprf-mm"));
  torch::manual_seed(3);
  LraModel reference(small("spectra-reference:oprf-mm"));
  fused->eval();
  reference->eval();
  torch::Tensor x = tokens(2, 16, 2);
  torch::Tensor a = fused->forward(x), b = reference->forward(x);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-4);
  a.sum().backward();
  b.sum().backward();
  auto pa = fused->named_parameters(), pb = reference->named_parameters();
  for (const auto &item : pa) {
    torch::Tensor ga = item.value().grad(), gb = pb[item.key()].grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << item.key();
    EXPECT_LT((ga - gb).abs().max().item<double>(), 2e-3 * (gb.abs().max().item<double>() + 1e-6))
        << item.key();
  }
}

TEST(LraModel, RetrievalDualEncoderClassifiesPairs) {
  torch::manual_seed(0);
  LraModel model(small("spectra:posrf-mm", /*dual=*/true));
  torch::Tensor logits = model->forward(tokens(2, 20, 4), tokens(2, 20, 5));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 2}));
  logits.sum().backward();
  EXPECT_THROW(model->forward(tokens(2, 20, 4)), c10::Error) << "the second documents are required";
}

TEST(LraModel, RedrawDrawsEachLayersFixedFeaturesFromItsSeedAndKeepsLearnableOnes) {
  spectra::VariantConfig config;
  config.m = 16;
  config.d = 8;
  LraConfig c = small("spectra:posrf-orf");
  c.seed = 7;
  torch::manual_seed(0);
  LraModel model(c);
  ASSERT_EQ(model->redrawableLayers(), 2);
  torch::Tensor x = tokens(2, 16, 6);
  model->eval();
  torch::Tensor before = model->forward(x);
  EXPECT_EQ(model->redrawFeatures(3), 2);
  // Layer l now holds the draw of seed 7 + l + 3 * stride, exactly as a new factory draws it.
  spectra::WeightFactory factory(spectra::describeVariant("posrf-orf", config));
  int64_t l = 0;
  for (const auto &item : model->named_buffers())
    if (item.key().find("spectral.weights.W") != std::string::npos) {
      torch::Tensor expected = factory.draw(7 + l + 3 * LraModelImpl::kRedrawSeedStride).W;
      EXPECT_TRUE(torch::equal(item.value(), expected.to(item.value().dtype()))) << item.key();
      ++l;
    }
  EXPECT_EQ(l, 2) << "the fixed W buffers of both layers";
  torch::Tensor after = model->forward(x);
  EXPECT_GT((after - before).abs().max().item<double>(), 1e-6) << "new features, new outputs";
  EXPECT_TRUE(torch::isfinite(after).all().item<bool>());
  // Learnable recipes (FastFoodL) and softmax have nothing to redraw.
  LraModel learnable(small("spectra:posrf-fastfoodl"));
  EXPECT_EQ(learnable->redrawableLayers(), 0);
  auto factors = learnable->named_parameters();
  std::vector<torch::Tensor> saved;
  for (const auto &item : factors)
    saved.push_back(item.value().detach().clone());
  EXPECT_EQ(learnable->redrawFeatures(1), 0);
  size_t i = 0;
  for (const auto &item : learnable->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), saved[i++])) << item.key();
  EXPECT_EQ(LraModel(small("softmax"))->redrawFeatures(1), 0);
  EXPECT_THROW(model->redrawFeatures(0), c10::Error) << "draw 0 is the initial one";
}

TEST(LraModel, TrainingOnlyTheGmmMixtureMovesItAndLowersTheLoss) {
  // GMM-PRF through the fused kernels: the mixture's Sigma_c and mu_c are parameters of the
  // model, get gradients through dW, and an optimiser that trains nothing else lowers the loss.
  torch::manual_seed(5);
  LraModel model(small("spectra:posrf-gmm"));
  std::vector<torch::Tensor> mixture, before;
  for (const auto &item : model->named_parameters())
    if (item.key().find("spectral.weights.") != std::string::npos) {
      mixture.push_back(item.value());
      before.push_back(item.value().detach().clone());
    }
  ASSERT_EQ(mixture.size(), 8u) << "2 layers x 2 components x (Sigma_c, mu_c)";
  torch::Tensor x = tokens(8, 24, 4);
  torch::Tensor y = torch::randint(0, 10, {8}, torch::kInt64);
  torch::optim::Adam adam(mixture, torch::optim::AdamOptions(0.05));
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    adam.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    ASSERT_TRUE(torch::isfinite(loss).item<bool>());
    if (step == 0) {
      for (const torch::Tensor &p : mixture)
        ASSERT_TRUE(p.grad().defined() && p.grad().abs().sum().item<double>() > 0);
      first = loss.item<double>();
    }
    last = loss.item<double>();
    adam.step();
  }
  EXPECT_LT(last, first - 0.02) << "first " << first << ", last " << last;
  for (size_t i = 0; i < mixture.size(); ++i)
    EXPECT_GT((mixture[i].detach() - before[i]).abs().max().item<double>(), 1e-3) << "parameter " << i;
}

TEST(LraModel, VariantOptionsReachTheRecipeAndTheGeneratorGetsGradients) {
  // Generative-RKS through the fused kernels with the variant option hidden = 12: the
  // generator's weights and biases are parameters of the model and get gradients through dW
  // (its training is tested in SpectralAttentionTest).
  torch::manual_seed(6);
  LraConfig config = small("spectra:trigrf-generative");
  config.options = {{"hidden", 12}};
  LraModel model(config);
  std::vector<torch::Tensor> generator;
  std::vector<std::string> names;
  for (const auto &item : model->named_parameters())
    if (item.key().find("spectral.weights.") != std::string::npos) {
      generator.push_back(item.value());
      names.push_back(item.key());
    }
  ASSERT_EQ(generator.size(), 20u) << "2 layers x 5 dense layers x (weight, bias)";
  EXPECT_EQ(generator[0].sizes().vec(), (std::vector<int64_t>{12, 8})) << "hidden = 12 reached the recipe";
  torch::Tensor x = tokens(8, 24, 4);
  torch::Tensor y = torch::randint(0, 10, {8}, torch::kInt64);
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  // Every weight and the output bias get a gradient; the hidden biases sit in front of batch
  // norm, which removes them (their exact gradient is 0).
  for (size_t i = 0; i < generator.size(); ++i) {
    ASSERT_TRUE(generator[i].grad().defined()) << names[i];
    bool hiddenBias = i % 2 == 1 && i % 10 != 9;
    if (!hiddenBias) {
      EXPECT_GT(generator[i].grad().abs().max().item<double>(), 1e-7) << names[i];
    }
  }
}

TEST(LanguageModel, NextTokenLogitsAreCausal) {
  // Changing tokens after position i changes no logit at or before i: causal spectral
  // attention (fused kernels) and softmax (SDPA's is_causal).
  for (const char *attention : {"spectra:posrf-orf", "softmax"}) {
    LraConfig c = small(attention);
    c.languageModel = true;
    c.classes = c.vocab;
    c.dropout = 0;
    torch::manual_seed(0);
    LraModel model(c);
    model->eval();
    torch::NoGradGuard noGrad;
    torch::manual_seed(3);
    torch::Tensor a = torch::randint(1, 20, {2, 40}, torch::kInt64), b = a.clone();
    b.index_put_({torch::indexing::Slice(), torch::indexing::Slice(25)},
                 torch::randint(1, 20, {2, 15}, torch::kInt64));
    torch::Tensor la = model->forward(a).view({2, 40, -1}), lb = model->forward(b).view({2, 40, -1});
    EXPECT_EQ(la.size(2), 20);
    using torch::indexing::Slice;
    EXPECT_LT((la.index({Slice(), Slice(0, 25)}) - lb.index({Slice(), Slice(0, 25)})).abs().max().item<double>(),
              1e-5)
        << attention;
    EXPECT_GT((la.index({Slice(), Slice(25)}) - lb.index({Slice(), Slice(25)})).abs().max().item<double>(),
              1e-3)
        << attention;
  }
}

TEST(LanguageModel, RecurrentGenerationFollowsTheFullForward) {
  // Greedy generation through the layers' recurrent states picks, at every position, the
  // argmax of the full (chunked causal kernels) forward of the sequence so far.
  for (const char *attention : {"spectra:posrf-orf", "spectra-reference:trigrf-orf", "softmax"}) {
    LraConfig c = small(attention);
    c.languageModel = true;
    c.classes = c.vocab;
    torch::manual_seed(1);
    LraModel model(c);
    std::vector<int64_t> prompt = {3, 7, 1, 12, 5, 5, 9};
    std::vector<int64_t> out = model->generate(prompt, 30, /*temperature=*/0, 0);
    ASSERT_EQ(out.size(), prompt.size() + 30);
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), out.begin()));
    model->eval();
    torch::NoGradGuard noGrad;
    torch::Tensor seq = torch::tensor(out, torch::kInt64).unsqueeze(0);
    torch::Tensor logits = model->forward(seq);  // [N, vocab]
    logits.index_put_({torch::indexing::Slice(), 0}, -INFINITY);
    for (size_t p = prompt.size(); p < out.size(); ++p)
      EXPECT_EQ(logits[p - 1].argmax().item<int64_t>(), out[p]) << attention << " position " << p;
    EXPECT_THROW(model->generate(prompt, 60, 0, 0), c10::Error);  // past maxLength = 64
  }
}

TEST(LraModel, BadConfigurationsAreNamed) {
  try {
    LraModel bad(small("performer"));
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("use softmax, spectra:<variant> or spectra-reference:<variant>"),
              std::string::npos)
        << e.what();
  }
  LraModel model(small("softmax"));
  EXPECT_THROW(model->forward(torch::ones({2, 100}, torch::kInt64)), c10::Error) << "too long";
  EXPECT_THROW(model->forward(torch::ones({2, 10}, torch::kFloat32)), c10::Error) << "not tokens";
}

} // namespace
