//===- TrainerPartsTest.cpp - the trainer's parts, one by one -------------===//
//
// Batches (the order and the ranks' shares), Checkpoint (a round trip, the
// trajectory check, the metrics truncation), Progress (durations, a silent
// rank), Devices (the errors), Distributed (the launcher's variables; two ranks
// as two threads of this process over Gloo on 127.0.0.1: bucketed averaging,
// the identical-state check, a lone rank's timeout) and Evaluation (shared out
// over two ranks, it gives the one-process figures). The loop itself is tested
// end to end by test/Tools/spectra-train-*.test.
//
//===----------------------------------------------------------------------===//

#include "models/Batches.h"
#include "models/Checkpoint.h"
#include "models/Devices.h"
#include "models/Distributed.h"
#include "models/Evaluation.h"
#include "models/Progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unistd.h>

namespace {
using namespace spectra::models;

std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "(no error)";
}

// --- Batches -------------------------------------------------------------------------------

TEST(Batches, OrderIsAFunctionOfSeedAndStep) {
  BatchOrder a(50, 8, 3), b(50, 8, 3), other(50, 8, 4);
  std::vector<int64_t> late = a.indices(17);  // a later epoch first
  EXPECT_EQ(b.indices(0), a.indices(0));
  EXPECT_EQ(b.indices(17), late);
  EXPECT_NE(other.indices(0), a.indices(0));
  // An epoch (6 steps of 8 from 50) visits distinct examples.
  std::set<int64_t> seen;
  for (int64_t s = 0; s < 6; ++s)
    for (int64_t i : a.indices(s))
      seen.insert(i);
  EXPECT_EQ(seen.size(), 48u);
}

TEST(Batches, RanksShareTheGlobalBatchContiguously) {
  std::vector<int64_t> global = {5, 1, 9, 2, 7, 3};
  EXPECT_EQ(shardOf(global, 0, 2), (std::vector<int64_t>{5, 1, 9}));
  EXPECT_EQ(shardOf(global, 1, 2), (std::vector<int64_t>{2, 7, 3}));
  EXPECT_EQ(shardOf(global, 2, 3), (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(shardOf(global, 0, 1), global);
  EXPECT_EQ(errorOf([&] { shardOf(global, 0, 4); }),
            "shardOf: a batch of 6 cannot be split evenly over 4 ranks (rank 0)");
}

// --- Progress ------------------------------------------------------------------------------

TEST(Progress, DurationsAndASilentRank) {
  EXPECT_EQ(duration(42.4), "42s");
  EXPECT_EQ(duration(187), "3m07s");
  EXPECT_EQ(duration(7500), "2h05m");
  std::ostringstream speaking, silent;
  Progress(speaking, false, "listops softmax", 10).say("hello");
  Progress(silent, true, "listops softmax", 10, /*silent=*/true).say("hello");
  EXPECT_EQ(speaking.str(), "[listops softmax] hello\n");
  EXPECT_EQ(silent.str(), "");
}

// --- Devices -------------------------------------------------------------------------------

TEST(Devices, ErrorsNameTheValidChoices) {
  EXPECT_EQ(pickDevice("cpu"), torch::Device(torch::kCPU));
  EXPECT_EQ(errorOf([] { pickDevice("tpu"); }),
            "unknown device 'tpu'; use auto, cpu, gpu-emulated or cuda[:N]");
  EXPECT_EQ(errorOf([] { pickPrecision("bf16", torch::Device(torch::kCPU)); }),
            "--precision bf16 is mixed precision on CUDA; the CPU trains in fp32 (use --precision fp32 or auto)");
  EXPECT_EQ(precisionName(pickPrecision("auto", torch::Device(torch::kCPU))), "fp32");
}

// --- Checkpoint ----------------------------------------------------------------------------

LraConfig smallModel() {
  LraConfig c;
  c.vocab = 20, c.classes = 5, c.maxLength = 32, c.embed = 16, c.layers = 1, c.heads = 2;
  c.headDim = 8, c.ffn = 32, c.dropout = 0, c.attention = "softmax";
  return c;
}

std::string temporaryDirectory() {
  char name[] = "/tmp/spectra-parts-XXXXXX";
  return ::mkdtemp(name);
}

TEST(Checkpoint, RoundTripAndTheTrajectoryCheck) {
  std::string dir = temporaryDirectory();
  TrainOptions o;
  o.batch = 8;
  nlohmann::json trajectory = trajectoryOf(o, "fp32", "cpu");
  torch::manual_seed(1);
  LraModel saved(smallModel());
  Counters c;
  c.step = 12, c.bestVal = 0.5, c.bestStep = 6;
  saveCheckpoint(dir + "/c.pt", saved, nullptr, c, trajectory);
  torch::manual_seed(2);
  LraModel loaded(smallModel());
  Counters back = loadCheckpoint(dir + "/c.pt", loaded, nullptr, trajectory, torch::kCPU);
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.bestStep, 6);
  auto a = saved->parameters(), b = loaded->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i]));
  o.batch = 16;
  EXPECT_EQ(errorOf([&] { loadCheckpoint(dir + "/c.pt", loaded, nullptr, trajectoryOf(o, "fp32", "cpu"), torch::kCPU); }),
            "cannot resume from '" + dir + "/c.pt': it was written with batch = 8, this run has batch = 16 "
            "(resume with the same options, or start a new --out)");
}

