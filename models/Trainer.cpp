//===- Trainer.cpp - LRA training: the paper's loop, checkpoints, resume --===//

#include "models/Trainer.h"
#include "models/TrainStep.h"
#include "runtime/Paths.h"

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace spectra::models {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}


// --- data -----------------------------------------------------------------------------------

struct Batch {
  torch::Tensor tokens, tokens2, labels;
};

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

Batch collate(const std::vector<data::Example> &examples, const std::vector<int64_t> &indices,
              bool dual, const torch::Device &device, bool languageModel = false) {
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

/// The batch order: a fresh permutation per epoch, seeded by (seed, epoch), so the batch of any
/// step is known without replaying the steps before it.
class BatchOrder {
public:
  BatchOrder(int64_t examples, int64_t batch, int64_t seed)
      : n(examples), b(batch), seed(static_cast<uint64_t>(seed)) {}
  std::vector<int64_t> indices(int64_t step) {
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

private:
  int64_t n, b;
  uint64_t seed;
  int64_t epoch = -1;
  std::vector<int64_t> permutation;
};

// --- precision ------------------------------------------------------------------------------

/// Autocast on CUDA for bf16/fp16; fp32 runs plain.
class AutocastScope {
public:
  AutocastScope(const torch::Device &device, torch::ScalarType dtype) {
    active = device.is_cuda() && dtype != torch::kFloat32;
    if (!active)
      return;
    previous = at::autocast::is_autocast_enabled(at::kCUDA);
    previousType = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  ~AutocastScope() {
    if (!active)
      return;
    at::autocast::set_autocast_enabled(at::kCUDA, previous);
    at::autocast::set_autocast_dtype(at::kCUDA, previousType);
    at::autocast::clear_cache();
  }

private:
  bool active = false, previous = false;
  at::ScalarType previousType = at::kFloat;
};

struct Evaluation {
  double loss = 0, accuracy = 0;
  int64_t examples = 0;
};

/// A mask row that kept nothing, over the steps or batches of a window (device flags, read once).
struct EmptyMaskFlag {
  torch::Tensor seen;
  void add(const DeferredInputChecks &checks) {
    if (checks.emptyMask().defined())
      seen = seen.defined() ? seen.logical_or(checks.emptyMask()) : checks.emptyMask();
  }
  void check() const {
    if (seen.defined())
      TORCH_CHECK(!seen.item<bool>(), "spectra attention: ", kEmptyKeyMask);
  }
};

/// The loss (per predicted label: an example, or a language model's next token) and accuracy
/// of the first `maxBatches` batches of a split (all with 0).
Evaluation evaluate(LraModel &model, const std::vector<data::Example> &split, int64_t batch,
                    int64_t maxBatches, bool dual, const torch::Device &device,
                    torch::ScalarType dtype, bool languageModel = false) {
  torch::NoGradGuard noGrad;
  model->eval();
  Evaluation e;
  // Sums on the device, read once at the end (no synchronisation per batch).
  torch::Tensor lossSum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  int64_t total = static_cast<int64_t>(split.size());
  if (maxBatches > 0)
    total = std::min(total, maxBatches * batch);
  EmptyMaskFlag emptyMask;
  int64_t labels = 0;
  for (int64_t start = 0; start < total; start += batch) {
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
    correct.add_(batchCorrect);
    emptyMask.add(checks);
  }
  model->train();
  emptyMask.check();
  e.examples = total;
  e.loss = labels ? lossSum.item<double>() / labels : 0;  // may be inf or NaN: written as null
  e.accuracy = labels ? static_cast<double>(correct.item<int64_t>()) / labels : 0;
  return e;
}

// --- schedule, memory, formatting ------------------------------------------------------------

/// Linear warmup to the peak rate over `warmup` steps, then linear decay that would reach zero
/// one step after the last (the last step trains at lr / (steps - warmup)).
double learningRate(const TrainOptions &o, int64_t step) {
  double s = static_cast<double>(step + 1);
  if (o.warmup > 0 && s <= o.warmup)
    return o.lr * s / o.warmup;
  double rest = static_cast<double>(std::max<int64_t>(1, o.steps - o.warmup));
  return o.lr * std::max(0.0, (o.steps - s) / rest + 1.0 / rest);
}

int64_t peakBytes(const torch::Device &device) {
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

std::string duration(double seconds) {
  int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

/// The options that decide a run's trajectory: a resumed run must match them.
json trajectoryOf(const TrainOptions &o, const std::string &precision, const std::string &deviceType) {
  json t = {{"precision", precision}, {"device_type", deviceType},{"task", o.task},           {"attention", o.attention}, {"batch", o.batch},
          {"warmup", o.warmup},       {"steps", o.steps},         {"eval_every", o.evalEvery},
          {"eval_batches", o.evalBatches}, {"max_length", o.maxLength}, {"log_every", o.logEvery},
          {"limit_train", o.limitTrain}, {"lr", o.lr},            {"clip", o.clip},
          {"weight_decay", o.weightDecay}, {"seed", o.seed},      {"features", o.model.features},
          {"embed", o.model.embed},   {"layers", o.model.layers}, {"heads", o.model.heads},
          {"head_dim", o.model.headDim}, {"ffn", o.model.ffn},    {"dropout", o.model.dropout}};
  // Only when set: checkpoints written before the option existed still resume.
  if (o.redrawEvery > 0)
    t["redraw_every"] = o.redrawEvery;
  if (!o.model.options.empty())
    t["variant_options"] = o.model.options;
  return t;
}

// --- checkpoints ----------------------------------------------------------------------------

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


constexpr const char *kCheckpointFormat = "spectra-train checkpoint 2";

/// Written to a temporary file and renamed: a kill mid-write leaves the previous checkpoint.
void saveCheckpoint(const std::string &path, LraModel &model, torch::optim::Optimizer *optimizer,
                    const Counters &c, const json &trajectory) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kCheckpointFormat)));
  archive.write("trajectory", c10::IValue(trajectory.dump()));
  torch::serialize::OutputArchive modelArchive;
  model->save(modelArchive);
  archive.write("model", modelArchive);
  if (optimizer) {
    torch::serialize::OutputArchive optimizerArchive;
    optimizer->save(optimizerArchive);
    archive.write("optimizer", optimizerArchive);
  }
  json counters = c;
  archive.write("counters", c10::IValue(counters.dump()));
  std::string error;
  if (!replaceAtomically(
          path,
          [&](const std::string &temporary) {
            archive.save_to(temporary);
            return true;
          },
          &error))
    throw std::runtime_error("cannot write the checkpoint: " + error);
}

std::string readString(torch::serialize::InputArchive &archive, const std::string &key) {
  c10::IValue v;
  archive.read(key, v);
  return v.toStringRef();
}

Counters loadCheckpoint(const std::string &path, LraModel &model, torch::optim::Optimizer *optimizer,
                        const json &trajectory, const torch::Device &device) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    std::string format = readString(archive, "format");
    if (format != kCheckpointFormat)
      throw std::runtime_error("its format is '" + format + "', this spectra-train reads '" +
                               kCheckpointFormat + "'");
    json saved = json::parse(readString(archive, "trajectory"));
    // Both ways: an option only one of them sets (redraw_every) is a mismatch too.
    json both = saved;
    both.update(trajectory);
    for (auto &[key, unused] : both.items())
      if (saved.value(key, json()) != trajectory.value(key, json()))
        throw std::invalid_argument("it was written with " + key + " = " + saved.value(key, json()).dump() +
                                    ", this run has " + key + " = " + trajectory.value(key, json()).dump() +
                                    " (resume with the same options, or start a new --out)");
    torch::serialize::InputArchive modelArchive;
    archive.read("model", modelArchive);
    model->load(modelArchive);
    if (optimizer) {
      torch::serialize::InputArchive optimizerArchive;
      archive.read("optimizer", optimizerArchive);
      optimizer->load(optimizerArchive);
    }
    return json::parse(readString(archive, "counters")).get<Counters>();
  } catch (const std::invalid_argument &e) {
    throw std::invalid_argument("cannot resume from '" + path + "': " + e.what());
  } catch (const std::exception &e) {
    throw std::runtime_error("cannot resume from '" + path + "': the checkpoint is unreadable (" +
                             std::string(e.what()).substr(0, 300) +
                             "); remove it to start again, or resume from a copy");
  }
}

