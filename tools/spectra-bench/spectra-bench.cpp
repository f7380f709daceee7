//===- spectra-bench.cpp - fused kernels against the eager reference ------===//
//
//   spectra-bench [--variant posrf-mm] [--batch 4 --heads 2 --length 4096 --dim 32 --m 128]
//                 [--repeats 5] [--device cpu|cuda] [--dtype f32|bf16|f16]
//
// Through SpectralAttention (what a model calls), in one run:
//  - the JIT: cold compile into an empty cache directory, then a warm disk hit
//    (memory cache cleared) and an in-memory hit;
//  - median forward time and forward+backward time of the fused kernels and
//    of the eager reference (which materialises phi), with ratios;
//  - peak memory of forward+backward for each mode: the CUDA allocator's peak
//    on a GPU; on the CPU the growth of the peak resident set of a child
//    process that runs one mode alone;
//  - the largest difference between the two modes' outputs.
//
//===----------------------------------------------------------------------===//

#include "runtime/KernelCache.h"
#include "runtime/SpectralAttention.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <spawn.h>
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
};

SpectralAttention makeModule(const Setup &s, AttentionMode mode) {
  SpectralAttentionOptions o = s.options;
  o.mode = mode;
  SpectralAttention m(o);
  m->to(s.device);
  return m;
}

void forwardBackward(SpectralAttention &m, const Setup &s) {
  torch::Tensor q = s.q.detach().requires_grad_(), k = s.k.detach().requires_grad_(),
                v = s.v.detach().requires_grad_();
  m->forward(q, k, v).sum().backward();
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
} // namespace

int main(int argc, char **argv) {
  std::map<std::string, std::string> opt = {
      {"variant", "posrf-mm"}, {"batch", "4"},   {"heads", "2"},      {"length", "4096"},
      {"dim", "32"},           {"m", "128"},     {"repeats", "5"},    {"device", "cpu"},
      {"dtype", "f32"},        {"child", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "usage: spectra-bench [--variant V] [--batch B] [--heads H] [--length N] "
                   "[--dim d] [--m m] [--repeats R] [--device cpu|cuda] [--dtype f32|bf16|f16]\n";
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc || !opt.count(a.substr(2))) {
      std::cerr << "spectra-bench: error: unknown or incomplete option '" << a << "' (--help)\n";
      return 1;
    }
    opt[a.substr(2)] = argv[++i];
  }
  try {
    Setup s;
    s.B = std::stoll(opt["batch"]);
    s.H = std::stoll(opt["heads"]);
    s.N = std::stoll(opt["length"]);
    s.d = std::stoll(opt["dim"]);
    s.repeats = std::stoi(opt["repeats"]);
    if (opt["device"] != "cpu" && opt["device"] != "cuda")
      throw std::invalid_argument("--device must be cpu or cuda, got '" + opt["device"] + "'");
    if (opt["device"] == "cuda") {
      if (!torch::cuda::is_available())
        throw std::invalid_argument("--device cuda: torch sees no CUDA device on this machine");
      s.device = torch::Device(torch::kCUDA, 0);
    }
    s.dtype = opt["dtype"] == "bf16"  ? torch::kBFloat16
              : opt["dtype"] == "f16" ? torch::kHalf
              : opt["dtype"] == "f32" ? torch::kFloat32
                                      : throw std::invalid_argument("--dtype must be f32, bf16 or f16");
    s.options.variant = opt["variant"];
    s.options.config.m = std::stoll(opt["m"]);
    s.options.config.d = s.d;
    torch::manual_seed(0);
    auto o = torch::TensorOptions().dtype(s.dtype).device(s.device);
    s.q = torch::randn({s.B, s.H, s.N, s.d}, o);
    s.k = torch::randn({s.B, s.H, s.N, s.d}, o);
    s.v = torch::randn({s.B, s.H, s.N, s.d}, o);
    if (!opt["child"].empty())
      return measureChild(s, parseAttentionMode(opt["child"]));

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
    double tfF, tfR, tbF, tbR;
    {
      torch::NoGradGuard g;
      tfF = median(s.repeats, s.device, [&] { a = fused->forward(s.q, s.k, s.v); });
      tfR = median(s.repeats, s.device, [&] { b = reference->forward(s.q, s.k, s.v); });
    }
    tbF = median(s.repeats, s.device, [&] { forwardBackward(fused, s); });
    tbR = median(s.repeats, s.device, [&] { forwardBackward(reference, s); });
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
              << "\n";
    std::cout << "JIT: cold compile " << cold << " s, disk-cache hit " << disk
              << " s, memory-cache hit " << std::setprecision(6) << memory << std::setprecision(4)
              << " s\n";
    std::cout << "forward           fused " << tfF << " s   reference " << tfR
              << " s   reference/fused " << tfR / tfF << "\n";
    std::cout << "forward+backward  fused " << tbF << " s   reference " << tbR
              << " s   reference/fused " << tbR / tbF << "\n";
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
  } catch (const std::exception &e) {
    std::cerr << "spectra-bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