TEST(Checkpoint, MetricsAreTruncatedToTheCheckpointStep) {
  std::string path = temporaryDirectory() + "/metrics.jsonl";
  std::ofstream(path) << R"({"split":"train","step":3})" "\n" R"({"split":"val","step":6})" "\n"
                      << R"({"split":"train","step":9})" "\n" R"({"split":"test","step":6})" "\n"
                      << R"({"split":"tr)";
  truncateMetrics(path, 6);
  std::ifstream in(path);
  std::stringstream kept;
  kept << in.rdbuf();
  EXPECT_EQ(kept.str(), "{\"split\":\"train\",\"step\":3}\n{\"split\":\"val\",\"step\":6}\n");
}

// --- Distributed ---------------------------------------------------------------------------

using Variables = std::map<std::string, std::string>;
DistributedEnvironment environmentOf(const Variables &vars) {
  return readDistributedEnvironment([&](const std::string &name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

TEST(Distributed, TheLaunchersVariables) {
  EXPECT_EQ(environmentOf({}).worldSize, 1);
  EXPECT_EQ(environmentOf({{"WORLD_SIZE", "1"}}).worldSize, 1);
  auto env = environmentOf({{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"MASTER_ADDR", "node7"},
                            {"MASTER_PORT", "29500"}});
  EXPECT_EQ(env.worldSize, 4);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.localRank, 3);  // LOCAL_RANK defaults to RANK
  EXPECT_EQ(env.masterAddr, "node7");
  EXPECT_EQ(env.masterPort, 29500);
  EXPECT_EQ(environmentOf({{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"},
                           {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}).localRank, 1);
  EXPECT_EQ(errorOf([] { environmentOf({{"WORLD_SIZE", "two"}}); }),
            "WORLD_SIZE=two is not an integer in [1, 1048576] (set by the launcher: torchrun, srun or mpirun)");
  EXPECT_EQ(errorOf([] { environmentOf({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "a"},
                                        {"MASTER_PORT", "1"}}); }),
            "RANK=2 is not an integer in [0, 1] (set by the launcher: torchrun, srun or mpirun)");
  EXPECT_EQ(errorOf([] { environmentOf({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "a"}}); }),
            "WORLD_SIZE=2 but MASTER_PORT is not set: launch with torchrun --nproc-per-node K "
            "--no-python spectra-train train ..., or set RANK, MASTER_ADDR and MASTER_PORT as torchrun does");
}

/// A port for this test process (distinct across concurrently running test processes).
int64_t testPort(int64_t offset) { return 20000 + (::getpid() * 7 + offset) % 20000; }

/// Runs `body(rank, group)` on two ranks, each a thread joined at 127.0.0.1:port.
void onTwoRanks(int64_t port, const std::function<void(int64_t, Distributed &)> &body) {
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        DistributedEnvironment env{r, 2, r, "127.0.0.1", port};
        auto group = Distributed::join(env, torch::kCPU, std::chrono::seconds(30));
        body(r, *group);
      } catch (const std::exception &e) {
        errors[r] = e.what();
      }
    });
  for (auto &t : threads)
    t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(Distributed, TwoRanksAverageInBucketsAndCompare) {
  std::vector<std::vector<torch::Tensor>> results(2);
  std::vector<std::string> mismatch(2);
  onTwoRanks(testPort(1), [&](int64_t rank, Distributed &group) {
    EXPECT_TRUE(group.active());
    EXPECT_EQ(group.backend(), "gloo");
    torch::manual_seed(100 + rank);
    // 7M floats (28 MiB) pass the 25 MiB bucket: two buckets, and a double tensor a third.
    std::vector<torch::Tensor> t = {torch::randn({7 << 20}), torch::randn({3, 5}),
                                    torch::randn({4}, torch::kFloat64)};
    std::vector<torch::Tensor> mine;
    for (auto &x : t)
      mine.push_back(x.clone());
    group.averageInPlace(t, "the test's tensors");
    results[rank] = {mine[0], mine[1], mine[2], t[0], t[1], t[2]};
    group.checkIdentical({t[0], t[1], t[2]}, "averages");
    mismatch[rank] = errorOf([&] { group.checkIdentical({mine[1]}, "own tensors"); });
  });
  ASSERT_EQ(results[0].size(), 6u);
  for (int i = 0; i < 3; ++i) {
    torch::Tensor expected = (results[0][i] + results[1][i]) / 2;
    EXPECT_TRUE(torch::allclose(results[0][3 + i], expected, 1e-6, 1e-7)) << i;
    EXPECT_TRUE(torch::equal(results[0][3 + i], results[1][3 + i])) << i;
  }
  EXPECT_EQ(mismatch[0], "rank 0 of 2 (gloo): the ranks' own tensors differ (tensor 0 of 1); "
                         "data-parallel ranks must start from the same options and checkpoint");
}

