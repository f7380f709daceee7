//===- Distributed.cpp - data parallelism through torch.distributed (c10d) ===//

#include "models/Distributed.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#ifdef SPECTRA_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef SPECTRA_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <stdexcept>

namespace spectra::models {

using Clock = std::chrono::steady_clock;

struct Distributed::Group {
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::string where;  // "rank R of K (gloo)"
  // The gradients' averaging during the backward (attachReducer).
  c10::intrusive_ptr<c10d::ProcessGroup> processGroup;
  std::unique_ptr<c10d::Reducer> reducer;
};

namespace {

int64_t parseInteger(const std::string &name, const std::string &text, int64_t low, int64_t high) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < low || value > high)
    throw std::invalid_argument(name + "=" + text + " is not an integer in [" + std::to_string(low) +
                                ", " + std::to_string(high) + "] (set by the launcher: torchrun, "
                                "srun or mpirun)");
  return value;
}

std::string seconds(std::chrono::milliseconds t) {
  return std::to_string(t.count() / 1000) + " s";
}

bool isLoopback(const std::string &address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

} // namespace

namespace {

[[noreturn]] void fail(const Distributed::Group &group, const std::string &phase,
                       const std::string &what) {
  throw std::runtime_error(group.where + ": " + phase + " failed (a peer rank died, hung past the " +
                           seconds(group.timeout) + " timeout, or was stopped); resume the run from "
                           "its last checkpoint with --resume: " + what.substr(0, 400));
}

void wait(const Distributed::Group &group, const std::vector<c10::intrusive_ptr<c10d::Work>> &works,
          const std::string &phase) {
  try {
    for (auto &w : works)
      if (!w->wait(group.timeout))
        fail(group, phase, "a collective did not complete");
  } catch (const std::runtime_error &e) {
    if (std::string(e.what()).rfind(group.where, 0) == 0)
      throw;
    fail(group, phase, e.what());
  } catch (const std::exception &e) {
    fail(group, phase, e.what());
  }
}

} // namespace

DistributedEnvironment readDistributedEnvironment(
    const std::function<std::optional<std::string>(const std::string &)> &lookupIn) {
  auto lookup = lookupIn ? lookupIn : [](const std::string &name) -> std::optional<std::string> {
    const char *v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  DistributedEnvironment env;
  auto worldSize = lookup("WORLD_SIZE");
  if (!worldSize || worldSize->empty())
    return env;
  env.worldSize = parseInteger("WORLD_SIZE", *worldSize, 1, 1 << 20);
  if (env.worldSize == 1)
    return env;
  auto need = [&](const std::string &name) {
    auto v = lookup(name);
    if (!v || v->empty())
      throw std::invalid_argument("WORLD_SIZE=" + *worldSize + " but " + name +
                                  " is not set: launch with torchrun --nproc-per-node K --no-python "
                                  "spectra-train train ..., or set RANK, MASTER_ADDR and MASTER_PORT "
                                  "as torchrun does");
    return *v;
  };
  env.rank = parseInteger("RANK", need("RANK"), 0, env.worldSize - 1);
  auto local = lookup("LOCAL_RANK");
  env.localRank = local && !local->empty() ? parseInteger("LOCAL_RANK", *local, 0, 1 << 20) : env.rank;
  env.masterAddr = need("MASTER_ADDR");
  env.masterPort = parseInteger("MASTER_PORT", need("MASTER_PORT"), 1, 65535);
  return env;
}

Distributed::Distributed() = default;
Distributed::~Distributed() = default;

void Distributed::attachReducer(const std::vector<torch::Tensor> &parameters) {
  if (!active())
    return;
  Group &g = *group_;
  try {
    auto type = backend_ == "nccl" ? c10d::ProcessGroup::BackendType::NCCL
                                   : c10d::ProcessGroup::BackendType::GLOO;
    g.processGroup = c10::make_intrusive<c10d::ProcessGroup>(g.store, static_cast<int>(rank_),
                                                             static_cast<int>(size_));
    g.processGroup->setDefaultBackend(type);
    g.processGroup->setBackend(backend_ == "nccl" ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
                               type, g.backend);
    // DDP's buckets: a small first one (the last parameters, whose gradients come first), then
    // 25 MiB; the reducer reorders them by readiness after the first backward.
    std::vector<bool> dense(parameters.size(), false);
    auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
        parameters, {static_cast<size_t>(c10d::kDefaultFirstBucketBytes),
                     static_cast<size_t>(c10d::kDefaultBucketBytesCap)},
        dense);
    std::reverse(buckets.begin(), buckets.end());
    g.reducer = std::make_unique<c10d::Reducer>(
        parameters, buckets, g.processGroup, dense, c10d::kDefaultBucketBytesCap,
        /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false,
        std::unordered_map<size_t, std::string>{}, c10d::kDefaultFirstBucketBytes,
        /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
        std::vector<int64_t>{});
  } catch (const std::exception &e) {
    fail(g, "setting up the gradients' reducer", e.what());
  }
}

