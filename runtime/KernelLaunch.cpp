//===- KernelLaunch.cpp - the launch plan of the GPU kernels ---------------===//

#include "runtime/KernelLaunch.h"

#include "runtime/BufferCache.h"

#include "codegen/spectra_compiler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace spectra {

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
    } else if (part.rfind("chunks=", 0) == 0) {
      if (part.substr(7) != "partials")
        throw std::invalid_argument("kernel ABI: unknown chunk rule '" + part + "' in '" + text +
                                    "' (chunks=partials)");
      abi.chunksFromPartials = true;
    } else if (part.rfind("tile_rows=", 0) == 0) {
      abi.tileRows = std::stoll(part.substr(10));
    } else if (part.rfind("antipodal=", 0) == 0) {
      std::string pairs = part.substr(10);
      if (pairs.empty() || pairs.find_first_not_of("0123456789") != std::string::npos)
        throw std::invalid_argument("kernel ABI: malformed '" + part + "' in '" + text +
                                    "' (antipodal=PAIRS)");
      abi.antipodalPairs = std::stoll(pairs);
    } else if (part.rfind("aligned=", 0) == 0) {
      size_t colon = part.find(':');
      std::string bytes = part.substr(8, colon == std::string::npos ? 0 : colon - 8);
      if (colon == std::string::npos || bytes.empty() ||
          bytes.find_first_not_of("0123456789") != std::string::npos)
        throw std::invalid_argument("kernel ABI: malformed '" + part + "' in '" + text +
                                    "' (aligned=BYTES:name,...)");
      abi.alignedBytes = std::stoll(bytes);
      std::stringstream names(part.substr(colon + 1));
      for (std::string name; std::getline(names, name, ',');)
        abi.alignedArgs.push_back(name);
    } else {
      std::vector<std::string> fields;
      std::stringstream fieldStream(part);
      for (std::string field; std::getline(fieldStream, field, ':');)
        fields.push_back(field);
      if (fields.size() != 4 || fields[0].empty() || fields[1].empty() ||
          fields[2].find_first_not_of("0123456789") != std::string::npos || fields[2].empty())
        throw std::invalid_argument("kernel ABI: malformed argument '" + part + "' in '" + text +
                                    "' (name:role:rank:element)");
      abi.args.push_back({fields[0], fields[1], std::stoll(fields[2]), fields[3]});
    }
  }
  if (abi.grid.empty() || abi.args.empty())
    throw std::invalid_argument("kernel ABI: no grid or no arguments in '" + text + "'");
  if (abi.chunksFromPartials && abi.tileRows <= 0)
    throw std::invalid_argument("kernel ABI: chunks=partials without tile_rows in '" + text + "'");
  return abi;
}

std::string elementName(torch::ScalarType type) {
  return type == torch::kBFloat16 ? "bf16" : type == torch::kHalf ? "f16" : "f32";
}

torch::ScalarType scalarTypeOf(const std::string &dtype) {
  if (dtype == "f32")
    return torch::kFloat32;
  if (dtype == "bf16")
    return torch::kBFloat16;
  if (dtype == "f16")
    return torch::kFloat16;
  throw std::invalid_argument("unknown dtype '" + dtype + "'; dtypes: f32, bf16, f16");
}

namespace {
/// The checks every operand passes: element type, unit inner stride, dense below the
/// outermost of the kernel's dimensions (from `first` on).
void checkOperand(const KernelAbi &abi, const KernelArgSpec &arg, const torch::Tensor &t,
                  int64_t first) {
  const bool kernelType = t.scalar_type() == torch::kFloat32 ||
                          t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
  TORCH_CHECK(arg.element.empty() || (kernelType && elementName(t.scalar_type()) == arg.element),
              "spectra kernel '", abi.kind, "': buffer '", arg.name, "' is ", t.scalar_type(),
              ", the kernel takes ", arg.element);
  if (t.numel() == 0)
    return;
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d > first; --d) {
    TORCH_CHECK(t.size(d) == 1 || t.stride(d) == expected, "spectra kernel '", abi.kind,
                "': buffer '", arg.name, "' of shape ", t.sizes(), " has strides ", t.strides(),
                "; the kernel needs its inner dimensions dense");
    expected *= t.size(d);
  }
}
} // namespace

std::vector<torch::Tensor> kernelOperands(const KernelAbi &abi,
                                          const std::map<std::string, torch::Tensor> &buffers) {
  std::vector<torch::Tensor> operands;
  operands.reserve(abi.args.size());
  for (const KernelArgSpec &arg : abi.args) {
    auto it = buffers.find(arg.name);
    TORCH_CHECK(it != buffers.end(), "spectra kernel '", abi.kind, "': the launch plan has no buffer '",
                arg.name, "' (role ", arg.role, ")");
    const torch::Tensor &t = it->second;
    TORCH_CHECK(t.dim() == arg.rank, "spectra kernel '", abi.kind, "': buffer '", arg.name,
                "' has rank ", t.dim(), ", the kernel takes rank ", arg.rank);
    checkOperand(abi, arg, t, 0);
    operands.push_back(t);
  }
  return operands;
}

std::array<int64_t, 3> launchGrid(const KernelAbi &abi, const std::vector<torch::Tensor> &operands) {
  auto first = [&](std::initializer_list<const char *> roles) -> const torch::Tensor & {
    for (size_t i = 0; i < abi.args.size(); ++i)
      for (const char *role : roles)
        if (abi.args[i].role == role)
          return operands.at(i);
    TORCH_CHECK(false, "spectra kernel '", abi.kind, "': grid '", abi.grid,
                "' needs an argument of role ", *roles.begin());
  };
  if (abi.grid == "keys" || abi.grid == "queries") {
    TORCH_CHECK(abi.chunkRows > 0, "spectra kernel '", abi.kind, "': no rows per block");
    const torch::Tensor &rows = first({"rows"});
    if (abi.chunksFromPartials) {
      // The chunk count is the partial sums' (rowChunks sized them): every one of them alike,
      // at least one chunk for rows to cover and no more chunks than rows.
      int64_t chunks = -1;
      for (size_t i = 0; i < abi.args.size(); ++i) {
        if (abi.args[i].role != "partial")
          continue;
        TORCH_CHECK(chunks < 0 || operands.at(i).size(1) == chunks, "spectra kernel '", abi.kind,
                    "': partial buffer '", abi.args[i].name, "' has ", operands.at(i).size(1),
                    " chunks, another ", chunks);
        chunks = operands.at(i).size(1);
      }
      const int64_t n = rows.size(1);
      TORCH_CHECK(chunks >= (n > 0 ? 1 : 0) && chunks <= std::max<int64_t>(n, 1), "spectra kernel '",
                  abi.kind, "': ", chunks, " chunks for ", n, " rows");
      return {chunks, rows.size(0), 1};
    }
    return {(rows.size(1) + abi.chunkRows - 1) / abi.chunkRows, rows.size(0), 1};
  }
  if (abi.grid == "slices" && abi.sliceBlocks > 1)
    return {abi.sliceBlocks, first({"rows", "slice"}).size(0), 1};
  if (abi.grid == "slices")
    return {first({"rows", "slice"}).size(0), 1, 1};
  TORCH_CHECK(abi.grid == "one", "spectra kernel '", abi.kind, "': unknown grid rule '", abi.grid, "'");
  return {abi.sliceBlocks, 1, 1};
}

