//===- Checkpoint.h - the trainer's checkpoints, metrics file and resume --===//
//
// A checkpoint (format "spectra-train checkpoint 2") holds the model, the
// optimizer, the run's counters and its trajectory: the options that decide
// what the run computes, which a resumed run must match. It is written to a
// temporary file and renamed, so a kill mid-write leaves the previous one. The
// best model is written as best.pt.pending and moved into place after the
// checkpoint that names it (promotePendingBest), so best.pt always matches the
// checkpoint's counters. A resumed run truncates metrics.jsonl to the
// checkpoint's step and appends what the uninterrupted run would have written.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_CHECKPOINT_H
#define SPECTRA_MODELS_CHECKPOINT_H

#include "models/LraModel.h"
#include "models/Trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace spectra::models {

bool fileExists(const std::string &path);

/// The run's counters, kept in every checkpoint.
struct Counters {
  int64_t step = 0;  ///< steps done
  double bestVal = -1;
  int64_t bestStep = 0, badEvals = 0;
  double trainSeconds = 0;
  double lossScale = 65536.0;
  int64_t goodSteps = 0;  ///< fp16: steps since the loss scale last changed
  int64_t skipped = 0;    ///< updates skipped for a non-finite loss or gradients
  int64_t nonFiniteRun = 0, divergedAt = 0;
  int64_t peakBytes = 0;  ///< the highest peak of the sessions so far (a resumed run keeps it)
  bool finished = false;  ///< training is over (the test may still be to do)
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Counters, step, bestVal, bestStep, badEvals,
                                                trainSeconds, lossScale, goodSteps, skipped,
                                                nonFiniteRun, divergedAt, peakBytes, finished)

inline constexpr const char *kCheckpointFormat = "spectra-train checkpoint 2";

/// The options that decide a run's trajectory: a resumed run must match them. The number of
/// ranks is not among them: K ranks with global batch B compute what one process does.
nlohmann::json trajectoryOf(const TrainOptions &o, const std::string &precision,
                            const std::string &deviceType);

/// Written to a temporary file and renamed. `optimizer` may be null (best.pt keeps none).
void saveCheckpoint(const std::string &path, LraModel &model, torch::optim::Optimizer *optimizer,
                    const Counters &c, const nlohmann::json &trajectory);

/// Loads `path` into `model` (and `optimizer`) and returns its counters. Throws
/// std::invalid_argument when its trajectory differs from `trajectory` (naming the option) and
/// std::runtime_error when it is unreadable.
Counters loadCheckpoint(const std::string &path, LraModel &model, torch::optim::Optimizer *optimizer,
                        const nlohmann::json &trajectory, const torch::Device &device);

/// A string entry of a checkpoint archive (format, trajectory, counters).
std::string readString(torch::serialize::InputArchive &archive, const std::string &key);

/// Keeps the metrics up to and including `step` (the checkpoint's), so a resumed run appends
/// exactly what the uninterrupted run wrote after it.
void truncateMetrics(const std::string &path, int64_t step);

/// best.pt.pending becomes best.pt when it is the best model the checkpoint knows of
/// (bestStep); otherwise it belongs to a trajectory the resumed run replays, and is dropped.
void promotePendingBest(const std::string &bestPath, int64_t bestStep);

} // namespace spectra::models

#endif // SPECTRA_MODELS_CHECKPOINT_H
