//===- TorchOps.cpp - torch.ops.spectra.* for PyTorch users ---------------===//
//
// Built as libspectra_torch_ops.so: `torch.ops.load_library(path)` then
//   out = torch.ops.spectra.attention(q, k, v, mask, "saderf-orf", 128, 0, "fused")
//   out = torch.ops.spectra.attention(q, k, v, variant="posrf-orf", causal=True)
//   y, state = torch.ops.spectra.decode(q_t, k_t, v_t, [], "posrf-orf")   # then pass state on
//                                     (mode="reference": eager ops in place of the kernel)
//   W = torch.ops.spectra.weights("saderf-orf", 128, d, 0)   # the same draw, [m, d]
// The op keeps one SpectralAttention module per (variant, m, d, seed, mode);
// its kernels come from the KernelCache. Registered as a composite op, so
// autograd runs through the fused kernels' own autograd Function.
//
//===----------------------------------------------------------------------===//

#include "runtime/BufferCache.h"
#include "runtime/KernelCache.h"
#include "runtime/SpectralAttention.h"

#include <torch/library.h>

#include <map>
#include <mutex>
#include <stdexcept>

namespace spectra {
namespace {

/// Feature maps declared in IR (spectra_attention.declare): name -> (IR text, source name).
struct Declared {
  std::string ir, source;
};
std::mutex &registryMutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, Declared> &declaredFeatures() {
  static std::map<std::string, Declared> features;
  return features;
}

/// "a=-0.2,b=1" -> {"a": -0.2, "b": 1}; a malformed entry is an error naming it.
std::map<std::string, double> parseOptions(const std::string &text) {
  std::map<std::string, double> options;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, end - start);
    size_t eq = item.find('=');
    double value = 0;
    size_t used = 0;
    bool ok = eq != std::string::npos && eq > 0;
    if (ok) {
      try {
        value = std::stod(item.substr(eq + 1), &used);
      } catch (const std::exception &) {
        ok = false;
      }
      ok = ok && used == item.size() - eq - 1;
    }
    TORCH_CHECK(ok, "spectra: component option '", item, "' is not NAME=NUMBER (options are "
                "comma-separated, e.g. 'a=-0.2')");
    options[item.substr(0, eq)] = value;
    start = end + 1;
  }
  return options;
}

/// The op's module for (feature, options, m, d, seed, mode, causal), made once. `feature` is a
/// variant name or a feature map declared through declare().
SpectralAttention moduleFor(const std::string &feature, int64_t m, int64_t d, int64_t seed,
                            const std::string &mode, bool causal = false,
                            const std::string &optionText = "") {
  static std::map<std::string, SpectralAttention> modules;
  SpectralAttentionOptions options;
  std::string key;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    auto declared = declaredFeatures().find(feature);
    if (declared != declaredFeatures().end()) {
      options.ir = declared->second.ir;
      options.irSource = declared->second.source;
      options.featureMap = feature;
      key = "ir:" + declared->second.ir;  // a redeclared name gets a module of its own
    }
  }
  options.variant = feature;
  options.config.m = m;
  options.config.d = d;
  options.config.seed = seed;
  options.config.options = parseOptions(optionText);
  options.causal = causal;
  key += feature + "|" + optionText + "|" + std::to_string(m) + "|" + std::to_string(d) + "|" +
         std::to_string(seed) + "|" + mode + (causal ? "|causal" : "");
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = modules.find(key);
  if (it == modules.end()) {
    try {
      options.mode = parseAttentionMode(mode);
      it = modules.emplace(key, SpectralAttention(options)).first;
    } catch (const std::invalid_argument &e) {
      TORCH_CHECK(false, "spectra.attention: ", e.what());
    }
  }
  return it->second;
}

torch::Tensor attentionOp(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const std::optional<torch::Tensor> &keyMask, std::string variant,
                          int64_t m, int64_t seed, std::string mode, bool causal) {
  TORCH_CHECK(q.dim() == 4, "spectra.attention: q must be [B, H, N, d], got ", q.sizes());
  return moduleFor(variant, m, q.size(3), seed, mode, causal)->forward(q, k, v, keyMask);
}

