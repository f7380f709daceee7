//===- spectra-bench.cpp - fused kernels against the eager reference ------===//
//
//   spectra-bench [--variant posrf-mm] [--batch 4 --heads 2 --length 4096 --dim 32 --m 128]
//                 [--repeats 5] [--device cpu|cuda|gpu-emulated] [--dtype f32|bf16|f16]
//   spectra-bench --sweep DIR [--variant V] [--batch B --heads H] [--lengths 1024,...,65536]
//                 [--shapes 32x128,64x256] [--dtypes f32,bf16] [--max-seconds S]
//
// Through SpectralAttention (what a model calls), in one run:
//  - the JIT: cold compile into an empty cache directory, then a warm disk hit
//    (memory cache cleared) and an in-memory hit;
//  - median forward time and forward+backward time of the fused kernels, of
//    the eager reference (which materialises phi), of torch's
//    scaled_dot_product_attention (softmax, quadratic) and of a linear
//    attention written by hand in torch (PosRF features, then the two
//    contractions as matmuls), with ratios, achieved FLOP/s (the
//    contractions' multiply-adds) and bandwidth (q, k, v, out and, in the
//    backward, their gradients);
//  - peak memory of forward+backward for fused and reference: the CUDA
//    allocator's peak on a GPU; on the CPU the growth of the peak resident set
//    of a child process that runs one mode alone;
//  - the largest difference between fused and reference outputs.
// --sweep runs every length x shape x dtype x pass and writes DIR/bench.csv
// and DIR/bench.png (time against length per method; matplotlib). Methods
// whose previous length took longer than --max-seconds are skipped at the
// longer ones (quadratic SDPA on a CPU).
//
//===----------------------------------------------------------------------===//

#include "FmaPeak.h"
#include "codegen/spectra_compiler.h"
#include "runtime/Compiler.h"
#include "runtime/KernelCache.h"
#include "runtime/KernelLaunch.h"
#include "runtime/SpectralAttention.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <malloc.h>
#include <map>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

using namespace spectra;
using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