bool Distributed::averagesDuringBackward() const { return active() && group_->reducer != nullptr; }

void Distributed::backward(const torch::Tensor &loss, const std::string &phase) {
  if (!active() || !group_->reducer) {
    loss.backward();
    return;
  }
  try {
    group_->reducer->prepare_for_backward({loss});
    loss.backward();
  } catch (const std::exception &e) {
    fail(*group_, phase, e.what());
  }
}

std::unique_ptr<Distributed> Distributed::join(const DistributedEnvironment &env,
                                               const torch::Device &device,
                                               std::chrono::milliseconds timeout) {
  auto d = std::make_unique<Distributed>();
  if (env.worldSize <= 1)
    return d;
  d->rank_ = env.rank, d->size_ = env.worldSize;
  d->backend_ = device.is_cuda() ? "nccl" : "gloo";
  d->group_ = std::make_unique<Group>();
  Group &g = *d->group_;
  g.timeout = timeout;
  g.where = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.worldSize) + " (" +
            d->backend_ + ")";
  const std::string master = "MASTER_ADDR=" + env.masterAddr + " MASTER_PORT=" +
                             std::to_string(env.masterPort);
  // Under torchrun the launcher's agent already serves the store at MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE): every rank is its client, under a prefix per restart
  // attempt, as torch.distributed does; otherwise rank 0 serves it.
  const char *agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agentStore = agent && std::string(agent) == "True";
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.masterPort);
  so.isServer = env.rank == 0 && !agentStore;
  so.numWorkers = static_cast<size_t>(env.worldSize);
  so.waitWorkers = true;
  so.timeout = timeout;
  try {
    g.store = c10::make_intrusive<c10d::TCPStore>(env.masterAddr, so);
    if (agentStore) {
      const char *attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
      g.store = c10::make_intrusive<c10d::PrefixStore>(
          std::string("/worker/attempt_") + (attempt && *attempt ? attempt : "0"), g.store);
    }
  } catch (const std::exception &e) {
    std::string what = std::string(e.what()).substr(0, 400);
    if (so.isServer)
      throw std::runtime_error(
          g.where + ": the rendezvous at " + master + " did not complete within " + seconds(timeout) +
          ": rank 0 serves it and waits for all WORLD_SIZE=" + std::to_string(env.worldSize) +
          " ranks (were that many started? is the port free?): " + what);
    throw std::runtime_error(g.where + ": cannot reach the rendezvous at " + master + " within " +
                             seconds(timeout) + " (is MASTER_ADDR rank 0's host, and rank 0 running?): " +
                             what);
  }
  try {
    if (device.is_cuda()) {
#ifdef SPECTRA_HAVE_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      g.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(g.store, env.rank, env.worldSize, options);
#else
      throw std::runtime_error("this spectra-train was built without NCCL (no nccl.h when it was "
                               "configured): train with --device cpu (Gloo), or rebuild with NCCL");
#endif
    } else {
#ifndef SPECTRA_HAVE_GLOO
      throw std::runtime_error("this spectra-train was built without Gloo (no gloo/algorithm.h when "
                               "it was configured): install Debian's libgloo-dev and rebuild, or "
                               "train on CUDA (NCCL)");
#else
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      // GLOO_SOCKET_IFNAME picks the interface, as in torch.distributed; a loopback master means
      // every rank is on this host.
      if (const char *ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else if (isLoopback(env.masterAddr))
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else
        options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      g.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(g.store, env.rank, env.worldSize, options);
#endif
    }
  } catch (const std::exception &e) {
    throw std::runtime_error(g.where + ": the process group did not form within " + seconds(timeout) +
                             " at " + master + " (every rank must be started with the same WORLD_SIZE=" +
                             std::to_string(env.worldSize) + "): " + std::string(e.what()).substr(0, 400));
  }
  // Every rank counts itself: a group whose ranks disagree on its size fails here, not later.
  torch::Tensor one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  d->sumInPlace({one}, "the first collective");
  if (one.item<double>() != static_cast<double>(env.worldSize))
    fail(g, "the first collective", std::to_string(static_cast<int64_t>(one.item<double>())) +
                                        " ranks answered, WORLD_SIZE is " + std::to_string(env.worldSize));
  return d;
}


