//===- Trainer.cpp - LRA training: the paper's loop, checkpoints, resume --===//
//
// The loop of one run. Its parts live beside it: Batches (collation, order,
// the ranks' shares), Evaluation, Checkpoint (save, load, resume, metrics
// truncation), Progress (the bar and metrics.jsonl), Devices (device,
// precision, memory), TrainStep (the update decided on the device) and
// Distributed (the ranks, through c10d).
//
//===----------------------------------------------------------------------===//

#include "models/Trainer.h"
#include "models/Batches.h"
#include "models/Checkpoint.h"
#include "models/Devices.h"
#include "models/Distributed.h"
#include "models/Evaluation.h"
#include "models/Progress.h"
#include "models/TrainStep.h"
#include "runtime/Paths.h"
#include "runtime/Reference.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

namespace spectra::models {
using json = nlohmann::json;

// report.json's fields, both ways (the keys are the file's, snake_case).
void to_json(json &j, const TrainReport &r) {
  j = {{"test_accuracy", r.testAccuracy},   {"best_val_accuracy", r.bestValAccuracy},
       {"best_step", r.bestStep},           {"steps", r.steps},
       {"early_stopped", r.earlyStopped},   {"time_limited", r.timeLimited},
       {"diverged_at", r.divergedAt},       {"skipped_steps", r.skippedSteps},
       {"train_seconds", r.trainSeconds},   {"steps_per_second", r.stepsPerSecond},
       {"peak_bytes", r.peakBytes},         {"peak_kind", r.peakKind},
       {"majority_baseline", r.majorityBaseline}, {"device", r.device},
       {"precision", r.precision},         {"world_size", r.worldSize},
       {"backend", r.backend},             {"collective_seconds", r.collectiveSeconds},
       {"grad_sync", r.gradSync}};
  if (r.testBitsPerByte > 0)
    j["test_bits_per_byte"] = r.testBitsPerByte;
}

void from_json(const json &j, TrainReport &r) {
  r.testAccuracy = j.at("test_accuracy");
  r.bestValAccuracy = j.at("best_val_accuracy");
  r.bestStep = j.at("best_step");
  r.steps = j.at("steps");
  r.earlyStopped = j.at("early_stopped");
  r.timeLimited = j.value("time_limited", false);
  r.divergedAt = j.value("diverged_at", int64_t(0));
  r.skippedSteps = j.value("skipped_steps", int64_t(0));
  r.trainSeconds = j.at("train_seconds");
  r.stepsPerSecond = j.at("steps_per_second");
  r.peakBytes = j.at("peak_bytes");
  r.peakKind = j.at("peak_kind");
  r.majorityBaseline = j.at("majority_baseline");
  r.device = j.at("device");
  r.precision = j.at("precision");
  r.testBitsPerByte = j.value("test_bits_per_byte", 0.0);
  r.worldSize = j.value("world_size", int64_t(1));
  r.backend = j.value("backend", std::string("none"));
  r.collectiveSeconds = j.value("collective_seconds", 0.0);
  r.gradSync = j.value("grad_sync", std::string("none"));
}


namespace {

using Clock = std::chrono::steady_clock;

/// Linear warmup to the peak rate over `warmup` steps, then linear decay that would reach zero
/// one step after the last (the last step trains at lr / (steps - warmup)).
double learningRate(const TrainOptions &o, int64_t step) {
  double s = static_cast<double>(step + 1);
  if (o.warmup > 0 && s <= o.warmup)
    return o.lr * s / o.warmup;
  double rest = static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.lr * std::max(0.0, (o.steps - s) / rest + 1.0 / rest);
}

/// lm: the share of the most frequent next byte in the windows (a unigram's accuracy).
double majorityNextByteShare(const std::vector<data::Example> &examples) {
  std::map<int32_t, int64_t> counts;
  int64_t total = 0;
  for (auto &e : examples)
    for (size_t i = 1; i < e.tokens.size(); ++i, ++total)
      ++counts[e.tokens[i]];
  int64_t most = 0;
  for (auto &[token, n] : counts)
    most = std::max(most, n);
  return total ? static_cast<double>(most) / total : 0;
}

double majorityShare(const std::vector<data::Example> &examples) {
  std::map<int, int64_t> counts;
  for (auto &e : examples)
    ++counts[e.label];
  int64_t most = 0;
  for (auto &[label, n] : counts)
    most = std::max(most, n);
  return examples.empty() ? 0 : static_cast<double>(most) / examples.size();
}

/// The option checks a run makes before it touches anything.
void validate(TrainOptions &o) {
  if (o.out.empty())
    throw std::invalid_argument("a run needs an output directory (--out DIR)");
  if (o.batch < 1 || o.steps < 1 || o.evalEvery < 1 || o.logEvery < 1 || o.warmup < 0 || o.lr <= 0 ||
      o.maxLength < 1 || o.patience < 1 || o.redrawEvery < 0)
    throw std::invalid_argument("--batch, --steps, --eval-every, --log-every, --max-length and "
                                "--patience must be positive, --warmup and --redraw-every "
                                "non-negative, --lr > 0");
  if (o.gradSync != "auto" && o.gradSync != "overlap" && o.gradSync != "after")
    throw std::invalid_argument("unknown --grad-sync '" + o.gradSync + "'; use auto, overlap or after");
  if (o.distTimeout < 1)
    throw std::invalid_argument("--dist-timeout must be at least 1 second, got " +
                                std::to_string(o.distTimeout));
  // Metric windows restart at every evaluation (the checkpoints), so a resumed run's windows
  // are the uninterrupted run's.
  o.logEvery = std::gcd(o.logEvery, o.evalEvery);
}

/// A fixed random subset of the validation split (the same for every run and variant): the
/// head of a split sorted by class (IMDb's files) would validate on one class.
void keepValidationSubset(TaskData &data, int64_t evalBatches, int64_t batch) {
  if (evalBatches <= 0 || evalBatches * batch >= static_cast<int64_t>(data.val.size()))
    return;
  std::vector<int64_t> keep(data.val.size());
  std::iota(keep.begin(), keep.end(), 0);
  std::mt19937_64 rng(0x5eed);
  for (int64_t i = static_cast<int64_t>(keep.size()) - 1; i > 0; --i)
    std::swap(keep[i], keep[rng() % static_cast<uint64_t>(i + 1)]);
  keep.resize(evalBatches * batch);
  std::vector<data::Example> subset;
  for (int64_t i : keep)
    subset.push_back(std::move(data.val[i]));
  data.val = std::move(subset);
  data.valSource += ", a fixed random " + std::to_string(data.val.size()) + " of them";
}

/// One run: set up (device, group, data, model, resume), the steps with their metrics windows
/// and evaluations, then the test of the best checkpoint and the report. Rank 0 writes every
/// file; the other ranks compute the same steps on their share of each batch.
class TrainingRun {
public:
  TrainingRun(const TrainOptions &options, std::ostream &log);
  TrainReport run();

private:
  void setUpDevice();
  void checkDirectory();
  void loadData();
  void buildModel();
  std::optional<TrainReport> resume();
  void trainSteps();
  void step(int64_t s);
  bool endWindow(int64_t s);
  void evaluateAndSave();
  TrainReport finish();
  json windowRecord(int64_t s);
  void save(const std::string &path, bool withOptimizer);
  double sessionSeconds() const {
    return std::chrono::duration<double>(Clock::now() - sessionStart).count();
  }