namespace {
constexpr size_t kMaxArgs = 24;

template <size_t... I>
void invoke(void *entry, void *const *args, std::index_sequence<I...>) {
  using Fn = void (*)(decltype(I, static_cast<void *>(nullptr))...);
  reinterpret_cast<Fn>(entry)(args[I]...);
}
} // namespace

std::map<std::string, HostKernel> hostKernels(spectra_cpu_kernel *compiled,
                                              std::string *backwardError) {
  std::map<std::string, HostKernel> out;
  for (const char *kind : kKernelKinds) {
    const char *why = nullptr;
    void *entry = spectra_cpu_kernel_entry(compiled, kind, &why);
    if (!entry) {
      if (why && *why && backwardError)
        *backwardError = why;
      continue;
    }
    HostKernel k{entry, KernelAbi::parse(spectra_cpu_kernel_abi(compiled, kind))};
    k.abi.kind = kind;
    out.emplace(kind, std::move(k));
  }
  return out;
}

void callHostKernel(void *entry, const KernelAbi &abi, const std::vector<torch::Tensor> &operands) {
  TORCH_CHECK(operands.size() <= kMaxArgs, "spectra kernel '", abi.kind, "': more than ", kMaxArgs,
              " arguments");
  // An MLIR memref descriptor as 8-byte words: allocated, aligned, offset, sizes, strides.
  std::vector<std::vector<int64_t>> descriptors;
  descriptors.reserve(operands.size());
  for (const torch::Tensor &t : operands) {
    std::vector<int64_t> words = {reinterpret_cast<int64_t>(t.data_ptr()),
                                  reinterpret_cast<int64_t>(t.data_ptr()), 0};
    for (int64_t size : t.sizes())
      words.push_back(size);
    for (int64_t stride : t.strides())
      words.push_back(stride);
    descriptors.push_back(std::move(words));
  }
  std::array<void *, kMaxArgs> args{};
  for (size_t i = 0; i < descriptors.size(); ++i)
    args[i] = descriptors[i].data();
  // Every argument is a pointer to a descriptor: one call shape covers every kernel.
  invoke(entry, args.data(), std::make_index_sequence<kMaxArgs>());
}

SliceCall::SliceCall(void *entry, const KernelAbi &abi, const std::vector<torch::Tensor> &ops)
    : entry(entry), kind(abi.kind) {
  TORCH_CHECK(entry, "spectra kernel '", abi.kind, "': no entry point");
  TORCH_CHECK(abi.args.size() == ops.size() && ops.size() <= kMaxArgs, "spectra kernel '",
              abi.kind, "': ", ops.size(), " operands for ", abi.args.size(), " arguments");
  for (size_t i = 0; i < ops.size(); ++i) {
    const KernelArgSpec &arg = abi.args[i];
    const torch::Tensor &t = ops[i];
    TORCH_CHECK(arg.rank >= 1 && arg.rank <= 5, "spectra kernel '", abi.kind, "': argument '",
                arg.name, "' of rank ", arg.rank, " (1 to 5 supported)");
    Operand o{static_cast<char *>(t.data_ptr()), static_cast<int64_t>(t.element_size()),
              t.dim() - arg.rank, arg.rank, t.sizes().vec(), t.strides().vec(),
              arg.role == "rows" || arg.role == "mask"};
    int64_t expectedLead = o.windowed ? 1 : arg.role == "shared" ? 0 : -1;
    TORCH_CHECK(o.lead >= 0 && o.lead <= 2 && (expectedLead < 0 || o.lead == expectedLead),
                "spectra kernel '", abi.kind, "': buffer '", arg.name, "' (role ", arg.role,
                ") has shape ", t.sizes(), " for a rank-", arg.rank, " argument");
    checkOperand(abi, arg, t, o.lead);
    // Streaming stores fault on an address off the vector's bytes: the runtime allocates these
    // buffers (64-byte aligned), so a misaligned one is a caller's bug, named here.
    if (abi.alignedBytes > 0 && std::find(abi.alignedArgs.begin(), abi.alignedArgs.end(), arg.name) != abi.alignedArgs.end())
      TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % abi.alignedBytes == 0 &&
                      (t.stride(o.lead) * o.elementBytes) % abi.alignedBytes == 0,
                  "spectra kernel '", abi.kind, "': buffer '", arg.name,
                  "' must start on a multiple of ", abi.alignedBytes,
                  " bytes (the kernel writes it with streaming stores), but starts at ",
                  t.data_ptr());
    operands.push_back(std::move(o));
  }
}

void SliceCall::operator()(int64_t slice, int64_t chunk, int64_t first, int64_t rows) const {
  std::array<std::array<int64_t, 3 + 2 * 5>, kMaxArgs> words;
  std::array<void *, kMaxArgs> args{};
  const int64_t index[2] = {slice, chunk};
  for (size_t i = 0; i < operands.size(); ++i) {
    const Operand &o = operands[i];
    int64_t offset = 0;
    for (int64_t l = 0; l < o.lead; ++l)
      offset += index[l] * o.strides[l];
    if (o.windowed)
      offset += first * o.strides[o.lead];
    auto &w = words[i];
    char *data = o.data + offset * o.elementBytes;
    w[0] = w[1] = reinterpret_cast<int64_t>(data);
    w[2] = 0;
    for (int64_t d = 0; d < o.rank; ++d) {
      w[3 + d] = o.windowed && d == 0 ? rows : o.sizes[o.lead + d];
      w[3 + o.rank + d] = o.strides[o.lead + d];
    }
    args[i] = w.data();
  }
  invoke(entry, args.data(), std::make_index_sequence<kMaxArgs>());
}

