//===- Evaluation.cpp - the trainer's evaluation of a split ---------------===//

#include "models/Evaluation.h"
#include "models/Batches.h"
#include "models/Devices.h"
#include "models/Distributed.h"
#include "runtime/Reference.h"

#include <algorithm>
#include <cmath>

namespace spectra::models {

void EmptyMaskFlag::add(const DeferredInputChecks &checks) {
  if (checks.emptyMask().defined())
    seen = seen.defined() ? seen.logical_or(checks.emptyMask()) : checks.emptyMask();
}

void EmptyMaskFlag::check() const {
  if (seen.defined())
    TORCH_CHECK(!seen.item<bool>(), "spectra attention: ", kEmptyKeyMask);
}

Evaluation evaluate(LraModel &model, const std::vector<data::Example> &split, int64_t batch,
                    int64_t maxBatches, bool dual, const torch::Device &device,
                    torch::ScalarType dtype, bool languageModel, Distributed &group) {
  torch::NoGradGuard noGrad;
  model->eval();
  // Sums on the device, read once at the end (no synchronisation per batch): the loss, the
  // correct predictions, the labels, and whether a mask row kept nothing.
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  torch::Tensor lossSum = torch::zeros({}, f64), correct = torch::zeros({}, f64);
  torch::Tensor emptyRows = torch::zeros({}, f64);
  int64_t total = static_cast<int64_t>(split.size());
  if (maxBatches > 0)
    total = std::min(total, maxBatches * batch);
  int64_t labels = 0;
  for (int64_t start = group.rank() * batch; start < total; start += group.size() * batch) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(total, start + batch); ++i)
      idx.push_back(i);
    Batch b = collate(split, idx, dual, device, languageModel);
    labels += b.labels.size(0);
    torch::Tensor logits;
    DeferredInputChecks checks;
    {
      AutocastScope amp(device, dtype);
      logits = model->forward(b.tokens, b.tokens2);
    }
    logits = logits.to(torch::kFloat32);
    torch::Tensor batchLoss = torch::nn::functional::cross_entropy(
        logits, b.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    torch::Tensor batchCorrect = logits.argmax(-1).eq(b.labels).sum();
    if (checks.nonFinite().defined()) {
      // A model whose activations overflow (the attention saw inf or NaN) gets this batch
      // wrong, with an infinite loss.
      batchLoss = torch::where(checks.nonFinite(), INFINITY, batchLoss.to(torch::kFloat64));
      batchCorrect = torch::where(checks.nonFinite(), 0, batchCorrect);
    }
    lossSum.add_(batchLoss.to(torch::kFloat64));
    correct.add_(batchCorrect.to(torch::kFloat64));
    if (checks.emptyMask().defined())
      emptyRows.add_(checks.emptyMask().to(torch::kFloat64).sum());
  }
  model->train();
  torch::Tensor sums = torch::stack({lossSum, correct, emptyRows,
                                     torch::full({}, static_cast<double>(labels), f64)});
  group.sumInPlace({sums}, "the evaluation");
  sums = sums.cpu();
  auto s = sums.accessor<double, 1>();
  TORCH_CHECK(s[2] == 0, "spectra attention: ", kEmptyKeyMask);
  Evaluation e;
  e.examples = total;
  const double n = s[3];
  e.loss = n > 0 ? s[0] / n : 0;  // may be inf or NaN: written as null
  e.accuracy = n > 0 ? s[1] / n : 0;
  return e;
}

} // namespace spectra::models