  TrainOptions o;
  std::ostream &log;
  bool emulated = false;
  DistributedEnvironment env;
  std::unique_ptr<Distributed> group;
  torch::Device device{torch::kCPU};
  torch::ScalarType dtype = torch::kFloat32;
  std::unique_ptr<Progress> progress;
  std::string checkpointPath, bestPath, metricsPath;
  TaskData data;
  LraModel model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  json trajectory;
  Counters c;
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<BatchOrder> order;
  std::unique_ptr<DeviceStep> stepper;
  StepWindow window;        // the last window read (the progress bar shows it)
  EmptyMaskFlag emptyMask;  // an error, reported at the window's end
  Clock::time_point sessionStart;
  int64_t sessionStartStep = 0;
  double secondsBefore = 0;
  bool timeLimited = false, stopped = false, outOfTime = false;
  bool timeUpOnMain = false;  // data parallel: rank 0 has trained --time-limit seconds
  std::string gradSync;       // data parallel: overlap | after
};

TrainingRun::TrainingRun(const TrainOptions &options, std::ostream &log) : o(options), log(log) {
  validate(o);
  env = readDistributedEnvironment();
  if (env.worldSize > 1 && o.batch % env.worldSize != 0)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " does not split evenly over " +
                                "WORLD_SIZE=" + std::to_string(env.worldSize) +
                                " ranks: the global batch must be a multiple of the ranks");
  checkpointPath = o.out + "/checkpoint.pt", bestPath = o.out + "/best.pt";
  metricsPath = o.out + "/metrics.jsonl";
}

/// The device (CUDA: one GPU per LOCAL_RANK), the precision, then the group on that device.
void TrainingRun::setUpDevice() {
  // gpu-emulated: the CPU, with spectra attention through the GPU kernels run on it.
  emulated = o.device == "gpu-emulated";
  std::string name = emulated ? "cpu" : o.device;
  if (env.worldSize > 1 && (name == "cuda" || (name == "auto" && torch::cuda::is_available())))
    name = "cuda:" + std::to_string(env.localRank);
  device = pickDevice(name);
  dtype = pickPrecision(o.precision, device);
  bool main = env.rank == 0;
  std::string label = o.task + " " + o.attention;
  progress = std::make_unique<Progress>(log, o.progress, label, o.steps, /*silent=*/!main);
  if (env.worldSize > 1)
    progress->say("joining " + std::to_string(env.worldSize) + " ranks at " + env.masterAddr + ":" +
                  std::to_string(env.masterPort) + " (timeout " + std::to_string(o.distTimeout) + " s)");
  group = Distributed::join(env, device, std::chrono::seconds(o.distTimeout));
}

void TrainingRun::checkDirectory() {
  std::string mkdirError;
  if (!makeDirectories(o.out, &mkdirError))
    throw std::runtime_error(mkdirError);
  if (!o.resume && (fileExists(checkpointPath) || fileExists(metricsPath)))
    throw std::invalid_argument("'" + o.out + "' already holds a run; pass --resume to continue it, "
                                "or choose another --out");
  // Every rank has looked before rank 0 writes anything.
  group->barrier("the start of the run");
}

void TrainingRun::loadData() {
  progress->say("loading " + o.task + " from " + o.data);
  data = loadTask(o.task, o.data, o.maxLength);
  if (o.limitTrain > 0 && o.limitTrain < static_cast<int64_t>(data.train.size()))
    data.train.resize(o.limitTrain);
  keepValidationSubset(data, o.evalBatches, o.batch);
  progress->say(std::to_string(data.train.size()) + " training, " + std::to_string(data.val.size()) +
                " validation (" + data.valSource + "), " + std::to_string(data.test.size()) +
                " test examples; device " +
                (emulated ? "gpu-emulated (the GPU kernels on the CPU)" : device.str()) + ", " +
                precisionName(dtype) +
                (group->active() ? "; " + std::to_string(group->size()) + " ranks (" +
                                       group->backend() + "), " + std::to_string(o.batch / group->size()) +
                                       " examples of each batch per rank"
                                 : ""));
}

void TrainingRun::buildModel() {
  o.model.vocab = data.vocab;
  o.model.classes = data.classes;
  o.model.dualEncoder = data.dualEncoder;
  o.model.languageModel = data.languageModel;
  o.model.maxLength = o.maxLength;
  o.model.attention = o.attention;
  o.model.seed = o.seed;
  o.model.gpuEmulated = emulated;
  torch::manual_seed(o.seed);
  model = LraModel(o.model);
  model->to(device);
  optimizer = std::make_unique<torch::optim::AdamW>(
      model->parameters(),
      torch::optim::AdamWOptions(o.lr).betas({0.9, 0.999}).eps(1e-6).weight_decay(o.weightDecay));
  trajectory = trajectoryOf(o, precisionName(dtype),
                            emulated ? "gpu-emulated" : device.is_cuda() ? "cuda" : "cpu");
  // The ranks must run one trajectory: compared through the text's hash, in two exact halves.
  uint64_t h = std::hash<std::string>{}(trajectory.dump());
  group->checkIdentical({torch::tensor({static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)},
                                       torch::TensorOptions().dtype(torch::kFloat64).device(device))},
                        "options (every rank must get the same spectra-train arguments)");
}