/// Keeps the metrics up to and including `step` (the checkpoint's), so a resumed run appends
/// exactly what the uninterrupted run wrote after it.
void truncateMetrics(const std::string &path, int64_t step) {
  std::ifstream in(path);
  std::vector<std::string> kept;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      break;  // a line cut by the kill
    if (j.value("split", "") != "test" && j.value("step", INT64_MAX) <= step)
      kept.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (auto &l : kept)
    out << l << "\n";
}

/// The counters of a checkpoint file (its step, best step, ...), or null when unreadable.
json countersOf(const std::string &path) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    return json::parse(readString(archive, "counters"));
  } catch (const std::exception &) {
    return json();
  }
}

/// best.pt.pending becomes best.pt when it is the best model the checkpoint knows of
/// (bestStep); otherwise it belongs to a trajectory the resumed run replays, and is dropped.
void promotePendingBest(const std::string &bestPath, int64_t bestStep) {
  std::string pending = bestPath + ".pending";
  if (!fileExists(pending))
    return;
  json counters = countersOf(pending);
  if (!counters.is_null() && counters.value("bestStep", int64_t(-1)) == bestStep) {
    if (std::rename(pending.c_str(), bestPath.c_str()) != 0)
      throw std::runtime_error("cannot move '" + pending + "' into place: " + std::strerror(errno));
  } else {
    std::remove(pending.c_str());
  }
}