TEST(Distributed, TheReducerAveragesGradientsDuringTheBackward) {
  // Each rank's loss over its own inputs; after backward() every rank holds the mean of the
  // ranks' gradients (computed here without the group for comparison), over several buckets.
  auto inputs = [](int64_t rank) {
    torch::manual_seed(50 + rank);
    return torch::randn({6, 300});
  };
  auto model = [] {
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(300, 900), torch::nn::Tanh(), torch::nn::Linear(900, 4));
  };
  // Models and inputs are made here, not in the ranks' threads: torch's generator is global,
  // and two threads drawing from it at once would interleave their draws.
  std::vector<std::vector<torch::Tensor>> own(2), reduced(2);
  std::vector<torch::Tensor> x = {inputs(0), inputs(1)};
  std::vector<torch::nn::Sequential> models = {model(), model()};
  for (int64_t r = 0; r < 2; ++r) {
    auto m = model();
    m->forward(x[r]).square().sum().backward();
    for (auto &p : m->parameters())
      own[r].push_back(p.grad().clone());
  }
  onTwoRanks(testPort(6), [&](int64_t rank, Distributed &group) {
    auto &m = models[rank];
    group.attachReducer(m->parameters());
    for (int step = 0; step < 2; ++step) {  // a second backward: the reducer starts each afresh
      for (auto &p : m->parameters())
        p.mutable_grad() = torch::Tensor();
      group.backward(m->forward(x[rank]).square().sum(), "the test's backward");
    }
    for (auto &p : m->parameters())
      reduced[rank].push_back(p.grad().clone());
  });
  ASSERT_EQ(reduced[0].size(), own[0].size());
  for (size_t i = 0; i < own[0].size(); ++i) {
    torch::Tensor mean = (own[0][i] + own[1][i]) / 2;
    // The ranks' float32 gradients come from matmuls partitioned by however many threads were
    // free, so they round differently from the ones computed here (measured up to 2.3e-5 of the
    // largest entry on a loaded 2-core machine): a bound relative to the tensor's largest entry,
    // four orders below what the sum or either rank's own gradient would miss by.
    auto off = [&](const torch::Tensor &t) { return (reduced[0][i] - t).abs().max().item<double>(); };
    double scale = mean.abs().max().item<double>();
    EXPECT_LE(off(mean), 1e-4 * scale)
        << "parameter " << i << ": from rank 0's own " << off(own[0][i]) << ", rank 1's own "
        << off(own[1][i]) << ", the sum " << off(own[0][i] + own[1][i]);
    EXPECT_TRUE(torch::equal(reduced[0][i], reduced[1][i])) << i;
  }
}