/// The random features' W [m, d] (float32) that attention() uses for the same variant, m, d
/// and seed (to give another implementation the same draw).
torch::Tensor weightsOp(std::string variant, int64_t m, int64_t d, int64_t seed) {
  return moduleFor(variant, m, d, seed, "reference")->weights->weights().W.detach().to(
      torch::kFloat32).clone();
}

/// A decoding op's state argument ([] or [S, z, zabs, c]) as a DecodeState of copies: the
/// compiled kernel advances a state in place, and the ops leave the caller's as it was.
DecodeState copiedState(const char *op, const std::vector<torch::Tensor> &state) {
  TORCH_CHECK(state.empty() || state.size() == 4, op, ": the state is [] or the [S, z, zabs, c] ",
              "of the previous step, got ", state.size(), " tensors");
  DecodeState st;
  if (!state.empty())
    st = {state[0].clone(), state[1].clone(), state[2].clone(), state[3].clone(), 0};
  return st;
}

/// One token of causal decoding: `state` is [] (empty) or [S, z, zabs, c] as returned by the
/// previous step (left unchanged: the op is functional); returns the output [B, H, 1, dv]
/// and the new state. Mode fused runs the compiled causal_decode kernel, reference eager ops.
std::tuple<torch::Tensor, std::vector<torch::Tensor>>
decodeOp(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
         std::vector<torch::Tensor> state, std::string variant, int64_t m, int64_t seed,
         std::string mode) {
  TORCH_CHECK(q.dim() == 4, "spectra.decode: q must be [B, H, 1, d], got ", q.sizes());
  DecodeState st = copiedState("spectra.decode", state);
  torch::Tensor out =
      moduleFor(variant, m, q.size(3), seed, mode, /*causal=*/true)->decode(q, k, v, st);
  return {out, {st.S, st.z, st.zabs, st.c}};
}

std::vector<int64_t> cacheStats() {
  CacheStats s = KernelCache::instance().stats();
  return {s.compiles, s.memoryHits, s.diskHits, s.corruptEntries, s.diskWrites};
}

/// The CPU buffer cache (runtime/BufferCache.h): {hits, misses, idle bytes, live bytes, cap},
/// after returning its idle blocks to the system when `release` is set.
std::vector<int64_t> bufferCacheOp(bool release) {
  if (release)
    releaseIdleBuffers();
  BufferCacheStats s = bufferCacheStats();
  return {s.hits, s.misses, s.idleBytes, s.liveBytes, s.capBytes};
}

std::vector<std::string> variantsOp() { return variantNames(); }

/// Registers the feature maps of `ir` (verified and described now, so errors surface here with
/// their location in `source`) and returns the declared names; `featureMap` picks one.
std::vector<std::string> declareOp(std::string ir, std::string source, std::string featureMap) {
  std::vector<std::string> names;
  try {
    if (!featureMap.empty()) {
      describeIR(ir, source, featureMap);
      names.push_back(featureMap);
    } else {
      names.push_back(describeIR(ir, source).name);
    }
  } catch (const std::invalid_argument &e) {
    TORCH_CHECK(false, "spectra.declare: ", e.what());
  }
  std::lock_guard<std::mutex> lock(registryMutex());
  for (const std::string &name : names)
    declaredFeatures()[name] = {ir, source};
  return names;
}

/// A feature's weights for `seed`: W [m', d] f32 (m' = m but for SGQ, whose quadrature has its
/// own count of points), the row weights ([m'], or empty when the
/// recipe has none) and the learnable factors (empty for fixed recipes) with their names.
std::tuple<torch::Tensor, torch::Tensor, std::vector<torch::Tensor>, std::vector<std::string>>
drawOp(std::string feature, int64_t m, int64_t d, int64_t seed, std::string options) {
  // One module per (feature, m, d, options) whatever the seed: its factory draws any seed, so
  // redraws build nothing new.
  SpectralAttention module = moduleFor(feature, m, d, 0, "reference", false, options);
  Weights w = module->weights->factory().draw(seed, torch::kFloat32);
  std::vector<torch::Tensor> factors;
  std::vector<std::string> names;
  for (auto &[name, factor] : w.learnable) {
    names.push_back(name);
    factors.push_back(factor.detach().clone());
  }
  torch::Tensor rows = w.rowWeights ? w.rowWeights->detach() : torch::empty({0});
  return {w.W.detach(), rows, factors, names};
}