/// Loads the checkpoint when resuming; a run that had finished returns its report.
std::optional<TrainReport> TrainingRun::resume() {
  if (o.resume && fileExists(checkpointPath)) {
    c = loadCheckpoint(checkpointPath, model, optimizer.get(), trajectory, device);
    if (group->main())
      promotePendingBest(bestPath, c.bestStep);
    // A finished run with its report is not tested again (the report is the test's result).
    bool stillStopped = c.step >= o.steps || c.badEvals >= o.patience || c.divergedAt > 0 ||
                        (o.timeLimit > 0 && c.trainSeconds >= o.timeLimit);
    if (c.finished && stillStopped) {
      std::ifstream in(o.out + "/report.json");
      json done = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!done.is_discarded() && done.value("options", json()) == trajectory &&
          done.value("steps", int64_t(-1)) == c.step) {
        progress->say("finished earlier (step " + std::to_string(c.step) + "); report kept: " + o.out +
                      "/report.json");
        TrainReport kept = done.get<TrainReport>();
        kept.rank = group->rank();
        return kept;
      }
    }
    if (group->main())
      truncateMetrics(metricsPath, c.step);
    progress->say("resumed from " + checkpointPath + " at step " + std::to_string(c.step));
  } else if (o.resume) {
    progress->say("no checkpoint in " + o.out + " yet; starting from step 0");
    if (group->main())
      std::ofstream(metricsPath, std::ios::trunc);
  }
  return std::nullopt;
}

