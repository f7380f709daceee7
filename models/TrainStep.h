//===- TrainStep.h - the optimiser step, decided on the device -----------===//
//
// The training step's update with no host synchronisation: the gradient clip,
// the skip of a non-finite step, fp16's loss scale and AdamW's update (through
// LibTorch's fused AdamW kernel, which skips itself when told to) all run as
// device work, and the bookkeeping the trainer needs (the window's loss and
// accuracy, skipped steps, the run of non-finite steps, the divergence step)
// accumulates in device scalars. The host reads them all at once, at the
// points where it decides something (a metrics window's end, an evaluation):
// one synchronisation per window instead of several per step.
//
// The optimiser state lives in the torch::optim::AdamW it is given (its
// exp_avg and exp_avg_sq tensors are updated in place), so checkpoints keep
// their format; the per-parameter step counts are device tensors written
// back into that state by syncOptimizerState() before a checkpoint is saved.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_TRAINSTEP_H
#define SPECTRA_MODELS_TRAINSTEP_H

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace spectra::models {

/// The counters that outlive a window (kept in the checkpoints).
struct StepCounters {
  int64_t skipped = 0;       ///< updates skipped for a non-finite loss, inputs or gradients
  int64_t nonFiniteRun = 0;  ///< non-finite steps in a row, up to the last step
  int64_t divergedAt = 0;    ///< the step at which the run reached the divergence limit (0: never)
  double lossScale = 65536.0;  ///< fp16's dynamic loss scale
  int64_t goodSteps = 0;     ///< fp16: steps since the loss scale last changed
};

/// What the host reads at a decision point: the window's sums since the last read and the
/// counters.
struct StepWindow {
  double lossSum = 0;         ///< sum over the counted steps of loss * examples
  int64_t correct = 0;        ///< correct predictions in the counted steps
  int64_t examples = 0;       ///< examples in the counted steps (finite steps before a divergence)
  int64_t nonFinite = 0;      ///< non-finite steps in the window (each one skipped)
  int64_t firstNonFinite = 0; ///< the first of them (a 1-based step number; 0: none)
  StepCounters counters;
};

class DeviceStep {
public:
  /// `divergeAfter`: that many non-finite steps in a row stop the updates (the trainer then
  /// declares the run diverged); every later step is skipped and not counted. `lossScaling`:
  /// fp16's dynamic loss scale (halved on a gradient overflow, doubled after 2000 clean steps).
  /// Every parameter gets its AdamW state now (zeros, or the loaded checkpoint's).
  DeviceStep(torch::optim::AdamW &optimizer, const torch::Device &device, bool lossScaling,
             int64_t divergeAfter, const StepCounters &from);

  /// The loss to run backward: multiplied by the loss scale when scaling.
  torch::Tensor lossToBackward(const torch::Tensor &loss) const;

  /// After backward: unscales (fp16), clips the gradients' total 2-norm to `clip`, and applies
  /// AdamW at learning rate `lr` unless the step is non-finite (`loss` not finite, `inputsBad`
  /// true, the gradients' norm not finite) or fp16's gradients overflowed. `step` is the 0-based
  /// step; `correct` the batch's correct predictions (an integer scalar), `examples` its size.
  /// `inputsBad` may be undefined. Launches device work only.
  void update(int64_t step, double lr, double clip, const torch::Tensor &loss,
              const torch::Tensor &correct, int64_t examples, const torch::Tensor &inputsBad);

  /// The one synchronisation: the window's sums (which restart) and the counters.
  StepWindow read();

  /// Whether the run has diverged (a synchronisation: the trainer asks before a feature redraw,
  /// which must not change a diverged run's checkpoint).
  bool halted() const;

  /// Writes the per-parameter step counts into the AdamW state (a synchronisation), so a
  /// checkpoint saved now resumes with them.
  void syncOptimizerState();

private:
  torch::optim::AdamW &optimizer;
  std::vector<torch::Tensor> params, expAvg, expAvgSq, stepCounts;
  bool lossScaling;
  int64_t divergeAfter;
  // Device scalars. f64 for the sums (as the host's double was), i64 for the counts.
  torch::Tensor lossSum, correct, examples, nonFinite, firstNonFinite;
  torch::Tensor skipped, nonFiniteRun, divergedAt, haltedFlag, scale, goodSteps;
};

} // namespace spectra::models

#endif // SPECTRA_MODELS_TRAINSTEP_H
