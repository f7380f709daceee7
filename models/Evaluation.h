//===- Evaluation.h - the trainer's evaluation of a split -----------------===//
//
// The loss and accuracy over (the first batches of) a split, per predicted
// label: a classified example, or a language model's next byte. Sums stay on
// the device and are read once. Under data parallelism rank r evaluates the
// batches r, r + K, r + 2K, ... and the sums are added over the ranks, so every
// rank gets the one-process figures (up to the order of the additions).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_EVALUATION_H
#define SPECTRA_MODELS_EVALUATION_H

#include "models/Datasets.h"
#include "models/LraModel.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace spectra {
class DeferredInputChecks;
namespace models {

class Distributed;

struct Evaluation {
  double loss = 0, accuracy = 0;
  int64_t examples = 0;
};

/// A mask row that kept nothing, over the steps or batches of a window (device flags, read once).
struct EmptyMaskFlag {
  torch::Tensor seen;
  void add(const DeferredInputChecks &checks);
  /// Throws (the attention's message) when a row kept nothing.
  void check() const;
};

/// The loss and accuracy of the first `maxBatches` batches of `split` (all with 0), shared out
/// over `group`'s ranks.
Evaluation evaluate(LraModel &model, const std::vector<data::Example> &split, int64_t batch,
                    int64_t maxBatches, bool dual, const torch::Device &device,
                    torch::ScalarType dtype, bool languageModel, Distributed &group);

} // namespace models
} // namespace spectra

#endif // SPECTRA_MODELS_EVALUATION_H