void TrainingRun::save(const std::string &path, bool withOptimizer) {
  if (withOptimizer)
    stepper->syncOptimizerState();
  if (group->main())
    saveCheckpoint(path, model, withOptimizer ? optimizer.get() : nullptr, c, trajectory);
}

/// The training metrics of the window ending at c.step (the rate is that of its last update).
json TrainingRun::windowRecord(int64_t s) {
  json record = {{"split", "train"},
                 {"step", c.step},
                 {"loss", window.examples ? json(window.lossSum / window.examples) : json()},
                 {"accuracy", window.examples ? json(static_cast<double>(window.correct) / window.examples) : json()},
                 {"lr", learningRate(o, s)},
                 {"time_s", c.trainSeconds}};
  if (c.skipped > 0)
    record["skipped"] = c.skipped;
  // The signed estimators' denominator guard (SGQ, TrigRF): the share of attention queries
  // it replaced in this window's training steps.
  if (auto [share, queries] = model->takeGuardStats(); queries > 0)
    record["guarded"] = share;
  return record;
}

TrainReport TrainingRun::run() {
  setUpDevice();
  checkDirectory();
  loadData();
  buildModel();
  if (auto done = resume())
    return *done;
  // The ranks start from one model (and, resumed, one checkpoint).
  group->checkIdentical(model->parameters(), "initial parameters");
  // --grad-sync: the gradients averaged during the backward (c10d's reducer, as DDP does; the
  // default on CUDA) or after it (the default on the CPU, where the all-reduces' thread takes
  // a core from the backward: measured 3-5% slower with the reducer on 2 cores).
  gradSync = o.gradSync == "auto" ? (device.is_cuda() ? "overlap" : "after") : o.gradSync;
  if (gradSync == "overlap")
    group->attachReducer(model->parameters());
  if (group->main())
    metrics = std::make_unique<MetricsLog>(metricsPath);
  if (o.redrawEvery > 0) {
    // Which attentions a redraw reaches (the count of a redraw is the same every time).
    int64_t layers = model->redrawableLayers();
    progress->say(layers ? "random features redrawn every " + std::to_string(o.redrawEvery) +
                               " steps in " + std::to_string(layers) + " attention layer(s)"
                         : "--redraw-every: " + o.attention +
                               " has no fixed random features to redraw (softmax, or learnable "
                               "weights, which are trained); ignored");
  }
  trainSteps();
  return finish();
}

void TrainingRun::trainSteps() {
  if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  order = std::make_unique<BatchOrder>(static_cast<int64_t>(data.train.size()), o.batch, o.seed);
  // The step runs on the device without waiting for it: its skip decisions and the window's
  // sums are device scalars, read once per metrics window.
  stepper = std::make_unique<DeviceStep>(*optimizer, device, dtype == torch::kHalf,
                                         kDivergedAfterNonFiniteSteps,
                                         StepCounters{c.skipped, c.nonFiniteRun, c.divergedAt,
                                                      c.lossScale, c.goodSteps});
  sessionStart = Clock::now();
  sessionStartStep = c.step;
  secondsBefore = c.trainSeconds;
  // A resumed run that had stopped (patience, divergence, time limit) stays stopped; a larger
  // --time-limit or --steps lets it go on.
  timeLimited = o.timeLimit > 0 && c.trainSeconds >= o.timeLimit && c.step < o.steps;
  stopped = timeLimited || c.badEvals >= o.patience || c.divergedAt > 0;
  for (int64_t s = c.step; s < o.steps && !stopped; ++s) {
    step(s);
    c.step = s + 1;
    c.trainSeconds = secondsBefore + sessionSeconds();
    double rate = (c.step - sessionStartStep) / std::max(1e-9, sessionSeconds());
    // Several ranks stop together: on rank 0's clock, whose verdict the step's averaging carried.
    outOfTime = (group->active() ? timeUpOnMain : o.timeLimit > 0 && c.trainSeconds >= o.timeLimit) &&
                c.step < o.steps;
    bool windowEnd = c.step % o.logEvery == 0 || c.step == o.steps || outOfTime;
    if (windowEnd && endWindow(s))
      break;  // diverged
    progress->update(c.step, window.examples ? window.lossSum / window.examples : NAN,
                     window.examples ? static_cast<double>(window.correct) / window.examples : NAN,
                     rate, c.bestVal, c.bestStep, windowEnd);
    if (outOfTime)
      timeLimited = stopped = true;
    if (c.step % o.evalEvery == 0 || c.step == o.steps || outOfTime)
      evaluateAndSave();
    if (o.killAfterStep == c.step && o.killRank == group->rank()) {
      log << std::flush;
      std::raise(SIGKILL);
    }
  }
}

