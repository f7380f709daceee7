//===- SweepTest.cpp - spectra-train sweep's plan and process queue -------===//
//
// The plan: how many runs go at once and where, from synthetic resources (no GPU is needed to
// test the GPU plans). The queue: real child processes (/bin/sh), their concurrency, their
// pinning, their logs and exit codes, and an interrupted queue.
//
//===----------------------------------------------------------------------===//

#include "models/Sweep.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>

using namespace spectra::sweep;

namespace {

constexpr int64_t GiB = int64_t(1) << 30;

Resources gpus(int n, int64_t freeBytes, int cores) {
  Resources r;
  r.cpuCores = cores;
  r.hostAvailableBytes = 100 * GiB;
  for (int i = 0; i < n; ++i)
    r.gpus.push_back({i, std::to_string(i), "Test GPU", freeBytes, 80 * GiB});
  return r;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tempDir() {
  char pattern[] = "/tmp/spectra-sweep-test-XXXXXX";
  const char *dir = ::mkdtemp(pattern);
  EXPECT_NE(dir, nullptr);
  return dir ? dir : "/tmp";
}

} // namespace

TEST(SweepPlan, CpuSharesTheCoresOutAndIsBoundByHostMemory) {
  Resources r;
  r.cpuCores = 8;
  r.hostAvailableBytes = 100 * GiB;
  Request q;
  q.runs = 19;
  Plan p = plan(r, q);
  ASSERT_EQ(p.slots.size(), 8u);  // one run per core
  EXPECT_EQ(p.threadsPerRun, 1);
  EXPECT_EQ(p.slots[0].label, "cpu");
  EXPECT_EQ(p.slots[0].args, (std::vector<std::string>{"--device", "cpu", "--threads", "1"}));
  EXPECT_TRUE(p.slots[0].cudaVisibleDevices.empty());
  EXPECT_TRUE(p.warnings.empty());

  // 5 GiB available, runs of 2 GiB: 0.9 * 5 / 2 = 2 at once, 4 threads each.
  r.hostAvailableBytes = 5 * GiB;
  q.runBytes = 2 * GiB;
  p = plan(r, q);
  EXPECT_EQ(p.slots.size(), 2u);
  EXPECT_EQ(p.threadsPerRun, 4);
  EXPECT_NE(p.explanation.find("fits 2 run(s)"), std::string::npos) << p.explanation;

  // Fewer runs than cores: no idle slots; the threads go to the runs.
  r.hostAvailableBytes = 100 * GiB;
  q.runs = 3;
  p = plan(r, q);
  EXPECT_EQ(p.slots.size(), 3u);
  EXPECT_EQ(p.threadsPerRun, 2);
}

TEST(SweepPlan, CpuHonoursParallelAndThreadsAndWarnsWhenOversubscribed) {
  Resources r;
  r.cpuCores = 2;
  r.hostAvailableBytes = 3 * GiB;
  Request q;
  q.runs = 4;
  q.parallel = 4;
  q.runBytes = 2 * GiB;
  Plan p = plan(r, q);
  EXPECT_EQ(p.slots.size(), 4u);
  EXPECT_EQ(p.threadsPerRun, 1);
  ASSERT_EQ(p.warnings.size(), 2u);
  EXPECT_NE(p.warnings[0].find("may not fit the host's"), std::string::npos) << p.warnings[0];
  EXPECT_EQ(p.warnings[1], "4 runs x 1 thread(s) oversubscribe the 2 CPU cores");
  q.parallel = 1;
  q.threads = 2;
  p = plan(r, q);
  EXPECT_EQ(p.slots.size(), 1u);
  EXPECT_EQ(p.slots[0].args.back(), "2");
  EXPECT_TRUE(p.warnings.empty());
}

TEST(SweepPlan, GpuRunsAreBoundByFreeMemoryAndCoresAndSpreadOverDevices) {
  Request q;
  q.runs = 19;
  // Two 80 GiB GPUs, 16 cores: memory allows 0.9 * 78 / 3.75 = 18 per GPU, the cores 8.
  Plan p = plan(gpus(2, 78 * GiB, 16), q);
  EXPECT_EQ(p.perDevice, 8);
  ASSERT_EQ(p.slots.size(), 16u);
  EXPECT_EQ(p.threadsPerRun, 1);
  // Round robin: cuda:0, cuda:1, cuda:0, ...; each child sees its GPU as cuda:0.
  EXPECT_EQ(p.slots[0].label, "cuda:0");
  EXPECT_EQ(p.slots[1].label, "cuda:1");
  EXPECT_EQ(p.slots[2].label, "cuda:0");
  EXPECT_EQ(p.slots[1].cudaVisibleDevices, "1");
  EXPECT_EQ(p.slots[1].args, (std::vector<std::string>{"--device", "cuda:0", "--threads", "1"}));

  // Memory-bound: 10 GiB free, runs of 1 GiB (+0.75 GiB context): 0.9 * 10 / 1.75 = 5.
  q.runBytes = 1 * GiB;
  p = plan(gpus(1, 10 * GiB, 16), q);
  EXPECT_EQ(p.perDevice, 5);
  EXPECT_EQ(p.slots.size(), 5u);
  EXPECT_EQ(p.threadsPerRun, 3);  // 16 cores / 5 runs
  EXPECT_NE(p.explanation.find("memory allows 5"), std::string::npos) << p.explanation;

  // Never more slots than runs need.
  q.runs = 3;
  p = plan(gpus(2, 78 * GiB, 16), q);
  EXPECT_EQ(p.perDevice, 2);
  EXPECT_EQ(p.slots.size(), 4u);

  // An explicit K beyond the memory is honoured with a warning.
  q.parallel = 12;
  p = plan(gpus(1, 10 * GiB, 16), q);
  EXPECT_EQ(p.slots.size(), 12u);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("room for 5"), std::string::npos) << p.warnings[0];
}

