//===- FusedEmulated.cpp - the GPU kernels run on the CPU (gpu-emulated) ---===//

#include "runtime/FusedEmulated.h"

#include "codegen/spectra_compiler.h"

#include <sstream>
#include <stdexcept>

namespace spectra {

struct FusedEmulatedAttention::Kernels {
  spectra_cpu_kernel *handle = nullptr;
  std::map<std::string, std::pair<void *, KernelAbi>> byKind;
  std::string backwardError;
  ~Kernels() { spectra_cpu_kernel_free(handle); }
  const std::pair<void *, KernelAbi> &get(const std::string &kind, const std::string &name) const {
    auto it = byKind.find(kind);
    TORCH_CHECK(it != byKind.end(), "spectra gpu-emulated attention: no '", kind, "' kernel for '",
                name, "'", backwardError.empty() ? "" : ": ", backwardError);
    return it->second;
  }
};

torch::ScalarType scalarTypeOf(const std::string &dtype) {
  if (dtype == "f32")
    return torch::kFloat32;
  if (dtype == "bf16")
    return torch::kBFloat16;
  if (dtype == "f16")
    return torch::kFloat16;
  throw std::invalid_argument("unknown dtype '" + dtype + "'; dtypes: f32, bf16, f16");
}

KernelAbi KernelAbi::parse(const std::string &text) {
  KernelAbi abi;
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ';')) {
    if (part.empty())
      continue;
    if (part.rfind("grid=", 0) == 0) {
      abi.grid = part.substr(5);
    } else if (part.rfind("chunk_rows=", 0) == 0) {
      abi.chunkRows = std::stoll(part.substr(11));
    } else {
      size_t a = part.find(':'), b = part.rfind(':');
      if (a == std::string::npos || a == b)
        throw std::invalid_argument("kernel ABI: malformed argument '" + part + "' in '" + text + "'");
      abi.args.push_back({part.substr(0, a), part.substr(a + 1, b - a - 1), std::stoll(part.substr(b + 1))});
    }
  }
  if (abi.grid.empty() || abi.args.empty())
    throw std::invalid_argument("kernel ABI: no grid or no arguments in '" + text + "'");
  return abi;
}

namespace {

/// An MLIR memref descriptor as 8-byte words: allocated, aligned, offset, sizes, strides.
std::vector<int64_t> descriptorOf(const torch::Tensor &t) {
  std::vector<int64_t> words = {reinterpret_cast<int64_t>(t.data_ptr()),
                                reinterpret_cast<int64_t>(t.data_ptr()), 0};
  for (int64_t s : t.sizes())
    words.push_back(s);
  for (int64_t s : t.strides())
    words.push_back(s);
  return words;
}

template <size_t... I>
void invoke(void *entry, std::vector<void *> &args, std::index_sequence<I...>) {
  using Fn = void (*)(decltype(I, static_cast<void *>(nullptr))...);
  reinterpret_cast<Fn>(entry)(args[I]...);
}

} // namespace

void callKernel(void *entry, const KernelAbi &abi, const std::string &kind,
                const std::map<std::string, torch::Tensor> &buffers) {
  std::vector<std::vector<int64_t>> descriptors;
  descriptors.reserve(abi.args.size());
  for (const KernelArgSpec &arg : abi.args) {
    auto it = buffers.find(arg.name);
    TORCH_CHECK(it != buffers.end(), "spectra kernel '", kind, "': the launch plan has no buffer '",
                arg.name, "' (role ", arg.role, ")");
    const torch::Tensor &t = it->second;
    TORCH_CHECK(t.dim() == arg.rank, "spectra kernel '", kind, "': buffer '", arg.name,
                "' has rank ", t.dim(), ", the kernel takes rank ", arg.rank);
    TORCH_CHECK(t.numel() == 0 || t.stride(-1) == 1, "spectra kernel '", kind, "': buffer '",
                arg.name, "' needs a unit inner stride");
    descriptors.push_back(descriptorOf(t));
  }
  std::vector<void *> args;
  for (auto &d : descriptors)
    args.push_back(d.data());
  args.resize(24, nullptr);
  TORCH_CHECK(abi.args.size() <= 24, "spectra kernel '", kind, "': more than 24 arguments");
  // Every argument is a pointer to a descriptor: one call shape covers every kernel.
  invoke(entry, args, std::make_index_sequence<24>());
}

