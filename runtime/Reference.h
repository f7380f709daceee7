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

#include "codegen/spectra_compiler.h"
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

/// The column moments of one side's rows under its mask weights w_n (1 kept, 0 masked),
/// all the data statistics need: sum_n w_n x_n and sum_n w_n x_n^2 [B, H, d] and the count
/// sum_n w_n [B, H, 1], of the unscaled rows.
struct RowMoments {
  torch::Tensor sum, sumsq, count;
};

/// How attention keeps exp() representable. Every scheme here leaves the
/// estimator unchanged in exact arithmetic; they differ in what stays finite.
enum class Stabilizer {
  None,       ///< phi as defined (overflows and underflows in float32 for large logits)
  /// One key constant per (batch, head) and one per query. Exact, but when logits spread over
  /// more than float32's exp range every feature's S and z can underflow to 0 (0/0). Kept to
  /// show what the per-feature scheme fixes (the numerics tests must fail with it).
  PerSlice,
  /// A key constant per feature, c_f = max over kept keys of feature f's logit, so S_f and z_f
  /// each hold a term of exp(0); the readout weighs feature f by exp(l_q,f + c_f - M_q),
  /// M_q = max_f (l_q,f + c_f), so the largest query term is exp(0) too. The denominator of a
  /// positive feature is then at least its largest coefficient product (no underflow, no 0/0).
  Exact,
};

/// The guard on signed estimators' denominators (SGQ's signed row weights, TrigRF): where
/// |den| <= kDenominatorGuard * T, T = sum_f |phi(q)_f| sum_j |phi(k_j)_f|, den becomes
/// den + 2 kDenominatorGuard T (Performer's additive guard, relative to T so that it does not
/// depend on the stabiliser's scale). Then |out| <= max|v| / kDenominatorGuard. Positive
/// features have den = T, so it never fires for them. Its gradient is that of den (T is held
/// constant), as in Performer's code.
constexpr double kDenominatorGuard = SPECTRA_DENOMINATOR_GUARD;

struct AttentionOptions {
  Stabilizer stabilizer = Stabilizer::Exact;
  /// Data normaliser applied to q and k; default d^(-1/4) (softmax's 1/sqrt(d)).
  std::optional<double> scale;
  /// Padded queries [B, Nq] bool (true = keep), left out of the query
  /// statistics (self-attention over padded sequences); all queries when unset.
  std::optional<torch::Tensor> queryMask;
  /// Causal attention: out_i over the keys j <= i (q and k of one length; CAUSAL-NOTES.md).
  /// With Stabilizer::Exact it is computed in chunks of kCausalChunk rows carrying the state
  /// (S, z, c) with a per-feature running maximum, each query row referenced to its own
  /// running maximum, a chunk halved while its factors would exceed exp(60); with None, as
  /// the masked N x N product. A query no kept key reaches yet gets 0. Components whose
  /// parameters read sequence statistics are refused (a token would see later tokens).
  bool causal = false;
};

/// Rows per chunk of the causal reference.
constexpr int64_t kCausalChunk = 64;

/// Why causal attention refuses components whose parameters read sequence statistics
/// (after "component '<name>' ").
inline constexpr const char *kCausalStatistics =
    "reads data statistics over the whole sequence, so under causal attention a token would "
    "see later tokens; use a component with fixed parameters (posrf; gerf with the option "
    "a=VALUE for OPRF's family with A fixed)";

/// Attention and how often the denominator guard fired.
struct AttentionResult {
  torch::Tensor out;      ///< [B, H, Nq, dv] in q's dtype
  torch::Tensor guarded;  ///< [B, H] float32: queries whose denominator the guard replaced
};

/// The outputs of a features program evaluated on broadcastable tensors.
struct FeatureValues {
  std::vector<torch::Tensor> logits, coeffs;  ///< one per output
};

/// Stacked outputs: logits and coefficients [B, H, N, outputs, m].
struct FeatureTerms {
  torch::Tensor logits, coeffs;
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

/// The value checks' messages (after "spectra attention: ").
inline constexpr const char *kEmptyKeyMask = "every sequence needs at least one unmasked key";
inline constexpr const char *kNonFiniteInputs = "q, k and v must be finite (found inf or nan)";

/// While one is alive on a thread, the value checks of the attention entry points on that
/// thread (q, k and v finite; every mask row keeping a key or query) do not read the device:
/// each adds to a device flag that the owner reads when it reads anything else (the trainer:
/// once per metrics window), so a training step never waits for the device. The checks of
/// shapes, dtypes and devices stay immediate errors. Scopes nest; the innermost collects.
class DeferredInputChecks {
public:
  DeferredInputChecks();
  ~DeferredInputChecks();
  DeferredInputChecks(const DeferredInputChecks &) = delete;
  DeferredInputChecks &operator=(const DeferredInputChecks &) = delete;

  /// The innermost scope of this thread, or null.
  static DeferredInputChecks *active();
  /// A bool scalar, true when some q, k or v seen had an inf or a NaN; undefined when no
  /// attention ran in the scope.
  const torch::Tensor &nonFinite() const { return nonFiniteFlag; }
  /// A bool scalar, true when some key (query) mask row kept nothing; undefined likewise.
  const torch::Tensor &emptyMask() const { return emptyMaskFlag; }