namespace {

/// [B, H, N, ...] as [B*H, N, ...].
torch::Tensor slices(const torch::Tensor &t) {
  std::vector<int64_t> shape = {t.size(0) * t.size(1)};
  for (int64_t i = 2; i < t.dim(); ++i)
    shape.push_back(t.size(i));
  return t.reshape(shape);
}

int64_t chunksOf(int64_t rows, int64_t chunkRows) { return (rows + chunkRows - 1) / chunkRows; }

/// The empty causal state (S [lead..., F, dv] and z, zabs 0, the running maxima c -inf) as a
/// DecodeState, float32.
DecodeState emptyCausalState(std::vector<int64_t> lead, int64_t F, int64_t dv,
                             torch::TensorOptions f32) {
  std::vector<int64_t> vec = lead, mat = lead;
  vec.push_back(F);
  mat.insert(mat.end(), {F, dv});
  DecodeState st;
  st.S = emptyBuffer(mat, f32).zero_();
  st.z = emptyBuffer(vec, f32).zero_();
  st.zabs = emptyBuffer(vec, f32).zero_();
  st.c = torch::full(vec, -std::numeric_limits<float>::infinity(), f32);
  return st;
}

std::atomic<KernelTimer *> activeTimer{nullptr};

void run(const KernelLauncher &launcher, const KernelAbi &abi,
         const std::map<std::string, torch::Tensor> &buffers) {
  std::vector<torch::Tensor> operands = kernelOperands(abi, buffers);
  KernelTimer *timer = activeTimer.load();
  if (!timer) {
    launcher.launch(abi, operands);
    return;
  }
  auto start = std::chrono::steady_clock::now();
  launcher.launch(abi, operands);
  timer->add(abi.kind,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

/// Kernels built for antipodal weights (KernelAbi::antipodalPairs) read half of W's rows, so
/// the W they are given must hold the blocks their weight recipe draws: a zero row, `pairs`
/// rows P, then -P. A W of another form (set by hand, loaded from elsewhere) is refused,
/// naming its first row that breaks the form.
void checkAntipodalWeights(const KernelLauncher &launcher, const torch::Tensor &W) {
  const int64_t h = launcher.has("kv") ? launcher.abi("kv").antipodalPairs : 0;
  if (h == 0)
    return;
  const int64_t block = 2 * h + 1, m = W.size(0);
  const std::string form = "spectra attention: this variant's kernels take W's rows as blocks "
                           "of " + std::to_string(block) + " (a zero row, " + std::to_string(h) +
                           " rows P, then -P: its weight recipe's points), but ";
  TORCH_CHECK(m % block == 0, form, "W has ", m, " rows");
  torch::Tensor blocks = W.reshape({m / block, block, W.size(1)});
  torch::Tensor plus = blocks.slice(1, 1, 1 + h), minus = blocks.slice(1, 1 + h, block);
  torch::Tensor zeroBad = blocks.select(1, 0).ne(0).any(-1);         // [blocks]
  torch::Tensor pairBad = plus.ne(minus.neg()).any(-1);              // [blocks, h]
  if (!zeroBad.any().item<bool>() && !pairBad.any().item<bool>())
    return;
  for (int64_t b = 0; b < m / block; ++b) {
    TORCH_CHECK(!zeroBad[b].item<bool>(), form, "row ", b * block,
                " of W is not zero; pass the W the variant draws");
    for (int64_t i = 0; i < h; ++i)
      TORCH_CHECK(!pairBad[b][i].item<bool>(), form, "row ", b * block + 1 + h + i,
                  " of W is not minus row ", b * block + 1 + i, "; pass the W the variant draws");
  }
}

/// The buffers both passes read: rows, the key mask per slice, W and its derived forms.
std::map<std::string, torch::Tensor> inputBuffers(const KernelLauncher &launcher,
                                                  const FusedInputs &in) {
  checkAntipodalWeights(launcher, in.W);
  const int64_t H = in.qs.size(1), Nk = in.ks.size(2);
  std::map<std::string, torch::Tensor> buf;
  buf["q"] = slices(in.qs);
  buf["k"] = slices(in.ks);
  buf["v"] = slices(in.vs);
  buf["keep"] = slices(keepPerSlice(in.keep, H, in.qs.options()));
  TORCH_CHECK(buf["keep"].size(1) == Nk, "spectra: internal error: a key mask of ",
              buf["keep"].size(1), " rows for ", Nk, " keys");
  buf["W"] = in.W.contiguous();
  buf["Wt"] = in.W.t().contiguous();
  buf["ww"] = in.W.square().sum(1).contiguous();
  buf["rowscale"] = in.rowscale.contiguous();
  buf["params"] = slices(in.params).contiguous();
  buf["qscale"] = slices(in.qscale).contiguous();
  buf["kscale"] = slices(in.kscale).contiguous();
  return buf;
}

/// The keys' summaries of every (slice, row chunk) by the `kv` kernel: S [BH, C, F, dv],
/// z, zabs and c [BH, C, F], each relative to its chunk's per-feature constants.
std::array<torch::Tensor, 4> keySummaries(const KernelLauncher &launcher, const KernelAbi &kv,
                                          const std::map<std::string, torch::Tensor> &inputs,
                                          int64_t C, int64_t F) {
  const torch::Tensor &v = inputs.at("v");
  const int64_t BH = v.size(0), dv = v.size(2);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(v.device());
  std::array<torch::Tensor, 4> out = {emptyBuffer({BH, C, F, dv}, f32), emptyBuffer({BH, C, F}, f32),
                                      emptyBuffer({BH, C, F}, f32), emptyBuffer({BH, C, F}, f32)};
  std::map<std::string, torch::Tensor> buf = inputs;
  buf["S"] = out[0];
  buf["z"] = out[1];
  buf["zabs"] = out[2];
  buf["c"] = out[3];
  run(launcher, kv, buf);
  return out;
}

} // namespace

KernelTimer::KernelTimer() {
  KernelTimer *none = nullptr;
  TORCH_CHECK(activeTimer.compare_exchange_strong(none, this),
              "spectra: only one KernelTimer can be alive at a time");
}

std::optional<int64_t> gpuBlocksFromEnvironment(const char *who) {
  const char *blocks = std::getenv("SPECTRA_GPU_BLOCKS");
  if (!blocks || !*blocks)
    return std::nullopt;
  char *end = nullptr;
  long long value = std::strtoll(blocks, &end, 10);
  TORCH_CHECK(*end == 0 && value > 0, who, ": SPECTRA_GPU_BLOCKS='", blocks,
              "' is not a positive block count");
  return value;
}

int64_t rowChunks(const KernelLauncher &launcher, const KernelAbi &abi, int64_t rows,
                  int64_t slices) {
  const int64_t fixed = chunksOf(rows, abi.chunkRows);
  if (!abi.chunksFromPartials || abi.tileRows <= 0 || rows <= 0 || slices <= 0)
    return fixed;
  const int64_t target = launcher.targetBlocks();
  if (target <= 0)
    return fixed;
  // Enough chunks that slices x chunks fill the target, but no more than chunk_rows gives.
  int64_t chunks = std::clamp<int64_t>((target + slices - 1) / slices, 1, fixed);
  // The kernel covers ceil(rows / C) rows per chunk, rounded up to its tile rows; a count
  // whose rounded chunks would leave the last ones empty shrinks to what they cover (a few
  // steps at most: the count never grows).
  for (;;) {
    const int64_t even = chunksOf(rows, chunks);
    const int64_t perChunk = chunksOf(even, abi.tileRows) * abi.tileRows;
    const int64_t covered = chunksOf(rows, perChunk);
    if (covered == chunks)
      return chunks;
    chunks = covered;
  }
}

KernelTimer::~KernelTimer() { activeTimer.store(nullptr); }

std::map<std::string, KernelTimer::Total> KernelTimer::totals() const {
  std::lock_guard<std::mutex> lock(mutex);
  return byKind;
}

void KernelTimer::add(const std::string &kind, double seconds) {
  std::lock_guard<std::mutex> lock(mutex);
  Total &t = byKind[kind];
  t.seconds += seconds;
  ++t.launches;
}

torch::Tensor keepPerSlice(const torch::Tensor &keep, int64_t H, torch::TensorOptions options) {
  TORCH_CHECK(keep.dim() == 2 || (keep.dim() == 3 && keep.size(1) == H),
              "spectra: internal error: a row mask must be [B, N] or [B, ", H, ", N], got ",
              keep.sizes());
  torch::Tensor f = keep.to(options.dtype(torch::kFloat32));
  if (f.dim() == 3)
    return f.contiguous();
  return f.unsqueeze(1).expand({f.size(0), H, f.size(1)}).contiguous();
}

torch::Tensor keepAllPerSlice(int64_t B, int64_t H, int64_t N, torch::TensorOptions options) {
  options = options.dtype(torch::kFloat32);
  // Kept on the CPU only (a device tensor would need its stream and a graph capture's
  // state), and never an inference tensor, which a training call could not save for its
  // backward; the cached one is never written (the kernels read masks).
  if (options.device().type() != c10::DeviceType::CPU || c10::InferenceMode::is_enabled())
    return torch::ones({B, H, N}, options);
  static std::mutex mutex;
  static torch::Tensor last;
  std::lock_guard<std::mutex> lock(mutex);
  if (!last.defined() || last.sizes() != torch::IntArrayRef{B, H, N})
    last = torch::ones({B, H, N}, options);
  return last;
}

std::array<torch::Tensor, 2> launchMoments(const KernelLauncher &launcher, const torch::Tensor &x,
                                           const torch::Tensor &y, const torch::Tensor &keep) {
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3), BH = B * H;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
  const KernelAbi &moments = launcher.abi("moments"), &combine = launcher.abi("moments_combine");
  const int64_t C = rowChunks(launcher, moments, N, BH);
  torch::Tensor sump = emptyBuffer({BH, C, D}, f32), crossp = emptyBuffer({BH, C, D}, f32);
  run(launcher, moments,
      {{"x", slices(x.contiguous())}, {"y", slices(y.contiguous())},
       {"keep", slices(keepPerSlice(keep, H, f32))},
       {"sum", sump}, {"cross", crossp}});
  torch::Tensor sum = emptyBuffer({BH, D}, f32), cross = emptyBuffer({BH, D}, f32);
  run(launcher, combine, {{"sump", sump}, {"crossp", crossp}, {"sum", sum}, {"cross", cross}});
  return {sum.view({B, H, D}), cross.view({B, H, D})};
}

namespace {
/// The params kernels' six inputs: the moments per slice, the counts, the input scale.
std::map<std::string, torch::Tensor> paramsInputs(const std::array<torch::Tensor, 4> &moments,
                                                  const torch::Tensor &counts, double scale) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(counts.device());
  std::map<std::string, torch::Tensor> buf;
  const char *names[] = {"qsum", "qsq", "ksum", "ksq"};
  for (int i = 0; i < 4; ++i)
    buf[names[i]] = slices(moments[i].to(f32)).contiguous();
  buf["counts"] = slices(counts.to(f32)).contiguous();
  buf["inscale"] = torch::full({1}, scale, f32);
  return buf;
}
} // namespace

