//===- Sweep.cpp - concurrent training runs: the plan and the process queue -===//

#include "models/Sweep.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace spectra::sweep {
namespace {

std::string gibString(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << bytes / 1073741824.0 << " GiB";
  return os.str();
}

int64_t atLeastOne(int64_t x) { return std::max<int64_t>(1, x); }

} // namespace

std::string visibleIdOf(int ordinal, const char *parentVisibleDevices) {
  if (!parentVisibleDevices || !*parentVisibleDevices)
    return std::to_string(ordinal);
  std::stringstream list(parentVisibleDevices);
  std::string item;
  for (int i = 0; std::getline(list, item, ','); ++i)
    if (i == ordinal)
      return item;
  return std::to_string(ordinal);
}

int64_t hostAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value >> unit)
    if (key == "MemAvailable:")
      return value * 1024;
  return 0;
}

Plan plan(const Resources &res, const Request &req) {
  if (req.parallel < 0)
    throw std::invalid_argument("--parallel must be at least 1 (or left out to choose from the memory), got " +
                                std::to_string(req.parallel));
  if (req.threads < 0)
    throw std::invalid_argument("--threads must be positive");
  const std::string &device = req.device;
  bool cuda = device.rfind("cuda", 0) == 0;
  if (!cuda && device != "auto" && device != "cpu")
    throw std::invalid_argument("unknown --device '" + device + "' (auto, cpu, cuda or cuda:N)");
  if (cuda && res.gpus.empty())
    throw std::invalid_argument("--device " + device + ": no CUDA device is visible to this process");
  int64_t cores = atLeastOne(res.cpuCores);
  int64_t runs = atLeastOne(static_cast<int64_t>(req.runs));
  Plan p;

  if (device == "cpu" || (device == "auto" && res.gpus.empty())) {
    int64_t runBytes = req.runBytes > 0 ? req.runBytes : kDefaultCpuRunBytes;
    int64_t byMemory = res.hostAvailableBytes > 0
                           ? atLeastOne(static_cast<int64_t>(kMemoryShare * res.hostAvailableBytes / runBytes))
                           : cores;
    int64_t k = req.parallel > 0 ? req.parallel : std::min({cores, byMemory, runs});
    if (req.parallel > byMemory && res.hostAvailableBytes > 0)
      p.warnings.push_back("--parallel " + std::to_string(req.parallel) + " runs of ~" + gibString(runBytes) +
                           " may not fit the host's " + gibString(res.hostAvailableBytes) + " available");
    p.threadsPerRun = req.threads > 0 ? req.threads : atLeastOne(cores / k);
    if (k * p.threadsPerRun > cores)
      p.warnings.push_back(std::to_string(k) + " runs x " + std::to_string(p.threadsPerRun) +
                           " thread(s) oversubscribe the " + std::to_string(cores) + " CPU cores");
    p.perDevice = static_cast<int>(k);
    for (int64_t i = 0; i < k; ++i)
      p.slots.push_back({"cpu", "", {"--device", "cpu", "--threads", std::to_string(p.threadsPerRun)}});
    std::ostringstream os;
    os << k << " run(s) at once on the CPU, " << p.threadsPerRun << " thread(s) each (" << cores
       << " cores";
    if (res.hostAvailableBytes > 0)
      os << "; " << gibString(res.hostAvailableBytes) << " available fits " << byMemory << " run(s) of ~"
         << gibString(runBytes);
    os << (req.parallel > 0 ? "; --parallel given" : "") << ")";
    p.explanation = os.str();
    return p;
  }

  std::vector<const Gpu *> gpus;
  if (device.rfind("cuda:", 0) == 0) {
    std::string index = device.substr(5);
    for (const Gpu &g : res.gpus)
      if (std::to_string(g.ordinal) == index)
        gpus.push_back(&g);
    if (gpus.empty())
      throw std::invalid_argument("--device " + device + " is not visible (visible: cuda:0 to cuda:" +
                                  std::to_string(res.gpus.size() - 1) + ")");
  } else {
    for (const Gpu &g : res.gpus)
      gpus.push_back(&g);
  }
  int64_t n = static_cast<int64_t>(gpus.size());
  int64_t runBytes = req.runBytes > 0 ? req.runBytes : kDefaultGpuRunBytes;
  int64_t need = runBytes + kCudaProcessOverheadBytes;
  int64_t byMemory = INT64_MAX;
  for (const Gpu *g : gpus)
    byMemory = std::min<int64_t>(byMemory, atLeastOne(static_cast<int64_t>(kMemoryShare * g->freeBytes / need)));
  int64_t coresPerDevice = atLeastOne(cores / n);
  int64_t k = req.parallel > 0 ? req.parallel
                               : std::min({byMemory, coresPerDevice, atLeastOne((runs + n - 1) / n)});
  if (req.parallel > byMemory)
    p.warnings.push_back("--parallel " + std::to_string(req.parallel) + " runs of ~" + gibString(need) +
                         " may not fit a device's free memory (room for " + std::to_string(byMemory) + ")");
  p.threadsPerRun = req.threads > 0 ? req.threads : atLeastOne(cores / (k * n));
  p.perDevice = static_cast<int>(k);
  // Round-robin over the devices, so the first runs spread over all of them.
  for (int64_t r = 0; r < k; ++r)
    for (const Gpu *g : gpus)
      p.slots.push_back({"cuda:" + std::to_string(g->ordinal), g->visibleId,
                         {"--device", "cuda:0", "--threads", std::to_string(p.threadsPerRun)}});
  std::ostringstream os;
  os << k << " run(s) at once on each of " << n << " GPU(s) (";
  for (size_t i = 0; i < gpus.size(); ++i)
    os << (i ? ", " : "") << "cuda:" << gpus[i]->ordinal << " " << gpus[i]->name << ", "
       << gibString(gpus[i]->freeBytes) << " free of " << gibString(gpus[i]->totalBytes);
  os << "; a run needs ~" << gibString(need) << ": " << gibString(runBytes) << " peak + "
     << gibString(kCudaProcessOverheadBytes) << " for its CUDA context; memory allows " << byMemory
     << ", " << cores << " CPU cores allow " << coresPerDevice << " per GPU"
     << (req.parallel > 0 ? "; --parallel given" : "") << "), " << p.threadsPerRun
     << " CPU thread(s) per run";
  p.explanation = os.str();
  return p;
}