  void noteNonFinite(const torch::Tensor &flag);
  void noteEmptyMask(const torch::Tensor &flag);

private:
  torch::Tensor nonFiniteFlag, emptyMaskFlag;
  DeferredInputChecks *outer;
};

/// The shape, dtype and device checks of checkAttentionInputs alone (no pass over the values).
void checkAttentionShapes(const Descriptor &desc, const torch::Tensor &q, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights);
/// The checks every attention entry point makes (shapes, dtypes, devices,
/// mask, finiteness), as TORCH_CHECK errors naming what is wrong (the value
/// checks deferred inside a DeferredInputChecks scope).
/// With `valuesAfterKernels` (the CPU kernels, which carry the check themselves: see
/// checkAttentionValues) the immediate pass over q, k and v is left out; inside a
/// DeferredInputChecks scope the check is made as always.
void checkAttentionInputs(const Descriptor &desc, const torch::Tensor &q, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask,
                          bool valuesAfterKernels = false);
/// The exact finiteness check of q, k and v (one min/max pass each): an error naming it, or
/// a deferred flag inside a DeferredInputChecks scope. The CPU kernels mark their guard
/// counts NaN where an input row was not finite; the runtime calls this only then (a false
/// alarm, from a finite input whose square overflows, passes here).
void checkAttentionValues(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v);

/// The recurrent state of causal attention per (batch, head) (CAUSAL-NOTES.md section 4):
/// S [B, H, F, dv], z and zabs [B, H, F] relative to the per-feature running maxima c
/// [B, H, F] of the key logits (-inf before any key), and the tokens seen. 17 KiB per head at
/// F = 128, dv = 32, whatever the length.
struct DecodeState {
  torch::Tensor S, z, zabs, c;
  int64_t length = 0;
};

class ReferenceFeatureMap {
public:
  explicit ReferenceFeatureMap(Descriptor descriptor);

  const Descriptor &descriptor() const { return desc; }

  /// Evaluates the params program on the statistics of inputScale * q and
  /// inputScale * k ([B, H, N, d]; the scale enters the statistics, no scaled
  /// copy is made); `keyMask` [B, Nk] (true = keep) restricts key statistics to
  /// kept keys, `queryMask` likewise.
  ComponentParams params(const torch::Tensor &q, const torch::Tensor &k,
                         const std::optional<torch::Tensor> &keyMask = std::nullopt,
                         const std::optional<torch::Tensor> &queryMask = std::nullopt,
                         double inputScale = 1.0) const;
  /// The same from the sides' moments (computed elsewhere, e.g. by the compiled moments
  /// kernels); each statistic is a function of them and the scale; the parameters are
  /// computed with `opts` (dtype, device).
  ComponentParams paramsFromMoments(const RowMoments &queries, const RowMoments &keys, int64_t B,
                                    int64_t H, double inputScale, torch::TensorOptions opts) const;
  /// Whether the params program reads data statistics (otherwise the moments are not needed).
  bool usesStatistics() const;
  /// A side's moments with LibTorch: x [B, H, N, d], weight [B or 1, 1, N, 1].
  static RowMoments moments(const torch::Tensor &x, const torch::Tensor &weight);
  /// The query mask's weights [B, 1, Nq, 1] (checked: bool [B, Nq], a query kept per row), or
  /// ones [1, 1, Nq, 1] without a mask; the same for keys (unchecked: checkAttentionInputs).
  static torch::Tensor queryWeights(const std::optional<torch::Tensor> &queryMask, int64_t B,
                                    int64_t Nq, torch::TensorOptions opts);
  static torch::Tensor keyWeights(const std::optional<torch::Tensor> &keyMask, int64_t B,
                                  int64_t Nk, torch::TensorOptions opts);

  /// phi of already-normalised inputs x [B, H, N, d] as [B, H, N, outputs*m]
  /// (the input transform of `side` applied; for keys, row weights m*a_i and
  /// the mask applied), unstabilised.
  torch::Tensor features(const torch::Tensor &x, Side side, const ComponentParams &params,
                         const Weights &weights,
                         const std::optional<torch::Tensor> &keyMask = std::nullopt) const;

  /// phi = coeffs * exp(logits) of already-normalised inputs, each [B, H, N, outputs, m]
  /// (input transform applied; for keys the row weights m*a_i are in the coefficients).
  FeatureTerms featureTerms(const torch::Tensor &x, Side side, const ComponentParams &params,
                            const Weights &weights) const;

  /// Non-causal attention phi(q)^T S / phi(q)^T z for q [B,H,Nq,d], k [B,H,Nk,d],
  /// v [B,H,Nk,dv], keyMask [B,Nk] bool. f16/bf16 inputs are computed in f32.
  torch::Tensor attention(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt,
                          const AttentionOptions &options = {}) const {
    return attentionWithStats(q, k, v, weights, keyMask, options).out;
  }
  /// attention() and the guard's count per (batch, head).
  AttentionResult attentionWithStats(const torch::Tensor &q, const torch::Tensor &k,
                                     const torch::Tensor &v, const Weights &weights,
                                     const std::optional<torch::Tensor> &keyMask = std::nullopt,
                                     const AttentionOptions &options = {}) const;

  /// The decoding state after the keys k [B, H, N, d] and values v [B, H, N, dv] (a prompt
  /// given whole; keyMask [B, N] true = keep): the state a causal pass over them ends in.
  /// Computed in float32 (float64 for float64 inputs); q's statistics are not needed (causal
  /// attention refuses components that read them).
  DecodeState prefill(const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
                      const std::optional<torch::Tensor> &keyMask = std::nullopt,
                      std::optional<double> scale = std::nullopt) const;
  /// One token of causal attention: q, k [B, H, 1, d], v [B, H, 1, dv] enter `state` (the
  /// key first: token t attends to itself), and the output [B, H, 1, dv] (q's dtype) is the
  /// causal attention of the whole sequence at that position. O(F (d + dv)) work, no
  /// dependence on the length. Not differentiable (decoding runs without autograd).
  torch::Tensor decode(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const Weights &weights, DecodeState &state,
                       std::optional<double> scale = std::nullopt) const;

private:
  Descriptor desc;
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_REFERENCE_H