std::array<torch::Tensor, 3> launchMomentsParams(const KernelLauncher &launcher,
                                                 const std::array<torch::Tensor, 4> &moments,
                                                 const torch::Tensor &counts, double scale,
                                                 int64_t P) {
  const KernelAbi &abi = launcher.abi("moments_params");
  const int64_t B = counts.size(0), H = counts.size(1), D = moments[0].size(2);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(counts.device());
  std::map<std::string, torch::Tensor> buf = paramsInputs(moments, counts, scale);
  buf["params"] = emptyBuffer({B * H, P}, f32);
  buf["qscale"] = emptyBuffer({B * H, D}, f32);
  buf["kscale"] = emptyBuffer({B * H, D}, f32);
  run(launcher, abi, buf);
  return {buf["params"].view({B, H, P}), buf["qscale"].view({B, H, D}),
          buf["kscale"].view({B, H, D})};
}

std::array<torch::Tensor, 4> launchMomentsParamsBackward(
    const KernelLauncher &launcher, const std::array<torch::Tensor, 4> &moments,
    const torch::Tensor &counts, double scale, int64_t P, const torch::Tensor &dparams,
    const torch::Tensor &dqscale, const torch::Tensor &dkscale) {
  const KernelAbi &abi = launcher.abi("moments_params_backward");
  const int64_t B = counts.size(0), H = counts.size(1), D = moments[0].size(2);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(counts.device());
  std::map<std::string, torch::Tensor> buf = paramsInputs(moments, counts, scale);
  auto given = [&](const torch::Tensor &t, int64_t width) {
    return t.defined() ? slices(t.to(f32)).contiguous() : torch::zeros({B * H, width}, f32);
  };
  buf["dparams"] = given(dparams, P);
  buf["dqscale"] = given(dqscale, D);
  buf["dkscale"] = given(dkscale, D);
  std::array<torch::Tensor, 4> out;
  const char *names[] = {"dqsum", "dqsq", "dksum", "dksq"};
  for (int i = 0; i < 4; ++i)
    buf[names[i]] = out[i] = emptyBuffer({B * H, D}, f32);
  run(launcher, abi, buf);
  for (torch::Tensor &t : out)
    t = t.view({B, H, D});
  return out;
}