// --- the process queue ---------------------------------------------------------------------

namespace {

volatile std::sig_atomic_t gStopSignal = 0;

void onStopSignal(int signal) { gStopSignal = signal; }

struct Running {
  pid_t pid;
  size_t job, slot;
  std::chrono::steady_clock::time_point start;
};

[[noreturn]] void execChild(const Job &job, const Slot &slot) {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!slot.cudaVisibleDevices.empty())
    ::setenv("CUDA_VISIBLE_DEVICES", slot.cudaVisibleDevices.c_str(), 1);
  if (!job.logPath.empty()) {
    int fd = ::open(job.logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "spectra-train: cannot open the run's log '%s': %s\n", job.logPath.c_str(),
                   std::strerror(errno));
      ::_exit(126);
    }
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::vector<std::string> args = job.argv;
  args.insert(args.end(), slot.args.begin(), slot.args.end());
  std::vector<char *> cargs;
  for (auto &s : args)
    cargs.push_back(const_cast<char *>(s.c_str()));
  cargs.push_back(nullptr);
  ::execv(cargs[0], cargs.data());
  std::fprintf(stderr, "spectra-train: cannot run '%s': %s\n", cargs[0], std::strerror(errno));
  ::_exit(127);
}

int exitCodeOf(int status) {
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

std::string seconds(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 100 ? 1 : 0) << s << " s";
  return os.str();
}

} // namespace

