//===- LraModel.h - the Spectraformer paper's LRA Transformer -------------===//
//
// Table 5 of the paper: token embedding 64 plus learned positions, 2
// pre-LayerNorm blocks (2 heads x 32, FFN 128, GELU, dropout 0.1), a final
// LayerNorm, masked mean pooling and an MLP head; the retrieval model encodes
// both documents with the same encoder and classifies [x0, x1, x0*x1, x0-x1].
// Attention is selectable: "softmax" (torch's scaled_dot_product_attention),
// "spectra:<variant>" (fused JIT kernels) or "spectra-reference:<variant>"
// (the eager oracle), with m random features.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_LRAMODEL_H
#define SPECTRA_MODELS_LRAMODEL_H

#include "runtime/SpectralAttention.h"

#include <torch/torch.h>

#include <map>
#include <string>

namespace spectra::models {

struct LraConfig {
  int64_t vocab = 32, maxLength = 2048, classes = 10;
  int64_t embed = 64, layers = 2, heads = 2, headDim = 32, ffn = 128;
  double dropout = 0.1;
  std::string attention = "softmax";  ///< softmax | spectra:<variant> | spectra-reference:<variant>
  int64_t features = 128;             ///< m for spectra attention
  /// Component and weight-recipe options of the variant (gerf's a, gmm's components, ...).
  std::map<std::string, double> options;
  int64_t seed = 0;                   ///< the random features' draw (per layer: seed + layer)
  bool dualEncoder = false;           ///< retrieval: two documents, one encoder
  /// spectra:<variant> runs the GPU kernels on the CPU (AttentionMode::GpuEmulated).
  bool gpuEmulated = false;
  /// A decoder: causal attention (SDPA's is_causal, or Spectra's causal kernels) and a
  /// next-token head over every position instead of pooling (the language-modelling task).
  bool languageModel = false;
};

/// Multi-head self-attention with a key padding mask and the selected kernel.
class SelfAttentionImpl : public torch::nn::Module {
public:
  SelfAttentionImpl(const LraConfig &config, int64_t layer);
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &keep);
  /// One position of causal self-attention from the layer's recurrent state (spectral
  /// attention: O(m d) whatever the position): x [B, 1, embed] -> [B, 1, embed].
  torch::Tensor step(const torch::Tensor &x, DecodeState &state);
  /// The random-feature attention (null for softmax).
  SpectralAttention spectralAttention() const { return spectral; }

private:
  bool causal = false;
  int64_t heads, headDim;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
  SpectralAttention spectral{nullptr};  ///< null for softmax
};
TORCH_MODULE(SelfAttention);

class LraModelImpl : public torch::nn::Module {
public:
  explicit LraModelImpl(LraConfig config);
  /// tokens [B, N] int64 (0 = pad); tokens2 the second documents (dual encoder).
  /// Returns logits [B, classes].
  torch::Tensor forward(const torch::Tensor &tokens, const torch::Tensor &tokens2 = {});
  /// Masked mean of the encoder's final states: [B, embed].
  torch::Tensor encode(const torch::Tensor &tokens);
  /// The language model's next-token logits [B * N, vocab] of tokens [B, N] (position i
  /// predicts token i + 1; languageModel only).
  torch::Tensor nextTokenLogits(const torch::Tensor &tokens);
  /// Generation with the recurrent state of every layer (languageModel only): the prompt's
  /// token ids [P] (P >= 1), then `count` tokens sampled at `temperature` (0: the most likely)
  /// from a generator seeded with `seed`, each from the last position's logits by one step per
  /// layer (spectral attention: O(m d) per token; softmax attention recomputes the prefix).
  /// Returns the prompt and the generated ids; total length at most the model's maxLength.
  std::vector<int64_t> generate(const std::vector<int64_t> &prompt, int64_t count,
                                double temperature, uint64_t seed);
  const LraConfig &config() const { return cfg; }
  /// The share of queries whose denominator guard fired (Reference.h, kDenominatorGuard) in
  /// every spectral attention since the last call, and the queries counted (padded ones
  /// included); resets the counts. 0 queries for softmax. Synchronises the device once.
  std::pair<double, int64_t> takeGuardStats();
  /// Redraw `draw` (>= 1) of the fixed random features: layer l's attention draws W from seed
  /// config().seed + l + draw * kRedrawSeedStride (draw 0 is the initial one). Attentions with
  /// learnable weights (FastFoodL) keep theirs. Returns how many attentions were redrawn (0
  /// for softmax). No kernel is recompiled.
  int64_t redrawFeatures(int64_t draw);
  /// The layers redrawFeatures reaches: spectral attentions with fixed recipes.
  int64_t redrawableLayers() const;
  static constexpr int64_t kRedrawSeedStride = 1000003;

private:
  LraConfig cfg;
  torch::nn::Embedding tokenEmbedding{nullptr}, positionEmbedding{nullptr};
  torch::nn::ModuleList norms1, attentions, norms2, ffns;
  torch::nn::LayerNorm finalNorm{nullptr};
  /// The hidden states after the final norm, [B, N, embed] (the shared trunk).
  torch::Tensor trunk(const torch::Tensor &tokens);
  /// Position `position`'s logits [B, vocab] from the layers' recurrent states.
  torch::Tensor stepLogits(const torch::Tensor &token, int64_t position,
                           std::vector<DecodeState> &states);
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Sequential head{nullptr};
};
TORCH_MODULE(LraModel);

} // namespace spectra::models

#endif // SPECTRA_MODELS_LRAMODEL_H
