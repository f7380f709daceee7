//===- Trainer.h - LRA training: the paper's loop, checkpoints, resume ----===//
//
// One training run of the LRA Transformer on ListOps, byte-level Text or
// byte-level Retrieval with the Spectraformer paper's setup (REFERENCE-NOTES,
// Table 5): AdamW (0.9, 0.999, eps 1e-6, weight decay 0), linear warmup then
// linear decay, gradient clipping 1.0, evaluation every K steps over a fixed
// number of validation batches, early stopping on validation accuracy, the
// best checkpoint tested.
//
// Reproducibility is by construction: the batch order and every dropout draw
// are functions of (seed, step), so a run resumed from a checkpoint (written at
// every evaluation, model + optimizer + counters) continues with the metrics
// the uninterrupted run would have had (bit for bit on the CPU, where every
// kernel is deterministic).
//
// Outputs in the run directory: metrics.jsonl (one record per logged window
// and per evaluation), checkpoint.pt (latest), best.pt (best validation),
// report.json (the final report).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_TRAINER_H
#define SPECTRA_MODELS_TRAINER_H

#include "models/Datasets.h"
#include "models/LraModel.h"

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace spectra::models {

struct TrainOptions {
  std::string task = "listops";  ///< listops | text | retrieval | lm
  std::string attention = "spectra:posrf-mm";
  std::string data;               ///< the task's data directory (LRA layout)
  std::string out;                ///< the run directory
  // The paper's per-task values come from defaultsFor(task); every one can be overridden.
  int64_t batch = 32, warmup = 1000, steps = 50000, evalEvery = 500, evalBatches = 62;
  int64_t maxLength = 2000;       ///< tokens kept per document (longer ones are truncated)
  int64_t patience = 10;          ///< evaluations without a better validation accuracy
  int64_t logEvery = 100;         ///< training-metric window (a divisor of evalEvery is used)
  int64_t limitTrain = 0;         ///< use only the first N training examples (0 = all)
  double timeLimit = 0;           ///< seconds of training, then evaluate, stop and test (0 = none)
  /// Fresh random features every N steps (0 = never): before step s with s % N == 0, every
  /// spectral attention with a fixed recipe redraws W from a seed that is a function of
  /// (model seed, layer, s / N) (LraModel::redrawFeatures). The weights are in the checkpoints,
  /// so a resumed run is the uninterrupted one. Learnable recipes are trained, not redrawn.
  int64_t redrawEvery = 0;
  double lr = 1e-4, clip = 1.0, weightDecay = 0.0;
  int64_t seed = 42;
  std::string device = "auto";     ///< auto | cpu | gpu-emulated | cuda[:N]
  std::string precision = "auto";  ///< auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
  bool resume = false;
  bool progress = true;           ///< the progress bar (stderr)
  LraConfig model;                ///< vocab, classes, maxLength and dualEncoder are set from the task
  /// Data parallelism (under torchrun, srun or mpirun): how long a rank waits for the others
  /// (the rendezvous, and every collective) before the run ends with an error naming them.
  int64_t distTimeout = 300;
  /// Data parallelism: when the gradients are averaged: during the backward (overlap: c10d's
  /// reducer), after it (after), or auto (overlap on CUDA, after on the CPU).
  std::string gradSync = "auto";
  /// Test hook: the process of rank killRank kills itself (SIGKILL) right after this step
  /// (0 = never).
  int64_t killAfterStep = 0, killRank = 0;
};

/// The paper's settings for a task (batch, lr, warmup, eval interval and batches, length).
/// Throws std::invalid_argument for an unknown task, naming the valid ones.
TrainOptions defaultsFor(const std::string &task);

struct TaskData {
  std::vector<data::Example> train, val, test;
  int64_t vocab = 0, classes = 0;
  bool dualEncoder = false;
  /// lm: each example is a window of maxLength + 1 bytes; the labels are its next bytes.
  bool languageModel = false;
  std::string valSource;  ///< what the validation split is (Text validates on IMDb's test split)
};

/// Loads a task's splits from `dir` in the official layouts:
///   listops: basic_{train,val,test}.tsv; text: aclImdb's {train,test}/{pos,neg}/*.txt;
///   retrieval: new_aan_pairs.{train,eval,test}.tsv;
///   lm: any text, a file or a directory of files (data::readTextCorpus), cut into windows of
///   maxLength + 1 bytes, the first 90% of them for training, then 5% validation, 5% test.
TaskData loadTask(const std::string &task, const std::string &dir, int64_t maxLength);

/// Non-finite steps (loss or gradients) in a row after which a run is declared diverged; each
/// such update is skipped.
inline constexpr int64_t kDivergedAfterNonFiniteSteps = 20;

struct TrainReport {
  /// Accuracy: of the class, or (lm) of the next byte, per byte.
  double testAccuracy = 0, bestValAccuracy = 0, majorityBaseline = 0;
  /// lm: the test split's cross-entropy in bits per byte (0 for the classification tasks).
  double testBitsPerByte = 0;
  int64_t bestStep = 0, steps = 0;
  double trainSeconds = 0;
  int64_t peakBytes = 0;
  std::string peakKind;  ///< "cuda allocator peak" or "process peak RSS"
  std::string device, precision;
  double stepsPerSecond = 0;
  bool earlyStopped = false;
  bool timeLimited = false;
  int64_t divergedAt = 0;     ///< the step a run was declared diverged (0 = it did not)
  int64_t skippedSteps = 0;   ///< updates skipped for a non-finite loss or gradients
  int64_t worldSize = 1;      ///< data-parallel ranks
  int64_t rank = 0;           ///< this process's rank (not in report.json: rank 0 writes it)
  std::string backend = "none";  ///< their c10d backend: none, gloo or nccl
  double collectiveSeconds = 0;  ///< rank 0's time in collectives outside the backward
  std::string gradSync = "none"; ///< overlap | after (none: one process)
};

/// Trains (or resumes) one run; progress goes to `log` (the bar and messages). Under a
/// launcher's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT the run is one of WORLD_SIZE data-parallel
/// ranks (models/Distributed.h): each computes its share of every global batch of options.batch,
/// the gradients are averaged, and rank 0 writes the files.
TrainReport train(const TrainOptions &options, std::ostream &log);

/// Text from a language model's checkpoint (task lm): the prompt's bytes, then `tokens` more
/// sampled at `temperature` (0: the most likely byte), one recurrent step per token
/// (LraModel::generate).
struct GenerateOptions {
  std::string checkpoint;  ///< a run's best.pt or checkpoint.pt
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 0;
};
struct GenerateResult {
  std::string text;  ///< the prompt and the generated bytes
  int64_t promptTokens = 0, generated = 0;
  double seconds = 0;  ///< generation, the prompt's steps included
  std::string attention;
};
GenerateResult generateText(const GenerateOptions &options);

} // namespace spectra::models

#endif // SPECTRA_MODELS_TRAINER_H