/// One step on this rank's share of the batch; with several ranks the gradients (during the
/// backward), the loss, the correct count and the non-finite flag are averaged over them before
/// the update, so every rank applies the same update (the one a single process with the whole
/// batch would).
void TrainingRun::step(int64_t s) {
  // Performer's feature redraw: a function of the step, so a resumed run (whose checkpoint
  // holds the weights of the last redraw) replays it. A run that diverged in this window (the
  // device knows; the host reads it at the window's end) keeps the features it diverged with.
  if (o.redrawEvery > 0 && s > 0 && s % o.redrawEvery == 0 && !stepper->halted())
    model->redrawFeatures(s / o.redrawEvery);
  // Dropout draws depend on (seed, step, rank) alone: resumed runs replay them exactly.
  torch::manual_seed(static_cast<uint64_t>(o.seed) * 1000003ULL + static_cast<uint64_t>(s) +
                     (static_cast<uint64_t>(group->rank()) << 40));
  std::vector<int64_t> indices = shardOf(order->indices(s), group->rank(), group->size());
  Batch b = collate(data.train, indices, data.dualEncoder, device, data.languageModel);
  torch::Tensor logits, loss, inputsBad;
  {
    // Non-finite attention inputs (an earlier layer overflowed) make the step non-finite,
    // like a NaN loss: the update is skipped.
    DeferredInputChecks checks;
    {
      AutocastScope amp(device, dtype);
      logits = model->forward(b.tokens, b.tokens2);
    }
    loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), b.labels);
    inputsBad = checks.nonFinite();
    emptyMask.add(checks);
  }
  optimizer->zero_grad();
  // --grad-sync overlap: c10d's reducer averages the gradients during this backward.
  group->backward(stepper->lossToBackward(loss), "the backward of step " + std::to_string(s + 1));
  torch::Tensor correct = logits.detach().argmax(-1).eq(b.labels).sum();
  int64_t examples = b.labels.size(0);
  if (group->active()) {
    // --grad-sync after: the gradients are averaged now, in the buckets of the step's numbers.
    std::vector<torch::Tensor> averaged;
    if (!group->averagesDuringBackward())
      for (torch::Tensor &p : model->parameters()) {
        if (!p.mutable_grad().defined())
          p.mutable_grad() = torch::zeros_like(p);
        averaged.push_back(p.mutable_grad());
      }
    // The step's numbers, averaged like the gradients: the loss, the correct count, whether
    // any rank saw a non-finite input, and --time-limit on rank 0's clock.
    bool timeUp = group->main() && o.timeLimit > 0 && secondsBefore + sessionSeconds() >= o.timeLimit;
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    torch::Tensor stats = torch::stack(
        {loss.detach().to(torch::kFloat32), correct.to(torch::kFloat32),
         inputsBad.defined() ? inputsBad.to(torch::kFloat32) : torch::zeros({}, f32),
         torch::full({}, timeUp ? 1.0f : 0.0f, f32)});
    averaged.push_back(stats);
    group->averageInPlace(averaged, "the gradients of step " + std::to_string(s + 1));
    const double ranks = static_cast<double>(group->size());
    loss = stats[0];
    correct = stats[1].mul(ranks).round().to(torch::kInt64);
    inputsBad = stats[2].gt(0);
    examples *= group->size();
    if (o.timeLimit > 0)  // a read of the device (only with a time limit)
      timeUpOnMain = stats[3].item<float>() > 0;
  }
  stepper->update(s, learningRate(o, s), o.clip, loss, correct, examples, inputsBad);
}