TEST(Distributed, ALoneRankEndsWithinTheTimeout) {
  DistributedEnvironment env{0, 2, 0, "127.0.0.1", testPort(2)};
  auto start = std::chrono::steady_clock::now();
  std::string error = errorOf([&] { Distributed::join(env, torch::kCPU, std::chrono::seconds(2)); });
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("rank 0 of 2 (gloo): the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                       std::to_string(env.masterPort) + " did not complete within 2 s: rank 0 "
                       "serves it and waits for all WORLD_SIZE=2 ranks"), std::string::npos) << error;
  EXPECT_LT(waited, 20.0);
}

struct HungPeer {
  std::string error, peerError;  ///< rank 0's error from `call`, and rank 1's (none expected)
  double waited = 0;             ///< how long `call` took on rank 0
};

/// Two ranks joined with a 2 s timeout; both run `prepare`, then rank 0 runs `call` while rank 1
/// never takes part (it sleeps `hangSeconds`, then leaves).
HungPeer againstAHungPeer(int64_t port, double hangSeconds,
                          const std::function<void(int64_t, Distributed &)> &prepare,
                          const std::function<void(Distributed &)> &call) {
  HungPeer result;
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::string &error = r == 0 ? result.error : result.peerError;
      try {
        DistributedEnvironment env{r, 2, r, "127.0.0.1", port};
        auto group = Distributed::join(env, torch::kCPU, std::chrono::seconds(2));
        prepare(r, *group);
        if (r == 1) {
          std::this_thread::sleep_for(std::chrono::duration<double>(hangSeconds));
          return;
        }
        auto start = std::chrono::steady_clock::now();
        error = errorOf([&] { call(*group); });
        result.waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } catch (const std::exception &e) {
        error = std::string("setup: ") + e.what();
      }
    });
  for (auto &t : threads)
    t.join();
  return result;
}

TEST(Distributed, AHungRankEndsItsPeersCollectiveWithinTheTimeout) {
  HungPeer r = againstAHungPeer(testPort(4), 5, [](int64_t, Distributed &) {}, [](Distributed &group) {
    group.sumInPlace({torch::ones({4})}, "the gradients of step 3");
  });
  EXPECT_EQ(r.error.rfind("rank 0 of 2 (gloo): the gradients of step 3 failed (a peer rank died, "
                          "hung past the 2 s timeout, or was stopped); resume the run from its last "
                          "checkpoint with --resume: ", 0), 0u) << r.error;
  EXPECT_LT(r.waited, 4.9);  // the timeout ended it, not rank 1 leaving
  EXPECT_EQ(r.peerError, "");
}