void launchMomentsBackward(const KernelLauncher &launcher, const torch::Tensor &x,
                           const torch::Tensor &keep, const torch::Tensor &a,
                           const torch::Tensor &b, torch::Tensor &dx) {
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3), BH = B * H;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
  TORCH_CHECK(dx.is_contiguous() && dx.sizes() == x.sizes() && dx.scalar_type() == x.scalar_type(),
              "spectra: internal error: the moments' gradient must be added to a contiguous ",
              x.sizes(), " tensor of ", x.scalar_type());
  torch::Tensor rows = dx.view({BH, N, D});
  run(launcher, launcher.abi("moments_backward"),
      {{"x", slices(x.contiguous())},
       {"keep", slices(keepPerSlice(keep, H, f32))},
       {"a", slices(a.to(f32)).contiguous()}, {"b", slices(b.to(f32)).contiguous()},
       {"dxin", rows}, {"dx", rows}});
}

FusedForward launchForward(const KernelLauncher &launcher, const FusedInputs &in, int64_t F) {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2),
                dv = in.vs.size(3), BH = B * H;
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device());
  const KernelAbi &kv = launcher.abi("kv"), &combine = launcher.abi("kv_combine"),
                  &readout = launcher.abi("readout");
  const int64_t C = rowChunks(launcher, kv, Nk, BH);

  std::map<std::string, torch::Tensor> buf = inputBuffers(launcher, in);
  // The keys' split reduction: per (slice, chunk) partials, then the combine in chunk order.
  auto [Sp, zp, zabsp, cp] = keySummaries(launcher, kv, buf, C, F);
  FusedForward result;
  result.S = emptyBuffer({BH, F, dv}, f32);
  result.z = emptyBuffer({BH, F}, f32);
  result.zabs = emptyBuffer({BH, F}, f32);
  result.shift = emptyBuffer({BH, F}, f32);
  run(launcher, combine,
      {{"Sp", Sp}, {"zp", zp}, {"zabsp", zabsp}, {"cp", cp}, {"S", result.S}, {"z", result.z},
       {"zabs", result.zabs}, {"c", result.shift}});
  buf["S"] = result.S;
  buf["z"] = result.z;
  buf["zabs"] = result.zabs;
  buf["c"] = result.shift;
  buf["out"] = emptyBuffer({BH, Nq, dv}, in.qs.options());
  buf["qstat"] = emptyBuffer({BH, Nq, 3}, f32);
  run(launcher, readout, buf);
  result.out = buf["out"].view({B, H, Nq, dv});
  result.qstat = buf["qstat"].view({B, H, Nq, 3});
  result.S = result.S.view({B, H, F, dv});
  result.z = result.z.view({B, H, F});
  result.zabs = result.zabs.view({B, H, F});
  result.shift = result.shift.view({B, H, F});
  result.guarded = result.qstat.select(3, 2).sum(2);
  return result;
}

namespace {
/// The backward kernels' `wgrad` switch: [1] f32, 1 where W's gradient is wanted.
torch::Tensor weightGradSwitch(const FusedInputs &in) {
  return torch::full({1}, in.weightGrad ? 1.0 : 0.0,
                     torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device()));
}

/// dW from the backward kernels' (slice, chunk) shares dWp [BH, C, M, D]: each slice's chunks,
/// then the slices, in order. Undefined when the gradient is not wanted (the kernels skipped it).
torch::Tensor weightGradient(const KernelLauncher &launcher, const KernelAbi &chunkCombine,
                             const KernelAbi &combine, const FusedInputs &in,
                             const torch::Tensor &dWp) {
  if (!in.weightGrad)
    return torch::Tensor();
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dWp.device());
  torch::Tensor dWs = emptyBuffer({dWp.size(0), dWp.size(2), dWp.size(3)}, f32),
                dW = emptyBuffer({dWp.size(2), dWp.size(3)}, f32);
  run(launcher, chunkCombine, {{"dWp", dWp}, {"dWs", dWs}});
  run(launcher, combine, {{"dWp", dWs}, {"dW", dW}});
  return dW;
}
} // namespace

