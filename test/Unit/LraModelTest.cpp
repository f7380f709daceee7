//===- LraModelTest.cpp - the LRA Transformer with each attention ---------===//

#include "models/LraModel.h"

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