/// W (and the row weights) from learnable factors, differentiably (LibTorch autograd).
std::tuple<torch::Tensor, torch::Tensor> rebuildOp(std::string feature, int64_t m, int64_t d,
                                                   int64_t seed, std::string options,
                                                   std::vector<torch::Tensor> factors,
                                                   std::vector<std::string> names) {
  TORCH_CHECK(factors.size() == names.size(), "spectra.rebuild: ", factors.size(),
              " factors but ", names.size(), " names");
  SpectralAttention module = moduleFor(feature, m, d, 0, "reference", false, options);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < factors.size(); ++i)
    named.emplace_back(names[i], factors[i]);
  Weights w = module->weights->factory().rebuild(seed, named);
  return {w.W, w.rowWeights ? *w.rowWeights : torch::empty({0}, w.W.options())};
}

/// rebuild() as one opaque kernel (torch.compile's graphs hold it; the draws of `seed` inside
/// use a generator a trace cannot follow).
std::tuple<torch::Tensor, torch::Tensor> rebuildFwd(std::string feature, int64_t m, int64_t d,
                                                    int64_t seed, std::string options,
                                                    std::vector<torch::Tensor> factors,
                                                    std::vector<std::string> names) {
  torch::NoGradGuard noGrad;
  return rebuildOp(feature, m, d, seed, options, factors, names);
}

/// The factors' gradients for W's gradient `grad` (rebuild run again with autograd on).
std::vector<torch::Tensor> rebuildBwd(const torch::Tensor &grad, std::string feature, int64_t m,
                                      int64_t d, int64_t seed, std::string options,
                                      std::vector<torch::Tensor> factors,
                                      std::vector<std::string> names) {
  c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
  c10::impl::ForceDispatchKeyGuard dispatch(
      tls.included_, tls.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  torch::AutoGradMode gradMode(true);
  for (torch::Tensor &f : factors)
    f = f.detach().requires_grad_(true);
  torch::Tensor W = std::get<0>(rebuildOp(feature, m, d, seed, options, factors, names));
  std::vector<torch::Tensor> grads =
      torch::autograd::grad({W}, factors, {grad}, false, false, /*allow_unused=*/true);
  for (size_t i = 0; i < grads.size(); ++i)
    if (!grads[i].defined())
      grads[i] = torch::zeros_like(factors[i]);
  return grads;
}

/// Shapes and devices of a feature_attention call, checked once for every entry point.
void checkFeatureCall(const char *op, const torch::Tensor &q, const torch::Tensor &k,
                      const torch::Tensor &v, const torch::Tensor &W) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": q, k, v must be [B, H, N, d] ",
              "(4 dimensions), got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(W.dim() == 2 && W.size(1) == q.size(3), op, ": W must be [m, d] with d = ",
              q.size(3), " (q's last dimension), got ", W.sizes());
}

Weights givenWeights(const torch::Tensor &W, const std::optional<torch::Tensor> &rowWeights) {
  Weights w{W, std::nullopt, {}};
  if (rowWeights && rowWeights->numel() > 0)
    w.rowWeights = *rowWeights;
  return w;
}

/// Attention with given weights; autograd through the fused kernels' own backward (eager).
torch::Tensor featureAttentionOp(const torch::Tensor &q, const torch::Tensor &k,
                                 const torch::Tensor &v, const torch::Tensor &W,
                                 const std::optional<torch::Tensor> &rowWeights,
                                 const std::optional<torch::Tensor> &keyMask,
                                 const std::optional<torch::Tensor> &queryMask,
                                 std::string feature, int64_t m, std::string options,
                                 std::string mode, bool causal) {
  checkFeatureCall("spectra.feature_attention", q, k, v, W);
  // m names the draw (SGQ's W has more rows than m); 0: W's rows.
  return moduleFor(feature, m > 0 ? m : W.size(0), W.size(1), 0, mode, causal, options)
      ->forwardWith(givenWeights(W, rowWeights), q, k, v, keyMask, queryMask);
}