class MetricsLog {
public:
  explicit MetricsLog(const std::string &path) : out(path, std::ios::app) {
    if (!out)
      throw std::runtime_error("cannot write metrics to '" + path + "'");
  }
  void write(const json &record) {
    out << record.dump() << "\n";
    out.flush();
  }

private:
  std::ofstream out;
};

// --- progress -------------------------------------------------------------------------------

class Progress {
public:
  Progress(std::ostream &os, bool enabled, std::string label, int64_t total)
      : os(os), enabled(enabled), label(std::move(label)), total(total) {
    interactive = &os == &std::cerr && ::isatty(2);
  }
  /// Called after every step; draws at most 5 times a second on a terminal, and once per
  /// metrics window otherwise.
  void update(int64_t step, double loss, double accuracy, double stepsPerSecond, double bestVal,
              int64_t bestStep, bool windowEnd) {
    if (!enabled)
      return;
    auto now = Clock::now();
    if (interactive && !windowEnd && step != total &&
        std::chrono::duration<double>(now - lastDraw).count() < 0.2)
      return;
    if (!interactive && !windowEnd)
      return;
    lastDraw = now;
    const int width = 24;
    int filled = static_cast<int>(width * step / std::max<int64_t>(1, total));
    std::ostringstream line;
    line << "[" << label << "] " << std::setw(static_cast<int>(std::to_string(total).size())) << step
         << "/" << total << " [" << std::string(filled, '#') << std::string(width - filled, '.')
         << "] loss " << std::fixed << std::setprecision(3) << loss << " acc " << std::setprecision(3)
         << accuracy << " | " << std::setprecision(2) << stepsPerSecond << " steps/s | ETA "
         << duration(stepsPerSecond > 0 ? (total - step) / stepsPerSecond : 0);
    if (bestVal >= 0)
      line << " | best val " << std::setprecision(3) << bestVal << " @" << bestStep;
    if (interactive)
      os << "\r" << line.str() << "\033[K" << std::flush;
    else
      os << line.str() << "\n" << std::flush;
  }
  /// A message on its own line (the bar is redrawn by the next update).
  void say(const std::string &message) {
    if (interactive)
      os << "\r\033[K";
    os << "[" << label << "] " << message << "\n" << std::flush;
  }

private:
  std::ostream &os;
  bool enabled, interactive = false;
  std::string label;
  int64_t total;
  Clock::time_point lastDraw{};
};