/// The metrics window's end: its one synchronisation. Returns true when the run diverged.
bool TrainingRun::endWindow(int64_t s) {
  window = stepper->read();
  emptyMask.check();
  c.skipped = window.counters.skipped;
  c.nonFiniteRun = window.counters.nonFiniteRun;
  c.lossScale = window.counters.lossScale;
  c.goodSteps = window.counters.goodSteps;
  if (window.nonFinite > 0)
    progress->say("step " + std::to_string(window.firstNonFinite) +
                  ": non-finite loss or gradients; the update is skipped" +
                  (window.nonFinite > 1 ? " (" + std::to_string(window.nonFinite) +
                                              " such steps in this window, up to step " +
                                              std::to_string(c.step) + ")"
                                        : ""));
  if (window.counters.divergedAt == 0) {
    if (metrics)
      metrics->write(windowRecord(s));
    return false;
  }
  // The updates stopped at the divergence; the steps after it in the window changed nothing.
  c.step = c.divergedAt = window.counters.divergedAt;
  c.trainSeconds = secondsBefore + sessionSeconds();
  stopped = true;
  progress->say("step " + std::to_string(c.step) + ": " + std::to_string(kDivergedAfterNonFiniteSteps) +
                " non-finite steps in a row: the run diverged; testing the best checkpoint "
                "(lower --lr, or --precision fp32, to train this attention)");
  if (metrics) {
    if (window.examples)
      metrics->write(windowRecord(c.step - 1));
    metrics->write({{"split", "train"}, {"step", c.step}, {"diverged", true}, {"skipped", c.skipped}});
  }
  c.finished = true;
  c.peakBytes = std::max(c.peakBytes, peakBytes(device));
  save(checkpointPath, true);
  return true;
}

void TrainingRun::evaluateAndSave() {
  Evaluation v = evaluate(model, data.val, o.batch, o.evalBatches, data.dualEncoder, device, dtype,
                          data.languageModel, *group);
  model->takeGuardStats();  // the guard's share is reported for training steps only
  // Data parallelism keeps the ranks' models equal by construction; checked at every evaluation.
  std::vector<torch::Tensor> state = model->parameters();
  for (auto &buffer : model->buffers())
    state.push_back(buffer);
  group->checkIdentical(state, "parameters and random features at step " + std::to_string(c.step));
  bool better = v.accuracy > c.bestVal;
  if (better) {
    c.bestVal = v.accuracy, c.bestStep = c.step, c.badEvals = 0;
    // Written as pending and moved into place after the checkpoint: a kill between the two
    // leaves a best.pt that matches the checkpoint's counters (see promotePendingBest).
    save(bestPath + ".pending", false);
  } else {
    ++c.badEvals;
  }
  stopped = stopped || c.badEvals >= o.patience;
  c.trainSeconds = secondsBefore + sessionSeconds();
  json record = {{"split", "val"},         {"step", c.step},         {"loss", v.loss},
                 {"accuracy", v.accuracy}, {"examples", v.examples}, {"best", better},
                 {"time_s", c.trainSeconds}};
  if (data.languageModel)
    record["bits_per_byte"] = v.loss / std::log(2.0);
  if (metrics)
    metrics->write(record);
  c.peakBytes = std::max(c.peakBytes, peakBytes(device));
  c.finished = stopped || c.step >= o.steps;
  save(checkpointPath, true);
  if (better && group->main())
    promotePendingBest(bestPath, c.bestStep);
  std::ostringstream msg;
  msg << "step " << c.step << ": validation accuracy " << std::fixed << std::setprecision(4)
      << v.accuracy << " (loss " << v.loss;
  if (data.languageModel)
    msg << ", " << v.loss / std::log(2.0) << " bits per byte";
  msg << ")" << (better ? ", best so far" : "")
      << (timeLimited ? "; the time limit is reached, stopping" : "")
      << (c.badEvals >= o.patience ? "; no improvement in " + std::to_string(o.patience) + " evaluations, stopping early" : "");
  progress->say(msg.str());
}

