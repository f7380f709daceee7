//===- spectra-eval.cpp - weights, features, attention and approximation studies ===//
//
//   spectra-eval weights   --variant posrf-orf --out W.npy
//   spectra-eval features  --variant oprf-mm --queries Q.npy --keys K.npy --out-queries PQ.npy --out-keys PK.npy
//   spectra-eval attention --variant saderf-orf --q Q.npy --k K.npy --v V.npy [--mask M.npy] --out O.npy
//   spectra-eval approx    --variants posrf-base,posrf-orf --ms 8,16,32,64 --out results/
//
// LibTorch only: the variant is described by libspectra-compiler's C API and
// evaluated by the eager reference (the oracle the fused kernels must match).
//
//===----------------------------------------------------------------------===//

#include "frontend/OptionText.h"
#include "runtime/Compiler.h"
#include "runtime/FusedCpu.h"
#include "runtime/FusedEmulated.h"
#include "runtime/KernelLaunch.h"
#include "runtime/FusedCuda.h"
#include "runtime/Npy.h"
#include "runtime/Reference.h"
#include "runtime/WeightFactory.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

using namespace spectra;

#ifndef SPECTRA_PLOT_SCRIPT
#define SPECTRA_PLOT_SCRIPT ""
#endif

namespace {

const char *kUsage = R"(spectra-eval: evaluate random features with the eager LibTorch reference.

Commands:
  weights    draw W (and SGQ's row weights) for a variant and seed
             --out W.npy [--out-row-weights A.npy]
  features   phi of queries and keys (parameters from their statistics)
             --queries Q.npy --keys K.npy [--mask M.npy] [--weights W.npy]
             --out-queries PQ.npy --out-keys PK.npy
  attention  random-feature attention of [B,H,N,d] inputs (q and k are scaled by d^-1/4)
             --q Q.npy --k K.npy --v V.npy [--mask M.npy (bool [B,N], true = keep)]
             [--weights W.npy] [--no-stabilize] [--scale S] [--mode reference|fused] [--causal]
             [--device cpu|cuda|gpu-emulated] --out O.npy   (fused: the JIT-compiled kernels, float32;
                                            gpu-emulated: the GPU kernels run on the CPU, in --dtype;
                                            --causal: out_i over keys j <= i, every mode and device)
  approx     MSE of phi(x)^T phi(y) against exp(x^T y) versus m, over seeds and pairs
             --variants A,B,... [--d 16] [--ms 8,16,32,64,128] [--seeds 50] [--pairs 256]
             [--query-mean 0] [--query-std d^-1/2] [--key-mean 0] [--key-std d^-1/2]
             --out DIR   (writes DIR/approx.csv and DIR/approx.png)
  mrf        random features beyond attention: the partition function of a linear-chain
             Markov random field over K states s_1..s_K in R^d with potentials
             exp(x_{t-1}^T x_t), Z = sum over all K^T paths, computed exactly (the forward
             algorithm in log space, O(T K^2)) and with the feature map (A ~ phi(S) phi(S)^T,
             O(T K m)); the error of log Z (|log Z_rf - log Z|, the plot) and the relative
             error of Z versus m; signed features (TrigRF) can make Z_rf <= 0 (counted)
             --variants A,B,... [--states 64] [--d 16] [--length 10] [--state-std d^-1/2]
             [--ms 8,16,32,64,128,256] [--seeds 20] --out DIR (DIR/mrf.csv, DIR/mrf.png)

Variant options (all commands):
  --variant NAME       <component>-<weights>, e.g. posrf-mm (see spectra-compile --list)
  --ir FILE.mlir       a user-declared feature map instead of --variant
  --feature-map NAME   which feature map of --ir (when it has several)
  --m M --d D --seed S --option NAME=VALUE (repeatable)
  --dtype f32|f64      computation dtype (default f64)
)";

/// `text` as a whole integer (no sign-only, blank or trailing characters), else none.
std::optional<int64_t> wholeInteger(const std::string &text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception &) {
    return std::nullopt;
  }
  if (used != text.size())
    return std::nullopt;
  return v;
}

struct Args {
  std::string command;
  std::map<std::string, std::vector<std::string>> values;
  std::set<std::string> flags;