namespace {
spectra_cpu_kernel *checked(spectra_cpu_kernel *kernel, char *error) {
  if (!kernel) {
    std::string message = error ? error : "libspectra-compiler failed without a message";
    spectra_free(error);
    throw std::invalid_argument(message);
  }
  return kernel;
}

std::string optionsOf(const VariantConfig &config) {
  std::ostringstream options;
  options.precision(17);
  for (const auto &[key, value] : config.options)
    options << (options.tellp() > 0 ? "," : "") << key << "=" << value;
  return options.str();
}

/// [B, H, N, ...] as [B*H, N, ...].
torch::Tensor slices(const torch::Tensor &t) {
  std::vector<int64_t> shape = {t.size(0) * t.size(1)};
  for (int64_t i = 2; i < t.dim(); ++i)
    shape.push_back(t.size(i));
  return t.reshape(shape);
}

int64_t chunksOf(int64_t rows, int64_t chunkRows) { return (rows + chunkRows - 1) / chunkRows; }
} // namespace

FusedEmulatedAttention::FusedEmulatedAttention(Descriptor desc, Compile c, std::string dtype)
    : reference(std::move(desc)), compile(std::move(c)), inputType(std::move(dtype)) {
  scalarTypeOf(inputType);
  kernelsFor(descriptor().d);
}

FusedEmulatedAttention::FusedEmulatedAttention(const std::string &variant,
                                               const VariantConfig &config,
                                               const std::string &dtype)
    : FusedEmulatedAttention(
          describeVariant(variant, config),
          [variant, config, dtype](int64_t dv) {
            char *error = nullptr;
            spectra_cpu_kernel *k = spectra_emulated_compile_variant(
                variant.c_str(), config.m, config.d, config.seed, optionsOf(config).c_str(),
                dtype.c_str(), dv, &error);
            return checked(k, error);
          },
          dtype) {}

FusedEmulatedAttention FusedEmulatedAttention::fromIR(const std::string &ir,
                                                      const std::string &sourceName,
                                                      const std::string &featureMap,
                                                      const std::string &dtype) {
  return FusedEmulatedAttention(
      describeIR(ir, sourceName, featureMap),
      [=](int64_t dv) {
        char *error = nullptr;
        spectra_cpu_kernel *k = spectra_emulated_compile_ir(
            ir.c_str(), sourceName.c_str(), featureMap.empty() ? nullptr : featureMap.c_str(),
            dtype.c_str(), dv, &error);
        return checked(k, error);
      },
      dtype);
}

const FusedEmulatedAttention::Kernels &FusedEmulatedAttention::kernelsFor(int64_t dv) const {
  std::lock_guard<std::mutex> lock(compiled->mutex);
  auto &kernels = compiled->byValueDim[dv];
  if (!kernels) {
    auto k = std::make_shared<Kernels>();
    k->handle = compile(dv);
    for (const char *kind : {"kv", "kv_combine", "readout", "query_backward", "dsummary_combine",
                             "key_backward", "dweights_combine", "dparams_combine"}) {
      const char *why = nullptr;
      void *entry = spectra_cpu_kernel_entry(k->handle, kind, &why);
      if (!entry) {
        if (why && *why)
          k->backwardError = why;
        continue;
      }
      k->byKind[kind] = {entry, KernelAbi::parse(spectra_cpu_kernel_abi(k->handle, kind))};
    }
    kernels = std::move(k);
  }
  return *kernels;
}

std::string FusedEmulatedAttention::kernelIR(const std::string &stage, int64_t dv) const {
  return spectra_cpu_kernel_ir(kernelsFor(dv > 0 ? dv : descriptor().d).handle, stage.c_str());
}

