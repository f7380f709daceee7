//===- Progress.h - the trainer's progress bar and metrics file -----------===//
//
// What a person and a plotting script see of a run: the progress bar on
// stderr (redrawn in place on a terminal, one line per metrics window in a
// log), messages on their own lines, and metrics.jsonl, one JSON record per
// line, flushed as it is written. Under data parallelism only rank 0 draws and
// writes (the trainer gives the other ranks a silent Progress).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_PROGRESS_H
#define SPECTRA_MODELS_PROGRESS_H

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <ostream>
#include <string>

namespace spectra::models {

/// "42s", "3m07s", "2h05m".
std::string duration(double seconds);

/// metrics.jsonl, appended to.
class MetricsLog {
public:
  explicit MetricsLog(const std::string &path);
  void write(const nlohmann::json &record);

private:
  std::ofstream out;
};

class Progress {
public:
  /// `enabled`: the bar (messages are printed either way); `silent`: nothing at all.
  Progress(std::ostream &os, bool enabled, std::string label, int64_t total, bool silent = false);
  /// Called after every step; draws at most 5 times a second on a terminal, and once per
  /// metrics window otherwise.
  void update(int64_t step, double loss, double accuracy, double stepsPerSecond, double bestVal,
              int64_t bestStep, bool windowEnd);
  /// A message on its own line (the bar is redrawn by the next update).
  void say(const std::string &message);

private:
  std::ostream &os;
  bool enabled, silent, interactive = false;
  std::string label;
  int64_t total;
  std::chrono::steady_clock::time_point lastDraw{};
};

} // namespace spectra::models

#endif // SPECTRA_MODELS_PROGRESS_H