  bool has(const std::string &k) const { return values.count(k) || flags.count(k); }
  std::string get(const std::string &k, const std::string &fallback = "") const {
    auto it = values.find(k);
    return it == values.end() ? fallback : it->second.back();
  }
  std::string require(const std::string &k) const {
    if (!values.count(k))
      throw std::invalid_argument("missing --" + k + " (spectra-eval " + command + " --help)");
    return get(k);
  }
  int64_t integer(const std::string &k, int64_t fallback) const {
    if (!values.count(k))
      return fallback;
    std::optional<int64_t> v = wholeInteger(get(k));
    if (!v)
      throw std::invalid_argument("--" + k + " expects an integer, got '" + get(k) + "'");
    return *v;
  }
  double number(const std::string &k, double fallback) const {
    if (!values.count(k))
      return fallback;
    try {
      size_t used = 0;
      double v = std::stod(get(k), &used);
      if (used != get(k).size())
        throw std::invalid_argument("");
      return v;
    } catch (...) {
      throw std::invalid_argument("--" + k + " expects a number, got '" + get(k) + "'");
    }
  }
};

const std::set<std::string> kFlags = {"no-stabilize", "causal", "help"};

Args parse(int argc, char **argv) {
  Args args;
  if (argc < 2)
    throw std::invalid_argument("missing command\n\n" + std::string(kUsage));
  args.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0)
      throw std::invalid_argument("unexpected argument '" + a + "'");
    a = a.substr(2);
    auto eq = a.find('=');
    if (eq != std::string::npos && a.substr(0, eq) != "option") {
      args.values[a.substr(0, eq)].push_back(a.substr(eq + 1));
    } else if (kFlags.count(a)) {
      args.flags.insert(a);
    } else {
      if (i + 1 >= argc)
        throw std::invalid_argument("--" + a + " needs a value");
      args.values[a].push_back(argv[++i]);
    }
  }
  return args;
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty())
      out.push_back(item);
  return out;
}

Descriptor describeFrom(const Args &args, const std::string &variant, int64_t m) {
  if (args.has("ir")) {
    std::ifstream in(args.get("ir"));
    if (!in)
      throw std::invalid_argument("cannot read --ir " + args.get("ir"));
    std::stringstream text;
    text << in.rdbuf();
    return describeIR(text.str(), args.get("ir"), args.get("feature-map"));
  }
  VariantConfig config;
  config.m = m;
  config.d = args.integer("d", 32);
  config.seed = args.integer("seed", 0);
  auto it = args.values.find("option");
  if (it != args.values.end())
    for (const std::string &kv : it->second)
      if (std::string error = parseOption(kv, config.options); !error.empty())
        throw std::invalid_argument("--option " + error);
  return describeVariant(variant, config);
}

Descriptor describeFrom(const Args &args) {
  if (!args.has("ir") && !args.has("variant"))
    throw std::invalid_argument("give --variant NAME or --ir FILE.mlir");
  return describeFrom(args, args.get("variant"), args.integer("m", 128));
}

torch::ScalarType dtypeOf(const Args &args) {
  std::string d = args.get("dtype", "f64");
  if (d == "f64")
    return torch::kFloat64;
  try {
    return scalarTypeOf(d);
  } catch (const std::invalid_argument &) {
    throw std::invalid_argument("--dtype must be f64, f32, bf16 or f16, got '" + d + "'");
  }
}

Weights weightsFor(const Args &args, const Descriptor &desc, torch::ScalarType dtype) {
  if (args.has("weights")) {
    torch::Tensor W = readNpy(args.get("weights")).to(dtype);
    if (W.dim() != 2 || W.size(0) != desc.m || W.size(1) != desc.d)
      throw std::invalid_argument(args.get("weights") + ": W must be [" + std::to_string(desc.m) +
                                  ", " + std::to_string(desc.d) + "], got " +
                                  c10::str(W.sizes()));
    if (desc.rowWeights)
      throw std::invalid_argument("--weights cannot replace a recipe with row weights ('" +
                                  desc.recipeName + "'); draw it instead");
    return Weights{W, std::nullopt, {}};
  }
  return WeightFactory(desc).draw(desc.seed, dtype);
}