FusedForward FusedEmulatedAttention::runForward(const FusedInputs &in) const {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2),
                dv = in.vs.size(3), BH = B * H, F = descriptor().numFeatures();
  const Kernels &kernels = kernelsFor(dv);
  const std::string &name = descriptor().name;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto &[kv, kvAbi] = kernels.get("kv", name);
  const auto &[combine, combineAbi] = kernels.get("kv_combine", name);
  const auto &[readout, readoutAbi] = kernels.get("readout", name);
  const int64_t C = chunksOf(Nk, kvAbi.chunkRows);

  std::map<std::string, torch::Tensor> buf;
  buf["k"] = slices(in.ks);
  buf["v"] = slices(in.vs);
  buf["q"] = slices(in.qs);
  buf["keep"] = in.keep.unsqueeze(1).expand({B, H, Nk}).reshape({BH, Nk}).contiguous();
  buf["Wt"] = in.W.t().contiguous();
  buf["ww"] = in.W.square().sum(1).contiguous();
  buf["rowscale"] = in.rowscale;
  buf["params"] = slices(in.params);
  buf["kscale"] = slices(in.kscale);
  buf["qscale"] = slices(in.qscale);
  // The keys' split reduction: per (slice, chunk) partials, then the combine in chunk order.
  torch::Tensor Sp = torch::empty({BH, C, F, dv}, f32), zp = torch::empty({BH, C, F}, f32),
                zabsp = torch::empty({BH, C, F}, f32), cp = torch::empty({BH, C, F}, f32);
  std::map<std::string, torch::Tensor> kvBuf = buf;
  kvBuf["S"] = Sp;
  kvBuf["z"] = zp;
  kvBuf["zabs"] = zabsp;
  kvBuf["c"] = cp;
  callKernel(kv, kvAbi, "kv", kvBuf);
  FusedForward result;
  result.S = torch::empty({BH, F, dv}, f32);
  result.z = torch::empty({BH, F}, f32);
  result.zabs = torch::empty({BH, F}, f32);
  result.shift = torch::empty({BH, F}, f32);
  callKernel(combine, combineAbi, "kv_combine",
             {{"Sp", Sp}, {"zp", zp}, {"zabsp", zabsp}, {"cp", cp}, {"S", result.S},
              {"z", result.z}, {"zabs", result.zabs}, {"c", result.shift}});
  buf["S"] = result.S;
  buf["z"] = result.z;
  buf["zabs"] = result.zabs;
  buf["c"] = result.shift;
  buf["out"] = torch::empty({BH, Nq, dv}, in.qs.options());
  buf["qstat"] = torch::empty({BH, Nq, 3}, f32);
  callKernel(readout, readoutAbi, "readout", buf);
  result.out = buf["out"].view({B, H, Nq, dv});
  result.qstat = buf["qstat"].view({B, H, Nq, 3});
  result.S = result.S.view({B, H, F, dv});
  result.z = result.z.view({B, H, F});
  result.zabs = result.zabs.view({B, H, F});
  result.shift = result.shift.view({B, H, F});
  result.guarded = result.qstat.select(3, 2).sum(2);
  return result;
}