/// The best checkpoint's test (shared out over the ranks) and the report (rank 0 writes it).
TrainReport TrainingRun::finish() {
  TrainReport r;
  r.steps = c.step;
  r.trainSeconds = c.trainSeconds;
  r.stepsPerSecond = c.trainSeconds > 0 ? c.step / c.trainSeconds : 0;
  r.bestValAccuracy = c.bestVal;
  r.bestStep = c.bestStep;
  r.earlyStopped = c.step < o.steps && !timeLimited && c.divergedAt == 0;
  r.divergedAt = c.divergedAt;
  r.skippedSteps = c.skipped;
  r.timeLimited = timeLimited;
  r.device = emulated ? "gpu-emulated" : device.str();
  r.precision = precisionName(dtype);
  r.majorityBaseline = majorityShare(data.test);
  r.worldSize = group->size();
  r.rank = group->rank();
  r.backend = group->backend();
  r.collectiveSeconds = group->collectiveSeconds();
  r.gradSync = group->active() ? gradSync : "none";
  group->barrier("the end of training (rank 0 writes best.pt)");
  if (fileExists(bestPath)) {
    LraModel best(o.model);
    best->to(device);
    loadCheckpoint(bestPath, best, nullptr, trajectory, device);
    model = best;
  }
  progress->say("testing the best checkpoint (step " + std::to_string(c.bestStep) + ") on " +
                std::to_string(data.test.size()) + " examples");
  Evaluation t = evaluate(model, data.test, o.batch, 0, data.dualEncoder, device, dtype,
                          data.languageModel, *group);
  r.testAccuracy = t.accuracy;
  if (data.languageModel) {
    r.testBitsPerByte = t.loss / std::log(2.0);
    r.majorityBaseline = majorityNextByteShare(data.test);
  }
  r.peakBytes = std::max(c.peakBytes, peakBytes(device));
  r.peakKind = device.is_cuda() ? "cuda allocator peak" : "process peak RSS";
  if (!group->main())
    return r;
  json testRecord = {{"split", "test"}, {"step", c.bestStep}, {"loss", t.loss},
                     {"accuracy", t.accuracy}, {"examples", t.examples}};
  if (data.languageModel)
    testRecord["bits_per_byte"] = r.testBitsPerByte;
  metrics->write(testRecord);
  json report = r;
  report["task"] = o.task;
  report["attention"] = o.attention;
  report["options"] = trajectory;
  if (std::string error; !writeFileAtomically(o.out + "/report.json", report.dump(2) + "\n", &error))
    throw std::runtime_error(error);
  return r;
}

} // namespace

// --- public ---------------------------------------------------------------------------------

// --- public ---------------------------------------------------------------------------------

TrainOptions defaultsFor(const std::string &task) {
  TrainOptions o;
  o.task = task;
  if (task == "listops") {
    o.batch = 32, o.lr = 1e-4, o.warmup = 1000, o.evalEvery = 500, o.evalBatches = 62;
    o.maxLength = 2000;
  } else if (task == "text") {
    o.batch = 32, o.lr = 1e-4, o.warmup = 80, o.evalEvery = 500, o.evalBatches = 200;
    o.maxLength = 4000;
  } else if (task == "retrieval") {
    o.batch = 16, o.lr = 2e-4, o.warmup = 800, o.evalEvery = 1000, o.evalBatches = 300;
    o.maxLength = 4000;
  } else if (task == "lm") {
    // Not a paper task: byte-level next-token prediction with a small decoder.
    o.batch = 16, o.lr = 1e-3, o.warmup = 100, o.steps = 2000, o.evalEvery = 200;
    o.evalBatches = 20, o.maxLength = 512;
  } else {
    throw std::invalid_argument("unknown task '" + task + "'; tasks: listops, text, retrieval, lm");
  }
  return o;
}

