//===- TorchOps.cpp - torch.ops.spectra.* for PyTorch users ---------------===//
//
// Built as libspectra_torch_ops.so: `torch.ops.load_library(path)` then
//   out = torch.ops.spectra.attention(q, k, v, mask, "saderf-orf", 128, 0, "fused")
//   out = torch.ops.spectra.attention(q, k, v, variant="posrf-orf", causal=True)
//   y, state = torch.ops.spectra.decode(q_t, k_t, v_t, [], "posrf-orf")   # then pass state on
//   W = torch.ops.spectra.weights("saderf-orf", 128, d, 0)   # the same draw, [m, d]
// The op keeps one SpectralAttention module per (variant, m, d, seed, mode);
// its kernels come from the KernelCache. Registered as a composite op, so
// autograd runs through the fused kernels' own autograd Function.
//
//===----------------------------------------------------------------------===//

#include "runtime/KernelCache.h"
#include "runtime/SpectralAttention.h"

#include <torch/library.h>

#include <map>
#include <mutex>
#include <stdexcept>

namespace spectra {
namespace {

/// The op's module for (variant, m, d, seed, mode), made once.
SpectralAttention moduleFor(const std::string &variant, int64_t m, int64_t d, int64_t seed,
                            const std::string &mode, bool causal = false) {
  static std::mutex mutex;
  static std::map<std::string, SpectralAttention> modules;
  std::string key = variant + "|" + std::to_string(m) + "|" + std::to_string(d) + "|" +
                    std::to_string(seed) + "|" + mode + (causal ? "|causal" : "");
  std::lock_guard<std::mutex> lock(mutex);
  auto it = modules.find(key);
  if (it == modules.end()) {
    SpectralAttentionOptions options;
    options.variant = variant;
    options.config.m = m;
    options.config.d = d;
    options.config.seed = seed;
    options.causal = causal;
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

/// One token of causal decoding: `state` is [] (empty) or [S, z, zabs, c] as returned by the
/// previous step; returns the output [B, H, 1, dv] and the new state.
std::tuple<torch::Tensor, std::vector<torch::Tensor>>
decodeOp(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
         std::vector<torch::Tensor> state, std::string variant, int64_t m, int64_t seed) {
  TORCH_CHECK(q.dim() == 4, "spectra.decode: q must be [B, H, 1, d], got ", q.sizes());
  TORCH_CHECK(state.empty() || state.size() == 4, "spectra.decode: the state is [] or the ",
              "[S, z, zabs, c] of the previous step, got ", state.size(), " tensors");
  DecodeState st;
  if (!state.empty())
    st = {state[0], state[1], state[2], state[3], 0};
  torch::Tensor out =
      moduleFor(variant, m, q.size(3), seed, "reference", /*causal=*/true)->decode(q, k, v, st);
  return {out, {st.S, st.z, st.zabs, st.c}};
}

std::vector<int64_t> cacheStats() {
  CacheStats s = KernelCache::instance().stats();
  return {s.compiles, s.memoryHits, s.diskHits, s.corruptEntries, s.diskWrites};
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
        "int seed=0) -> (Tensor, Tensor[])",
        &spectra::decodeOp);
  m.def("cache_stats() -> int[]", &spectra::cacheStats);
}