template <typename F>
double median(int repeats, torch::Device device, F &&f) {
  std::vector<double> times;
  f();  // warm-up (lazy initialisation, allocator)
  for (int i = 0; i < repeats; ++i) {
    if (device.is_cuda())
      torch::cuda::synchronize();
    auto t0 = Clock::now();
    f();
    if (device.is_cuda())
      torch::cuda::synchronize();
    times.push_back(seconds(t0, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// A field of /proc/self/status in bytes (VmRSS, VmHWM).
int64_t procStatus(const std::string &field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key) {
    if (key == field + ":") {
      in >> kb >> unit;
      return kb * 1024;
    }
    std::getline(in, unit);
  }
  return -1;
}

struct Setup {
  int64_t B, H, N, d;
  int repeats;
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
  SpectralAttentionOptions options;
  torch::Tensor q, k, v;
  /// The gradient of the output every backward receives (random, contiguous: what the layer
  /// above hands a training step's attention, where a sum's backward would hand every method
  /// a broadcast 1 to copy or special-case).
  torch::Tensor gout;
  /// Whether W is learnable (a recipe with parameters, e.g. FastFoodL): then the fused and
  /// the eager backward compute dW and the flop counts include it (the hand-written torch
  /// linear attention takes W detached, so its count is high by dW there); a drawn W is a
  /// buffer, and no method computes its gradient (the fused backward kernels skip the dW
  /// product). Set where the modules are made.
  bool weightGrad = false;
  /// Where the fused CPU kernels take W as antipodal blocks (a zero row, P, then -P: SGQ's
  /// points; spectra-compile --emit=work's antipodal=): the pairs per block. Their logits and
  /// the inputs' gradient contract P only, and the flop counts of the fused method count
  /// that (logitRows). Set where the fused module is made.
  int64_t antipodalPairs = 0;
};

/// The CPU kernels' work table of a variant (spectra-compile --emit=work), compiled once per
/// variant, configuration and causality.
const KernelWorkTable &cpuWork(const Setup &s, bool causal) {
  static std::map<std::string, KernelWorkTable> tables;
  const VariantConfig &c = s.options.config;
  std::string key = s.options.variant + "|" + std::to_string(c.m) + "|" + std::to_string(c.d) +
                    "|" + std::to_string(c.seed) + "|" + variantOptionsText(c) + "|" +
                    (causal ? "causal" : "");
  auto it = tables.find(key);
  if (it == tables.end())
    it = tables.emplace(key, cpuKernelWork(s.options.variant, c, causal)).first;
  return it->second;
}

/// The rows of W the fused kernels' logits contract: m, or with antipodal weights the rows P
/// of each block (m / (2 pairs + 1) x pairs).
int64_t logitRows(const Setup &s, int64_t m) {
  const int64_t p = s.antipodalPairs;
  return p > 0 ? m / (2 * p + 1) * p : m;
}

SpectralAttention makeModule(Setup &s, AttentionMode mode) {
  SpectralAttentionOptions o = s.options;
  o.mode = mode;
  SpectralAttention m(o);
  m->to(s.device);
  s.weightGrad = m->weights->weights().W.requires_grad();
  if (mode == AttentionMode::Fused && s.device.is_cpu() && o.ir.empty()) {
    s.antipodalPairs = 0;
    try {
      for (auto &[kind, v] : cpuWork(s, o.causal))
        if (v.count("antipodal"))
          s.antipodalPairs = std::max(s.antipodalPairs, int64_t(v.at("antipodal")));
    } catch (const std::exception &) {
      // No work table: the flops counted dense (kernelBounds says why).
    }
  }
  return m;
}

/// One forward+backward of `attention` (q, k, v -> out) on s's inputs as fresh leaves, the
/// output's gradient s.gout.
template <typename F>
void forwardBackwardOf(const Setup &s, F &&attention) {
  torch::Tensor q = s.q.detach().requires_grad_(), k = s.k.detach().requires_grad_(),
                v = s.v.detach().requires_grad_();
  attention(q, k, v).backward(s.gout);
}

void forwardBackward(SpectralAttention &m, const Setup &s) {
  forwardBackwardOf(s, [&](auto &q, auto &k, auto &v) { return m->forward(q, k, v); });
}

/// Child mode: one forward+backward of one mode; prints the peak growth.
int measureChild(Setup &s, AttentionMode mode) {
  SpectralAttention m = makeModule(s, mode);
  if (mode == AttentionMode::Fused)
    m->fusedCpu();  // compile before the baseline: the JIT's memory is not the kernel's
  int64_t base = procStatus("VmRSS");
  forwardBackward(m, s);
  std::cout << "peak_growth_bytes " << procStatus("VmHWM") - base << "\n";
  return 0;
}

/// Runs this program again in `mode` alone and returns its peak growth (bytes), or -1.
int64_t measureInChild(int argc, char **argv, const std::string &mode) {
  std::vector<std::string> args(argv, argv + argc);
  args.push_back("--child");
  args.push_back(mode);
  // Peak memory with glibc's defaults: a heap that keeps freed pages would count them too.
  args.push_back("--heap");
  args.push_back("system");
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0)
    return -1;
  std::string output;
  char buffer[256];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;)
    output.append(buffer, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  size_t at = output.find("peak_growth_bytes ");
  return at == std::string::npos ? -1 : std::stoll(output.substr(at + 18));
}

int64_t cudaPeak(SpectralAttention &m, const Setup &s) {
  auto device = s.device.index();
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  int64_t base = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
  forwardBackward(m, s);
  torch::cuda::synchronize();
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak - base;
}

std::string mib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << bytes / 1048576.0 << " MiB";
  return bytes < 0 ? "n/a" : os.str();
}

/// The methods compared: the fused kernels, the eager reference, torch's softmax SDPA, and a
/// linear attention a user writes by hand in torch (PosRF features, two matmuls).
enum class Method { Fused, Reference, Sdpa, TorchLinear };
const char *methodName(Method m) {
  switch (m) {
  case Method::Fused: return "fused";
  case Method::Reference: return "reference";
  case Method::Sdpa: return "sdpa";
  case Method::TorchLinear: return "torch-linear";
  }
  return "";
}

/// PosRF linear attention as a user writes it in torch: phi materialised, S and z by matmul,
/// one stabiliser constant per query and per (batch, head).
torch::Tensor torchLinear(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                          const torch::Tensor &W) {
  double s = std::pow(static_cast<double>(q.size(3)), -0.25);
  torch::Tensor qs = q * s, ks = k * s, Wt = W.t().to(q.scalar_type());
  torch::Tensor lq = qs.matmul(Wt) - qs.square().sum(-1, true) / 2;
  torch::Tensor lk = ks.matmul(Wt) - ks.square().sum(-1, true) / 2;
  torch::Tensor pq = (lq - lq.amax(-1, true).detach()).exp();
  torch::Tensor pk = (lk - lk.amax({-2, -1}, true).detach()).exp();
  torch::Tensor S = pk.transpose(-2, -1).matmul(v), z = pk.sum(-2, true);
  return pq.matmul(S) / (pq * z).sum(-1, true);
}

/// Multiply-adds x 2 of one pass: the linear methods' contractions (forward: X W^T for q
/// and k, phi^T V and phi S; the backward adds gS, dq, dW twice, dS, b and dv), or
/// softmax attention's QK^T and PV (backward 2.5x the forward).
double flops(Method method, const Setup &s, int64_t m, int64_t features, bool backward) {
  double BH = double(s.B) * s.H, N = s.N, d = s.d, dv = s.d, F = features;
  if (method == Method::Sdpa) {
    double forward = 4 * N * N * d * BH;
    return backward ? 3.5 * forward : forward;
  }
  // The fused kernels' logits and dq / dk contract logitRows of W's rows (antipodal weights).
  double mL = method == Method::Fused ? double(logitRows(s, m)) : double(m);
  double forward = 4 * N * (mL * d + F * dv) * BH;
  double backwardOnly = 4 * N * mL * d + 8 * N * F * dv + (s.weightGrad ? 8 : 4) * N * F * d -
                        4 * N * (m - mL) * d;
  return backward ? forward + backwardOnly * BH : forward;
}
/// Bytes every method must move: q, k, v and out (backward: also gout, dq, dk, dv, reading
/// q, k, v and out again).
double bytes(const Setup &s, bool backward) {
  double element = s.dtype == torch::kFloat32 ? 4 : 2;
  double forward = double(s.B) * s.H * s.N * 4 * s.d * element;
  return backward ? 3 * forward : forward;
}

/// Multiply-adds x 2 of one call of a kernel kind (the contractions, as flops() counts them:
/// logits X W^T; S or the readout; the backward's gS or b, dS or dv, dq or dk, dW).
/// The causal kernels' own contractions per row, with T-row tiles (their code in
/// codegen/CausalKernels.cpp): both sides' logits in each pass (2 m d, m the logits' rows
/// of W: logitRows); the readout's masked
/// P = qa kf^T and P V (T F + T dv), qa S and S += kf^T V; the queries' backward's G = gn v^T,
/// a = gn S^T + G kf, dq and dW, S += kf^T v; the keys' backward's G, a = v R^T + G^T qb,
/// dv = kb R + P^T gn with P = qb kb^T, dk and dW, R += qb^T gn. The masked halves of the
/// T x T products are computed, so counted. dW only where W is learnable (s.weightGrad).
double kernelFlops(const std::string &kind, const Setup &s, int64_t m, int64_t features) {
  double BH = double(s.B) * s.H, N = s.N, d = s.d, dv = s.d, F = features,
         T = double(spectra_cpu_causal_tile_rows(features, s.d)),  // the CPU's causal tiles
      dx = s.weightGrad ? 2 : 1;                                      // dq or dk, and dW
  // With antipodal weights the logits and dq / dk contract logitRows of W's m rows.
  const double mL = double(logitRows(s, m)), saved = (m - mL) * d;
  if (kind == "kv" || kind == "readout")
    return 2 * N * (mL * d + F * dv) * BH;
  if (kind == "query_backward" || kind == "key_backward")
    return (2 * N * mL * d + 4 * N * F * dv + 2 * N * (dx * F * d - saved)) * BH;
  if (kind == "causal_readout")
    return 2 * N * (2 * mL * d + T * F + T * dv + 2 * F * dv) * BH;
  if (kind == "causal_query_backward")
    return 2 * N * (2 * mL * d + T * dv + 2 * F * dv + T * F + dx * F * d - saved) * BH;
  if (kind == "causal_key_backward")
    return 2 * N * (2 * mL * d + 2 * T * dv + 3 * F * dv + 2 * T * F + dx * F * d - saved) * BH;
  return 0;
}

/// The bytes a memory-bound kernel must move in one forward+backward (f32 rows, as the CPU
/// kernels take them), and what they are; 0 for the others. The statistics' moments read q
/// and k once; their backward reads q, k and the gradients the backward kernels wrote, and
/// writes those gradients back (dq += ..., in place).
std::pair<double, const char *> kernelBytes(const std::string &kind, const Setup &s) {
  double rows = 4.0 * s.B * s.H * 2 * s.N * s.d;  // q and k, f32
  if (kind == "moments")
    return {rows, "q and k read once"};
  if (kind == "moments_backward")
    return {3 * rows, "q, k, dq, dk read, dq, dk written"};
  return {0, nullptr};
}

/// A CPU kernel's vector work per row tile and the share of the FMA peak it could reach if
/// every vector operation took an FMA port's cycle (spectra_cpu_work_variant,
/// codegen/KernelWork.h), with the weights' gradient where W is learnable.
struct KernelBound {
  double bound = 0;
  bool exact = true;  // no branch on the data, every trip count known
  int64_t tileRows = 0, width = 0, fma = 0, exps = 0, expOps = 0, other = 0;
};

/// The share of a kernel's vector FMA lanes that carry the contractions kernelFlops counts:
/// 1 where the features fill whole vectors, less where the last vector is partly padding
/// (SGQ's 2d+1 = 65 features in 80 lanes at 16, where its logits' contraction spends 5 vector
/// FMAs on 4.06 vectors' work). The work model counts the vector FMAs issued, padding lanes
/// included; the benchmark's GFLOP/s count the features' flops only, so the bound it prints
/// is the work model's times this share.
double laneFill(const KernelBound &b, double flopsPerRow) {
  double issued = 2.0 * double(b.fma) * double(b.width) / double(b.tileRows);
  return issued > 0 && flopsPerRow > 0 ? std::min(1.0, flopsPerRow / issued) : 1.0;
}

std::map<std::string, KernelBound> kernelBounds(const Setup &s, bool causal) {
  std::map<std::string, KernelBound> out;
  if (!s.options.ir.empty() || !s.device.is_cpu())
    return out;
  KernelWorkTable table;
  try {
    table = cpuWork(s, causal);
  } catch (const std::exception &e) {
    std::cerr << "spectra-bench: no FMA-port bounds: " << e.what() << "\n";
    return out;
  }
  for (auto &[kind, v] : table) {
    const bool dW = s.weightGrad;
    KernelBound b;
    b.bound = dW ? v["if_bound"] : v["bound"];
    b.exact = v["exact"] == 1;
    b.tileRows = int64_t(v["tile_rows"]);
    b.width = int64_t(v["width"]);
    b.fma = int64_t(v["fma"] + (dW ? v["if_fma"] : 0));
    b.exps = int64_t(v["exp"] + (dW ? v["if_exp"] : 0));
    b.expOps = int64_t(v["exp_ops"]);
    b.other = int64_t(v["other"] + (dW ? v["if_other"] : 0));
    out[kind] = b;
  }
  return out;
}

/// `repeats` forward+backward passes with every kernel launch timed: the kernels' totals by
/// kind, the fastest pass of each kind, and the passes' own times. The breakdown divides the
/// kernels' times by these passes' mean (not by a median taken in another loop, which the
/// machine's drift between the two loops could put below the kernels' sum).
struct TimedPasses {
  std::map<std::string, KernelTimer::Total> perKernel;
  std::map<std::string, double> fastest;  // the quickest pass's time of each kind
  int passes = 0;
  double mean = 0, fastestPass = 0;
};

template <typename F>
TimedPasses timeKernelPasses(int repeats, F &&pass) {
  TimedPasses out;
  KernelTimer timer;
  double total = 0;
  for (int r = 0; r < repeats; ++r) {
    std::map<std::string, KernelTimer::Total> before = timer.totals();
    auto t0 = Clock::now();
    pass();
    double t = seconds(t0, Clock::now());
    total += t;
    out.fastestPass = r == 0 ? t : std::min(out.fastestPass, t);
    for (auto &[kind, after] : timer.totals()) {
      double inPass = after.seconds - before[kind].seconds;
      auto it = out.fastest.find(kind);
      out.fastest[kind] = it == out.fastest.end() ? inPass : std::min(it->second, inPass);
    }
  }
  out.perKernel = timer.totals();
  out.passes = repeats;
  out.mean = repeats > 0 ? total / repeats : 0;
  return out;
}

/// The four kernels of the bidirectional pass whose contractions carry its flops.
constexpr const char *kBidirectionalKinds[] = {"kv", "readout", "query_backward", "key_backward"};

/// The per-kernel times of `repeats` forward+backward passes: each kind's time per pass, its
/// share of the pass, its contraction GFLOP/s and share of the FMA peak beside its FMA-port
/// bound, the same for its fastest pass, and what is left outside the kernels (LibTorch:
/// preparation, parameters, autograd, conversions).
void printKernelBreakdown(const TimedPasses &timed, const Setup &s, int64_t m, int64_t features,
                          double peak, const std::map<std::string, KernelBound> &bounds) {
  const auto &perKernel = timed.perKernel;
  const double pass = timed.mean;
  if (perKernel.empty() || timed.passes == 0)
    return;
  std::cout << "fused kernels     per forward+backward (" << timed.passes
            << " passes timed; mean, and in brackets the fastest pass):\n";
  double inKernels = 0, boundedFlops = 0, boundedSeconds = 0, bestSeconds = 0,
         fastestSeconds = 0;
  for (const char *kind : kKernelKinds) {
    auto it = perKernel.find(kind);
    if (it == perKernel.end())
      continue;
    double t = it->second.seconds / timed.passes;
    double fast = timed.fastest.count(kind) ? timed.fastest.at(kind) : t;
    inKernels += t;
    std::cout << "  " << std::left << std::setw(24) << kind << std::right << std::fixed
              << std::setprecision(2) << std::setw(7) << 1e3 * t << " ms " << std::setprecision(1)
              << std::setw(5) << 100 * t / pass << "%";
    double f = kernelFlops(kind, s, m, features);
    if (f > 0 && t > 0 && fast > 0) {
      double share = f / t / 1e9 / peak, fastShare = f / fast / 1e9 / peak;
      std::cout << "   " << std::setw(6) << f / t / 1e9 << " GFLOP/s, " << std::setw(4)
                << 100 * share << "% of the FMA peak (" << 100 * fastShare << "%)";
      auto b = bounds.find(kind);
      if (b != bounds.end() && b->second.bound > 0 && !b->second.exact) {
        std::cout << "; bound not modelled (branches on the data)";
      } else if (b != bounds.end() && b->second.bound > 0) {
        const KernelBound &k = b->second;
        const double fill = laneFill(k, f / (double(s.B) * s.H * s.N));
        const double bound = k.bound * fill;
        std::cout << "; bound " << 100 * bound << "% (" << std::setw(3) << 100 * share / bound
                  << "% of it (" << 100 * fastShare / bound << "%); per " << k.tileRows
                  << "-row tile " << k.fma << " FMAs, " << k.exps << " exps x " << k.expOps
                  << ", " << k.other << " other";
        if (fill < 0.995)
          std::cout << "; " << 100 * fill << "% of the FMA lanes carry features, the rest "
                    << "pad " << features << " features to whole vectors of " << k.width;
        std::cout << ")";
        boundedFlops += f;
        boundedSeconds += t;
        fastestSeconds += fast;
        bestSeconds += f / (bound * peak * 1e9);
      }
    }
    if (auto [bytes, what] = kernelBytes(kind, s); bytes > 0 && t > 0)
      std::cout << "   " << std::setw(6) << bytes / t / 1e9 << " GB/s (" << what
                << ": memory-bound)";
    std::cout << "\n";
  }
  std::cout << "  " << std::left << std::setw(24) << "outside kernels" << std::right
            << std::setprecision(2) << std::setw(7) << 1e3 * (pass - inKernels) << " ms "
            << std::setprecision(1) << std::setw(5) << 100 * (pass - inKernels) / pass
            << "%   (LibTorch: inputs, parameters, autograd)\n";
  if (bestSeconds > 0)
    std::cout << "FMA-port bound    the share of the FMA peak a kernel could reach if each of its "
                 "vector operations (an exp's "
              << bounds.begin()->second.expOps
              << ", the features, stabiliser, masks, reductions) took an FMA port's cycle, as "
                 "512-bit operations do on Intel cores (elsewhere the true ceiling is higher); "
                 "counted on the vector stage (spectra-compile --emit=work), less the FMA "
                 "lanes that only pad the features to whole vectors. These kernels: "
              << 100 * boundedFlops / bestSeconds / 1e9 / peak << "% together, measured "
              << 100 * boundedFlops / boundedSeconds / 1e9 / peak << "% ("
              << 100 * bestSeconds / boundedSeconds << "% of the bound), their fastest passes "
              << 100 * boundedFlops / fastestSeconds / 1e9 / peak << "% ("
              << 100 * bestSeconds / fastestSeconds << "% of the bound).\n";
  std::cout << "fastest pass      " << std::setprecision(4) << timed.fastestPass
            << " s, mean " << pass << " s: every pass runs the same code on the same data, and "
            << "the peak is the best of three runs, so the fastest pass is its like; a wide gap "
            << "is the machine's (on a virtual machine, other guests on the cores' caches, "
            << "which a register-only peak loop does not feel).\n";
  std::cout << std::setprecision(4);
}

/// One method's attention on (q, k, v).
torch::Tensor runMethod(Method method, const Setup &s, SpectralAttention &fused,
                        SpectralAttention &reference, const torch::Tensor &q,
                        const torch::Tensor &k, const torch::Tensor &v) {
  switch (method) {
  case Method::Fused: return fused->forward(q, k, v);
  case Method::Reference: return reference->forward(q, k, v);
  case Method::Sdpa: return at::scaled_dot_product_attention(q, k, v);
  case Method::TorchLinear:
    return torchLinear(q, k, v, fused->weights->weights().W.to(s.device).detach());
  }
  return torch::Tensor();
}

/// The median time of each of `passes` over `repeats` rounds, each round one call of every
/// pass in turn (after one warm-up call of each); `onRound(r)` before round r, if given.
std::vector<double> interleavedMedians(int repeats, torch::Device device,
                                       const std::vector<std::function<void()>> &passes,
                                       const std::function<void(int)> &onRound = {}) {
  std::vector<std::vector<double>> times(passes.size());
  for (const auto &pass : passes)
    pass();
  for (int r = 0; r < repeats; ++r) {
    if (onRound)
      onRound(r);
    for (size_t i = 0; i < passes.size(); ++i) {
      if (device.is_cuda())
        torch::cuda::synchronize();
      auto t0 = Clock::now();
      passes[i]();
      if (device.is_cuda())
        torch::cuda::synchronize();
      times[i].push_back(seconds(t0, Clock::now()));
    }
  }
  std::vector<double> medians;
  for (std::vector<double> &t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

/// The median time of one pass of `method` on s's inputs (forward, or forward+backward).
double timeMethod(Method method, Setup &s, SpectralAttention &fused, SpectralAttention &reference,
                  bool backward) {
  auto run = [&](const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v) {
    return runMethod(method, s, fused, reference, q, k, v);
  };
  if (!backward) {
    torch::NoGradGuard g;
    return median(s.repeats, s.device, [&] { run(s.q, s.k, s.v); });
  }
  return median(s.repeats, s.device, [&] { forwardBackwardOf(s, run); });
}

/// The fused forward+backward on one thread beside the run on `threads`, each as a share of
/// the FMA peak measured on as many threads: whether the kernels or the machine lose what
/// the threads do not gain (on a virtual machine two vCPUs may share a core's FMA units
/// with other guests for a while, which a register-only peak of a fraction of a second
/// misses and a run of seconds does not). Then each of the four kernels' mean time on one
/// thread and on `threads` (`timed`, the breakdown's passes): the kernel that gains least is
/// where the threads lose.
void printThreadScaling(Setup &s, SpectralAttention &fused, SpectralAttention &reference,
                        int64_t m, int64_t features, double both, double peak, int threads,
                        const TimedPasses &timed) {
  at::set_num_threads(1);
  double peak1 = bench::measureFmaPeak(1).gflops;
  double one = timeMethod(Method::Fused, s, fused, reference, true);
  const TimedPasses single = timeKernelPasses(s.repeats, [&] { forwardBackward(fused, s); });
  at::set_num_threads(threads);
  if (peak1 <= 0 || one <= 0)
    return;
  double f = flops(Method::Fused, s, m, features, true) / 1e9;
  std::cout << "one thread        fused forward+backward " << std::setprecision(4) << one
            << " s, " << std::setprecision(1) << f / one << " GFLOP/s = " << 100 * f / one / peak1
            << "% of the 1-thread FMA peak (" << peak1 << " GFLOP/s, measured now); on "
            << threads << " threads " << 100 * f / both / peak << "% of theirs: " << std::setprecision(2)
            << one / both << "x faster on " << threads << " threads, the peak " << peak / peak1
            << "x" << std::setprecision(4) << "\n";
  if (single.passes == 0 || timed.passes == 0)
    return;
  std::cout << "per kernel        mean ms of a pass on 1 -> " << threads << " threads:";
  const char *sep = " ";
  for (const char *kind : kBidirectionalKinds) {
    auto a = single.perKernel.find(kind), b = timed.perKernel.find(kind);
    if (a == single.perKernel.end() || b == timed.perKernel.end() || b->second.seconds <= 0)
      continue;
    double t1 = a->second.seconds / single.passes, tn = b->second.seconds / timed.passes;
    std::cout << sep << kind << " " << std::setprecision(2) << 1e3 * t1 << " -> " << 1e3 * tn
              << " (" << t1 / tn << "x)";
    sep = ", ";
  }
  std::cout << std::setprecision(4) << "\n";
}

/// `text` as a whole positive integer, or an error that names the option and what it got.
int64_t positive(const std::string &option, const std::string &text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1)
    throw std::invalid_argument(option + " takes a positive integer, got '" + text + "'");
  return value;
}

/// A comma-separated list of positive integers (`option` names it in errors).
std::vector<int64_t> numbers(const std::string &option, const std::string &list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');)
    out.push_back(positive(option, item));
  if (out.empty())
    throw std::invalid_argument(option + " takes a comma-separated list of positive integers");
  return out;
}

/// --sweep: every shape x dtype x length x method x pass into DIR/bench.csv and DIR/bench.png.
int sweep(const std::map<std::string, std::string> &opt, const std::string &dir, Setup base,
          const char *self) {
  (void)std::system(("mkdir -p '" + dir + "'").c_str());
  std::string csvPath = dir + "/bench.csv";
  std::ofstream csv(csvPath);
  if (!csv)
    throw std::invalid_argument("cannot write " + csvPath);
  csv << "variant,device,dtype,batch,heads,length,d,m,method,pass,seconds,gflops_per_s,gbytes_per_s,threads\n";
  double maxSeconds = 0;
  {
    const std::string &text = opt.at("max-seconds");
    char *end = nullptr;
    maxSeconds = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(maxSeconds > 0))
      throw std::invalid_argument("--max-seconds takes a positive number of seconds, got '" +
                                  text + "'");
  }
  std::vector<std::string> dtypes;
  {
    std::stringstream ss(opt.at("dtypes"));
    for (std::string t; std::getline(ss, t, ',');)
      dtypes.push_back(t);
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  {
    std::stringstream ss(opt.at("shapes"));
    for (std::string t; std::getline(ss, t, ',');) {
      size_t x = t.find('x');
      if (x == std::string::npos)
        throw std::invalid_argument("--shapes takes DxM pairs (32x128,64x256), got '" + t + "'");
      shapes.push_back({positive("--shapes (d)", t.substr(0, x)),
                        positive("--shapes (m)", t.substr(x + 1))});
    }
  }
  std::vector<int64_t> lengths = numbers("--lengths", opt.at("lengths"));
  int threads = base.device.is_cuda() ? 0 : torch::get_num_threads();
  for (auto [d, m] : shapes)
    for (const std::string &dtype : dtypes) {
      Setup s = base;
      s.d = d;
      s.options.config.d = d;
      s.options.config.m = m;
      s.dtype = dtype == "bf16"  ? torch::kBFloat16
                : dtype == "f16" ? torch::kHalf
                : dtype == "f32" ? torch::kFloat32
                                 : throw std::invalid_argument("--dtypes takes f32, bf16, f16");
      SpectralAttention fused = makeModule(s, AttentionMode::Fused),
                        reference = makeModule(s, AttentionMode::Reference);
      int64_t features = fused->descriptor().numFeatures();
      std::map<std::pair<int, bool>, bool> skipped;
      for (int64_t N : lengths) {
        s.N = N;
        torch::manual_seed(0);
        auto o = torch::TensorOptions().dtype(s.dtype).device(s.device);
        s.q = torch::randn({s.B, s.H, N, d}, o);
        s.k = torch::randn({s.B, s.H, N, d}, o);
        s.v = torch::randn({s.B, s.H, N, d}, o);
        s.gout = torch::randn({s.B, s.H, N, d}, o);
        for (Method method : {Method::Fused, Method::Reference, Method::Sdpa, Method::TorchLinear})
          for (bool backward : {false, true}) {
            bool &skip = skipped[{static_cast<int>(method), backward}];
            double seconds = NAN;
            if (!skip) {
              try {
                seconds = timeMethod(method, s, fused, reference, backward);
              } catch (const std::exception &e) {
                std::cerr << "spectra-bench: " << methodName(method) << " at N=" << N
                          << " failed (" << e.what() << "); skipped from here on\n";
              }
              skip = !(seconds <= maxSeconds);
            }
            csv << opt.at("variant") << "," << opt.at("device") << "," << dtype << "," << s.B << ","
                << s.H << "," << N << "," << d << "," << m << "," << methodName(method) << ","
                << (backward ? "forward+backward" : "forward") << ",";
            if (std::isnan(seconds))
              csv << ",,";
            else
              csv << seconds << "," << flops(method, s, m, features, backward) / seconds / 1e9 << ","
                  << bytes(s, backward) / seconds / 1e9;
            csv << "," << threads << "\n";
            csv.flush();
            std::cerr << "[sweep] d=" << d << " m=" << m << " " << dtype << " N=" << N << " "
                      << methodName(method) << (backward ? " fwd+bwd " : " fwd ")
                      << (std::isnan(seconds) ? std::string("skipped") : std::to_string(seconds) + " s")
                      << "\n";
          }
      }
    }
  std::cout << "wrote " << csvPath << "\n";
  std::string plot = std::string(self);
  plot = plot.substr(0, plot.rfind('/') + 1) + "spectra-plot-bench.py";
  std::string command = "python3 '" + plot + "' '" + csvPath + "' '" + dir + "/bench.png'";
  if (std::system(command.c_str()) == 0)
    std::cout << "wrote " << dir << "/bench.png\n";
  else
    std::cerr << "spectra-bench: the plot was not written (" << command << ")\n";
  return 0;
}
} // namespace

/// --device gpu-emulated: the GPU kernels run on the CPU beside the CPU kernels and the
/// reference, one shape: times, ratios, and each one's distance from the float64 reference.
/// The emulation runs blocks and threads as loops; its times say what a CPU run of the GPU
/// schedule costs, not what a GPU does.
int benchEmulated(Setup &s, std::map<std::string, std::string> &opt) {
  SpectralAttention emulated = makeModule(s, AttentionMode::GpuEmulated),
                    fused = makeModule(s, AttentionMode::Fused),
                    reference = makeModule(s, AttentionMode::Reference);
  torch::Tensor oracle;
  {
    torch::NoGradGuard g;
    SpectralAttention exact = makeModule(s, AttentionMode::Reference);
    exact->to(torch::kFloat64);
    oracle = exact->forward(s.q.to(torch::kFloat64), s.k.to(torch::kFloat64), s.v.to(torch::kFloat64));
  }
  auto t0 = Clock::now();
  {
    torch::NoGradGuard g;
    emulated->forward(s.q.narrow(2, 0, 2), s.k.narrow(2, 0, 2), s.v.narrow(2, 0, 2));
  }
  double compile = seconds(t0, Clock::now());
  std::cout << std::setprecision(4) << "variant " << opt["variant"] << "  B=" << s.B << " H=" << s.H
            << " N=" << s.N << " d=" << s.d << " m=" << emulated->descriptor().m << ", "
            << opt["dtype"] << ", " << torch::get_num_threads() << " threads\n"
            << "gpu-emulated: the GPU kernels' mapped IR compiled for the CPU in " << compile
            << " s (blocks and threads run as loops)\n";
  std::cout << "                  forward (s)  fwd+bwd (s)  emulated/this  max |out - float64|\n";
  std::vector<std::pair<std::string, SpectralAttention *>> modes = {
      {"gpu-emulated", &emulated}, {"fused (CPU)", &fused}, {"reference", &reference}};
  double emulatedForward = 0;
  for (auto &[name, m] : modes) {
    torch::Tensor out;
    double tf;
    {
      torch::NoGradGuard g;
      tf = median(s.repeats, s.device, [&] { out = (*m)->forward(s.q, s.k, s.v); });
    }
    double tb = median(s.repeats, s.device, [&] { forwardBackward(*m, s); });
    if (emulatedForward == 0)
      emulatedForward = tf;
    double error = (out.to(torch::kFloat64) - oracle).abs().max().item<double>();
    std::cout << "  " << std::left << std::setw(16) << name << std::right << std::setw(11) << tf
              << std::setw(13) << tb << std::setw(14) << emulatedForward / tf << "x"
              << std::setw(18) << error << "\n";
  }
  return 0;
}

/// Where the contractions run on AMX tiles: the tile unit's rate measured in the run, and how
/// much of the four bidirectional kernels' time their contractions would take at it (three
/// bf16 products per f32-grade one, bf16x3), so the rest is seen to be the work around them.
/// Only where every contraction fits the tiles (d, m and the features multiples of 32).
void printAmxShare(const TimedPasses &timed, const Setup &s, int64_t m, int64_t features,
                   double fmaPeak, int threads, double amxBefore) {
  if (!spectra_cpu_amx() || timed.passes == 0 || s.d % 32 || m % 32 || features % 32)
    return;
  // The better of before and after the timings, as for the FMA peak.
  double amx = std::max(amxBefore, bench::measureAmxPeak(threads));
  if (amx <= 0)
    return;
  double flops = 0, seconds = 0;
  std::ostringstream perKernel;  // each kernel's share
  const char *separator = "";
  for (const char *kind : kBidirectionalKinds) {
    auto it = timed.perKernel.find(kind);
    if (it == timed.perKernel.end())
      continue;
    double f = kernelFlops(kind, s, m, features), t = it->second.seconds / timed.passes;
    if (t > 0) {
      perKernel << separator << kind << " " << std::fixed << std::setprecision(1)
                << 100 * 3 * f / (amx * 1e9) / t << "%";
      separator = ", ";
    }
    flops += f;
    seconds += t;
  }
  if (flops <= 0 || seconds <= 0)
    return;
  double onTiles = 3 * flops / (amx * 1e9);
  std::cout << "AMX tiles         " << std::fixed << std::setprecision(1) << amx
            << " GFLOP/s of bf16 tile products (TDPBF16PS on " << threads
            << " thread(s), independent accumulators, measured in this run, the better of "
            << "before and after the timings), " << amx / 3
            << " GFLOP/s at three products per f32-grade one (bf16x3): "
            << std::setprecision(2) << amx / 3 / fmaPeak << "x the FMA peak. At that rate the "
            << "four kernels' contractions take " << 1e3 * onTiles << " ms of the "
            << 1e3 * seconds << " ms they ran (" << std::setprecision(1)
            << 100 * onTiles / seconds << "%; " << perKernel.str() << "): the rest is the "
            << "work around them (features, exps, splitting and packing the operands, moving "
            << "tiles to and from memory).\n"
            << std::setprecision(4);
}

/// The higher of two peak measurements: the FMA peak is what the machine can do, so a
/// measurement taken in a slow minute (another guest on the cores) says less about it. The
/// benchmarks measure it before and after their timings and state shares of the better.
bench::FmaPeak betterPeak(const bench::FmaPeak &a, const bench::FmaPeak &b) {
  return b.gflops > a.gflops ? b : a;
}

/// --variant paper: the Spectraformer paper's 18 variants (PosRF/OPRF/SADERF x ORF, SORF,
/// QMC, MM, SGQ, FastFoodL) side by side in one run: per variant the fused forward and
/// ", contractions on AMX tiles ..." where the CPU kernels' contractions run on AMX tiles
/// (SPECTRA_CPU_AMX=1 on a host with them), else "".
std::string cpuContractions() {
  return spectra_cpu_amx() ? ", contractions on AMX tiles (SPECTRA_CPU_AMX=1: bf16x3; the work "
                             "model's bounds count FMAs)"
                           : "";
}

/// forward+backward times, their GFLOP/s and share of the FMA peak measured in this run, and
/// the eager reference and torch SDPA against the fused forward+backward.
int benchPaper(Setup &s, const std::map<std::string, std::string> &opt) {
  TORCH_CHECK(!s.device.is_cuda(), "--variant paper measures the CPU (--device cpu)");
  int threads = torch::get_num_threads();
  bench::FmaPeak peak = bench::measureFmaPeak(threads);
  std::cout << "the paper's 18 variants  B=" << s.B << " H=" << s.H << " N=" << s.N
            << " d=" << s.d << " m=" << s.options.config.m << ", cpu f32, " << threads
            << " threads, heap " << opt.at("heap") << cpuContractions() << "\n"
            << "CPU FMA peak " << std::fixed << std::setprecision(1) << peak.gflops
            << " GFLOP/s (f32 FMA chains, " << peak.isa << ", measured in this run before "
            << "the timings; again after them, and % peak is of the better)\n";
  std::cout << std::endl;  // before the progress lines on stderr
  struct Row {
    std::string variant;
    double forward, both, eager, gflops;
    double bound = 0;  // the four kernels' FMA-port bound together (0: not modelled)
    bool weightGrad = false;  // W learnable (FastFoodL): dW's flops and work counted
    int64_t antipodalPairs = 0;  // SGQ's antipodal W: the kernels' flops counted on P
  };
  std::vector<Row> rows;
  std::vector<SpectralAttention> modules;
  int index = 0;
  for (const char *component : {"posrf", "oprf", "saderf"})
    for (const char *weights : {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"}) {
      s.options.variant = std::string(component) + "-" + weights;
      std::cerr << "measuring " << s.options.variant << " (" << ++index << "/18)\n";
      SpectralAttention fused = makeModule(s, AttentionMode::Fused);
      SpectralAttention reference = makeModule(s, AttentionMode::Reference);
      Row r{s.options.variant, timeMethod(Method::Fused, s, fused, reference, false), 0,
            timeMethod(Method::Reference, s, fused, reference, true), 0};
      r.weightGrad = s.weightGrad;
      r.antipodalPairs = s.antipodalPairs;
      modules.push_back(fused);
      rows.push_back(r);
    }
  // The fused forward+backward in rounds, each one pass of every variant in turn: a slow
  // phase of the machine (on a virtual machine the same kernel's time moves by 15-25% from
  // one minute to the next) then falls on all of them alike, so the ratios between variants
  // hold where one variant's passes timed after another's would not.
  const int rounds = std::max(s.repeats, 5);
  std::vector<std::function<void()>> passes;
  for (SpectralAttention &m : modules)
    passes.push_back([&] { forwardBackward(m, s); });
  std::vector<double> both = interleavedMedians(rounds, s.device, passes, [&](int round) {
    std::cerr << "forward+backward round " << round + 1 << "/" << rounds << "\n";
  });
  for (size_t i = 0; i < rows.size(); ++i) {
    Row &r = rows[i];
    r.both = both[i];
    s.options.variant = r.variant;
    s.weightGrad = r.weightGrad;
    s.antipodalPairs = r.antipodalPairs;
    const Descriptor &desc = modules[i]->descriptor();
    r.gflops = flops(Method::Fused, s, desc.m, desc.numFeatures(), true) / r.both / 1e9;
    // The bound of the four kernels together: their flops over the time each would take
    // at its own bound.
    double f = 0, atBound = 0;
    auto bounds = kernelBounds(s, false);
    for (const char *kind : kBidirectionalKinds) {
      auto b = bounds.find(kind);
      double fk = kernelFlops(kind, s, desc.m, desc.numFeatures());
      if (b == bounds.end() || !b->second.exact || b->second.bound <= 0 || fk <= 0) {
        atBound = 0;
        break;
      }
      f += fk;
      atBound += fk / (b->second.bound * laneFill(b->second, fk / (double(s.B) * s.H * s.N)));
    }
    r.bound = atBound > 0 ? f / atBound : 0;
  }
  modules.clear();
  const bench::FmaPeak before = peak;
  peak = betterPeak(peak, bench::measureFmaPeak(threads));
  // The softmax baseline after the variants: timed first, its long passes slowed the first
  // variant's (posrf-orf 0.039 s in the table against 0.021 s on its own, 2026-12-02).
  s.options.variant = "posrf-orf";
  SpectralAttention probe = makeModule(s, AttentionMode::Fused);
  double sdpa = timeMethod(Method::Sdpa, s, probe, probe, true);
  std::cout << "torch SDPA (softmax) forward+backward " << std::setprecision(4) << sdpa << " s\n";
  std::cout << "CPU FMA peak " << std::setprecision(1) << peak.gflops << " GFLOP/s, the better of "
            << before.gflops << " before the timings and the measurement after them\n";
  double posrfMm = 0;
  for (const Row &r : rows)
    if (r.variant == "posrf-mm")
      posrfMm = r.gflops;
  std::cout << std::left << std::setw(18) << "variant" << std::right << std::setw(10) << "fwd s"
            << std::setw(10) << "fwd+bwd s" << std::setw(10) << "GFLOP/s" << std::setw(8)
            << "% peak" << std::setw(12) << "eager/fused" << std::setw(11) << "SDPA/fused"
            << std::setw(13) << "vs posrf-mm" << std::setw(8) << "bound" << "\n";
  for (const Row &r : rows)
    std::cout << std::left << std::setw(18) << r.variant << std::right << std::setprecision(4)
              << std::setw(10) << r.forward << std::setw(10) << r.both << std::setprecision(1)
              << std::setw(10) << r.gflops << std::setw(8) << 100 * r.gflops / peak.gflops
              << std::setw(12) << r.eager / r.both << std::setw(11) << sdpa / r.both
              << std::setw(12) << 100 * r.gflops / posrfMm << "%" << std::setw(7)
              << (r.bound > 0 ? std::to_string(int(std::lround(100 * r.bound))) + "%" : "-")
              << "\n";
  std::cout << "fwd+bwd: the median of " << rounds << " rounds, each one pass of every "
            << "variant in turn (so a slow phase of the machine falls on all of them); "
            << "GFLOP/s: the contractions of the forward+backward (as the single-variant run "
               "counts them); eager: the LibTorch reference of the same variant; bound: the "
               "share of the peak the four kernels could reach together if each vector "
               "operation took an FMA port's cycle (the work model: spectra-compile "
               "--emit=work), less the FMA lanes that only pad the features to whole "
               "vectors (SGQ's 65).\n";
  return 0;
}

/// --causal: causal attention side by side in one run: the fused causal kernels, the eager
/// chunked reference (the causal reference's chunks of kCausalChunk rows, autograd through
/// them) and torch's softmax SDPA with is_causal, forward and forward+backward; then decoding
/// tokens/s from the state after the N-token prompt (its cost per token does not depend on N).
int benchCausal(Setup &s, const std::map<std::string, std::string> &opt) {
  TORCH_CHECK(s.device.is_cpu() || s.device.is_cuda(),
              "--causal measures the CPU or a GPU (--device cpu|cuda)");
  const bool gpu = s.device.is_cuda();
  s.options.causal = true;
  SpectralAttention fused = makeModule(s, AttentionMode::Fused);
  SpectralAttention reference = makeModule(s, AttentionMode::Reference);
  auto sdpa = [&](const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  };
  auto fwd = [&](auto &&f) {
    torch::NoGradGuard g;
    return median(s.repeats, s.device, [&] { f(s.q, s.k, s.v); });
  };
  auto both = [&](auto &&f) {
    return median(s.repeats, s.device, [&] { forwardBackwardOf(s, f); });
  };
  auto viaFused = [&](auto &q, auto &k, auto &v) { return fused->forward(q, k, v); };
  auto viaReference = [&](auto &q, auto &k, auto &v) { return reference->forward(q, k, v); };
  fwd(viaFused);  // compile outside the timings
  // Past 16K rows the baselines are left out (SDPA is quadratic; the eager reference's chunk
  // loop takes minutes): the fused kernels and decoding are what long prompts are for.
  const bool baselines = s.N <= 16384;
  const double none = std::nan("");
  double fF = fwd(viaFused), fR = baselines ? fwd(viaReference) : none,
         fS = baselines ? fwd(sdpa) : none;
  double bF = both(viaFused), bR = baselines ? both(viaReference) : none,
         bS = baselines ? both(sdpa) : none;
  // Kernel by kernel on the CPU only (its launches are synchronous; a GPU's are not).
  TimedPasses timed;
  if (!gpu)
    timed = timeKernelPasses(s.repeats, [&] { forwardBackward(fused, s); });
  torch::Tensor a, b;
  if (baselines) {
    torch::NoGradGuard g;
    a = fused->forward(s.q, s.k, s.v);
    b = reference->forward(s.q, s.k, s.v);
  }
  // Decoding: the state after the N-token prompt, then `steps` tokens one at a time.
  const int64_t steps = 64;
  DecodeState state = fused->prefill(s.k, s.v);
  torch::Tensor qt = s.q.narrow(2, 0, 1), kt = s.k.narrow(2, 0, 1), vt = s.v.narrow(2, 0, 1);
  fused->decode(qt, kt, vt, state);  // warm: the decode kernel's first launch loads it
  if (gpu)
    torch::cuda::synchronize();
  auto t0 = Clock::now();
  for (int64_t t = 0; t < steps; ++t)
    fused->decode(qt, kt, vt, state);
  if (gpu)
    torch::cuda::synchronize();
  double perStep = seconds(t0, Clock::now()) / steps;
  const Descriptor &desc = fused->descriptor();
  int64_t features = desc.numFeatures();
  int threads = torch::get_num_threads();
  bench::FmaPeak peak = gpu ? bench::FmaPeak{} : bench::measureFmaPeak(threads);
  std::cout << std::fixed << std::setprecision(4);
  std::cout << "causal " << opt.at("variant") << "  B=" << s.B << " H=" << s.H << " N=" << s.N
            << " d=" << s.d << " m=" << desc.m << " (features " << features << "), "
            << opt.at("device") << " " << opt.at("dtype")
            << (gpu ? "" : ", " + std::to_string(threads) + " threads, heap " + opt.at("heap") +
                               cpuContractions())
            << ", " << (s.weightGrad ? "W learnable (dW computed)" : "W drawn (no dW)") << "\n";
  // A left-out baseline prints as "-".
  auto num = [](double x, int precision) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(precision) << x;
    return std::isnan(x) ? std::string("-") : os.str();
  };
  std::cout << "forward           fused " << fF << " s   eager chunked reference " << num(fR, 4)
            << " s   SDPA causal " << num(fS, 4) << " s   reference/fused " << num(fR / fF, 2)
            << "   SDPA/fused " << num(fS / fF, 2) << "\n";
  std::cout << "forward+backward  fused " << bF << " s   eager chunked reference " << num(bR, 4)
            << " s   SDPA causal " << num(bS, 4) << " s   reference/fused " << num(bR / bF, 2)
            << "   SDPA/fused " << num(bS / bF, 2) << "\n";
  if (peak.gflops > 0) {
    // The bidirectional contractions' count (the prefix products within a tile come on top).
    double f1 = flops(Method::Fused, s, desc.m, features, false) / fF / 1e9,
           f2 = flops(Method::Fused, s, desc.m, features, true) / bF / 1e9;
    // And the causal kernels' own contractions (on the CPU plan, one task per slice).
    double own = 0;
    for (const char *kind : {"causal_readout", "causal_query_backward", "causal_key_backward"})
      own += kernelFlops(kind, s, desc.m, features);
    std::cout << "CPU FMA peak      " << std::setprecision(1) << peak.gflops << " GFLOP/s ("
              << peak.isa << ", measured in this run): fused causal forward " << f1
              << " GFLOP/s = " << 100 * f1 / peak.gflops << "%, forward+backward " << f2
              << " GFLOP/s = " << 100 * f2 / peak.gflops
              << "% of it (contractions counted as the bidirectional kernels'); the causal "
              << "kernels' own contractions ("
              << spectra_cpu_causal_tile_rows(features, s.d) << "-row tiles) "
              << own / bF / 1e9 << " GFLOP/s = " << 100 * own / bF / 1e9 / peak.gflops << "%"
              << std::setprecision(4) << "\n";
  }
  printKernelBreakdown(timed, s, desc.m, features, peak.gflops,
                       gpu ? std::map<std::string, KernelBound>{} : kernelBounds(s, true));
  std::cout << "decoding          " << std::setprecision(1) << 1.0 / perStep
            << " steps/s after an " << s.N << "-token prompt (" << s.B * s.H
            << " heads per step, " << std::setprecision(3) << 1e6 * perStep
            << " us per step; state " << (features * (s.d + 2) * 4) / 1024.0
            << " KiB per head, independent of N)\n";
  if (!baselines) {
    std::cout << "(N > 16384: the eager reference and SDPA are left out)\n";
    return 0;
  }
  std::cout << "max |fused - reference| / max |reference|: " << std::scientific
            << ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() /
                b.to(torch::kFloat64).abs().max())
                   .item<double>()
            << "\n";
  return 0;
}

