//===- LraModel.cpp - the Spectraformer paper's LRA Transformer -----------===//

#include "models/LraModel.h"

#include <limits>
#include <stdexcept>

namespace spectra::models {

SelfAttentionImpl::SelfAttentionImpl(const LraConfig &c, int64_t layer)
    : causal(c.languageModel), heads(c.heads), headDim(c.headDim) {
  qkv = register_module("qkv", torch::nn::Linear(c.embed, 3 * c.heads * c.headDim));
  out = register_module("out", torch::nn::Linear(c.heads * c.headDim, c.embed));
  if (c.attention == "softmax")
    return;
  std::string prefix = c.attention.substr(0, c.attention.find(':'));
  if ((prefix != "spectra" && prefix != "spectra-reference") ||
      c.attention.find(':') == std::string::npos)
    throw std::invalid_argument("unknown attention '" + c.attention +
                                "'; use softmax, spectra:<variant> or spectra-reference:<variant> "
                                "(e.g. spectra:posrf-mm)");
  SpectralAttentionOptions o;
  o.variant = c.attention.substr(c.attention.find(':') + 1);
  o.config.m = c.features;
  o.config.d = c.headDim;
  o.config.seed = c.seed + layer;
  o.config.options = c.options;
  o.causal = c.languageModel;
  o.mode = prefix != "spectra" ? AttentionMode::Reference
           : c.gpuEmulated    ? AttentionMode::GpuEmulated
                              : AttentionMode::Fused;
  spectral = register_module("spectral", SpectralAttention(o));
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor &x, const torch::Tensor &keep) {
  const int64_t B = x.size(0), N = x.size(1);
  auto parts = qkv->forward(x).view({B, N, 3, heads, headDim}).permute({2, 0, 3, 1, 4});
  torch::Tensor q = parts[0], k = parts[1], v = parts[2];  // [B, H, N, hd]
  torch::Tensor o;
  if (spectral)
    o = spectral->forward(q, k, v, keep, keep);  // self-attention: padded queries too
  else if (causal)
    o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  else
    o = at::scaled_dot_product_attention(q, k, v, keep.view({B, 1, 1, N}));
  return out->forward(o.permute({0, 2, 1, 3}).reshape({B, N, heads * headDim}));
}

torch::Tensor SelfAttentionImpl::step(const torch::Tensor &x, DecodeState &state) {
  TORCH_CHECK(spectral && causal, "SelfAttention::step: recurrent steps need causal spectral attention");
  const int64_t B = x.size(0);
  auto parts = qkv->forward(x).view({B, 1, 3, heads, headDim}).permute({2, 0, 3, 1, 4});
  torch::Tensor o = spectral->decode(parts[0], parts[1], parts[2], state);  // [B, H, 1, hd]
  return out->forward(o.permute({0, 2, 1, 3}).reshape({B, 1, heads * headDim}));
}

LraModelImpl::LraModelImpl(LraConfig c) : cfg(std::move(c)) {
  tokenEmbedding = register_module("token_embedding", torch::nn::Embedding(cfg.vocab, cfg.embed));
  positionEmbedding =
      register_module("position_embedding", torch::nn::Embedding(cfg.maxLength, cfg.embed));
  norms1 = register_module("norms1", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  norms2 = register_module("norms2", torch::nn::ModuleList());
  ffns = register_module("ffns", torch::nn::ModuleList());
  for (int64_t l = 0; l < cfg.layers; ++l) {
    norms1->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.embed})));
    attentions->push_back(SelfAttention(cfg, l));
    norms2->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.embed})));
    ffns->push_back(torch::nn::Sequential(torch::nn::Linear(cfg.embed, cfg.ffn), torch::nn::GELU(),
                                          torch::nn::Dropout(cfg.dropout),
                                          torch::nn::Linear(cfg.ffn, cfg.embed)));
  }
  finalNorm = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.embed})));
  dropout = register_module("dropout", torch::nn::Dropout(cfg.dropout));
  int64_t pooled = cfg.dualEncoder ? 4 * cfg.embed : cfg.embed;
  if (cfg.languageModel)  // per position: the next token's logits
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(cfg.embed, cfg.vocab)));
  else
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(pooled, cfg.ffn),
                                                         torch::nn::GELU(),
                                                         torch::nn::Linear(cfg.ffn, cfg.classes)));
}

torch::Tensor LraModelImpl::encode(const torch::Tensor &tokens) {
  torch::Tensor x = trunk(tokens);
  // Masked mean: padding contributes nothing, and an all-padding row stays finite.
  torch::Tensor w = tokens.ne(0).to(x.scalar_type()).unsqueeze(-1);
  return (x * w).sum(1) / w.sum(1).clamp_min(1.0);
}

torch::Tensor LraModelImpl::nextTokenLogits(const torch::Tensor &tokens) {
  TORCH_CHECK(cfg.languageModel, "LraModel: next-token logits need a language model");
  torch::Tensor x = trunk(tokens);
  return head->forward(x).reshape({-1, cfg.vocab});
}

torch::Tensor LraModelImpl::trunk(const torch::Tensor &tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64,
              "LraModel: tokens must be int64 [B, N], got ", tokens.scalar_type(), " ", tokens.sizes());
  TORCH_CHECK(tokens.size(1) <= cfg.maxLength, "LraModel: sequence length ", tokens.size(1),
              " exceeds the model's ", cfg.maxLength);
  torch::Tensor keep = tokens.ne(0);
  torch::Tensor positions = torch::arange(tokens.size(1), tokens.options());
  torch::Tensor x = dropout->forward(tokenEmbedding->forward(tokens) +
                                     positionEmbedding->forward(positions).unsqueeze(0));
  for (int64_t l = 0; l < cfg.layers; ++l) {
    torch::Tensor h = norms1[l]->as<torch::nn::LayerNorm>()->forward(x);
    x = x + dropout->forward(attentions[l]->as<SelfAttention>()->forward(h, keep));
    h = norms2[l]->as<torch::nn::LayerNorm>()->forward(x);
    x = x + dropout->forward(ffns[l]->as<torch::nn::Sequential>()->forward(h));
  }
  return finalNorm->forward(x);
}