/// The causal decoding state after a prompt, with given weights: [S, z, zabs, c].
std::vector<torch::Tensor> featurePrefillOp(const torch::Tensor &k, const torch::Tensor &v,
                                            const torch::Tensor &W,
                                            const std::optional<torch::Tensor> &rowWeights,
                                            const std::optional<torch::Tensor> &keyMask,
                                            std::string feature, int64_t m, std::string options,
                                            std::string mode) {
  checkFeatureCall("spectra.feature_prefill", k, k, v, W);
  DecodeState st = moduleFor(feature, m > 0 ? m : W.size(0), W.size(1), 0, mode, true, options)
                       ->prefillWith(givenWeights(W, rowWeights), k, v, keyMask);
  return {st.S, st.z, st.zabs, st.c};
}

/// One token of causal decoding with given weights; `state` ([S, z, zabs, c], or [] for the
/// empty state) is left unchanged and the advanced one returned.
std::tuple<torch::Tensor, std::vector<torch::Tensor>>
featureDecodeOp(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                const torch::Tensor &W, std::vector<torch::Tensor> state,
                const std::optional<torch::Tensor> &rowWeights, std::string feature, int64_t m,
                std::string options, std::string mode) {
  checkFeatureCall("spectra.feature_decode", q, k, v, W);
  DecodeState st = copiedState("spectra.feature_decode", state);
  torch::Tensor out = moduleFor(feature, m > 0 ? m : W.size(0), W.size(1), 0, mode, true, options)
                          ->decodeWith(givenWeights(W, rowWeights), q, k, v, st);
  return {out, {st.S, st.z, st.zabs, st.c}};
}

/// The same as one opaque kernel (no autograd of its own; torch.compile's graphs hold it,
/// with its backward feature_attention_bwd registered from Python).
torch::Tensor featureAttentionFwd(const torch::Tensor &q, const torch::Tensor &k,
                                  const torch::Tensor &v, const torch::Tensor &W,
                                  const std::optional<torch::Tensor> &rowWeights,
                                  const std::optional<torch::Tensor> &keyMask,
                                  const std::optional<torch::Tensor> &queryMask,
                                  std::string feature, int64_t m, std::string options,
                                  std::string mode, bool causal) {
  torch::NoGradGuard noGrad;
  return featureAttentionOp(q, k, v, W, rowWeights, keyMask, queryMask, feature, m, options,
                            mode, causal)
      .contiguous();
}

/// dq, dk, dv, dW of feature_attention_fwd for `grad` (zeros where `needs` says no): the
/// forward is run again with autograd on, then the fused kernels' backward.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor>
featureAttentionBwd(const torch::Tensor &grad, const torch::Tensor &q, const torch::Tensor &k,
                    const torch::Tensor &v, const torch::Tensor &W,
                    const std::optional<torch::Tensor> &rowWeights,
                    const std::optional<torch::Tensor> &keyMask,
                    const std::optional<torch::Tensor> &queryMask, std::string feature,
                    int64_t m, std::string options, std::string mode, bool causal,
                    std::array<bool, 4> needs) {
  // Kernels run below the autograd keys; this one records a graph again.
  c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
  c10::impl::ForceDispatchKeyGuard dispatch(
      tls.included_, tls.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  torch::AutoGradMode gradMode(true);
  std::array<torch::Tensor, 4> in = {q, k, v, W};
  std::vector<torch::Tensor> wanted;
  for (int i = 0; i < 4; ++i) {
    in[i] = in[i].detach().requires_grad_(needs[i]);
    if (needs[i])
      wanted.push_back(in[i]);
  }
  // Every result is defined (zeros where `needs` says no) and contiguous, as the fake kernel
  // promises.
  std::array<torch::Tensor, 4> result;
  for (int i = 0; i < 4; ++i)
    result[i] = torch::zeros(in[i].sizes(), in[i].options());
  if (wanted.empty())
    return {result[0], result[1], result[2], result[3]};
  torch::Tensor out = featureAttentionOp(in[0], in[1], in[2], in[3], rowWeights, keyMask,
                                         queryMask, feature, m, options, mode, causal);
  std::vector<torch::Tensor> grads = torch::autograd::grad({out}, wanted, {grad},
                                                           /*retain_graph=*/false,
                                                           /*create_graph=*/false,
                                                           /*allow_unused=*/true);
  for (int i = 0, j = 0; i < 4; ++i)
    if (needs[i]) {
      if (grads[j].defined())
        result[i] = grads[j].contiguous();
      ++j;
    }
  return {result[0], result[1], result[2], result[3]};
}

} // namespace
} // namespace spectra