namespace {

/// One collective per tensor, every one launched before the first wait; the time spent is added
/// to `seconds`.
void runCollectives(const Distributed::Group &group, const std::vector<torch::Tensor> &tensors,
                    const std::string &phase, double &seconds,
                    const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<torch::Tensor> &)> &launch) {
  auto start = Clock::now();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    for (const torch::Tensor &t : tensors) {
      std::vector<torch::Tensor> one{t};
      works.push_back(launch(one));
    }
  } catch (const std::exception &e) {
    fail(group, phase, e.what());
  }
  wait(group, works, phase);
  seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

} // namespace

void Distributed::sumInPlace(const std::vector<torch::Tensor> &tensors, const std::string &phase) {
  if (!active() || tensors.empty())
    return;
  runCollectives(*group_, tensors, phase, seconds_,
                 [&](std::vector<torch::Tensor> &one) { return group_->backend->allreduce(one); });
}

void Distributed::averageInPlace(const std::vector<torch::Tensor> &tensors, const std::string &phase) {
  if (!active() || tensors.empty())
    return;
  torch::NoGradGuard noGrad;
  // Flat buckets of one dtype and at most 25 MiB (c10d's reducer's first-bucket size), every
  // all-reduce launched before the first wait: Gloo works through them on its threads.
  constexpr int64_t kBucketBytes = 25 << 20;
  std::vector<std::vector<torch::Tensor>> buckets;
  std::vector<int64_t> bytes;
  for (const torch::Tensor &t : tensors) {
    TORCH_CHECK(t.is_contiguous(), "Distributed::averageInPlace: ", phase, " holds a non-contiguous tensor");
    int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    if (buckets.empty() || buckets.back().front().scalar_type() != t.scalar_type() ||
        bytes.back() + size > kBucketBytes) {
      buckets.emplace_back();
      bytes.push_back(0);
    }
    buckets.back().push_back(t);
    bytes.back() += size;
  }
  std::vector<torch::Tensor> flats;
  for (auto &bucket : buckets) {
    std::vector<torch::Tensor> views;
    for (auto &t : bucket)
      views.push_back(t.reshape({-1}));
    flats.push_back(torch::cat(views));
  }
  sumInPlace(flats, phase);
  for (size_t b = 0; b < buckets.size(); ++b) {
    flats[b].div_(static_cast<double>(size_));
    int64_t at = 0;
    for (auto &t : buckets[b]) {
      t.copy_(flats[b].narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

void Distributed::barrier(const std::string &phase) {
  if (!active())
    return;
  // An all-reduce of one number: the same wait and errors as every other collective.
  torch::Tensor t = torch::zeros({1}, torch::kFloat64);
  if (backend_ == "nccl")
    t = t.cuda();
  sumInPlace({t}, phase);
}

void Distributed::checkIdentical(const std::vector<torch::Tensor> &tensors, const std::string &what) {
  if (!active() || tensors.empty())
    return;
  torch::NoGradGuard noGrad;
  std::vector<torch::Tensor> sums;
  for (const torch::Tensor &t : tensors) {
    torch::Tensor x = t.detach().to(torch::kFloat64);
    sums.push_back(torch::stack({x.sum(), x.square().sum()}));
  }
  torch::Tensor local = torch::cat(sums);
  torch::Tensor high = local.clone(), low = local.neg();
  c10d::AllreduceOptions maxOp;
  maxOp.reduceOp = c10d::ReduceOp::MAX;
  runCollectives(*group_, {high, low}, "comparing " + what, seconds_,
                 [&](std::vector<torch::Tensor> &one) { return group_->backend->allreduce(one, maxOp); });
  torch::Tensor differ = high.ne(low.neg());
  if (differ.any().item<bool>()) {
    int64_t first = differ.nonzero()[0].item<int64_t>() / 2;
    throw std::runtime_error(group_->where + ": the ranks' " + what + " differ (tensor " +
                             std::to_string(first) + " of " + std::to_string(tensors.size()) +
                             "); data-parallel ranks must start from the same options and checkpoint");
  }
}

} // namespace spectra::models