std::vector<torch::Tensor> FusedEmulatedAttention::runBackward(const FusedInputs &in,
                                                               const FusedForward &saved,
                                                               const torch::Tensor &goutIn) const {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2),
                dv = in.vs.size(3), BH = B * H, F = descriptor().numFeatures(),
                M = in.W.size(0), D = in.W.size(1), P = in.params.size(2);
  const Kernels &kernels = kernelsFor(dv);
  const std::string &name = descriptor().name;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto &[qb, qbAbi] = kernels.get("query_backward", name);
  const auto &[dsum, dsumAbi] = kernels.get("dsummary_combine", name);
  const auto &[kb, kbAbi] = kernels.get("key_backward", name);
  const auto &[dw, dwAbi] = kernels.get("dweights_combine", name);
  const auto &[dp, dpAbi] = kernels.get("dparams_combine", name);
  const int64_t Cq = chunksOf(Nq, qbAbi.chunkRows), Ck = chunksOf(Nk, kbAbi.chunkRows);

  std::map<std::string, torch::Tensor> buf;
  buf["q"] = slices(in.qs);
  buf["k"] = slices(in.ks);
  buf["v"] = slices(in.vs);
  buf["keep"] = in.keep.unsqueeze(1).expand({B, H, Nk}).reshape({BH, Nk}).contiguous();
  buf["W"] = in.W.contiguous();
  buf["Wt"] = in.W.t().contiguous();
  buf["ww"] = in.W.square().sum(1).contiguous();
  buf["rowscale"] = in.rowscale;
  buf["params"] = slices(in.params);
  buf["qscale"] = slices(in.qscale);
  buf["kscale"] = slices(in.kscale);
  buf["S"] = slices(saved.S).contiguous();
  buf["St"] = buf["S"].transpose(1, 2).contiguous();
  buf["z"] = slices(saved.z).contiguous();
  buf["c"] = slices(saved.shift).contiguous();
  buf["out"] = slices(saved.out).contiguous();
  buf["gout"] = slices(goutIn.to(in.qs.scalar_type())).contiguous();
  buf["qstat"] = slices(saved.qstat).contiguous();
  buf["dq"] = torch::empty({BH, Nq, D}, in.qs.options());
  buf["dk"] = torch::empty({BH, Nk, D}, in.ks.options());
  buf["dv"] = torch::empty({BH, Nk, dv}, in.vs.options());
  // Every (slice, chunk) share of dW and dparams, queries' chunks first, in one buffer each.
  torch::Tensor dWp = torch::empty({BH, Cq + Ck, M, D}, f32),
                dpp = torch::empty({BH, Cq + Ck, P}, f32);
  torch::Tensor dSp = torch::empty({BH, Cq, F, dv}, f32), dzp = torch::empty({BH, Cq, F}, f32);
  buf["dS"] = dSp;
  buf["dz"] = dzp;
  buf["dW"] = dWp.narrow(1, 0, Cq);
  buf["dparams"] = dpp.narrow(1, 0, Cq);
  callKernel(qb, qbAbi, "query_backward", buf);
  torch::Tensor dS = torch::empty({BH, F, dv}, f32), dz = torch::empty({BH, F}, f32);
  callKernel(dsum, dsumAbi, "dsummary_combine", {{"dSp", dSp}, {"dzp", dzp}, {"dS", dS}, {"dz", dz}});
  buf["dS"] = dS;
  buf["dSt"] = dS.transpose(1, 2).contiguous();
  buf["dz"] = dz;
  buf["dW"] = dWp.narrow(1, Cq, Ck);
  buf["dparams"] = dpp.narrow(1, Cq, Ck);
  callKernel(kb, kbAbi, "key_backward", buf);
  torch::Tensor dW = torch::empty({M, D}, f32), dparams = torch::empty({BH, P}, f32);
  callKernel(dw, dwAbi, "dweights_combine", {{"dWp", dWp.view({BH * (Cq + Ck), M, D})}, {"dW", dW}});
  callKernel(dp, dpAbi, "dparams_combine", {{"dparamsp", dpp}, {"dparams", dparams}});
  return {buf["dq"].view({B, H, Nq, D}), buf["dk"].view({B, H, Nk, D}),
          buf["dv"].view({B, H, Nk, dv}), dW, dparams.view({B, H, P})};
}

AttentionResult FusedEmulatedAttention::attentionWithStats(
    const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
    const std::optional<torch::Tensor> &keyMask, std::optional<double> scale,
    const std::optional<torch::Tensor> &queryMask) const {
  TORCH_CHECK(q.device().is_cpu(),
              "spectra gpu-emulated attention runs on the CPU: inputs must be CPU tensors, got ",
              q.device());
  FusedInputs p = prepareFusedInputs(reference, q, k, v, weights, keyMask, scale,
                                     scalarTypeOf(inputType), queryMask);
  auto out = FusedAttentionFunction<FusedEmulatedAttention>::apply(
      p.qs, p.ks, p.vs, p.W, p.params, p.keep, p.rowscale, p.qscale, p.kscale, this);
  return {out[0].to(q.scalar_type()), out[1]};
}

} // namespace spectra