std::optional<torch::Tensor> maskFrom(const Args &args) {
  if (!args.has("mask"))
    return std::nullopt;
  torch::Tensor mask = readNpy(args.get("mask"));
  if (mask.scalar_type() != torch::kBool)
    mask = mask != 0;
  return mask;
}

torch::Tensor input(const Args &args, const std::string &key, torch::ScalarType dtype) {
  return readNpy(args.require(key)).to(dtype);
}

int weights(const Args &args) {
  Descriptor desc = describeFrom(args);
  Weights w = WeightFactory(desc).draw(desc.seed, dtypeOf(args));
  writeNpy(args.require("out"), w.W);
  std::cout << "wrote W [" << desc.m << ", " << desc.d << "] of " << desc.name << " (seed "
            << desc.seed << ") to " << args.get("out") << "\n";
  if (w.rowWeights) {
    std::string path = args.get("out-row-weights", args.get("out") + ".row_weights.npy");
    writeNpy(path, *w.rowWeights);
    std::cout << "wrote row weights [" << desc.m << "] to " << path << "\n";
  }
  return 0;
}

int features(const Args &args) {
  Descriptor desc = describeFrom(args);
  torch::ScalarType dtype = dtypeOf(args);
  torch::Tensor q = input(args, "queries", dtype), k = input(args, "keys", dtype);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "features: queries and keys must be [B, H, N, d]");
  std::optional<torch::Tensor> mask = maskFrom(args);
  Weights w = weightsFor(args, desc, dtype);
  ReferenceFeatureMap fm(desc);
  ComponentParams p = fm.params(q, k, mask);
  writeNpy(args.require("out-queries"), fm.features(q, Side::Queries, p, w));
  writeNpy(args.require("out-keys"), fm.features(k, Side::Keys, p, w, mask));
  std::cout << "wrote phi [.., " << desc.numFeatures() << "] of queries to "
            << args.get("out-queries") << " and of keys to " << args.get("out-keys") << "\n";
  return 0;
}

int attention(const Args &args) {
  Descriptor desc = describeFrom(args);
  torch::ScalarType dtype = dtypeOf(args);
  torch::Tensor q = input(args, "q", dtype), k = input(args, "k", dtype), v = input(args, "v", dtype);
  AttentionOptions options;
  options.stabilizer = args.has("no-stabilize") ? Stabilizer::None : Stabilizer::Exact;
  if (args.has("scale"))
    options.scale = args.number("scale", 0);
  options.causal = args.has("causal");
  std::string mode = args.get("mode", "reference");
  std::string deviceName = args.get("device", "cpu");
  if (deviceName != "cpu" && deviceName != "cuda" && deviceName != "gpu-emulated")
    throw std::invalid_argument("--device must be cpu, cuda or gpu-emulated, got '" + deviceName + "'");
  if (deviceName == "gpu-emulated" && mode != "fused")
    throw std::invalid_argument("--device gpu-emulated runs the fused GPU kernels: it needs --mode fused");
  if (deviceName == "cuda" && !torch::cuda::is_available())
    throw std::invalid_argument("--device cuda: torch sees no CUDA device on this machine");
  torch::Device device(deviceName == "cuda" ? torch::kCUDA : torch::kCPU);
  q = q.to(device);
  k = k.to(device);
  v = v.to(device);
  std::optional<torch::Tensor> mask = maskFrom(args);
  if (mask)
    mask = mask->to(device);
  torch::Tensor out;
  if (mode == "fused") {
    if (options.stabilizer == Stabilizer::None)
      throw std::invalid_argument("--no-stabilize applies to the reference only: the fused kernel "
                                  "always uses the exact stabiliser");
    std::string irText;
    if (args.has("ir")) {
      std::ifstream in(args.get("ir"));
      std::stringstream text;
      text << in.rdbuf();
      irText = text.str();
    }
    VariantConfig config;
    config.m = desc.m;
    config.d = desc.d;
    config.seed = desc.seed;
    config.options = desc.options;
    Weights w = weightsFor(args, desc, torch::kFloat32);
    if (deviceName == "gpu-emulated") {
      // The GPU kernels' mapped IR run on the CPU, with q, k, v in the requested dtype.
      std::string dt = spectra::elementName(dtype);
      FusedEmulatedAttention fused =
          args.has("ir") ? FusedEmulatedAttention::fromIR(irText, args.get("ir"),
                                                          args.get("feature-map"), dt, options.causal)
                         : FusedEmulatedAttention(args.get("variant"), config, dt, options.causal);
      torch::NoGradGuard noGrad;
      out = fused.attention(q, k, v, w, mask, options.scale).to(torch::kFloat32);
    } else if (device.is_cuda()) {
      auto fused = args.has("ir") ? FusedCudaAttention::fromIR(irText, args.get("ir"),
                                                               args.get("feature-map"), options.causal)
                                  : FusedCudaAttention::forVariant(args.get("variant"), config,
                                                                   options.causal);
      torch::NoGradGuard noGrad;
      out = fused->attention(q, k, v, w, mask, options.scale).cpu();
    } else {
      FusedCpuAttention fused =
          args.has("ir") ? FusedCpuAttention::fromIR(irText, args.get("ir"), args.get("feature-map"),
                                                     options.causal)
                         : FusedCpuAttention(args.get("variant"), config, options.causal);
      out = fused.forward(q, k, v, w, mask, options.scale).out;
    }
  } else if (mode == "reference") {
    ReferenceFeatureMap fm(desc);
    Weights w = weightsFor(args, desc, dtype);
    w.W = w.W.to(device);
    if (w.rowWeights)
      w.rowWeights = w.rowWeights->to(device);
    out = fm.attention(q, k, v, w, mask, options).cpu();
  } else {
    throw std::invalid_argument("--mode must be reference or fused, got '" + mode + "'");
  }
  writeNpy(args.require("out"), out);
  std::cout << "wrote attention output " << c10::str(out.sizes()) << " of " << desc.name << " ("
            << mode << (options.causal ? ", causal" : "") << ") to " << args.get("out") << "\n";
  return 0;
}

