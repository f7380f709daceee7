//===- Batches.cpp - the trainer's batches: collation and order -----------===//

#include "models/Batches.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace spectra::models {
namespace {

/// Host tensors for a CUDA device are pinned, so their copy is asynchronous (a copy from
/// pageable memory waits for the device).
torch::TensorOptions hostOptions(const torch::Device &device) {
  return torch::TensorOptions().dtype(torch::kInt64).pinned_memory(device.is_cuda());
}

torch::Tensor padTokens(const std::vector<const std::vector<int32_t> *> &rows,
                        const torch::Device &device) {
  size_t longest = 1;
  for (auto *r : rows)
    longest = std::max(longest, r->size());
  torch::Tensor t = torch::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)},
                                 hostOptions(device));
  auto a = t.accessor<int64_t, 2>();
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i]->size(); ++j)
      a[i][j] = (*rows[i])[j];
  return t;
}

/// Pads to the longest document of the batch: the model's masks make the result independent
/// of the padded length, so nothing is gained by padding to the task's maximum.
/// A language model's batch: windows [B, N + 1] -> inputs [B, N] and next tokens [B * N].
Batch collateWindows(const std::vector<data::Example> &examples,
                     const std::vector<int64_t> &indices, const torch::Device &device) {
  std::vector<const std::vector<int32_t> *> rows;
  for (int64_t i : indices)
    rows.push_back(&examples[i].tokens);
  torch::Tensor all = padTokens(rows, device);
  const int64_t N = all.size(1) - 1;
  auto copy = [&](const torch::Tensor &t) { return t.contiguous().to(device, /*non_blocking=*/true); };
  return {copy(all.narrow(1, 0, N)), {}, copy(all.narrow(1, 1, N).reshape({-1}))};
}

} // namespace

Batch collate(const std::vector<data::Example> &examples, const std::vector<int64_t> &indices,
              bool dual, const torch::Device &device, bool languageModel) {
  if (languageModel)
    return collateWindows(examples, indices, device);
  std::vector<const std::vector<int32_t> *> a, b;
  torch::Tensor labels = torch::empty({static_cast<int64_t>(indices.size())}, hostOptions(device));
  auto label = labels.accessor<int64_t, 1>();
  for (size_t i = 0; i < indices.size(); ++i) {
    const data::Example &e = examples[indices[i]];
    a.push_back(&e.tokens);
    b.push_back(&e.tokens2);
    label[i] = e.label;
  }
  auto copy = [&](const torch::Tensor &t) { return t.to(device, /*non_blocking=*/true); };
  Batch batch{copy(padTokens(a, device)), {}, copy(labels)};
  if (dual)
    batch.tokens2 = copy(padTokens(b, device));
  return batch;
}

BatchOrder::BatchOrder(int64_t examples, int64_t batch, int64_t seed)
    : n(examples), b(batch), seed(static_cast<uint64_t>(seed)) {}

std::vector<int64_t> BatchOrder::indices(int64_t step) {
  int64_t perEpoch = std::max<int64_t>(1, n / b);
  int64_t e = step / perEpoch, at = (step % perEpoch) * b;
  if (e != epoch) {
    permutation.resize(n);
    std::iota(permutation.begin(), permutation.end(), 0);
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(e));
    // Fisher-Yates by hand: std::shuffle's sequence is implementation-defined.
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(permutation[i], permutation[rng() % static_cast<uint64_t>(i + 1)]);
    epoch = e;
  }
  std::vector<int64_t> out;
  for (int64_t i = 0; i < b; ++i)
    out.push_back(permutation[(at + i) % n]);
  return out;
}

std::vector<int64_t> shardOf(const std::vector<int64_t> &global, int64_t rank, int64_t worldSize) {
  const int64_t size = static_cast<int64_t>(global.size());
  if (worldSize < 1 || rank < 0 || rank >= worldSize || size % worldSize != 0)
    throw std::invalid_argument("shardOf: a batch of " + std::to_string(size) +
                                " cannot be split evenly over " + std::to_string(worldSize) +
                                " ranks (rank " + std::to_string(rank) + ")");
  const int64_t share = size / worldSize;
  return {global.begin() + rank * share, global.begin() + (rank + 1) * share};
}

} // namespace spectra::models