std::vector<torch::Tensor> launchBackward(const KernelLauncher &launcher, const FusedInputs &in,
                                          const FusedForward &saved, const torch::Tensor &goutIn,
                                          int64_t F) {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), Nq = in.qs.size(2), Nk = in.ks.size(2),
                dv = in.vs.size(3), BH = B * H, M = in.W.size(0), D = in.W.size(1),
                P = in.params.size(2);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device());
  const KernelAbi &qb = launcher.abi("query_backward"), &dsum = launcher.abi("dsummary_combine"),
                  &kb = launcher.abi("key_backward"), &dw = launcher.abi("dweights_combine"),
                  &dwc = launcher.abi("dweights_chunk_combine"),
                  &dp = launcher.abi("dparams_combine");
  const int64_t Cq = rowChunks(launcher, qb, Nq, BH), Ck = rowChunks(launcher, kb, Nk, BH);

  std::map<std::string, torch::Tensor> buf = inputBuffers(launcher, in);
  buf["S"] = slices(saved.S).contiguous();
  buf["St"] = contiguousBuffer(buf["S"].transpose(1, 2));
  buf["z"] = slices(saved.z).contiguous();
  buf["c"] = slices(saved.shift).contiguous();
  buf["out"] = slices(saved.out).contiguous();
  buf["gout"] = contiguousBuffer(slices(goutIn.to(in.qs.scalar_type())));
  buf["qstat"] = slices(saved.qstat).contiguous();
  buf["dq"] = emptyBuffer({BH, Nq, D}, in.qs.options());
  buf["dk"] = emptyBuffer({BH, Nk, D}, in.ks.options());
  buf["dv"] = emptyBuffer({BH, Nk, dv}, in.vs.options());
  // Every (slice, chunk) share of dW and dparams, queries' chunks first, in one buffer each.
  torch::Tensor dWp = emptyBuffer({BH, Cq + Ck, M, D}, f32),
                dpp = emptyBuffer({BH, Cq + Ck, P}, f32);
  torch::Tensor dSp = emptyBuffer({BH, Cq, F, dv}, f32), dzp = emptyBuffer({BH, Cq, F}, f32);
  buf["dS"] = dSp;
  buf["dz"] = dzp;
  buf["dW"] = dWp.narrow(1, 0, Cq);
  buf["wgrad"] = weightGradSwitch(in);
  buf["dparams"] = dpp.narrow(1, 0, Cq);
  // The input scales' gradients per chunk (summed below: [BH, C, D] is tiny).
  torch::Tensor dqscale = emptyBuffer({BH, Cq, D}, f32), dkscale = emptyBuffer({BH, Ck, D}, f32);
  buf["dqscale"] = dqscale;
  buf["dkscale"] = dkscale;
  run(launcher, qb, buf);
  torch::Tensor dS = emptyBuffer({BH, F, dv}, f32), dz = emptyBuffer({BH, F}, f32);
  run(launcher, dsum, {{"dSp", dSp}, {"dzp", dzp}, {"dS", dS}, {"dz", dz}});
  buf["dS"] = dS;
  buf["dSt"] = contiguousBuffer(dS.transpose(1, 2));
  buf["dz"] = dz;
  buf["dW"] = dWp.narrow(1, Cq, Ck);
  buf["dparams"] = dpp.narrow(1, Cq, Ck);
  run(launcher, kb, buf);
  torch::Tensor dW = weightGradient(launcher, dwc, dw, in, dWp);
  torch::Tensor dparams = emptyBuffer({BH, P}, f32);
  run(launcher, dp, {{"dparamsp", dpp}, {"dparams", dparams}});
  return {buf["dq"].view({B, H, Nq, D}),
          buf["dk"].view({B, H, Nk, D}),
          buf["dv"].view({B, H, Nk, dv}),
          dW,
          dparams.view({B, H, P}),
          dqscale.sum(1).view({B, H, D}) / in.qscale,
          dkscale.sum(1).view({B, H, D}) / in.kscale};
}

FusedForward launchCausalForward(const KernelLauncher &launcher, const FusedInputs &in, int64_t F) {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), N = in.qs.size(2), dv = in.vs.size(3),
                BH = B * H;
  TORCH_CHECK(in.ks.size(2) == N, "spectra causal attention: q and k must have one length, got ",
              N, " queries and ", in.ks.size(2), " keys");
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device());
  KernelAbi readout = launcher.abi("causal_readout");
  if (launcher.wholeSequencePerSlice(BH))
    readout.chunkRows = std::max<int64_t>(N, 1);
  const int64_t C = chunksOf(N, readout.chunkRows);
  std::map<std::string, torch::Tensor> buf = inputBuffers(launcher, in);
  torch::Tensor S0, z0, zabs0, c0;
  if (C <= 1) {  // one chunk: it starts from the empty state
    DecodeState empty = emptyCausalState({BH, 1}, F, dv, f32);
    S0 = empty.S, z0 = empty.z, zabs0 = empty.zabs, c0 = empty.c;
  } else {
    const KernelAbi &kv = launcher.abi("kv"), &prefix = launcher.abi("causal_prefix");
    TORCH_CHECK(kv.chunkRows == readout.chunkRows, "spectra causal attention: internal error: ",
                "the keys' chunks (", kv.chunkRows, " rows) and the readout's (",
                readout.chunkRows, ") differ");
    auto [Sp, zp, zabsp, cp] = keySummaries(launcher, kv, buf, C, F);
    S0 = emptyBuffer({BH, C, F, dv}, f32), z0 = emptyBuffer({BH, C, F}, f32),
    zabs0 = emptyBuffer({BH, C, F}, f32), c0 = emptyBuffer({BH, C, F}, f32);
    run(launcher, prefix,
        {{"Sp", Sp}, {"zp", zp}, {"zabsp", zabsp}, {"cp", cp}, {"S0", S0}, {"z0", z0},
         {"zabs0", zabs0}, {"c0", c0}});
  }
  // The readout advances the carried states in place: it gets copies (the backward reads them).
  buf["S0"] = S0.clone();
  buf["z0"] = z0.clone();
  buf["zabs0"] = zabs0.clone();
  buf["c0"] = c0.clone();
  buf["out"] = emptyBuffer({BH, N, dv}, in.qs.options());
  buf["qstat"] = emptyBuffer({BH, N, 3}, f32);
  run(launcher, readout, buf);
  FusedForward result;
  result.out = buf["out"].view({B, H, N, dv});
  result.qstat = buf["qstat"].view({B, H, N, 3});
  const int64_t states = S0.size(1);  // C, or 1 when the rows are one chunk (or none)
  result.S = S0.view({B, H, states, F, dv});
  result.z = z0.view({B, H, states, F});
  result.zabs = zabs0.view({B, H, states, F});
  result.shift = c0.view({B, H, states, F});
  result.guarded = result.qstat.select(3, 2).sum(2);
  return result;
}

