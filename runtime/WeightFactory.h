//===- WeightFactory.h - materialising weight recipes with LibTorch ------===//
//
// Interprets the weight recipe of a descriptor: every building block with
// LibTorch numerics (QR, Cholesky, ndtri, Hadamard, ...). Random draws come
// from CPU generators seeded by (seed, op, block replica), so a seed gives the
// same W on every device. Draws marked `learnable` become parameters; W is a
// differentiable function of them.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_WEIGHTFACTORY_H
#define SPECTRA_RUNTIME_WEIGHTFACTORY_H

#include "runtime/Descriptor.h"

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace spectra {

/// A materialised recipe.
struct Weights {
  torch::Tensor W;                           ///< [m, d]
  std::optional<torch::Tensor> rowWeights;   ///< [m], signed quadrature weights (SGQ)
  /// The learnable factors by stable name (e.g. "b0.chi4"), in recipe order.
  std::vector<std::pair<std::string, torch::Tensor>> learnable;
};

class WeightFactory {
public:
  explicit WeightFactory(Descriptor descriptor);

  const Descriptor &descriptor() const { return desc; }

  /// Draws the recipe for `seed` (a redraw is just another seed). The result
  /// is computed in float64 on the CPU and then converted to `options`, so it
  /// is the same on every device up to the final rounding. Learnable factors
  /// are returned as leaf tensors requiring grad, W as a function of them.
  Weights draw(int64_t seed, const torch::TensorOptions &options = torch::kFloat64) const;

  /// Recomputes W (differentiably) from given learnable factors, e.g. the
  /// parameters of a module after an optimiser step, with the other draws of
  /// `seed`. Computation happens in the factors' dtype and device.
  Weights rebuild(int64_t seed,
                  const std::vector<std::pair<std::string, torch::Tensor>> &factors) const;

  /// True when the recipe has learnable factors.
  bool hasLearnable() const;

private:
  Descriptor desc;
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_WEIGHTFACTORY_H
