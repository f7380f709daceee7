//===- Checkpoint.cpp - the trainer's checkpoints, metrics file and resume ===//

#include "models/Checkpoint.h"
#include "runtime/Paths.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <sys/stat.h>
#include <vector>

namespace spectra::models {

using json = nlohmann::json;

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

/// The options that decide a run's trajectory: a resumed run must match them.
nlohmann::json trajectoryOf(const TrainOptions &o, const std::string &precision, const std::string &deviceType) {
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

/// Written to a temporary file and renamed: a kill mid-write leaves the previous checkpoint.
void saveCheckpoint(const std::string &path, LraModel &model, torch::optim::Optimizer *optimizer,
                    const Counters &c, const nlohmann::json &trajectory) {
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
                        const nlohmann::json &trajectory, const torch::Device &device) {
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

namespace {

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

} // namespace

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

} // namespace spectra::models