torch::Tensor LraModelImpl::stepLogits(const torch::Tensor &token, int64_t position,
                                       std::vector<DecodeState> &states) {
  torch::Tensor x = tokenEmbedding->forward(token.view({-1, 1})) +
                    positionEmbedding->forward(torch::full({1}, position, token.options()));
  for (int64_t l = 0; l < cfg.layers; ++l) {
    torch::Tensor h = norms1[l]->as<torch::nn::LayerNorm>()->forward(x);
    x = x + attentions[l]->as<SelfAttention>()->step(h, states[l]);
    h = norms2[l]->as<torch::nn::LayerNorm>()->forward(x);
    x = x + ffns[l]->as<torch::nn::Sequential>()->forward(h);
  }
  return head->forward(finalNorm->forward(x)).select(1, 0);  // [B, vocab]
}

std::vector<int64_t> LraModelImpl::generate(const std::vector<int64_t> &prompt, int64_t count,
                                            double temperature, uint64_t seed) {
  TORCH_CHECK(cfg.languageModel, "LraModel::generate needs a language model (task lm)");
  TORCH_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  TORCH_CHECK(static_cast<int64_t>(prompt.size()) + count <= cfg.maxLength, "generate: ",
              prompt.size(), " prompt tokens and ", count, " more exceed the model's ",
              cfg.maxLength, " positions (its learned position embeddings)");
  torch::NoGradGuard noGrad;
  bool wasTraining = is_training();
  eval();
  auto device = tokenEmbedding->weight.device();
  auto ids = torch::TensorOptions().dtype(torch::kInt64).device(device);
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<int64_t> tokens = prompt;
  bool recurrent = cfg.attention != "softmax";
  std::vector<DecodeState> states(cfg.layers);
  torch::Tensor logits;
  if (recurrent)  // the prompt through the recurrent steps: its state, then the last logits
    for (size_t i = 0; i < prompt.size(); ++i)
      logits = stepLogits(torch::full({1}, prompt[i], ids), static_cast<int64_t>(i), states);
  for (int64_t n = 0; n < count; ++n) {
    if (!recurrent) {  // softmax: the whole prefix again (no cache of keys and values)
      torch::Tensor t = torch::tensor(tokens, torch::kInt64).to(device).unsqueeze(0);
      logits = nextTokenLogits(t).select(0, t.size(1) - 1).unsqueeze(0);
    }
    torch::Tensor l = logits.to(torch::kCPU, torch::kFloat32).squeeze(0).clone();
    l.index_put_({0}, -std::numeric_limits<float>::infinity());  // never the padding id
    int64_t next;
    if (temperature <= 0) {
      next = l.argmax().item<int64_t>();
    } else {
      torch::Tensor p = torch::softmax(l / temperature, 0);
      next = torch::multinomial(p, 1, false, gen).item<int64_t>();
    }
    tokens.push_back(next);
    if (recurrent && n + 1 < count)
      logits = stepLogits(torch::full({1}, next, ids), static_cast<int64_t>(tokens.size()) - 1,
                          states);
  }
  train(wasTraining);
  return tokens;
}

torch::Tensor LraModelImpl::forward(const torch::Tensor &tokens, const torch::Tensor &tokens2) {
  if (cfg.languageModel)
    return nextTokenLogits(tokens);
  torch::Tensor x0 = encode(tokens);
  if (!cfg.dualEncoder)
    return head->forward(x0);
  TORCH_CHECK(tokens2.defined(), "LraModel: the dual encoder needs the second documents");
  torch::Tensor x1 = encode(tokens2);
  return head->forward(torch::cat({x0, x1, x0 * x1, x0 - x1}, -1));
}

/// Layer l's attention when its random features are fixed (redrawable), else null.
static SpectralAttention redrawable(torch::nn::ModuleList attentions, int64_t l) {
  SpectralAttention spectral = attentions[l]->as<SelfAttention>()->spectralAttention();
  return spectral && !spectral->weights->learnable() ? spectral : nullptr;
}

int64_t LraModelImpl::redrawableLayers() const {
  int64_t layers = 0;
  for (int64_t l = 0; l < cfg.layers; ++l)
    layers += redrawable(attentions, l) ? 1 : 0;
  return layers;
}

int64_t LraModelImpl::redrawFeatures(int64_t draw) {
  TORCH_CHECK(draw >= 1, "LraModel::redrawFeatures: draw must be >= 1 (0 is the initial draw), got ",
              draw);
  int64_t redrawn = 0;
  for (int64_t l = 0; l < cfg.layers; ++l)
    if (SpectralAttention spectral = redrawable(attentions, l)) {
      spectral->redraw(cfg.seed + l + draw * kRedrawSeedStride);
      ++redrawn;
    }
  return redrawn;
}

std::pair<double, int64_t> LraModelImpl::takeGuardStats() {
  double guarded = 0;
  int64_t queries = 0;
  for (const auto &module : modules(/*include_self=*/false))
    if (auto *attention = dynamic_cast<SpectralAttentionImpl *>(module.get())) {
      SpectralAttentionImpl::GuardStats s = attention->guardStats();
      if (s.guarded.defined())
        guarded += s.guarded.item<double>();
      queries += s.queries;
      attention->resetGuardStats();
    }
  return {queries ? guarded / static_cast<double>(queries) : 0.0, queries};
}

} // namespace spectra::models