TEST(SweepPlan, DeviceSelectionAndErrors) {
  Request q;
  q.runs = 4;
  q.device = "cuda:1";
  Resources r = gpus(2, 78 * GiB, 16);
  r.gpus[1].visibleId = "7";  // the parent itself sees CUDA_VISIBLE_DEVICES=3,7
  Plan p = plan(r, q);
  for (const Slot &s : p.slots) {
    EXPECT_EQ(s.label, "cuda:1");
    EXPECT_EQ(s.cudaVisibleDevices, "7");
  }
  q.device = "cuda:2";
  EXPECT_THROW(
      {
        try {
          plan(r, q);
        } catch (const std::invalid_argument &e) {
          EXPECT_STREQ(e.what(), "--device cuda:2 is not visible (visible: cuda:0 to cuda:1)");
          throw;
        }
      },
      std::invalid_argument);
  q.device = "cuda";
  Resources none;
  none.cpuCores = 2;
  try {
    plan(none, q);
    FAIL() << "cuda without a GPU was accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_STREQ(e.what(), "--device cuda: no CUDA device is visible to this process");
  }
  q.device = "tpu";
  EXPECT_THROW(plan(none, q), std::invalid_argument);
  // --device cpu on a GPU machine stays on the CPU.
  q.device = "cpu";
  p = plan(r, q);
  EXPECT_EQ(p.slots[0].label, "cpu");
  EXPECT_TRUE(p.slots[0].cudaVisibleDevices.empty());

  EXPECT_EQ(visibleIdOf(1, "3,7"), "7");
  EXPECT_EQ(visibleIdOf(0, "GPU-1a2b,GPU-3c4d"), "GPU-1a2b");
  EXPECT_EQ(visibleIdOf(2, nullptr), "2");
  EXPECT_EQ(visibleIdOf(2, ""), "2");
}

TEST(SweepQueue, RunsAtMostOnePerSlotInOrderPinnedAndLogged) {
  std::string dir = tempDir();
  // Each job records its start and end (with the slot's args and pinning) in a shared file,
  // so the overlap can be reconstructed.
  std::vector<Job> jobs;
  for (int i = 0; i < 5; ++i) {
    std::string script = "echo start " + std::to_string(i) + " $CUDA_VISIBLE_DEVICES \"$@\" >> " + dir +
                         "/events; sleep 0.3; echo end " + std::to_string(i) + " >> " + dir +
                         "/events; echo hello from job " + std::to_string(i);
    jobs.push_back({"job" + std::to_string(i), {"/bin/sh", "-c", script, "sh"}, dir + "/job" + std::to_string(i) + ".log"});
  }
  jobs[3].argv[2] += "; exit 3";
  std::vector<Slot> slots = {{"cuda:0", "0", {"--device", "cuda:0"}}, {"cuda:1", "5", {"--device", "cuda:0"}}};
  std::vector<std::string> lines;
  QueueCallbacks cb;
  cb.say = [&](const std::string &l) { lines.push_back(l); };
  QueueResult r = runQueue(jobs, slots, cb);
  EXPECT_FALSE(r.interrupted);
  EXPECT_EQ(r.maxConcurrent, 2);
  ASSERT_EQ(r.outcomes.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.outcomes[i].exitCode, i == 3 ? 3 : 0) << i;
    EXPECT_GE(r.outcomes[i].seconds, 0.25) << i;
    EXPECT_EQ(readFile(dir + "/job" + std::to_string(i) + ".log"), "hello from job " + std::to_string(i) + "\n");
  }
  // Two at a time: 3 waves of 0.3 s, not 5 (and not 1).
  EXPECT_GE(r.seconds, 0.85);
  EXPECT_LT(r.seconds, 1.45);
  // At no point more than two jobs between start and end (the two children of a wave may
  // write in either order).
  std::istringstream events(readFile(dir + "/events"));
  std::string word, rest;
  int alive = 0, maxAlive = 0, nextStart = 0;
  std::set<std::string> pins;
  while (events >> word) {
    int id;
    events >> id;
    std::getline(events, rest);
    if (word == "start") {
      ++nextStart;
      pins.insert(rest);
      maxAlive = std::max(maxAlive, ++alive);
    } else {
      --alive;
    }
  }
  EXPECT_EQ(nextStart, 5);
  EXPECT_EQ(maxAlive, 2);
  EXPECT_EQ(pins, (std::set<std::string>{" 0 --device cuda:0", " 5 --device cuda:0"}));
  // The user sees every start (in the jobs' order) and every end, the failure with its log.
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_EQ(lines[0], "[1/5 started] job0 on cuda:0 (log: " + dir + "/job0.log)");
  int started = 0;
  for (auto &l : lines) {
    if (l.find(" started] ") == std::string::npos)
      continue;
    std::string expected = "[" + std::to_string(started + 1) + "/5 started] job" + std::to_string(started);
    EXPECT_EQ(l.rfind(expected, 0), 0u) << l;
    ++started;
  }
  EXPECT_EQ(started, 5);
  bool failureSaid = false;
  for (auto &l : lines)
    failureSaid = failureSaid || (l.find("job3 on ") != std::string::npos &&
                                  l.find("failed (exit 3)") != std::string::npos &&
                                  l.find("see " + dir + "/job3.log") != std::string::npos);
  EXPECT_TRUE(failureSaid);
}