TORCH_LIBRARY(spectra, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor? key_mask=None, str variant='posrf-mm', "
        "int m=128, int seed=0, str mode='fused', bool causal=False) -> Tensor",
        &spectra::attentionOp);
  m.def("weights(str variant='posrf-mm', int m=128, int d=32, int seed=0) -> Tensor",
        &spectra::weightsOp);
  m.def("decode(Tensor q, Tensor k, Tensor v, Tensor[] state, str variant='posrf-mm', int m=128, "
        "int seed=0, str mode='fused') -> (Tensor, Tensor[])",
        &spectra::decodeOp);
  m.def("cache_stats() -> int[]", &spectra::cacheStats);
  m.def("buffer_cache(bool release=False) -> int[]", &spectra::bufferCacheOp);
  // The Python package's ops (python/spectra_attention): weights held by the caller.
  m.def("variants() -> str[]", &spectra::variantsOp);
  m.def("declare(str ir, str source='<ir>', str feature_map='') -> str[]", &spectra::declareOp);
  m.def("draw(str feature, int m, int d, int seed=0, str options='') -> "
        "(Tensor, Tensor, Tensor[], str[])",
        &spectra::drawOp);
  m.def("rebuild(str feature, int m, int d, int seed, str options, Tensor[] factors, "
        "str[] names) -> (Tensor, Tensor)",
        &spectra::rebuildOp);
  const char *rebuildArgs = "str feature, int m, int d, int seed, str options, Tensor[] factors, "
                            "str[] names";
  m.def((std::string("rebuild_fwd(") + rebuildArgs + ") -> (Tensor, Tensor)").c_str());
  m.def((std::string("rebuild_bwd(Tensor grad, ") + rebuildArgs + ") -> Tensor[]").c_str());
  const std::string featureArgs =
      "Tensor q, Tensor k, Tensor v, Tensor W, Tensor? row_weights=None, Tensor? key_mask=None, "
      "Tensor? query_mask=None, str feature='posrf-mm', int m=0, str options='', "
      "str mode='fused', bool causal=False";
  m.def(("feature_attention(" + featureArgs + ") -> Tensor").c_str(),
        &spectra::featureAttentionOp);
  m.def("feature_prefill(Tensor k, Tensor v, Tensor W, Tensor? row_weights=None, "
        "Tensor? key_mask=None, str feature='posrf-mm', int m=0, str options='', "
        "str mode='fused') -> Tensor[]",
        &spectra::featurePrefillOp);
  m.def("feature_decode(Tensor q, Tensor k, Tensor v, Tensor W, Tensor[] state, "
        "Tensor? row_weights=None, str feature='posrf-mm', int m=0, str options='', "
        "str mode='fused') -> (Tensor, Tensor[])",
        &spectra::featureDecodeOp);
  m.def(("feature_attention_fwd(" + featureArgs + ") -> Tensor").c_str());
  m.def(("feature_attention_bwd(Tensor grad, " + featureArgs +
         ", bool[4] needs=[True, True, True, True]) -> (Tensor, Tensor, Tensor, Tensor)")
            .c_str());
}

// The opaque pair runs the same kernels on either device (each picks its target inside).
TORCH_LIBRARY_IMPL(spectra, CPU, m) {
  m.impl("feature_attention_fwd", &spectra::featureAttentionFwd);
  m.impl("feature_attention_bwd", &spectra::featureAttentionBwd);
  m.impl("rebuild_fwd", &spectra::rebuildFwd);
  m.impl("rebuild_bwd", &spectra::rebuildBwd);
}
TORCH_LIBRARY_IMPL(spectra, CUDA, m) {
  m.impl("feature_attention_fwd", &spectra::featureAttentionFwd);
  m.impl("feature_attention_bwd", &spectra::featureAttentionBwd);
  m.impl("rebuild_fwd", &spectra::rebuildFwd);
  m.impl("rebuild_bwd", &spectra::rebuildBwd);
}