TEST(Distributed, AHungRankEndsItsPeersBackwardWithinTheTimeout) {
  // --grad-sync overlap: the all-reduces run inside the backward; a peer that never joins
  // them ends it within the timeout too, with the same message.
  torch::manual_seed(1);
  std::vector<torch::nn::Linear> layers = {torch::nn::Linear(8, 3), torch::nn::Linear(8, 3)};
  HungPeer r = againstAHungPeer(
      testPort(7), 6,
      [&](int64_t rank, Distributed &group) { group.attachReducer(layers[rank]->parameters()); },
      [&](Distributed &group) {
        group.backward(layers[0]->forward(torch::ones({2, 8})).sum(), "the backward of step 5");
      });
  EXPECT_EQ(r.error.rfind("rank 0 of 2 (gloo): the backward of step 5 failed (a peer rank died, "
                          "hung past the 2 s timeout, or was stopped)", 0), 0u) << r.error;
  EXPECT_LT(r.waited, 5.9);
  EXPECT_EQ(r.peerError, "");
}

TEST(Distributed, NcclAveragesOverTwoGpus) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2)
    GTEST_SKIP() << "NCCL needs 2 CUDA devices, this machine has "
                 << (torch::cuda::is_available() ? torch::cuda::device_count() : 0)
                 << " (the NCCL path is compiled and runs where there are two)";
  std::vector<torch::Tensor> averaged(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  int64_t port = testPort(5);
  for (int64_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        torch::Device gpu(torch::kCUDA, static_cast<c10::DeviceIndex>(r));
        DistributedEnvironment env{r, 2, r, "127.0.0.1", port};
        auto group = Distributed::join(env, gpu, std::chrono::seconds(60));
        EXPECT_EQ(group->backend(), "nccl");
        torch::Tensor t = torch::full({1000}, static_cast<float>(r + 1), torch::TensorOptions().device(gpu));
        group->averageInPlace({t}, "the test's tensor");
        averaged[r] = t.cpu();
      } catch (const std::exception &e) {
        errors[r] = e.what();
      }
    });
  for (auto &t : threads)
    t.join();
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "");
    EXPECT_TRUE(averaged[r].defined() && torch::allclose(averaged[r], torch::full({1000}, 1.5f)));
  }
}

TEST(Distributed, AGroupOfOneIsANoOp) {
  Distributed one;
  torch::Tensor t = torch::ones({3});
  one.averageInPlace({t}, "x");
  one.sumInPlace({t}, "x");
  one.checkIdentical({t}, "x");
  one.barrier("x");
  EXPECT_TRUE(torch::equal(t, torch::ones({3})));
  EXPECT_FALSE(one.active());
  EXPECT_EQ(one.backend(), "none");
}

// --- Evaluation ----------------------------------------------------------------------------

TEST(Evaluation, SharedOverTwoRanksGivesTheOneProcessFigures) {
  std::vector<spectra::data::Example> split;
  std::mt19937 rng(5);
  for (int i = 0; i < 37; ++i) {  // 5 batches of 8, the last short: rank 0 evaluates 3
    spectra::data::Example e;
    for (int j = 0, n = 3 + static_cast<int>(rng() % 20); j < n; ++j)
      e.tokens.push_back(1 + static_cast<int32_t>(rng() % 19));
    e.label = static_cast<int>(rng() % 5);
    split.push_back(e);
  }
  torch::manual_seed(3);
  LraModel model(smallModel());
  Distributed one;
  Evaluation whole = evaluate(model, split, 8, 0, false, torch::kCPU, torch::kFloat32, false, one);
  std::vector<Evaluation> shared(2);
  std::vector<LraModel> copies;  // made here: torch's generator is global (see above)
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(3);
    copies.emplace_back(smallModel());
  }
  onTwoRanks(testPort(3), [&](int64_t rank, Distributed &group) {
    shared[rank] = evaluate(copies[rank], split, 8, 0, false, torch::kCPU, torch::kFloat32, false, group);
  });
  for (auto &e : shared) {
    EXPECT_NEAR(e.loss, whole.loss, 1e-12 * std::abs(whole.loss));
    EXPECT_DOUBLE_EQ(e.accuracy, whole.accuracy);
    EXPECT_EQ(e.examples, 37);
  }
  EXPECT_GT(whole.loss, 0);
}

} // namespace
