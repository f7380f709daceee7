//===- spectra-bench.cpp - fused kernels against the eager reference ------===//
//
//   spectra-bench [--variant posrf-mm] [--batch 4 --heads 2 --length 4096 --dim 32 --m 128]
//                 [--repeats 5]
//
// Prints the compile time of the fused CPU kernel, the median forward time of
// the fused kernel and of the eager reference (which materialises phi), their
// ratio, the largest difference between the two, and the bytes of phi the
// reference materialises (the fused kernel stores none).
//
//===----------------------------------------------------------------------===//

#include "runtime/FusedCpu.h"
#include "runtime/WeightFactory.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>

using namespace spectra;
using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

template <typename F>
double median(int repeats, F &&f) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = Clock::now();
    f();
    times.push_back(seconds(t0, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
} // namespace

int main(int argc, char **argv) {
  std::map<std::string, std::string> opt = {{"variant", "posrf-mm"}, {"batch", "4"},
                                            {"heads", "2"},          {"length", "4096"},
                                            {"dim", "32"},           {"m", "128"},
                                            {"repeats", "5"}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "usage: spectra-bench [--variant V] [--batch B] [--heads H] [--length N] "
                   "[--dim d] [--m m] [--repeats R]\n";
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc || !opt.count(a.substr(2))) {
      std::cerr << "spectra-bench: error: unknown or incomplete option '" << a << "' (--help)\n";
      return 1;
    }
    opt[a.substr(2)] = argv[++i];
  }
  try {
    int64_t B = std::stoll(opt["batch"]), H = std::stoll(opt["heads"]),
            N = std::stoll(opt["length"]), d = std::stoll(opt["dim"]);
    int repeats = std::stoi(opt["repeats"]);
    VariantConfig config;
    config.m = std::stoll(opt["m"]);
    config.d = d;
    auto c0 = Clock::now();
    FusedCpuAttention fused(opt["variant"], config);
    double compile = seconds(c0, Clock::now());
    const Descriptor &desc = fused.descriptor();
    Weights w = WeightFactory(desc).draw(desc.seed, torch::kFloat32);
    ReferenceFeatureMap reference(desc);
    torch::manual_seed(0);
    torch::Tensor q = torch::randn({B, H, N, d}), k = torch::randn({B, H, N, d}),
                  v = torch::randn({B, H, N, d});
    torch::NoGradGuard guard;
    torch::Tensor a, b;
    double tf = median(repeats, [&] { a = fused.forward(q, k, v, w).out; });
    double tr = median(repeats, [&] { b = reference.attention(q, k, v, w); });
    double phiBytes = 2.0 * B * H * N * desc.numFeatures() * 4;
    std::cout << std::fixed << std::setprecision(4);
    std::cout << "variant " << opt["variant"] << "  B=" << B << " H=" << H << " N=" << N
              << " d=" << d << " m=" << desc.m << " (features " << desc.numFeatures() << "), "
              << torch::get_num_threads() << " threads\n";
    std::cout << "fused kernel compile (JIT, cold): " << compile << " s\n";
    std::cout << "forward, fused CPU kernel:        " << tf << " s (median of " << repeats << ")\n";
    std::cout << "forward, eager reference:         " << tr << " s\n";
    std::cout << "reference / fused time ratio:     " << tr / tf << "\n";
    std::cout << "phi materialised by the reference: " << phiBytes / (1 << 20)
              << " MiB; by the fused kernel: 0\n";
    std::cout << "max |fused - reference| / max |reference|: " << std::scientific
              << ((a - b).abs().max() / b.abs().max()).item<double>() << "\n";
  } catch (const std::exception &e) {
    std::cerr << "spectra-bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