TaskData loadTask(const std::string &task, const std::string &dir, int64_t maxLength) {
  TaskData d;
  auto need = [&](const std::string &path, const std::string &what) {
    if (!fileExists(path))
      throw std::invalid_argument("--data " + dir + ": no " + path + " (" + what + ")");
    return path;
  };
  if (task == "listops") {
    std::string hint = "LRA's ListOps layout; generate one with 'spectra-train generate-listops --out " + dir + "'";
    d.train = data::loadListOpsTsv(need(dir + "/basic_train.tsv", hint), maxLength);
    d.val = data::loadListOpsTsv(need(dir + "/basic_val.tsv", hint), maxLength);
    d.test = data::loadListOpsTsv(need(dir + "/basic_test.tsv", hint), maxLength);
    d.vocab = static_cast<int64_t>(data::listOpsVocabulary().size());
    d.classes = 10;
    d.valSource = "basic_val.tsv";
  } else if (task == "text") {
    std::string hint = "IMDb's aclImdb layout: {train,test}/{pos,neg}/*.txt";
    need(dir + "/train", hint);
    need(dir + "/test", hint);
    d.train = data::loadImdb(dir, "train", maxLength);
    d.test = data::loadImdb(dir, "test", maxLength);
    d.val = d.test;  // LRA validates Text on IMDb's test split (it has no other)
    d.vocab = 257;
    d.classes = 2;
    d.valSource = "the test split, as in LRA: IMDb has no validation split";
  } else if (task == "lm") {
    std::string bytes = data::readTextCorpus(dir);
    std::vector<data::Example> windows = data::byteWindows(bytes, maxLength);
    if (windows.size() < 3)
      throw std::invalid_argument("--data " + dir + ": " + std::to_string(bytes.size()) +
                                  " bytes make " + std::to_string(windows.size()) + " windows of " +
                                  std::to_string(maxLength + 1) +
                                  " bytes; the lm task needs at least 3 (use a shorter --max-length)");
    size_t val = std::max<size_t>(1, windows.size() / 20), test = val;
    size_t train = windows.size() - val - test;
    d.train.assign(windows.begin(), windows.begin() + train);
    d.val.assign(windows.begin() + train, windows.begin() + train + val);
    d.test.assign(windows.begin() + train + val, windows.end());
    d.vocab = 257;
    d.classes = 257;
    d.languageModel = true;
    d.valSource = "the 5% of the windows after the training ones";
  } else if (task == "retrieval") {
    std::string hint = "LRA's AAN layout";
    d.train = data::loadAanTsv(need(dir + "/new_aan_pairs.train.tsv", hint), maxLength);
    d.val = data::loadAanTsv(need(dir + "/new_aan_pairs.eval.tsv", hint), maxLength);
    d.test = data::loadAanTsv(need(dir + "/new_aan_pairs.test.tsv", hint), maxLength);
    d.vocab = 257;
    d.classes = 2;
    d.dualEncoder = true;
    d.valSource = "new_aan_pairs.eval.tsv";
  } else {
    throw std::invalid_argument("unknown task '" + task + "'; tasks: listops, text, retrieval, lm");
  }
  for (auto *split : {&d.train, &d.val, &d.test})
    if (split->empty())
      throw std::invalid_argument("--data " + dir + ": a split of the " + task + " data is empty");
  return d;
}

TrainReport train(const TrainOptions &options, std::ostream &log) {
  return TrainingRun(options, log).run();
}

GenerateResult generateText(const GenerateOptions &o) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(o.checkpoint, torch::kCPU);
  } catch (const c10::Error &e) {
    throw std::invalid_argument(o.checkpoint + ": not a spectra-train checkpoint (" +
                                e.what_without_backtrace() + ")");
  }
  if (readString(archive, "format") != kCheckpointFormat)
    throw std::invalid_argument(o.checkpoint + ": its format is not '" +
                                std::string(kCheckpointFormat) + "'");
  json t = json::parse(readString(archive, "trajectory"));
  if (t.value("task", std::string()) != "lm")
    throw std::invalid_argument(o.checkpoint + ": a checkpoint of task '" +
                                t.value("task", std::string()) +
                                "'; generate needs a language model (train with --task lm)");
  LraConfig c;
  c.vocab = 257, c.classes = 257, c.languageModel = true;
  c.maxLength = t.at("max_length");
  c.attention = t.at("attention");
  c.features = t.at("features"), c.embed = t.at("embed"), c.layers = t.at("layers");
  c.heads = t.at("heads"), c.headDim = t.at("head_dim"), c.ffn = t.at("ffn");
  c.dropout = t.at("dropout");
  c.seed = t.at("seed");
  if (t.contains("variant_options"))
    c.options = t.at("variant_options").get<std::map<std::string, double>>();
  LraModel model(c);
  torch::serialize::InputArchive modelArchive;
  archive.read("model", modelArchive);
  model->load(modelArchive);
  std::vector<int32_t> ids = data::encodeBytes(o.prompt, static_cast<int64_t>(o.prompt.size()));
  if (ids.empty())
    throw std::invalid_argument("generate: --prompt must hold at least one byte");
  std::vector<int64_t> prompt(ids.begin(), ids.end());
  auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> all = model->generate(prompt, o.tokens, o.temperature, o.seed);
  GenerateResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int64_t id : all)
    r.text.push_back(static_cast<char>(id - 1));
  r.promptTokens = static_cast<int64_t>(prompt.size());
  r.generated = static_cast<int64_t>(all.size()) - r.promptTokens;
  r.attention = c.attention;
  return r;
}

} // namespace spectra::models