/// Plots a study's CSV (plot_approx.py): `column` (and `column`_stderr) against m per variant.
void plot(const std::string &csv, const std::string &png, const std::string &column,
          const std::string &label, const std::string &title) {
  std::string script = SPECTRA_PLOT_SCRIPT;
  std::string cmd = "python3 '" + script + "' '" + csv + "' '" + png + "' '" + column + "' '" + label +
                    "' '" + title + "'";
  if (!script.empty() && std::system(cmd.c_str()) == 0)
    std::cout << "wrote " << png << "\n";
  else
    std::cerr << "warning: the plot was not written (needs python3 with matplotlib: "
                 "pip install matplotlib); the CSV is complete\n";
}

/// One entry of a comma-separated list option (`--NAME a,b,c`) as a whole integer, or an
/// error that names the option and the entry.
int64_t listInteger(const std::string &name, const std::string &entry) {
  std::optional<int64_t> v = wholeInteger(entry);
  if (!v)
    throw std::invalid_argument("--" + name + " takes a comma-separated list of integers, got '" +
                                entry + "'");
  return *v;
}

int approx(const Args &args) {
  std::vector<std::string> variants = split(args.get("variants", "posrf-base,posrf-orf,trigrf-base,trigrf-orf"), ',');
  std::vector<int64_t> ms;
  for (const std::string &m : split(args.get("ms", "8,16,32,64,128"), ','))
    ms.push_back(listInteger("ms", m));
  int64_t seeds = args.integer("seeds", 50), pairs = args.integer("pairs", 256);
  int64_t d = args.integer("d", 16);
  if (seeds < 2 || pairs < 1)
    throw std::invalid_argument("approx needs --seeds >= 2 and --pairs >= 1");
  std::string dir = args.require("out");
  if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0)
    throw std::runtime_error("cannot create " + dir);

  // Pairs (x, y): the same for every variant, m and seed.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  // Default spread d^-1/2: ||x|| ~ 1, the regime of the Performer comparisons.
  double spread = 1.0 / std::sqrt(static_cast<double>(d));
  double qm = args.number("query-mean", 0), qs = args.number("query-std", spread);
  double km = args.number("key-mean", 0), ks = args.number("key-std", spread);
  torch::Tensor x = (torch::randn({1, 1, pairs, d}, gen, torch::kFloat64) * qs + qm);
  torch::Tensor y = (torch::randn({1, 1, pairs, d}, gen, torch::kFloat64) * ks + km);
  torch::Tensor target = torch::exp((x * y).sum(-1)).view({pairs});

  std::ofstream csv(dir + "/approx.csv");
  csv << "variant,m,features,mse,mse_stderr,relative_mse\n";
  std::cout << std::left << std::setw(22) << "variant" << std::setw(6) << "m" << std::setw(14)
            << "MSE" << std::setw(14) << "stderr" << "relative MSE\n";
  for (const std::string &variant : variants)
    for (int64_t m : ms) {
      Args local = args;
      local.values["d"] = {std::to_string(d)};
      Descriptor desc = describeFrom(local, variant, m);
      WeightFactory factory(desc);
      ReferenceFeatureMap fm(desc);
      ComponentParams p = fm.params(x, y);
      std::vector<double> perSeed;
      torch::Tensor relative = torch::zeros({}, torch::kFloat64);
      for (int64_t s = 0; s < seeds; ++s) {
        Weights w = factory.draw(desc.seed * 1000003 + s);
        torch::Tensor est = (fm.features(x, Side::Queries, p, w) *
                             fm.features(y, Side::Keys, p, w)).sum(-1).view({pairs});
        torch::Tensor err = (est - target).square();
        perSeed.push_back(err.mean().item<double>());
        relative += (err / target.square()).mean();
      }
      torch::Tensor e = torch::tensor(perSeed, torch::kFloat64);
      double mse = e.mean().item<double>(), se = e.std().item<double>() / std::sqrt(double(seeds));
      double rel = relative.item<double>() / static_cast<double>(seeds);
      csv << variant << "," << desc.m << "," << desc.numFeatures() << "," << std::setprecision(10)
          << mse << "," << se << "," << rel << "\n";
      std::cout << std::setw(22) << variant << std::setw(6) << desc.m << std::setw(14)
                << std::setprecision(5) << mse << std::setw(14) << se << rel << "\n";
    }
  csv.close();
  std::cout << "wrote " << dir << "/approx.csv\n";
  plot(dir + "/approx.csv", dir + "/approx.png", "mse", "MSE of phi(x)^T phi(y) vs exp(x^T y)",
       "Kernel approximation error");
  return 0;
}

