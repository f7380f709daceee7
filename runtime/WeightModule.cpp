//===- WeightModule.cpp - weights as module state -------------------------===//

#include "runtime/WeightModule.h"

#include <algorithm>

namespace spectra {
namespace {
/// Parameter names cannot hold '.', which torch uses for submodules.
std::string parameterName(std::string factor) {
  std::replace(factor.begin(), factor.end(), '.', '_');
  return factor;
}
} // namespace

RandomFeatureWeightsImpl::RandomFeatureWeightsImpl(Descriptor descriptor, int64_t seed)
    : weightFactory(std::move(descriptor)) {
  seedBuffer = register_buffer("seed", torch::tensor(seed, torch::kInt64));
  Weights drawn = weightFactory.draw(seed);
  if (drawn.learnable.empty()) {
    fixedW = register_buffer("W", drawn.W);
    if (drawn.rowWeights)
      fixedRowWeights = register_buffer("row_weights", *drawn.rowWeights);
    return;
  }
  for (auto &[name, factor] : drawn.learnable) {
    factorNames.push_back(name);
    register_parameter(parameterName(name), factor.detach().clone());
  }
}

Weights RandomFeatureWeightsImpl::weights() const {
  if (factorNames.empty()) {
    Weights w{fixedW, std::nullopt, {}};
    if (fixedRowWeights.defined())
      w.rowWeights = fixedRowWeights;
    return w;
  }
  std::vector<std::pair<std::string, torch::Tensor>> factors;
  for (const std::string &name : factorNames)
    factors.emplace_back(name, named_parameters(false)[parameterName(name)]);
  return weightFactory.rebuild(seed(), factors);
}

void RandomFeatureWeightsImpl::redraw(int64_t seed) {
  torch::NoGradGuard guard;
  seedBuffer.fill_(seed);
  if (factorNames.empty()) {
    Weights drawn = weightFactory.draw(seed, fixedW.options());
    fixedW.copy_(drawn.W);
    if (fixedRowWeights.defined())
      fixedRowWeights.copy_(*drawn.rowWeights);
    return;
  }
  Weights drawn = weightFactory.draw(seed);
  for (auto &[name, factor] : drawn.learnable)
    named_parameters(false)[parameterName(name)].copy_(factor);
}

} // namespace spectra