torch::Device pickDevice(const std::string &name) {
  if (name == "auto")
    return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::Device d(torch::kCPU);
  try {
    d = torch::Device(name);
  } catch (const std::exception &) {
    throw std::invalid_argument("unknown device '" + name + "'; use auto, cpu, gpu-emulated or cuda[:N]");
  }
  if (d.is_cuda() && !torch::cuda::is_available())
    throw std::invalid_argument("--device " + name + ": no CUDA device is available here (use cpu)");
  if (d.is_cuda() && !d.has_index())
    d = torch::Device(torch::kCUDA, 0);
  if (d.is_cuda() && d.index() >= static_cast<int64_t>(torch::cuda::device_count()))
    throw std::invalid_argument("--device " + name + ": this machine has " +
                                std::to_string(torch::cuda::device_count()) + " CUDA device(s)");
  if (!d.is_cuda() && !d.is_cpu())
    throw std::invalid_argument("unknown device '" + name + "'; use auto, cpu or cuda[:N]");
  return d;
}

torch::ScalarType pickPrecision(const std::string &name, const torch::Device &device) {
  if (name == "auto")
    return device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  if (name == "fp32")
    return torch::kFloat32;
  if (name == "bf16" || name == "fp16") {
    if (!device.is_cuda())
      throw std::invalid_argument("--precision " + name + " is mixed precision on CUDA; the CPU "
                                  "trains in fp32 (use --precision fp32 or auto)");
    return name == "bf16" ? torch::kBFloat16 : torch::kHalf;
  }
  throw std::invalid_argument("unknown precision '" + name + "'; use auto, fp32, bf16 or fp16");
}

std::string precisionName(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bf16" : t == torch::kHalf ? "fp16" : "fp32";
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

} // namespace

// report.json's fields, both ways (the keys are the file's, snake_case).
void to_json(json &j, const TrainReport &r) {
  j = {{"test_accuracy", r.testAccuracy},   {"best_val_accuracy", r.bestValAccuracy},
       {"best_step", r.bestStep},           {"steps", r.steps},
       {"early_stopped", r.earlyStopped},   {"time_limited", r.timeLimited},
       {"diverged_at", r.divergedAt},       {"skipped_steps", r.skippedSteps},
       {"train_seconds", r.trainSeconds},   {"steps_per_second", r.stepsPerSecond},
       {"peak_bytes", r.peakBytes},         {"peak_kind", r.peakKind},
       {"majority_baseline", r.majorityBaseline}, {"device", r.device},
       {"precision", r.precision}};
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
}


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

