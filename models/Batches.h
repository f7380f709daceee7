//===- Batches.h - the trainer's batches: collation and order -------------===//
//
// A batch is the examples of one step, padded to its longest document and
// copied to the device (pinned host memory on CUDA, so the copy does not wait).
// The order of the training examples is a function of (seed, step): a fresh
// permutation per epoch, so the batch of any step is known without replaying
// the steps before it. Under data parallelism each rank takes its contiguous
// share of that global batch (shardOf), so a run is a function of (seed, step,
// rank) and K ranks see exactly the examples one process would.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_BATCHES_H
#define SPECTRA_MODELS_BATCHES_H

#include "models/Datasets.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace spectra::models {

struct Batch {
  torch::Tensor tokens, tokens2, labels;
};

/// The examples `indices` of `examples` on `device`: tokens [B, N] padded with 0 to the
/// longest, tokens2 for a dual encoder, labels [B]; a language model's windows [B, N + 1]
/// become inputs [B, N] and next tokens [B * N].
Batch collate(const std::vector<data::Example> &examples, const std::vector<int64_t> &indices,
              bool dual, const torch::Device &device, bool languageModel = false);

/// The training order: a permutation per epoch seeded by (seed, epoch).
class BatchOrder {
public:
  BatchOrder(int64_t examples, int64_t batch, int64_t seed);
  /// The global batch of `step` (0-based): `batch` example indices.
  std::vector<int64_t> indices(int64_t step);

private:
  int64_t n, b;
  uint64_t seed;
  int64_t epoch = -1;
  std::vector<int64_t> permutation;
};

/// Rank `rank`'s contiguous share of a global batch split over `worldSize` ranks (its size a
/// multiple of worldSize: the trainer checks --batch).
std::vector<int64_t> shardOf(const std::vector<int64_t> &global, int64_t rank, int64_t worldSize);

} // namespace spectra::models

#endif // SPECTRA_MODELS_BATCHES_H
