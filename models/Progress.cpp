//===- Progress.cpp - the trainer's progress bar and metrics file ---------===//

#include "models/Progress.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace spectra::models {

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

MetricsLog::MetricsLog(const std::string &path) : out(path, std::ios::app) {
  if (!out)
    throw std::runtime_error("cannot write metrics to '" + path + "'");
}

void MetricsLog::write(const nlohmann::json &record) {
  out << record.dump() << "\n";
  out.flush();
}

Progress::Progress(std::ostream &os, bool enabled, std::string label, int64_t total, bool silent)
    : os(os), enabled(enabled && !silent), silent(silent), label(std::move(label)), total(total) {
  interactive = &os == &std::cerr && ::isatty(2);
}

void Progress::update(int64_t step, double loss, double accuracy, double stepsPerSecond,
                      double bestVal, int64_t bestStep, bool windowEnd) {
  if (!enabled)
    return;
  auto now = std::chrono::steady_clock::now();
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

void Progress::say(const std::string &message) {
  if (silent)
    return;
  if (interactive)
    os << "\r\033[K";
  os << "[" << label << "] " << message << "\n" << std::flush;
}

} // namespace spectra::models