TEST(SweepQueue, AProgramThatCannotRunFailsWithItsReason) {
  std::string dir = tempDir();
  QueueResult r = runQueue({{"missing", {dir + "/no-such-program"}, dir + "/missing.log"}}, {{"cpu", "", {}}});
  ASSERT_EQ(r.outcomes.size(), 1u);
  EXPECT_EQ(r.outcomes[0].exitCode, 127);
  EXPECT_NE(readFile(dir + "/missing.log").find("cannot run '" + dir + "/no-such-program'"), std::string::npos);
}

TEST(SweepQueue, ASignalStopsTheRunsAndLeavesTheRestQueued) {
  // Each run starts a child of its own that would leave a file behind if it outlived the
  // interrupt: the queue stops a run's whole process group.
  std::string dir = tempDir();
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i)
    jobs.push_back({"sleeper" + std::to_string(i),
                    {"/bin/sh", "-c", "(sleep 1; touch " + dir + "/survivor" + std::to_string(i) +
                                          ") & sleep 20"},
                    ""});
  std::thread interrupter([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    ::kill(::getpid(), SIGTERM);
  });
  std::vector<std::string> lines;
  QueueCallbacks cb;
  cb.say = [&](const std::string &l) { lines.push_back(l); };
  QueueResult r = runQueue(jobs, {{"cpu", "", {}}, {"cpu", "", {}}}, cb);
  interrupter.join();
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_EQ(r.outcomes[0].exitCode, 128 + SIGTERM);
  EXPECT_EQ(r.outcomes[1].exitCode, 128 + SIGTERM);
  EXPECT_EQ(r.outcomes[2].exitCode, -1);  // never started
  EXPECT_EQ(r.outcomes[3].exitCode, -1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (int i = 0; i < 2; ++i)
    EXPECT_FALSE(std::ifstream(dir + "/survivor" + std::to_string(i)).good())
        << "run " << i << "'s child outlived the interrupt";
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "interrupted (signal 15): stopping 2 run(s); rerun the same sweep to resume them");
  // The process's own SIGTERM handling is restored.
  struct sigaction now = {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST(SweepQueue, PeriodicStatusNamesTheRunningJobsAndTheirProgress) {
  std::vector<Job> jobs = {{"a", {"/bin/sh", "-c", "sleep 0.5"}, ""}, {"b", {"/bin/sh", "-c", "sleep 0.5"}, ""},
                           {"c", {"/bin/sh", "-c", "sleep 0.1"}, ""}};
  std::vector<std::string> lines;
  QueueCallbacks cb;
  cb.say = [&](const std::string &l) { lines.push_back(l); };
  cb.progress = [](size_t j) { return "step " + std::to_string(100 * (j + 1)); };
  cb.statusEverySeconds = 0.2;
  runQueue(jobs, {{"cpu", "", {}}, {"cpu", "", {}}}, cb);
  bool status = false;
  for (auto &l : lines)
    status = status || (l.rfind("[status ", 0) == 0 &&
                        l.find("0 done, 2 running, 1 queued: a (cpu, step 100) b (cpu, step 200)") != std::string::npos);
  EXPECT_TRUE(status);
}