std::vector<torch::Tensor> launchCausalBackward(const KernelLauncher &launcher,
                                                const FusedInputs &in, const FusedForward &saved,
                                                const torch::Tensor &goutIn, int64_t F) {
  const int64_t B = in.qs.size(0), H = in.qs.size(1), N = in.qs.size(2), dv = in.vs.size(3),
                BH = B * H, M = in.W.size(0), D = in.W.size(1), P = in.params.size(2);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(in.qs.device());
  KernelAbi qb = launcher.abi("causal_query_backward");
  const KernelAbi &suffix = launcher.abi("causal_suffix"),
                  &scan = launcher.abi("causal_suffix_scan"),
                  &kb = launcher.abi("causal_key_backward"),
                  &dw = launcher.abi("dweights_combine"),
                  &dwc = launcher.abi("dweights_chunk_combine"),
                  &dp = launcher.abi("dparams_combine");
  if (saved.S.size(2) == 1)  // the forward ran each slice as one chunk
    qb.chunkRows = std::max<int64_t>(N, 1);
  const int64_t Cq = chunksOf(N, qb.chunkRows);
  TORCH_CHECK(saved.S.size(2) == std::max<int64_t>(Cq, 1), "spectra causal attention: internal error: ", saved.S.size(2),
              " carried states for ", Cq, " chunks");
  std::map<std::string, torch::Tensor> buf = inputBuffers(launcher, in);
  auto perSlice = [&](const torch::Tensor &t) {
    std::vector<int64_t> shape = {BH};
    for (int64_t i = 2; i < t.dim(); ++i)
      shape.push_back(t.size(i));
    return t.reshape(shape).contiguous();
  };
  // The queries' pass advances copies of the carried states (S transposed: [C, dv, F]). A
  // copy always: at dv = 1 the transpose is already contiguous, and contiguous() would hand
  // the kernel the saved S itself (a second backward would start from advanced states).
  buf["St0"] = perSlice(saved.S).transpose(2, 3).clone(torch::MemoryFormat::Contiguous);
  buf["z0"] = perSlice(saved.z).clone();
  buf["c0"] = perSlice(saved.shift).clone();
  // The keys' pass: each chunk's summary of the suffix state, then the state carried into
  // each chunk from the right.
  const int64_t Ck = chunksOf(N, kb.chunkRows);
  TORCH_CHECK(chunksOf(N, suffix.chunkRows) == Ck, "spectra causal attention: internal error: ",
              "the suffix summaries' chunks differ from the keys' backward's");
  torch::Tensor Rtp = emptyBuffer({BH, Ck, dv, F}, f32), rp = emptyBuffer({BH, Ck, F}, f32),
                ep = emptyBuffer({BH, Ck, F}, f32);
  buf["Rt"] = Rtp;
  buf["r"] = rp;
  buf["e"] = ep;
  buf["Rt0"] = emptyBuffer({BH, Ck, dv, F}, f32);
  buf["r0"] = emptyBuffer({BH, Ck, F}, f32);
  buf["e0"] = emptyBuffer({BH, Ck, F}, f32);
  buf["out"] = slices(saved.out).contiguous();
  buf["gout"] = contiguousBuffer(slices(goutIn.to(in.qs.scalar_type())));
  buf["qstat"] = slices(saved.qstat).contiguous();
  buf["dq"] = emptyBuffer({BH, N, D}, in.qs.options());
  buf["dk"] = emptyBuffer({BH, N, D}, in.ks.options());
  buf["dv"] = emptyBuffer({BH, N, dv}, in.vs.options());
  // The (slice, chunk) shares of dW and dparams: the queries' chunks, then the keys'.
  torch::Tensor dWp = emptyBuffer({BH, Cq + Ck, M, D}, f32),
                dpp = emptyBuffer({BH, Cq + Ck, P}, f32);
  torch::Tensor dqscale = emptyBuffer({BH, Cq, D}, f32), dkscale = emptyBuffer({BH, Ck, D}, f32);
  buf["dW"] = dWp.narrow(1, 0, Cq);
  buf["wgrad"] = weightGradSwitch(in);
  buf["dparams"] = dpp.narrow(1, 0, Cq);
  buf["dqscale"] = dqscale;
  run(launcher, qb, buf);
  if (Ck > 1) {
    run(launcher, suffix, buf);
    run(launcher, scan, {{"Rtp", Rtp}, {"rp", rp}, {"ep", ep}, {"Rt0", buf["Rt0"]},
                         {"r0", buf["r0"]}, {"e0", buf["e0"]}});
  } else {  // one chunk: it starts from the empty state
    buf["Rt0"].zero_();
    buf["r0"].zero_();
    buf["e0"].fill_(-std::numeric_limits<float>::infinity());
  }
  buf["dW"] = dWp.narrow(1, Cq, Ck);
  buf["dparams"] = dpp.narrow(1, Cq, Ck);
  buf["dkscale"] = dkscale;
  run(launcher, kb, buf);
  torch::Tensor dW = weightGradient(launcher, dwc, dw, in, dWp);
  torch::Tensor dparams = emptyBuffer({BH, P}, f32);
  run(launcher, dp, {{"dparamsp", dpp}, {"dparams", dparams}});
  return {buf["dq"].view({B, H, N, D}),
          buf["dk"].view({B, H, N, D}),
          buf["dv"].view({B, H, N, dv}),
          dW,
          dparams.view({B, H, P}),
          dqscale.sum(1).view({B, H, D}) / in.qscale,
          dkscale.sum(1).view({B, H, D}) / in.kscale};
}

