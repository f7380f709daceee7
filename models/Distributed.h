//===- Distributed.h - data parallelism through torch.distributed (c10d) --===//
//
// The trainer's view of K processes training one model. The launcher (torchrun
// --no-python, srun or mpirun) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
// and MASTER_PORT; join() meets the other ranks at a c10d TCPStore served by
// rank 0 and forms a process group: Gloo on the CPU, NCCL on CUDA (one GPU per
// LOCAL_RANK). The collectives are c10d's; what is ours is the policy:
//
//  - averageInPlace: gradients (and the step's loss and counts) averaged over
//    the ranks after the backward, in flat buckets of at most 25 MiB, every
//    bucket's all-reduce in flight at once;
//  - checkIdentical: a cheap proof that the ranks hold the same tensors (the
//    parameters, the redrawn random features, the options);
//  - every collective waits at most the run's timeout, and a failure (a peer
//    that died, hung or never arrived) becomes one error naming the rank, the
//    phase, the backend and the way on (resume from the last checkpoint).
//
// A process started without WORLD_SIZE (or with 1) is a group of one: every
// call is then a no-op, and the trainer is what it was.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_DISTRIBUTED_H
#define SPECTRA_MODELS_DISTRIBUTED_H

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace spectra::models {

/// The launcher's variables.
struct DistributedEnvironment {
  int64_t rank = 0, worldSize = 1, localRank = 0;
  std::string masterAddr;
  int64_t masterPort = 0;
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK (default RANK), MASTER_ADDR and MASTER_PORT through
/// `lookup` (the process environment by default). No WORLD_SIZE: one process. Throws
/// std::invalid_argument naming a malformed or missing variable.
DistributedEnvironment readDistributedEnvironment(
    const std::function<std::optional<std::string>(const std::string &)> &lookup = {});

class Distributed {
public:
  /// A group of one (no process group).
  Distributed();
  ~Distributed();
  Distributed(const Distributed &) = delete;
  Distributed &operator=(const Distributed &) = delete;

  /// Joins the group `env` describes, on `device` (Gloo for the CPU, NCCL for CUDA), waiting
  /// at most `timeout` for the other ranks. Throws std::runtime_error naming what did not
  /// arrive (MASTER_ADDR:MASTER_PORT unreachable, fewer ranks than WORLD_SIZE).
  static std::unique_ptr<Distributed> join(const DistributedEnvironment &env,
                                           const torch::Device &device,
                                           std::chrono::milliseconds timeout);

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  bool active() const { return size_ > 1; }
  bool main() const { return rank_ == 0; }
  /// "none", "gloo" or "nccl".
  const std::string &backend() const { return backend_; }

  /// Averages the gradients of `parameters` during every later backward (c10d's Reducer, as
  /// DistributedDataParallel does): their buckets' all-reduces start as soon as a bucket's
  /// gradients are ready, overlapping the rest of the backward, and backward() returns with
  /// the averages in place (through backward() below).
  void attachReducer(const std::vector<torch::Tensor> &parameters);
  /// loss.backward(), its gradients averaged by the reducer when one is attached; a collective
  /// that fails in it is reported like every other (the rank, `phase`, the way on).
  void backward(const torch::Tensor &loss, const std::string &phase);
  /// Whether backward() averages the gradients (a reducer is attached).
  bool averagesDuringBackward() const;

  /// Each tensor summed over the ranks, in place. `phase` names the call in errors.
  void sumInPlace(const std::vector<torch::Tensor> &tensors, const std::string &phase);
  /// Each tensor averaged over the ranks, in place, in flat buckets (contiguous tensors).
  void averageInPlace(const std::vector<torch::Tensor> &tensors, const std::string &phase);
  void barrier(const std::string &phase);
  /// Throws std::runtime_error when the ranks' tensors differ (compared through each tensor's
  /// sum and sum of squares in float64: two all-reduces of a few numbers).
  void checkIdentical(const std::vector<torch::Tensor> &tensors, const std::string &what);
  /// Seconds spent in collectives so far (their launch and wait), the reducer's excepted: its
  /// all-reduces run during the backward.
  double collectiveSeconds() const { return seconds_; }

  struct Group;  // the c10d store and process group (Distributed.cpp)

private:
  int64_t rank_ = 0, size_ = 1;
  std::string backend_ = "none";
  std::unique_ptr<Group> group_;
  double seconds_ = 0;
};

} // namespace spectra::models

#endif // SPECTRA_MODELS_DISTRIBUTED_H
