//===- Sweep.h - concurrent training runs: the plan and the process queue -===//
//
// `spectra-train sweep --parallel K` trains many attentions at once, each in its
// own process (so each run's peak memory and its failures stay its own). This
// file is the part that needs neither LibTorch nor a GPU, so it is unit-tested
// on any machine:
//   - plan(): how many runs go at once and where, from the resources (visible
//     GPUs with their free memory, CPU cores, host memory) and the request
//     (--parallel, --device, --threads, an estimate of one run's peak memory);
//   - runQueue(): the runs as child processes over the plan's slots, one run per
//     slot at a time, in order; each child pinned to its slot's device
//     (CUDA_VISIBLE_DEVICES), its output in its own log when several run at
//     once; SIGINT/SIGTERM stop the children and report the sweep interrupted
//     (every run resumes from its last checkpoint when the sweep is rerun).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_SWEEP_H
#define SPECTRA_MODELS_SWEEP_H

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace spectra::sweep {

/// A CUDA device as this process sees it.
struct Gpu {
  int ordinal = 0;          ///< its index among the visible devices (cuda:ordinal here)
  std::string visibleId;    ///< what pins a child to it: CUDA_VISIBLE_DEVICES=visibleId
  std::string name;         ///< e.g. "NVIDIA H100 80GB HBM3"
  int64_t freeBytes = 0, totalBytes = 0;
};

struct Resources {
  std::vector<Gpu> gpus;            ///< empty: no usable GPU
  int cpuCores = 1;
  int64_t hostAvailableBytes = 0;   ///< MemAvailable (0: unknown)
};

struct Request {
  int parallel = 0;                 ///< --parallel: runs at once per device (0: choose)
  std::string device = "auto";      ///< --device of the sweep: auto | cpu | cuda | cuda:N
  int64_t threads = 0;              ///< --threads of every run (0: choose)
  size_t runs = 0;                  ///< how many runs the sweep has to do
  int64_t runBytes = 0;             ///< one run's estimated peak (0: unknown, a default is used)
};

/// Bytes a CUDA process holds beyond its allocator's peak (context, kernels, workspaces).
constexpr int64_t kCudaProcessOverheadBytes = int64_t(768) << 20;
/// One run's peak when no finished run says otherwise (the paper's model at LRA's lengths).
constexpr int64_t kDefaultGpuRunBytes = int64_t(3) << 30;
constexpr int64_t kDefaultCpuRunBytes = int64_t(2) << 30;
/// The share of free memory the runs may take together.
constexpr double kMemoryShare = 0.9;

/// One place a run can go.
struct Slot {
  std::string label;                ///< "cpu", "cuda:0", ... (for messages)
  std::string cudaVisibleDevices;   ///< set in the child's environment ("" = leave it)
  std::vector<std::string> args;    ///< appended to the run's command (--device, --threads)
};

struct Plan {
  std::vector<Slot> slots;          ///< runs at once = slots.size()
  int perDevice = 1;                ///< runs at once on each device
  int64_t threadsPerRun = 0;        ///< --threads given to every run (0: left to torch)
  std::string explanation;          ///< one line: what was chosen and why
  std::vector<std::string> warnings;
};

/// Chooses the slots. Throws std::invalid_argument for a request that cannot be met (a
/// --device cuda:N that is not visible, cuda without a GPU, --parallel < 0).
Plan plan(const Resources &resources, const Request &request);

/// CUDA_VISIBLE_DEVICES id of visible ordinal `ordinal` given the parent's own setting
/// (null or empty: every device is visible, so the id is the ordinal itself).
std::string visibleIdOf(int ordinal, const char *parentVisibleDevices);

/// MemAvailable of /proc/meminfo in bytes (0 when it cannot be read).
int64_t hostAvailableBytes();

/// One run of the queue.
struct Job {
  std::string name;                 ///< for messages (the attention)
  std::vector<std::string> argv;    ///< argv[0] is the program's path
  std::string logPath;              ///< the child's stdout and stderr, appended ("" = ours)
};

struct Outcome {
  std::string name, slot;
  int exitCode = -1;                ///< 128 + signal when killed; -1 when never started
  double seconds = 0;
};

struct QueueResult {
  std::vector<Outcome> outcomes;    ///< in the jobs' order
  double seconds = 0;               ///< wall time of the whole queue
  bool interrupted = false;         ///< SIGINT/SIGTERM arrived: the children were stopped
  int maxConcurrent = 0;            ///< the most children alive at once
};

struct QueueCallbacks {
  /// A line for the user (start, finish, status); defaults to nothing.
  std::function<void(const std::string &)> say;
  /// What a running job is doing (e.g. "step 3500"); asked for the periodic status line.
  std::function<std::string(size_t job)> progress;
  double statusEverySeconds = 60;   ///< 0: no periodic status line
};

/// Runs the jobs in order over the slots, each slot one child at a time. A child gets its
/// slot's args appended and CUDA_VISIBLE_DEVICES set when the slot pins one. Returns when every
/// job has finished, or when SIGINT/SIGTERM arrives (the children get SIGTERM, are waited for,
/// and the jobs not started keep exitCode -1).
QueueResult runQueue(const std::vector<Job> &jobs, const std::vector<Slot> &slots,
                     const QueueCallbacks &callbacks = {});

} // namespace spectra::sweep

#endif // SPECTRA_MODELS_SWEEP_H
