//===- KernelLaunch.h - the launch plan of the GPU kernels, for any launcher ===//
//
// The GPU kernels of a feature map (codegen/MapTilesToGpu.h) are launched in
// one plan whatever runs them: the keys' kernel writes per-(slice, chunk)
// partials, `kv_combine` merges them in chunk order, `readout` reads the
// merged summary; backward, `query_backward` writes the queries' partials,
// `dsummary_combine` merges them, `key_backward` writes the keys' shares, and
// `dweights_chunk_combine` + `dweights_combine` / `dparams_combine` sum every share in a fixed order. No
// atomics anywhere, so the same inputs give the same bits on every run.
//
// The plan names buffers; each kernel's generated ABI (argument order, role,
// rank, grid rule, rows per block, threads) says which of them it takes, so
// nothing here restates a signature. Two launchers follow it: the CPU
// (`gpu-emulated`, FusedEmulated.h: the mapped IR JIT-compiled for the host)
// and CUDA (FusedCuda.h: the PTX of the same mapped IR).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_KERNELLAUNCH_H
#define SPECTRA_RUNTIME_KERNELLAUNCH_H

#include "runtime/FusedCpu.h"

#include <torch/torch.h>

#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct spectra_cpu_kernel;

namespace spectra {

/// One argument of a compiled kernel (its ABI): element "f32", "bf16" or "f16".
struct KernelArgSpec {
  std::string name, role;
  int64_t rank = 0;
  std::string element;
};

/// The kernel kinds of a feature map, in launch order (codegen's tileKernelKinds).
inline const char *const kKernelKinds[] = {
    "moments",          "moments_combine", "moments_params", "kv",
    "kv_combine",       "readout",         "query_backward",
    "dsummary_combine", "key_backward",    "dweights_chunk_combine", "dweights_combine",
    "dparams_combine", "moments_params_backward",  "moments_backward", "causal_prefix",
    "causal_readout",   "causal_query_backward", "causal_suffix", "causal_suffix_scan",
    "causal_key_backward", "causal_decode"};

/// The element name of a tensor type as kernels name it: "f32", "bf16", "f16" (others: "f32",
/// the type the runtime computes them in).
std::string elementName(torch::ScalarType type);
/// The inverse: the scalar type of "f32", "bf16" or "f16"; throws std::invalid_argument for
/// other names.
torch::ScalarType scalarTypeOf(const std::string &dtype);

/// A compiled kernel's ABI: its kind, symbol, grid rule ("keys", "queries": a block
/// per (row chunk, slice); "slices": a block per slice; "one": one block), rows per
/// block, threads per block, shared bytes (of which dynamicSharedBytes are dynamic: the
/// launch passes them) and its arguments in order.
struct KernelAbi {
  std::string kind, name, grid;
  int64_t chunkRows = 0, threads = 1, sharedBytes = 0, dynamicSharedBytes = 0;
  /// A mapped row kernel with partial sums whose chunk count is theirs (spectra.chunks =
  /// "partials", codegen/MapTilesToGpu.h): the host picks it (rowChunks), the kernel covers
  /// ceil(N / C) rows per chunk rounded up to `tileRows`.
  bool chunksFromPartials = false;
  int64_t tileRows = 0;
  /// A row kernel built for antipodal weights (codegen/TileKernels.h, spectra.antipodal_pairs):
  /// W's rows in blocks of a zero row, this many rows P, then -P ("antipodal=PAIRS;"); 0: W
  /// dense.
  int64_t antipodalPairs = 0;
  /// A mapped per-slice kernel whose blocks split its rows (spectra.slice_blocks, the
  /// combines): its blocks per slice, the grid's first dimension (grid "one": its blocks);
  /// 1 otherwise.
  int64_t sliceBlocks = 1;
  /// The arguments the kernel writes with streaming stores, which must start on
  /// `alignedBytes` (a CPU kernel's "aligned=BYTES:name,...").
  std::vector<std::string> alignedArgs;
  int64_t alignedBytes = 0;
  std::vector<KernelArgSpec> args;
  /// Parses spectra_cpu_kernel_abi's text ("grid=..;chunk_rows=..;[chunks=partials;]
  /// [tile_rows=..;]name:role:rank:element;...[aligned=BYTES:name,..;]"); throws
  /// std::invalid_argument naming the part.
  static KernelAbi parse(const std::string &text);
};

/// The buffers named by a kernel's ABI, in its argument order; each tensor's rank and
/// element type must be the ABI's and every dimension but the outermost dense (the kernels
/// are compiled for identity layouts: only the outermost stride is free; TORCH_CHECK naming
/// the kernel and buffer).
std::vector<torch::Tensor> kernelOperands(const KernelAbi &abi,
                                          const std::map<std::string, torch::Tensor> &buffers);

/// The grid a mapped kernel's host function launches (codegen/MapTilesToGpu.cpp):
/// {ceil(rows / chunk_rows), slices, 1} for a row grid (rows and slices read off the
/// first `rows` argument; with chunksFromPartials the chunk count is the first `partial`
/// argument's second dimension), {slices, 1, 1} for "slices" ({sliceBlocks, slices, 1} where
/// its blocks split the rows), {1, 1, 1} for "one" ({sliceBlocks, 1, 1} where they do).
std::array<int64_t, 3> launchGrid(const KernelAbi &abi, const std::vector<torch::Tensor> &operands);

/// The kernels of a JIT-compiled (or cached) set, by kind, with their generated ABI; a kind
/// without an entry (a component without a derivative has no backward kernels) is left out
/// and `*backwardError` says why.
struct HostKernel {
  void *entry = nullptr;
  KernelAbi abi;
};
std::map<std::string, HostKernel> hostKernels(spectra_cpu_kernel *compiled,
                                              std::string *backwardError);

/// The kernel of `kind` in a launcher's kernels by kind; TORCH_CHECK naming the launcher
/// (`who`, e.g. "spectra fused CPU attention"), the kind, the feature map and why it is missing.
template <typename Kernels>
const typename Kernels::mapped_type &kernelOfKind(const Kernels &kernels, const std::string &kind,
                                                  const char *who, const std::string &name,
                                                  const std::string &backwardError) {
  auto it = kernels.find(kind);
  TORCH_CHECK(it != kernels.end(), who, ": no '", kind, "' kernel for '", name, "'",
              backwardError.empty() ? "" : ": ", backwardError);
  return it->second;
}

/// Calls a kernel JIT-compiled for the host (its C interface: one memref descriptor
/// pointer per operand, operands as kernelOperands gives them).
void callHostKernel(void *entry, const KernelAbi &abi, const std::vector<torch::Tensor> &operands);

/// A per-slice host kernel (the CPU schedule of the tile layer) bound to the launch plan's
/// batched operands (kernelOperands of its ABI), so one (slice, chunk) task builds its
/// descriptors without making tensors: `rows` [BH, N, ...] and `mask` [BH, N] operands are
/// indexed by the slice and windowed to the task's rows, `slice` and `partial` operands are
/// indexed by (slice[, chunk]) as far as their extra leading dimensions go, `shared` ones are
/// passed whole.
class SliceCall {
public:
  SliceCall(void *entry, const KernelAbi &abi, const std::vector<torch::Tensor> &operands);
  void operator()(int64_t slice, int64_t chunk, int64_t first, int64_t rows) const;

private:
  struct Operand {
    char *data;
    int64_t elementBytes, lead, rank;
    std::vector<int64_t> sizes, strides;
    bool windowed;
  };
  void *entry;
  std::string kind;
  std::vector<Operand> operands;
};

/// Runs the kernels of one feature map; the plan below calls it.
class KernelLauncher {
public:
  virtual ~KernelLauncher() = default;
  /// The ABI of the kernel of `kind`; throws (naming the reason) when there is none.
  virtual const KernelAbi &abi(const std::string &kind) const = 0;
  /// Whether there is a kernel of `kind` (the statistics' kernels exist only for
  /// components that use statistics; the backward's only where it was derived).
  virtual bool has(const std::string &kind) const = 0;
  /// Launches the kernel on `operands` (kernelOperands of its ABI).
  virtual void launch(const KernelAbi &abi, const std::vector<torch::Tensor> &operands) const = 0;
  /// The blocks a launch should spread over (one wave: resident blocks per SM times SMs), or
  /// 0 for no preference; rowChunks sizes chunksFromPartials kernels' chunks from it.
  virtual int64_t targetBlocks() const { return 0; }
  /// Whether the causal plan runs each slice's rows as one task (no chunk summaries, no
  /// prefix scan: the readout and the queries' backward start from the empty state), as a
  /// launcher with at least as many slices as workers prefers.
  virtual bool wholeSequencePerSlice(int64_t /*slices*/) const { return false; }
};

/// The blocks per SM the partial-sum kernels' chunks are sized for on a GPU: four waves of
/// two resident blocks. Measured on an H200 (posrf-mm, B=1 H=16 N=65536 d=64 m=256): one wave
/// (17 chunks of 3856 rows) took 127 ms forward+backward in bf16 and 100 ms in f32, four waves
/// (66 chunks) 73 and 67 ms, 256-row chunks (256) 83 and 76 ms: a block's serial loop over
/// thousands of rows leaves the SM idle between its tiles, and the combines grow with the
/// chunks.
constexpr int64_t kChunkBlocksPerSm = 8;

/// SPECTRA_GPU_BLOCKS, when set: the blocks a GPU launch (or its emulation) spreads the
/// partial-sum kernels' rows over, in place of kChunkBlocksPerSm per SM (read at each launch,
/// so tests and measurements can vary it); throws naming `who` when it is not a positive count.
std::optional<int64_t> gpuBlocksFromEnvironment(const char *who);

/// The row chunks of a launch of `abi` over `rows` rows of `slices` slices: ceil(rows /
/// chunk_rows), or for a chunksFromPartials kernel the fewest that still give the launcher's
/// target blocks (never more than that), as a count C whose chunks of ceil(rows / C) rows,
/// rounded up to the tile rows, are all non-empty (the kernel's own rule).
int64_t rowChunks(const KernelLauncher &launcher, const KernelAbi &abi, int64_t rows,
                  int64_t slices);

/// Per-kind launch times of the plan, for benchmarks: while a KernelTimer is alive, every
/// launch the plan makes (on any thread) is timed on the host and summed by kernel kind. The
/// CPU launchers return when their kernels are done; CUDA launches return when enqueued, so
/// their times mean nothing without a synchronisation (spectra-bench times CPU runs only).
/// Destroy a timer only when no launch is in flight (a launch adds to the timer it found).
class KernelTimer {
public:
  struct Total {
    double seconds = 0;
    int64_t launches = 0;
  };
  KernelTimer();
  ~KernelTimer();
  KernelTimer(const KernelTimer &) = delete;
  KernelTimer &operator=(const KernelTimer &) = delete;
  /// The totals so far, by kind.
  std::map<std::string, Total> totals() const;
  /// Adds a launch (called by the plan).
  void add(const std::string &kind, double seconds);

private:
  mutable std::mutex mutex;
  std::map<std::string, Total> byKind;
};

/// A row mask [B, N] as the kernels read it: one row per (batch, head) slice, [B, H, N] f32
/// contiguous on `options`' device. prepareFusedInputs makes its masks so once per call;
/// every launch that takes a mask then views it as [B * H, N], where it copied the broadcast
/// [B, N] each time (six copies a forward+backward with compiled statistics, 40 us each at
/// B=8 H=2 N=4096).
torch::Tensor keepPerSlice(const torch::Tensor &keep, int64_t H, torch::TensorOptions options);
/// The mask that keeps every row, [B, H, N] f32 ones on `options`' device. On the CPU, outside
/// inference mode, the last one made is handed out again while its shape matches (the kernels
/// only read masks), so a loop of unmasked calls fills none; elsewhere a new one each call.
torch::Tensor keepAllPerSlice(int64_t B, int64_t H, int64_t N, torch::TensorOptions options);

/// The data statistics' prologue (moments, moments_combine): per (batch, head) the column
/// sums {sum_n keep_n x_n, sum_n keep_n x_n y_n} [B, H, D] in f32 of rows x, y [B, H, N, D]
/// (the kernels' element type) with keep [B, N] or, as keepPerSlice gives it, [B, H, N] (1
/// kept, 0 masked).
std::array<torch::Tensor, 2> launchMoments(const KernelLauncher &launcher, const torch::Tensor &x,
                                           const torch::Tensor &y, const torch::Tensor &keep);
/// The compiled params program (moments_params) on the moments {qsum, qsq, ksum, ksq}
/// [B, H, D], the kept rows per side `counts` [B, H, 2] and the input scale s: {params
/// [B, H, P], qscale [B, H, D], kscale [B, H, D]} as the row kernels read them.
std::array<torch::Tensor, 3> launchMomentsParams(const KernelLauncher &launcher,
                                                 const std::array<torch::Tensor, 4> &moments,
                                                 const torch::Tensor &counts, double scale,
                                                 int64_t P);
/// Its adjoint (moments_params_backward): the moments' gradients {dqsum, dqsq, dksum, dksq}
/// [B, H, D] from dparams [B, H, P] and the gradients of qscale and kscale [B, H, D] (an
/// undefined one: zeros).
std::array<torch::Tensor, 4> launchMomentsParamsBackward(
    const KernelLauncher &launcher, const std::array<torch::Tensor, 4> &moments,
    const torch::Tensor &counts, double scale, int64_t P, const torch::Tensor &dparams,
    const torch::Tensor &dqscale, const torch::Tensor &dkscale);
/// The moments' backward (moments_backward): adds keep (a + b x) to dx [B, H, N, D]
/// (contiguous, x's dtype) in place, for a, b [B, H, D]; keep as launchMoments takes it.
void launchMomentsBackward(const KernelLauncher &launcher, const torch::Tensor &x,
                           const torch::Tensor &keep, const torch::Tensor &a,
                           const torch::Tensor &b, torch::Tensor &dx);

/// The forward plan on prepared inputs (on the launcher's device) for `features`
/// features (outputs x m): kv, kv_combine, readout.
FusedForward launchForward(const KernelLauncher &launcher, const FusedInputs &in, int64_t features);
/// The backward plan: query_backward, dsummary_combine, key_backward, dweights_chunk_combine
/// (each slice's chunks), dweights_combine (the slices),
/// dparams_combine. Returns {dq, dk, dv (in the inputs' dtypes), dW, dparams, dqscale,
/// dkscale} (the last two [B, H, D]: the input scales' gradients). Without in.weightGrad the
/// backward kernels skip dW (their `wgrad` switch is 0), the two dW combines are not launched
/// and dW comes back undefined.
std::vector<torch::Tensor> launchBackward(const KernelLauncher &launcher, const FusedInputs &in,
                                          const FusedForward &saved, const torch::Tensor &gout,
                                          int64_t features);

/// The causal forward plan (q and k of one length): kv (each row chunk's key summary),
/// causal_prefix (the state carried into each chunk), causal_readout; with one chunk per
/// slice (a short sequence, or wholeSequencePerSlice) only causal_readout, from the empty
/// state. The result's S, z, zabs and shift hold the carried states [B, H, C, F(, dv)] the
/// backward reads.
FusedForward launchCausalForward(const KernelLauncher &launcher, const FusedInputs &in,
                                 int64_t features);
/// The causal backward plan: causal_query_backward (per row chunk, from the carried
/// states), causal_suffix (each chunk's summary of the keys' suffix state) and
/// causal_suffix_scan (the state carried into each chunk from the right), causal_key_backward
/// (per row chunk, last row to first), then the sums of the dW (only with in.weightGrad) and
/// dparams shares; returns what launchBackward returns.
std::vector<torch::Tensor> launchCausalBackward(const KernelLauncher &launcher,
                                                const FusedInputs &in, const FusedForward &saved,
                                                const torch::Tensor &gout, int64_t features);

/// Causal decoding by the compiled kernels of any launcher (a causal kernel set): the state a
/// prompt k, v [B, H, N, .] ends in (kv per row chunk, then kv_combine: the same S, z, zabs
/// and running maxima c as ReferenceFeatureMap::prefill, in float32), computed from inputs
/// of `inputType`.
DecodeState causalPrefill(const ReferenceFeatureMap &reference, const KernelLauncher &launcher,
                          torch::ScalarType inputType, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask = std::nullopt,
                          std::optional<double> scale = std::nullopt);
/// causal_decode's operands that depend only on the weights, the scale and the batch shape
/// (W's derived forms, the parameters, the input scales, the key mask), kept between decoding
/// steps by whoever holds the kernels: a step then prepares only its token. Reused while the
/// weights are equal (compared by value) and the shapes, scale, dtype and device are the same.
struct DecodeConstants {
  std::mutex mutex;
  std::string key;
  torch::Tensor W, rowWeights;
  std::map<std::string, torch::Tensor> buffers;
};

/// One token (q, k [B, H, 1, d], v [B, H, 1, dv]) through causal_decode: the state (float32,
/// empty or as prefill/decode left it) advances in place, and the output [B, H, 1, dv] in
/// q's dtype is the causal attention at that position (ReferenceFeatureMap::decode's).
/// `constants`, when given, keeps the step's constant operands between calls.
torch::Tensor causalDecode(const ReferenceFeatureMap &reference, const KernelLauncher &launcher,
                           torch::ScalarType inputType, const torch::Tensor &q,
                           const torch::Tensor &k, const torch::Tensor &v, const Weights &weights,
                           DecodeState &state, std::optional<double> scale = std::nullopt,
                           DecodeConstants *constants = nullptr);

} // namespace spectra

#endif // SPECTRA_RUNTIME_KERNELLAUNCH_H