QueueResult runQueue(const std::vector<Job> &jobs, const std::vector<Slot> &slots,
                     const QueueCallbacks &cb) {
  if (slots.empty())
    throw std::invalid_argument("runQueue: no slots");
  auto say = [&](const std::string &line) {
    if (cb.say)
      cb.say(line);
  };
  using Clock = std::chrono::steady_clock;
  QueueResult result;
  result.outcomes.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    result.outcomes[i].name = jobs[i].name;

  struct sigaction stop = {}, oldInt = {}, oldTerm = {};
  stop.sa_handler = onStopSignal;
  sigemptyset(&stop.sa_mask);
  gStopSignal = 0;
  ::sigaction(SIGINT, &stop, &oldInt);
  ::sigaction(SIGTERM, &stop, &oldTerm);

  auto begin = Clock::now(), lastStatus = begin;
  std::vector<bool> slotBusy(slots.size(), false);
  std::vector<Running> running;
  size_t next = 0, finished = 0;
  auto reap = [&](pid_t pid, int status) {
    auto it = std::find_if(running.begin(), running.end(), [&](const Running &r) { return r.pid == pid; });
    if (it == running.end())
      return;
    Outcome &o = result.outcomes[it->job];
    o.exitCode = exitCodeOf(status);
    o.seconds = std::chrono::duration<double>(Clock::now() - it->start).count();
    slotBusy[it->slot] = false;
    ++finished;
    std::ostringstream os;
    os << "[" << finished << "/" << jobs.size() << " done] " << o.name << " on " << o.slot
       << (o.exitCode == 0 ? " finished" : " failed (exit " + std::to_string(o.exitCode) + ")")
       << " after " << seconds(o.seconds);
    if (o.exitCode != 0 && !jobs[it->job].logPath.empty())
      os << "; see " << jobs[it->job].logPath;
    if (!gStopSignal)
      say(os.str());
    running.erase(it);
  };

  while (true) {
    while (!gStopSignal && next < jobs.size()) {
      auto freeSlot = std::find(slotBusy.begin(), slotBusy.end(), false);
      if (freeSlot == slotBusy.end())
        break;
      size_t s = static_cast<size_t>(freeSlot - slotBusy.begin());
      size_t j = next++;
      pid_t pid = ::fork();
      if (pid < 0) {
        ::sigaction(SIGINT, &oldInt, nullptr);
        ::sigaction(SIGTERM, &oldTerm, nullptr);
        throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
      }
      if (pid == 0) {
        // Each run leads its own process group, so an interrupt stops what the run started
        // too (a wrapper script's children), not only its first process.
        ::setpgid(0, 0);
        execChild(jobs[j], slots[s]);
      }
      ::setpgid(pid, pid);  // also here: the child may not have run yet when a signal comes
      slotBusy[s] = true;
      running.push_back({pid, j, s, Clock::now()});
      result.outcomes[j].slot = slots[s].label;
      result.maxConcurrent = std::max(result.maxConcurrent, static_cast<int>(running.size()));
      say("[" + std::to_string(j + 1) + "/" + std::to_string(jobs.size()) + " started] " + jobs[j].name +
          " on " + slots[s].label + (jobs[j].logPath.empty() ? "" : " (log: " + jobs[j].logPath + ")"));
    }
    if (running.empty())
      break;
    if (gStopSignal) {
      say("interrupted (signal " + std::to_string(gStopSignal) + "): stopping " +
          std::to_string(running.size()) + " run(s); rerun the same sweep to resume them");
      for (const Running &r : running)
        if (::kill(-r.pid, SIGTERM) != 0)
          ::kill(r.pid, SIGTERM);
      while (!running.empty()) {
        int status = 0;
        pid_t pid = ::waitpid(running.front().pid, &status, 0);
        if (pid < 0 && errno == EINTR)
          continue;
        if (pid < 0) {
          running.erase(running.begin());
          continue;
        }
        reap(pid, status);
      }
      result.interrupted = true;
      break;
    }
    bool reaped = false;
    for (size_t i = 0; i < running.size();) {
      int status = 0;
      pid_t pid = running[i].pid;
      pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        reap(pid, status), reaped = true;
        continue;
      }
      ++i;
    }
    if (!reaped)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (cb.statusEverySeconds > 0 && !running.empty() &&
        std::chrono::duration<double>(Clock::now() - lastStatus).count() >= cb.statusEverySeconds) {
      lastStatus = Clock::now();
      std::ostringstream os;
      os << "[status " << seconds(std::chrono::duration<double>(lastStatus - begin).count()) << "] "
         << finished << " done, " << running.size() << " running, " << jobs.size() - next << " queued:";
      for (const Running &r : running) {
        os << " " << jobs[r.job].name << " (" << slots[r.slot].label;
        if (cb.progress) {
          std::string p = cb.progress(r.job);
          if (!p.empty())
            os << ", " << p;
        }
        os << ")";
      }
      say(os.str());
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
  ::sigaction(SIGINT, &oldInt, nullptr);
  ::sigaction(SIGTERM, &oldTerm, nullptr);
  return result;
}

} // namespace spectra::sweep