int mrf(const Args &args) {
  std::vector<std::string> variants =
      split(args.get("variants", "posrf-base,posrf-orf,posrf-simrf,posrf-scrf,oprf-orf,trigrf-orf"), ',');
  std::vector<int64_t> ms;
  for (const std::string &m : split(args.get("ms", "8,16,32,64,128,256"), ','))
    ms.push_back(listInteger("ms", m));
  int64_t K = args.integer("states", 64), d = args.integer("d", 16), T = args.integer("length", 10);
  int64_t seeds = args.integer("seeds", 20);
  double stateStd = args.number("state-std", 1.0 / std::sqrt(static_cast<double>(d)));
  if (K < 1 || d < 1 || T < 1 || seeds < 2 || stateStd < 0)
    throw std::invalid_argument("mrf needs --states, --d, --length >= 1, --seeds >= 2 and "
                                "--state-std >= 0");
  std::string dir = args.require("out");
  if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0)
    throw std::runtime_error("cannot create " + dir);

  // The states (the same for every variant, m and seed) and the exact log Z:
  // alpha_1 = 0, alpha_t(j) = logsumexp_i(alpha_{t-1}(i) + s_i^T s_j), log Z = logsumexp(alpha_T).
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4321);
  torch::Tensor S = torch::randn({K, d}, gen, torch::kFloat64) * stateStd;
  torch::Tensor logA = S.matmul(S.t());
  torch::Tensor alpha = torch::zeros({K}, torch::kFloat64);
  for (int64_t t = 1; t < T; ++t)
    alpha = torch::logsumexp(alpha.unsqueeze(1) + logA, 0);
  double logZ = torch::logsumexp(alpha, 0).item<double>();

  std::ofstream csv(dir + "/mrf.csv");
  csv << "variant,m,features,log_z_error,log_z_error_stderr,relative_error,relative_error_stderr,"
         "log_z,log_z_rf,invalid\n";
  std::cout << "linear-chain MRF: " << K << " states in R^" << d << ", length " << T
            << ", log Z = " << std::setprecision(10) << logZ << " (exact, forward algorithm)\n";
  std::cout << std::left << std::setw(22) << "variant" << std::setw(6) << "m" << std::setw(16)
            << "|log Z error|" << std::setw(14) << "stderr" << std::setw(16) << "rel. error Z"
            << "invalid draws\n";
  torch::Tensor x = S.view({1, 1, K, d});
  for (const std::string &variant : variants)
    for (int64_t m : ms) {
      Args local = args;
      local.values["d"] = {std::to_string(d)};
      Descriptor desc = describeFrom(local, variant, m);
      WeightFactory factory(desc);
      ReferenceFeatureMap fm(desc);
      ComponentParams p = fm.params(x, x);
      std::vector<double> errors, logErrors, logZs;
      int64_t invalid = 0;
      for (int64_t s = 0; s < seeds; ++s) {
        Weights w = factory.draw(desc.seed * 1000003 + s);
        // A ~ Pq Pk^T: alpha_t = Pk (Pq^T alpha_{t-1}), renormalised every step (log c_t kept).
        torch::Tensor Pq = fm.features(x, Side::Queries, p, w).view({K, -1});
        torch::Tensor Pk = fm.features(x, Side::Keys, p, w).view({K, -1});
        // Renormalised by max |alpha| (signed features may make entries or sums negative on the
        // way; only the final Z_rf must be positive).
        torch::Tensor a = torch::ones({K}, torch::kFloat64);
        double logScale = 0;
        bool ok = true;
        for (int64_t t = 1; t < T && ok; ++t) {
          a = Pk.mv(Pq.t().mv(a));
          double peak = a.abs().max().item<double>();
          ok = std::isfinite(peak) && peak > 0;
          if (ok) {
            a = a / peak;
            logScale += std::log(peak);
          }
        }
        double total = ok ? a.sum().item<double>() : 0;
        if (!ok || !(total > 0)) {
          ++invalid;
          continue;
        }
        double logZrf = logScale + std::log(total);
        logZs.push_back(logZrf);
        logErrors.push_back(std::abs(logZrf - logZ));
        errors.push_back(std::abs(std::expm1(logZrf - logZ)));
      }
      // Mean and standard error over the valid draws (NaN when there is none).
      auto meanAndError = [](const std::vector<double> &v) -> std::pair<double, double> {
        if (v.empty())
          return {NAN, NAN};
        torch::Tensor t = torch::tensor(v, torch::kFloat64);
        double se = v.size() > 1 ? t.std().item<double>() / std::sqrt(double(v.size())) : 0.0;
        return {t.mean().item<double>(), se};
      };
      auto [logError, logSe] = meanAndError(logErrors);
      auto [relError, relSe] = meanAndError(errors);
      double meanLogZ = meanAndError(logZs).first;
      csv << variant << "," << desc.m << "," << desc.numFeatures() << "," << std::setprecision(10)
          << logError << "," << logSe << "," << relError << "," << relSe << "," << logZ << ","
          << meanLogZ << "," << invalid << "\n";
      std::cout << std::setw(22) << variant << std::setw(6) << desc.m << std::setw(16)
                << std::setprecision(5) << logError << std::setw(14) << logSe << std::setw(16)
                << relError << invalid << "\n";
    }
  csv.close();
  std::cout << "wrote " << dir << "/mrf.csv\n";
  plot(dir + "/mrf.csv", dir + "/mrf.png", "log_z_error", "|log Z_rf - log Z|",
       "Linear-chain MRF partition function (" + std::to_string(K) + " states, length " +
           std::to_string(T) + ")");
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    Args args = parse(argc, argv);
    if (args.command == "--help" || args.command == "-h" || args.command == "help" ||
        args.has("help")) {
      std::cout << kUsage;
      return 0;
    }
    if (args.command == "weights")
      return weights(args);
    if (args.command == "features")
      return features(args);
    if (args.command == "attention")
      return attention(args);
    if (args.command == "approx")
      return approx(args);
    if (args.command == "mrf")
      return mrf(args);
    throw std::invalid_argument("unknown command '" + args.command +
                                "' (commands: weights, features, attention, approx, mrf)");
  } catch (const c10::Error &e) {
    std::cerr << "spectra-eval: error: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception &e) {
    std::cerr << "spectra-eval: error: " << e.what() << "\n";
  }
  return 1;
}
