//===- WeightModule.h - a feature map's weights as a torch::nn::Module ---===//
//
// Holds what the WeightFactory draws: W (and row weights) as buffers for
// fixed recipes, the learnable factors as parameters for learnable ones
// (FastFoodL), plus the seed, so state_dict saves and restores everything
// needed to rebuild W, and device/dtype moves follow the module.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_WEIGHTMODULE_H
#define SPECTRA_RUNTIME_WEIGHTMODULE_H

#include "runtime/WeightFactory.h"

#include <torch/torch.h>

namespace spectra {

class RandomFeatureWeightsImpl : public torch::nn::Module {
public:
  RandomFeatureWeightsImpl(Descriptor descriptor, int64_t seed);

  /// W (differentiable in the learnable factors) and the row weights.
  Weights weights() const;

  /// Draws anew from `seed` (fresh factors for learnable recipes). Nothing is recompiled.
  void redraw(int64_t seed);

  int64_t seed() const { return seedBuffer.item<int64_t>(); }
  /// Whether the recipe has learnable factors (trained, so a redraw would discard training).
  bool learnable() const { return !factorNames.empty(); }
  const WeightFactory &factory() const { return weightFactory; }

private:
  void install(const Weights &drawn);

  WeightFactory weightFactory;
  torch::Tensor seedBuffer;                  ///< int64 scalar: rebuilds need the fixed draws' seed
  torch::Tensor fixedW, fixedRowWeights;     ///< buffers of non-learnable recipes
  std::vector<std::string> factorNames;      ///< learnable factors, in recipe order
};
TORCH_MODULE(RandomFeatureWeights);

} // namespace spectra

#endif // SPECTRA_RUNTIME_WEIGHTMODULE_H