TrainReport train(const TrainOptions &optionsIn, std::ostream &log) {
  TrainOptions o = optionsIn;
  if (o.out.empty())
    throw std::invalid_argument("a run needs an output directory (--out DIR)");
  if (o.batch < 1 || o.steps < 1 || o.evalEvery < 1 || o.logEvery < 1 || o.warmup < 0 || o.lr <= 0 ||
      o.maxLength < 1 || o.patience < 1 || o.redrawEvery < 0)
    throw std::invalid_argument("--batch, --steps, --eval-every, --log-every, --max-length and "
                                "--patience must be positive, --warmup and --redraw-every "
                                "non-negative, --lr > 0");
  // Metric windows restart at every evaluation (the checkpoints), so a resumed run's windows
  // are the uninterrupted run's.
  o.logEvery = std::gcd(o.logEvery, o.evalEvery);
  // gpu-emulated: the CPU, with spectra attention through the GPU kernels run on it.
  const bool emulated = o.device == "gpu-emulated";
  torch::Device device = pickDevice(emulated ? "cpu" : o.device);
  torch::ScalarType dtype = pickPrecision(o.precision, device);
  std::string label = o.task + " " + o.attention;
  Progress progress(log, o.progress, label, o.steps);

  std::string mkdirError;
  if (!makeDirectories(o.out, &mkdirError))
    throw std::runtime_error(mkdirError);
  std::string checkpointPath = o.out + "/checkpoint.pt", bestPath = o.out + "/best.pt",
              metricsPath = o.out + "/metrics.jsonl";
  if (!o.resume && (fileExists(checkpointPath) || fileExists(metricsPath)))
    throw std::invalid_argument("'" + o.out + "' already holds a run; pass --resume to continue it, "
                                "or choose another --out");

  progress.say("loading " + o.task + " from " + o.data);
  TaskData data = loadTask(o.task, o.data, o.maxLength);
  if (o.limitTrain > 0 && o.limitTrain < static_cast<int64_t>(data.train.size()))
    data.train.resize(o.limitTrain);
  if (o.evalBatches > 0 && o.evalBatches * o.batch < static_cast<int64_t>(data.val.size())) {
    // A fixed random subset (the same for every run and variant): the head of a split sorted
    // by class (IMDb's files) would validate on one class.
    std::vector<int64_t> keep(data.val.size());
    std::iota(keep.begin(), keep.end(), 0);
    std::mt19937_64 rng(0x5eed);
    for (int64_t i = static_cast<int64_t>(keep.size()) - 1; i > 0; --i)
      std::swap(keep[i], keep[rng() % static_cast<uint64_t>(i + 1)]);
    keep.resize(o.evalBatches * o.batch);
    std::vector<data::Example> subset;
    for (int64_t i : keep)
      subset.push_back(std::move(data.val[i]));
    data.val = std::move(subset);
    data.valSource += ", a fixed random " + std::to_string(data.val.size()) + " of them";
  }
  progress.say(std::to_string(data.train.size()) + " training, " + std::to_string(data.val.size()) +
               " validation (" + data.valSource + "), " + std::to_string(data.test.size()) +
               " test examples; device " + (emulated ? "gpu-emulated (the GPU kernels on the CPU)" : device.str()) +
               ", " + precisionName(dtype));

  o.model.vocab = data.vocab;
  o.model.classes = data.classes;
  o.model.dualEncoder = data.dualEncoder;
  o.model.languageModel = data.languageModel;
  o.model.maxLength = o.maxLength;
  o.model.attention = o.attention;
  o.model.seed = o.seed;
  o.model.gpuEmulated = emulated;
  torch::manual_seed(o.seed);
  LraModel model(o.model);
  model->to(device);

  std::vector<torch::Tensor> parameters = model->parameters();
  torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(o.lr)
                                                .betas({0.9, 0.999})
                                                .eps(1e-6)
                                                .weight_decay(o.weightDecay));
  json trajectory =
      trajectoryOf(o, precisionName(dtype), emulated ? "gpu-emulated" : device.is_cuda() ? "cuda" : "cpu");
  Counters c;
  if (o.resume && fileExists(checkpointPath)) {
    c = loadCheckpoint(checkpointPath, model, &optimizer, trajectory, device);
    promotePendingBest(bestPath, c.bestStep);
    // A finished run with its report is not tested again (the report is the test's result).
    bool stillStopped = c.step >= o.steps || c.badEvals >= o.patience || c.divergedAt > 0 ||
                        (o.timeLimit > 0 && c.trainSeconds >= o.timeLimit);
    if (c.finished && stillStopped) {
      std::ifstream in(o.out + "/report.json");
      json done = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!done.is_discarded() && done.value("options", json()) == trajectory &&
          done.value("steps", int64_t(-1)) == c.step) {
        progress.say("finished earlier (step " + std::to_string(c.step) + "); report kept: " + o.out +
                     "/report.json");
        return done.get<TrainReport>();
      }
    }
    truncateMetrics(metricsPath, c.step);
    progress.say("resumed from " + checkpointPath + " at step " + std::to_string(c.step));
  } else if (o.resume) {
    progress.say("no checkpoint in " + o.out + " yet; starting from step 0");
    std::ofstream(metricsPath, std::ios::trunc);
  }
  MetricsLog metrics(metricsPath);
  if (o.redrawEvery > 0) {
    // Which attentions a redraw reaches (the count of a redraw is the same every time).
    int64_t layers = model->redrawableLayers();
    progress.say(layers ? "random features redrawn every " + std::to_string(o.redrawEvery) +
                              " steps in " + std::to_string(layers) + " attention layer(s)"
                        : "--redraw-every: " + o.attention +
                              " has no fixed random features to redraw (softmax, or learnable "
                              "weights, which are trained); ignored");
  }

  if (device.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  BatchOrder order(static_cast<int64_t>(data.train.size()), o.batch, o.seed);
  // The step runs on the device without waiting for it: its skip decisions and the window's
  // sums are device scalars, read once per metrics window.
  DeviceStep stepper(optimizer, device, dtype == torch::kHalf, kDivergedAfterNonFiniteSteps,
                     {c.skipped, c.nonFiniteRun, c.divergedAt, c.lossScale, c.goodSteps});
  auto save = [&](const std::string &path, bool withOptimizer) {
    if (withOptimizer)
      stepper.syncOptimizerState();
    saveCheckpoint(path, model, withOptimizer ? &optimizer : nullptr, c, trajectory);
  };
  StepWindow window;        // the last window read (the progress bar shows it)
  EmptyMaskFlag emptyMask;  // an error, reported at the window's end
  auto sessionStart = Clock::now();
  int64_t sessionStartStep = c.step;
  double secondsBefore = c.trainSeconds;
  auto sessionSeconds = [&] { return std::chrono::duration<double>(Clock::now() - sessionStart).count(); };
  // The training metrics of the window ending at c.step (the rate is that of its last update).
  auto windowRecord = [&](int64_t step) {
    json record = {{"split", "train"},
                   {"step", c.step},
                   {"loss", window.examples ? json(window.lossSum / window.examples) : json()},
                   {"accuracy", window.examples ? json(static_cast<double>(window.correct) / window.examples) : json()},
                   {"lr", learningRate(o, step)},
                   {"time_s", c.trainSeconds}};
    if (c.skipped > 0)
      record["skipped"] = c.skipped;
    // The signed estimators' denominator guard (SGQ, TrigRF): the share of attention queries
    // it replaced in this window's training steps.
    if (auto [share, queries] = model->takeGuardStats(); queries > 0)
      record["guarded"] = share;
    return record;
  };
  // A resumed run that had stopped (patience, divergence, time limit) stays stopped; a larger
  // --time-limit or --steps lets it go on.
  bool timeLimited = o.timeLimit > 0 && c.trainSeconds >= o.timeLimit && c.step < o.steps;
  bool stopped = timeLimited || c.badEvals >= o.patience || c.divergedAt > 0;

  for (int64_t step = c.step; step < o.steps && !stopped; ++step) {
    // Performer's feature redraw: a function of the step, so a resumed run (whose checkpoint
    // holds the weights of the last redraw) replays it.
    // A run that diverged in this window (the device knows; the host reads it at the window's
    // end) keeps the features it diverged with: one read per redraw.
    if (o.redrawEvery > 0 && step > 0 && step % o.redrawEvery == 0 && !stepper.halted())
      model->redrawFeatures(step / o.redrawEvery);
    // Dropout draws depend on (seed, step) alone: resumed runs replay them exactly.
    torch::manual_seed(static_cast<uint64_t>(o.seed) * 1000003ULL + static_cast<uint64_t>(step));
    Batch b = collate(data.train, order.indices(step), data.dualEncoder, device,
                      data.languageModel);
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
    optimizer.zero_grad();
    stepper.lossToBackward(loss).backward();
    stepper.update(step, learningRate(o, step), o.clip, loss,
                   logits.detach().argmax(-1).eq(b.labels).sum(), b.labels.size(0), inputsBad);
    c.step = step + 1;
    c.trainSeconds = secondsBefore + sessionSeconds();
    double rate = (c.step - sessionStartStep) / std::max(1e-9, sessionSeconds());

    bool outOfTime = o.timeLimit > 0 && c.trainSeconds >= o.timeLimit && c.step < o.steps;
    bool windowEnd = c.step % o.logEvery == 0 || c.step == o.steps || outOfTime;
    if (windowEnd) {
      // The window's one synchronisation.
      window = stepper.read();
      emptyMask.check();
      c.skipped = window.counters.skipped;
      c.nonFiniteRun = window.counters.nonFiniteRun;
      c.lossScale = window.counters.lossScale;
      c.goodSteps = window.counters.goodSteps;
      if (window.nonFinite > 0)
        progress.say("step " + std::to_string(window.firstNonFinite) +
                     ": non-finite loss or gradients; the update is skipped" +
                     (window.nonFinite > 1 ? " (" + std::to_string(window.nonFinite) +
                                                 " such steps in this window, up to step " +
                                                 std::to_string(c.step) + ")"
                                           : ""));
      if (window.counters.divergedAt > 0) {
        // The updates stopped at the divergence; the steps after it in the window changed nothing.
        c.step = c.divergedAt = window.counters.divergedAt;
        c.trainSeconds = secondsBefore + sessionSeconds();
        stopped = true;
        progress.say("step " + std::to_string(c.step) + ": " + std::to_string(kDivergedAfterNonFiniteSteps) +
                     " non-finite steps in a row: the run diverged; testing the best checkpoint "
                     "(lower --lr, or --precision fp32, to train this attention)");
        if (window.examples)
          metrics.write(windowRecord(c.step - 1));
        metrics.write({{"split", "train"}, {"step", c.step}, {"diverged", true}, {"skipped", c.skipped}});
        c.finished = true;
        c.peakBytes = std::max(c.peakBytes, peakBytes(device));
        save(checkpointPath, true);
        break;
      }
      metrics.write(windowRecord(step));
    }
    progress.update(c.step, window.examples ? window.lossSum / window.examples : NAN,
                    window.examples ? static_cast<double>(window.correct) / window.examples : NAN,
                    rate, c.bestVal, c.bestStep, windowEnd);

    if (outOfTime) {
      timeLimited = true;
      stopped = true;
    }
    if (c.step % o.evalEvery == 0 || c.step == o.steps || outOfTime) {
      Evaluation v = evaluate(model, data.val, o.batch, o.evalBatches, data.dualEncoder, device,
                              dtype, data.languageModel);
      model->takeGuardStats();  // the guard's share is reported for training steps only
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
      json record = {{"split", "val"},       {"step", c.step},     {"loss", v.loss},
                     {"accuracy", v.accuracy}, {"examples", v.examples}, {"best", better},
                     {"time_s", c.trainSeconds}};
      if (data.languageModel)
        record["bits_per_byte"] = v.loss / std::log(2.0);
      metrics.write(record);
      c.peakBytes = std::max(c.peakBytes, peakBytes(device));
      c.finished = stopped || c.step >= o.steps;
      save(checkpointPath, true);
      if (better)
        promotePendingBest(bestPath, c.bestStep);
      std::ostringstream msg;
      msg << "step " << c.step << ": validation accuracy " << std::fixed << std::setprecision(4)
          << v.accuracy << " (loss " << v.loss;
      if (data.languageModel)
        msg << ", " << v.loss / std::log(2.0) << " bits per byte";
      msg << ")" << (better ? ", best so far" : "")
          << (timeLimited ? "; the time limit is reached, stopping" : "")
          << (c.badEvals >= o.patience ? "; no improvement in " + std::to_string(o.patience) + " evaluations, stopping early" : "");
      progress.say(msg.str());
    }
    if (o.killAfterStep == c.step) {
      log << std::flush;
      std::raise(SIGKILL);
    }
  }

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
  if (fileExists(bestPath)) {
    LraModel best(o.model);
    best->to(device);
    loadCheckpoint(bestPath, best, nullptr, trajectory, device);
    model = best;
  }
  progress.say("testing the best checkpoint (step " + std::to_string(c.bestStep) + ") on " +
               std::to_string(data.test.size()) + " examples");
  Evaluation t = evaluate(model, data.test, o.batch, 0, data.dualEncoder, device, dtype,
                          data.languageModel);
  r.testAccuracy = t.accuracy;
  if (data.languageModel) {
    r.testBitsPerByte = t.loss / std::log(2.0);
    r.majorityBaseline = majorityNextByteShare(data.test);
  }
  r.peakBytes = std::max(c.peakBytes, peakBytes(device));
  r.peakKind = device.is_cuda() ? "cuda allocator peak" : "process peak RSS";
  json testRecord = {{"split", "test"}, {"step", c.bestStep}, {"loss", t.loss},
                     {"accuracy", t.accuracy}, {"examples", t.examples}};
  if (data.languageModel)
    testRecord["bits_per_byte"] = r.testBitsPerByte;
  metrics.write(testRecord);
  json report = r;
  report["task"] = o.task;
  report["attention"] = o.attention;
  report["options"] = trajectory;
  if (std::string error; !writeFileAtomically(o.out + "/report.json", report.dump(2) + "\n", &error))
    throw std::runtime_error(error);
  return r;
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
