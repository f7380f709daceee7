//===- Reference.h - the eager LibTorch oracle of every random feature ---===//
//
// Materialises phi with plain LibTorch ops by interpreting the component's
// params and features programs, so any feature declared in the dialect
// (built-in or a user's) has an obviously-right reference with autograd.
// The fused kernels are tested against it and benchmarked against it.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_REFERENCE_H
#define SPECTRA_RUNTIME_REFERENCE_H

#include "runtime/Descriptor.h"
#include "runtime/WeightFactory.h"

#include <torch/torch.h>

#include <optional>

namespace spectra {

/// Per-(batch, head) parameters of a component, from data statistics.
struct ComponentParams {
  std::vector<torch::Tensor> scalars;  ///< each [B, H]
  torch::Tensor queryScale, keyScale;  ///< [B, H, d] diagonal input transforms, or undefined
};

enum class Side { Queries, Keys };

/// How phi is scaled before it is returned.
enum class Stabilizer {
  None,       ///< phi as defined (may overflow)
  Exact,      ///< queries: one constant per query; keys: one per (batch, head). Cancels in attention.
};

struct AttentionOptions {
  Stabilizer stabilizer = Stabilizer::Exact;
  /// Data normaliser applied to q and k; default d^(-1/4) (softmax's 1/sqrt(d)).
  std::optional<double> scale;
  /// Padded queries [B, Nq] bool (true = keep), left out of the query
  /// statistics (self-attention over padded sequences); all queries when unset.
  std::optional<torch::Tensor> queryMask;
};

/// The outputs of a features program evaluated on broadcastable tensors.
struct FeatureValues {
  std::vector<torch::Tensor> logits, coeffs;  ///< one per output
};

/// Evaluates the component's features program elementwise on wx, xx, ww and
/// the scalar parameters (any broadcastable shapes).
FeatureValues evaluateFeatures(const Descriptor &desc, const torch::Tensor &wx,
                               const torch::Tensor &xx, const torch::Tensor &ww,
                               const std::vector<torch::Tensor> &params);

/// Evaluates the compiler-derived partials program: element [o][v] is the pair
/// (d logit_o / d v, d coeff_o / d v), v over (wx, xx, ww, params...).
std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>>
evaluatePartials(const Descriptor &desc, const torch::Tensor &wx, const torch::Tensor &xx,
                 const torch::Tensor &ww, const std::vector<torch::Tensor> &params);

/// The checks every attention entry point makes (shapes, dtypes, devices,
/// mask, finiteness), as TORCH_CHECK errors naming what is wrong.
void checkAttentionInputs(const Descriptor &desc, const torch::Tensor &q, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask);

class ReferenceFeatureMap {
public:
  explicit ReferenceFeatureMap(Descriptor descriptor);

  const Descriptor &descriptor() const { return desc; }

  /// Evaluates the params program on already-normalised q, k: [B, H, N, d];
  /// `keyMask` [B, Nk] (true = keep) restricts key statistics to kept keys.
  ComponentParams params(const torch::Tensor &q, const torch::Tensor &k,
                         const std::optional<torch::Tensor> &keyMask = std::nullopt,
                         const std::optional<torch::Tensor> &queryMask = std::nullopt) const;

  /// phi of already-normalised inputs x [B, H, N, d] as [B, H, N, outputs*m]
  /// (the input transform of `side` applied; for keys, row weights m*a_i and
  /// the mask applied). With Stabilizer::Exact the result is phi times a
  /// positive constant per query (queries) or per (batch, head) (keys).
  torch::Tensor features(const torch::Tensor &x, Side side, const ComponentParams &params,
                         const Weights &weights, Stabilizer stabilizer = Stabilizer::None,
                         const std::optional<torch::Tensor> &keyMask = std::nullopt) const;

  /// Non-causal attention phi(q)^T S / phi(q)^T z for q [B,H,Nq,d], k [B,H,Nk,d],
  /// v [B,H,Nk,dv], keyMask [B,Nk] bool. f16/bf16 inputs are computed in f32.
  torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt,
                          const AttentionOptions &options = {}) const;

private:
  Descriptor desc;
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_REFERENCE_H