DecodeState causalPrefill(const ReferenceFeatureMap &reference, const KernelLauncher &launcher,
                          torch::ScalarType inputType, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask, std::optional<double> scale) {
  TORCH_CHECK(!reference.usesStatistics(), "spectra causal decoding: component '",
              reference.descriptor().component.name, "' ", kCausalStatistics);
  torch::NoGradGuard noGrad;
  // The keys stand in for the queries: the prompt's state reads no query.
  FusedInputs in = prepareFusedInputs(reference, k, k, v, weights, keyMask, scale, inputType,
                                      std::nullopt, &launcher);
  const int64_t B = k.size(0), H = k.size(1), N = k.size(2), dv = v.size(3), BH = B * H,
                F = reference.descriptor().numFeatures();
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(k.device());
  DecodeState st = emptyCausalState({B, H}, F, dv, f32);
  st.length = N;
  if (N == 0)
    return st;
  const KernelAbi &kv = launcher.abi("kv"), &combine = launcher.abi("kv_combine");
  std::map<std::string, torch::Tensor> buf = inputBuffers(launcher, in);
  auto [Sp, zp, zabsp, cp] = keySummaries(launcher, kv, buf, chunksOf(N, kv.chunkRows), F);
  run(launcher, combine,
      {{"Sp", Sp}, {"zp", zp}, {"zabsp", zabsp}, {"cp", cp}, {"S", st.S.view({BH, F, dv})},
       {"z", st.z.view({BH, F})}, {"zabs", st.zabs.view({BH, F})}, {"c", st.c.view({BH, F})}});
  return st;
}

namespace {
/// Whether the float32 values of `t` (contiguous, on the CPU) are all finite: a step's q, k
/// and v checked without launching tensor operations.
bool allFinite(const torch::Tensor &t) {
  const float *x = t.data_ptr<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(x[i]))
      return false;
  return true;
}
} // namespace

torch::Tensor causalDecode(const ReferenceFeatureMap &reference, const KernelLauncher &launcher,
                           torch::ScalarType inputType, const torch::Tensor &q,
                           const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
                           DecodeState &state, std::optional<double> scale,
                           DecodeConstants *constants) {
  TORCH_CHECK(!reference.usesStatistics(), "spectra causal decoding: component '",
              reference.descriptor().component.name, "' ", kCausalStatistics);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(2) == 1 && k.size(2) == 1,
              "spectra causal decoding: one token per step, got q ", q.sizes(), " and k ",
              k.sizes());
  torch::NoGradGuard noGrad;
  const int64_t B = q.size(0), H = q.size(1), dv = v.size(3), BH = B * H,
                F = reference.descriptor().numFeatures();
  // The step's constant operands: from `constants` when they were made for these weights,
  // shapes, scale, dtype and device (the step's own checks below), else prepared in full.
  std::map<std::string, torch::Tensor> buf;
  std::unique_lock<std::mutex> lock;
  std::string key;
  bool hit = false;
  if (constants) {
    lock = std::unique_lock<std::mutex>(constants->mutex);
    std::ostringstream os;
    os << std::setprecision(17) << B << "x" << H << "x" << q.size(3) << "x" << dv << "|"
       << q.scalar_type() << "|" << q.device() << "|" << inputType << "|"
       << (scale ? *scale : -1.0);
    key = os.str();
    const torch::Tensor rw = weights.rowWeights ? *weights.rowWeights : torch::Tensor();
    auto same = [](const torch::Tensor &kept, const torch::Tensor &now) {
      return kept.sizes() == now.sizes() && kept.scalar_type() == now.scalar_type() &&
             kept.device() == now.device() && torch::equal(kept, now);
    };
    hit = constants->key == key && same(constants->W, weights.W) &&
          constants->rowWeights.defined() == rw.defined() &&
          (!rw.defined() || same(constants->rowWeights, rw));
  }
  if (hit) {
    const bool hostFloats = q.device().is_cpu() && inputType == torch::kFloat32;
    if (hostFloats)
      checkAttentionShapes(reference.descriptor(), q, k, v, weights);
    else
      checkAttentionInputs(reference.descriptor(), q, k, v, weights, std::nullopt);
    buf = constants->buffers;
    buf["q"] = slices(q.to(inputType).contiguous());
    buf["k"] = slices(k.to(inputType).contiguous());
    buf["v"] = slices(v.to(inputType).contiguous());
    TORCH_CHECK(!hostFloats || (allFinite(buf["q"]) && allFinite(buf["k"]) && allFinite(buf["v"])),
                "spectra attention: ", kNonFiniteInputs);
  } else {
    FusedInputs in = prepareFusedInputs(reference, q, k, v, weights, std::nullopt, scale,
                                        inputType, std::nullopt, &launcher);
    buf = inputBuffers(launcher, in);
    if (constants) {
      constants->key = key;
      constants->W = weights.W.detach().clone();
      constants->rowWeights =
          weights.rowWeights ? weights.rowWeights->detach().clone() : torch::Tensor();
      constants->buffers = buf;
      for (const char *row : {"q", "k", "v"})
        constants->buffers.erase(row);
    }
  }
  if (lock.owns_lock())
    lock.unlock();  // `buf` holds its own handles; the kernel runs unlocked
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(q.device());
  if (!state.c.defined()) {  // the empty state
    state = emptyCausalState({B, H}, F, dv, f32);
  }
  auto check = [&](torch::Tensor &t, const char *name, std::vector<int64_t> shape) {
    TORCH_CHECK(t.defined() && t.sizes() == torch::IntArrayRef(shape) &&
                    t.scalar_type() == torch::kFloat32 && t.device() == q.device(),
                "spectra causal decoding: the state's ", name, " is ",
                t.defined() ? t.sizes() : torch::IntArrayRef{}, " ",
                t.defined() ? t.scalar_type() : torch::kFloat32, " on ",
                t.defined() ? t.device() : q.device(), "; the compiled kernels need ",
                torch::IntArrayRef(shape), " float32 on ", q.device(),
                " (a float64 state is the reference's: decode it with mode reference)");
    if (!t.is_contiguous())
      t = t.contiguous();  // advanced in place below
  };
  check(state.S, "S", {B, H, F, dv});
  check(state.z, "z", {B, H, F});
  check(state.zabs, "zabs", {B, H, F});
  check(state.c, "c", {B, H, F});
  // The state is the carried state of a one-chunk sequence; the kernel advances it in place.
  buf["S0"] = state.S.view({BH, 1, F, dv});
  buf["z0"] = state.z.view({BH, 1, F});
  buf["zabs0"] = state.zabs.view({BH, 1, F});
  buf["c0"] = state.c.view({BH, 1, F});
  buf["out"] = emptyBuffer({BH, 1, dv}, buf["q"].options());
  buf["qstat"] = emptyBuffer({BH, 1, 3}, f32);
  run(launcher, launcher.abi("causal_decode"), buf);
  state.length += 1;
  return buf["out"].view({B, H, 1, dv}).to(q.scalar_type());
}

} // namespace spectra