int main(int argc, char **argv) {
  std::map<std::string, std::string> opt = {
      {"variant", "posrf-mm"}, {"batch", "4"},   {"heads", "2"},      {"length", "4096"},
      {"dim", "32"},           {"m", "128"},     {"repeats", "5"},    {"device", "cpu"},
      {"dtype", "f32"},        {"child", ""},    {"sweep", ""},       {"lengths", "1024,2048,4096,8192,16384,32768,65536"},
      {"shapes", "32x128,64x256"}, {"dtypes", ""}, {"max-seconds", "5"}, {"heap", "kept"},
      {"causal", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "usage: spectra-bench [--variant V|paper] [--batch B] [--heads H] [--length N] "
                   "[--dim d] [--m m] [--repeats R] [--device cpu|cuda|gpu-emulated] [--dtype f32|bf16|f16] [--causal]\n"
                   "       spectra-bench --sweep DIR [--variant V] [--batch B] [--heads H] "
                   "[--lengths 1024,...,65536] [--shapes 32x128,64x256] [--dtypes f32,bf16] "
                   "[--max-seconds 5] [--repeats R] [--device cpu|cuda]\n"
                   "Compares the fused kernels with the eager reference, torch's SDPA and a "
                   "hand-written torch linear attention (time, FLOP/s, bandwidth, memory).\n"
                   "--causal: causal attention (fused, the eager chunked reference, SDPA with "
                   "is_causal; forward and forward+backward) and decoding steps/s.\n"
                   "--variant paper: the paper's 18 variants in one run (fused GFLOP/s, share "
                   "of the FMA peak, eager/fused, SDPA/fused; the fused forward+backward in "
                   "max(repeats, 5) rounds of one pass per variant, so the variants share the "
                   "machine's slow phases).\n"
                   "--device gpu-emulated: the GPU kernels run on the CPU beside the CPU kernels "
                   "and the reference (times, and each one's distance from float64).\n"
                   "--heap kept (default): glibc's heap keeps freed pages (no mmap per tensor, no "
                   "trimming), so no method pays page faults for every fresh buffer; --heap system: "
                   "glibc's defaults (eager methods then run up to 3x slower, and times vary more).\n";
      return 0;
    }
    if (a == "--causal") {
      opt["causal"] = "1";
      continue;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc || !opt.count(a.substr(2))) {
      std::cerr << "spectra-bench: error: unknown or incomplete option '" << a << "' (--help)\n";
      return 1;
    }
    opt[a.substr(2)] = argv[++i];
  }
  try {
    if (opt["heap"] == "kept") {
      // Page faults on fresh multi-MB tensors would otherwise dominate the eager baselines.
      mallopt(M_MMAP_MAX, 0);  // every block from the heap
      mallopt(M_TRIM_THRESHOLD, 1 << 30);
      mallopt(M_TOP_PAD, 64 << 20);
    } else if (opt["heap"] != "system") {
      throw std::invalid_argument("--heap must be kept or system, got '" + opt["heap"] + "'");
    }
    Setup s;
    s.B = positive("--batch", opt["batch"]);
    s.H = positive("--heads", opt["heads"]);
    s.N = positive("--length", opt["length"]);
    s.d = positive("--dim", opt["dim"]);
    s.repeats = int(std::min<int64_t>(positive("--repeats", opt["repeats"]), 1 << 20));
    if (opt["device"] != "cpu" && opt["device"] != "cuda" && opt["device"] != "gpu-emulated")
      throw std::invalid_argument("--device must be cpu, cuda or gpu-emulated, got '" +
                                  opt["device"] + "'");
    if (opt["device"] == "cuda") {
      if (!torch::cuda::is_available())
        throw std::invalid_argument("--device cuda: torch sees no CUDA device on this machine");
      s.device = torch::Device(torch::kCUDA, 0);
    }
    try {
      s.dtype = scalarTypeOf(opt["dtype"]);
    } catch (const std::invalid_argument &) {
      throw std::invalid_argument("--dtype must be f32, bf16 or f16");
    }
    s.options.variant = opt["variant"];
    s.options.config.m = positive("--m", opt["m"]);
    s.options.config.d = s.d;
    torch::manual_seed(0);
    auto o = torch::TensorOptions().dtype(s.dtype).device(s.device);
    s.q = torch::randn({s.B, s.H, s.N, s.d}, o);
    s.k = torch::randn({s.B, s.H, s.N, s.d}, o);
    s.v = torch::randn({s.B, s.H, s.N, s.d}, o);
    s.gout = torch::randn({s.B, s.H, s.N, s.d}, o);
    if (!opt["child"].empty())
      return measureChild(s, parseAttentionMode(opt["child"]));
    if (opt["variant"] == "paper")
      return benchPaper(s, opt);
    if (opt["causal"] == "1")
      return benchCausal(s, opt);
    if (opt["device"] == "gpu-emulated") {
      if (!opt["sweep"].empty())
        throw std::invalid_argument("--sweep measures a real device (cpu or cuda), not gpu-emulated");
      return benchEmulated(s, opt);
    }
    if (!opt["sweep"].empty()) {
      if (opt["dtypes"].empty())
        opt["dtypes"] = s.device.is_cuda() ? "f32,bf16" : "f32";
      return sweep(opt, opt["sweep"], s, argv[0]);
    }

    // The FMA peak before the timings (and again after them: the better is the peak).
    const bench::FmaPeak peakBefore =
        s.device.is_cpu() ? bench::measureFmaPeak(torch::get_num_threads()) : bench::FmaPeak{};
    // And the AMX tile unit's, where the contractions run on it (printAmxShare).
    const double amxBefore = s.device.is_cpu() && spectra_cpu_amx()
                                 ? bench::measureAmxPeak(torch::get_num_threads())
                                 : 0;
    // The JIT: cold compile into an empty cache directory, a disk hit, a memory hit.
    std::string cacheDir = "/tmp/spectra-bench-cache-" + std::to_string(getpid());
    setenv("SPECTRA_CACHE_DIR", cacheDir.c_str(), 1);
    KernelCache &cache = KernelCache::instance();
    SpectralAttention fused = makeModule(s, AttentionMode::Fused);
    auto first = [&] {
      torch::NoGradGuard g;
      fused->forward(s.q.narrow(2, 0, 2), s.k.narrow(2, 0, 2), s.v.narrow(2, 0, 2));
    };
    auto t0 = Clock::now();
    first();
    double cold = seconds(t0, Clock::now());
    cache.clearMemory();
    SpectralAttention again = makeModule(s, AttentionMode::Fused);
    t0 = Clock::now();
    if (s.device.is_cuda()) {
      torch::NoGradGuard g;
      again->forward(s.q.narrow(2, 0, 2), s.k.narrow(2, 0, 2), s.v.narrow(2, 0, 2));
    } else {
      again->fusedCpu();
    }
    double disk = seconds(t0, Clock::now());
    SpectralAttention third = makeModule(s, AttentionMode::Fused);
    t0 = Clock::now();
    if (!s.device.is_cuda())
      third->fusedCpu();
    double memory = seconds(t0, Clock::now());
    (void)std::system(("rm -rf '" + cacheDir + "'").c_str());

    SpectralAttention reference = makeModule(s, AttentionMode::Reference);
    torch::Tensor a, b;
    // The fused kernels, the eager reference and the baselines a user has without Spectra
    // (softmax SDPA, linear attention by hand), each pass of every method in turn: a slow
    // phase of the machine then falls on all of them alike, and their ratios hold.
    auto methodPass = [&](Method method, bool backward) -> std::function<void()> {
      return [&, method, backward] {
        if (backward) {
          forwardBackwardOf(s, [&](auto &q, auto &k, auto &v) {
            return runMethod(method, s, fused, reference, q, k, v);
          });
          return;
        }
        torch::NoGradGuard g;
        torch::Tensor out = runMethod(method, s, fused, reference, s.q, s.k, s.v);
        if (method == Method::Fused)
          a = out;
        else if (method == Method::Reference)
          b = out;
      };
    };
    const std::vector<Method> methods = {Method::Fused, Method::Reference, Method::Sdpa,
                                         Method::TorchLinear};
    std::vector<std::function<void()>> forwards, both;
    for (Method method : methods) {
      forwards.push_back(methodPass(method, false));
      both.push_back(methodPass(method, true));
    }
    std::vector<double> tf = interleavedMedians(s.repeats, s.device, forwards),
                        tb = interleavedMedians(s.repeats, s.device, both);
    const double tfF = tf[0], tfR = tf[1], tfS = tf[2], tfL = tf[3];
    const double tbF = tb[0], tbR = tb[1], tbS = tb[2], tbL = tb[3];
    // Where the fused forward+backward spends its time, kernel by kernel (CPU launches are
    // synchronous, so host timing is exact there).
    TimedPasses timed;
    if (!s.device.is_cuda())
      timed = timeKernelPasses(s.repeats, [&] { forwardBackward(fused, s); });
    int64_t memF, memR;
    if (s.device.is_cuda()) {
      memF = cudaPeak(fused, s);
      memR = cudaPeak(reference, s);
    } else {
      memF = measureInChild(argc, argv, "fused");
      memR = measureInChild(argc, argv, "reference");
    }
    const Descriptor &desc = fused->descriptor();
    std::cout << std::fixed << std::setprecision(4);
    std::cout << "variant " << opt["variant"] << "  B=" << s.B << " H=" << s.H << " N=" << s.N
              << " d=" << s.d << " m=" << desc.m << " (features " << desc.numFeatures() << "), "
              << opt["device"] << " " << opt["dtype"]
              << (s.device.is_cuda() ? "" : ", " + std::to_string(torch::get_num_threads()) + " threads")
              << ", heap " << opt["heap"] << (s.device.is_cuda() ? "" : cpuContractions()) << ", "
              << (s.weightGrad ? "W learnable (dW computed)" : "W drawn (no dW)") << "\n";
    std::cout << "JIT: cold compile " << cold << " s, disk-cache hit " << disk
              << " s, memory-cache hit " << std::setprecision(6) << memory << std::setprecision(4)
              << " s\n";
    std::cout << "timing            the median of " << s.repeats
              << (s.repeats == 1 ? " round" : " rounds") << ", each one pass of "
              << "every method in turn (fused, reference, SDPA, linear)\n";
    std::cout << "forward           fused " << tfF << " s   reference " << tfR
              << " s   reference/fused " << tfR / tfF << "\n";
    std::cout << "forward+backward  fused " << tbF << " s   reference " << tbR
              << " s   reference/fused " << tbR / tbF << "\n";
    std::cout << "baselines         torch SDPA (softmax) forward " << tfS << " s, forward+backward "
              << tbS << " s   SDPA/fused " << std::setprecision(2) << tfS / tfF << " and "
              << tbS / tbF << std::setprecision(4) << "\n";
    std::cout << "                  torch linear attention (PosRF by hand) forward " << tfL
              << " s, forward+backward " << tbL << " s   linear/fused " << std::setprecision(2)
              << tfL / tfF << " and " << tbL / tbF << std::setprecision(4) << "\n";
    int64_t features = desc.numFeatures();
    std::cout << "fused throughput  forward " << std::setprecision(1)
              << flops(Method::Fused, s, desc.m, features, false) / tfF / 1e9 << " GFLOP/s "
              << bytes(s, false) / tfF / 1e9 << " GB/s, forward+backward "
              << flops(Method::Fused, s, desc.m, features, true) / tbF / 1e9 << " GFLOP/s "
              << bytes(s, true) / tbF / 1e9 << " GB/s" << std::setprecision(4) << "\n";
    if (!s.device.is_cuda()) {
      // The share of what this CPU does at best, measured now (machines change day to day).
      int threads = torch::get_num_threads();
      bench::FmaPeak peak = betterPeak(peakBefore, bench::measureFmaPeak(threads));
      if (peak.gflops > 0) {
        double forward = flops(Method::Fused, s, desc.m, features, false) / tfF / 1e9,
               both = flops(Method::Fused, s, desc.m, features, true) / tbF / 1e9;
        std::cout << "CPU FMA peak      " << std::setprecision(1) << peak.gflops
                  << " GFLOP/s (f32 FMA chains on " << threads << " thread(s), " << peak.isa
                  << ", measured in this run, the better of before and after the timings): "
                  << "fused forward " << 100 * forward / peak.gflops
                  << "%, forward+backward " << 100 * both / peak.gflops << "% of it";
        if (timed.fastestPass > 0)
          std::cout << " (the fastest of " << timed.passes << " passes "
                    << 100 * flops(Method::Fused, s, desc.m, features, true) / timed.fastestPass /
                           1e9 / peak.gflops
                    << "%)";
        std::cout << std::setprecision(4) << "\n";
      }
      printKernelBreakdown(timed, s, desc.m, features, peak.gflops, kernelBounds(s, false));
      if (peak.gflops > 0)
        printAmxShare(timed, s, desc.m, features, peak.gflops, threads, amxBefore);
      if (threads > 1 && peak.gflops > 0)
        printThreadScaling(s, fused, reference, desc.m, features, tbF, peak.gflops, threads,
                           timed);
    }
    std::cout << "peak memory (forward+backward)  fused " << mib(memF) << "   reference "
              << mib(memR);
    if (memF > 0 && memR > 0)
      std::cout << "   reference/fused " << std::setprecision(2) << double(memR) / memF;
    std::cout << "\nphi materialised by the reference: "
              << mib(int64_t(2) * s.B * s.H * s.N * desc.numFeatures() * 4)
              << " per forward; by the fused kernels: 0\n";
    std::cout << "max |fused - reference| / max |reference|: " << std::scientific
              << ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() /
                  b.to(torch::kFloat64).abs().max())
                     .item<double>()
              << "\n";
  } catch (const c10::Error &e) {
    // LibTorch's checks: their message, without the C++ backtrace.
    std::cerr << "spectra-bench: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception &e) {
    std::cerr << "spectra-bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
