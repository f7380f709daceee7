//===- TileKernels.h - the fused kernels as contractions on tiles ---------===//
//
// The kernel layer. Random-feature attention is three contractions with
// elementwise work between them:
//   keys:    L = K W^T, phi = c exp(l - c_f)      ->  S += phi^T V, z += phi^T 1
//   queries: L = Q W^T, phi = c exp(l + c_f - M)  ->  out = phi S / phi z
// and the same shapes again in the backward (gS = G S^T, dq = A W, dW += A^T Q,
// dS += P^T G, b = V dS^T, dv = phi dS). These builders write each kernel as
// scf loops over row tiles (`tileRows` rows of q or k staged into a static
// buffer) whose body is upstream linalg on static memref tiles:
//   - contractions as linalg.generic with a reduction dimension (matmul, or
//     matmul with the first operand transposed);
//   - the component's features region (and its compiler-derived partials) as
//     the body of an elementwise linalg.generic over [rows x m], with ||x||^2
//     broadcast along features and ||w||^2 along rows;
//   - the stabiliser's maxima, the denominators and column sums as reduction
//     generics.
// Nothing here is target-specific: spectra-vectorize-tiles maps the generics
// to register-tiled vector code for the CPU (a GPU pipeline can map the same
// contractions to tensor cores). All kernels are specialised on m, d, dv and
// the component; rows are dynamic.
//
// One (batch, head) slice and a range of rows per call; every buffer f32. q and k
// arrive unscaled: qscale/kscale [D] (the d^-1/4 normaliser times SADERF's Psi or
// HCEXP's A) multiply each staged row, and dq, dk are written with respect to
// the unscaled rows.
//   <map>_kv(k [N,D], v [N,DV], keep [N], Wt [D,M], ww [M], rowscale [M],
//            params [P], S [F,DV], z [F], zabs [F], c [F], kscale [D])
//       S, z, zabs over the given keys relative to the per-feature key
//       constants c (-inf for a feature no kept key reached); the runtime
//       merges row chunks (c = max, the rest rescaled by exp(c_chunk - c)).
//   <map>_readout(q [N,D], Wt, ww, params, S, z, zabs, c, out [N,DV],
//            qstat [N,3], qscale [D])
//       out with the query constants and the denominator guard; qstat is
//       (M, guarded denominator, 1 if the guard fired) per query.
//   <map>_query_backward(q, Wt, W [M,D], ww, params, S, St [DV,F], z, c, out,
//            gout [N,DV], qstat, dq [N,D], dS [F,DV], dz [F], dW [M,D], dparams [P],
//            qscale, dqscale [D], wgrad [1])
//   <map>_key_backward(k, v, keep, Wt, W, ww, rowscale, params, c, dS,
//            dSt [DV,F], dz, dk [N,D], dv [N,DV], dW, dparams, kscale, dkscale [D],
//            wgrad [1])
//       dS, dz, dW, dparams and dqscale/dkscale are this call's share (zeroed first;
//       a parameter or input scale that reads no statistic, a constant of the compile,
//       keeps its 0: TileBuilder.h, parametersWithGradient, scalesWithGradient);
//       dqscale = sum_n dx_n x_n over the scaled rows x (the runtime divides by the scale).
//       wgrad[0] == 0 (W wants no gradient): dW is neither formed nor written.
//   <map>_kv_combine(Sp [C,F,DV], zp [C,F], zabsp [C,F], cp [C,F], S, z, zabs, c)
//       the second stage of the keys' split reduction: the chunks' partials
//       merged in chunk order (c = max, the rest rescaled by exp(c_chunk - c)).
//   <map>_dsummary_combine(dSp [C,F,DV], dzp [C,F], dS, dz),
//   <map>_dweights_chunk_combine(dWp [C,M,D], dWs [M,D]) per slice, then
//   <map>_dweights_combine(dWs [R,M,D], dW), <map>_dparams_combine(dparamsp [C,P], dparams)
//       the backward's partial shares summed in order.
//   <map>_moments(x [N,D], y [N,D], keep [N], sum [D], cross [D])
//       the data statistics' prologue (components with spectra.statistic only): this
//       chunk's column sums of keep x and keep x y; <map>_moments_combine(sump [C,D],
//       crossp [C,D], sum, cross) sums the chunks in order, and
//       <map>_moments_backward(x, keep, a [D], b [D], dxin [N,D], dx [N,D]) writes
//       dx = dxin + keep (a + b x) (dx may be dxin: the statistics' gradient added in place).
//   <map>_moments_params(qsum [D], qsq [D], ksum [D], ksq [D], counts [2], inscale [1],
//            params [P], qscale [D], kscale [D]) and <map>_moments_params_backward(the same
//            six inputs, dparams [P], dqscale [D], dkscale [D], dqsum, dqsq, dksum, dksq [D])
//       with TileKernelOptions::paramsKernels: the component's params program on one
//       slice's moments (the input scale s applied as the statistics apply it; qscale and
//       kscale are s times the program's input scales) and its adjoint (ParamsKernels.cpp).
// F = outputs * m; W is [M, D] and Wt its transpose; ww = ||w_i||^2. q, k, v, out,
// gout, dq, dk and dv are of the input type (f32, bf16 or f16); every tile is f32.
//
// The kernel ABI. Each kernel function carries its kind (spectra.kernel), its grid
// rule (spectra.grid: "keys" or "queries" = a block per (row chunk, slice), "slices"
// = one per slice, "one") and per argument its name and role (spectra.arg_names,
// spectra.arg_roles): "rows" ([N, ...] rows of the slice), "mask" ([N] keep flags),
// "slice" (one per (batch, head) slice), "partial" (a row chunk's share of a sum,
// merged by a combine kernel) or "shared" (the same for every slice). No argument a kernel
// writes overlaps another unless both are marked spectra.may_alias (kMayAliasArgAttr,
// SpectraDialect.h: an in-place call's pair, moments_backward's dxin and dx); arguments only
// read may share a tensor (the moments' x and y). The GPU
// schedule (spectra-map-tiles-to-gpu) batches the arguments by role, and the
// runtimes read the ABI from these attributes (through the compiled artifact)
// instead of restating it. (A GPU schedule may give a "slices" or "one" kernel several
// blocks where its rows are independent, the combines: spectra.slice_blocks,
// MapTilesToGpu.h; the tile kernel itself does not change.)
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_TILEKERNELS_H
#define SPECTRA_CODEGEN_TILEKERNELS_H

#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/BuiltinOps.h"

#include <functional>
#include <string>

namespace mlir::spectra {

/// What the tile kernels are specialised on besides the feature map.
struct TileKernelOptions {
  /// Value head dimension; 0 means the feature map's d.
  int64_t valueDim = 0;
  /// Rows of q or k per tile; with causal, 0: the CPU's choice by the head
  /// (spectra_cpu_causal_tile_rows).
  int64_t tileRows = 32;
  /// When larger than tileRows: the row kernels (kv, readout and the two backward kernels
  /// each; the causal kernels as one group) take the most rows per tile, halving from this
  /// down to tileRows, whose tile buffers fit `sharedLimit` bytes (or dynamicSharedLimit).
  int64_t maxTileRows = 0;
  int64_t sharedLimit = 0;
  /// With sharedLimit: where a row kernel's tiles at tileRows rows would not fit, it keeps
  /// halving down to this many rows (larger heads: d = 64, m = 256); 0 means tileRows.
  int64_t minTileRows = 0;
  /// With sharedLimit: a row kernel takes the most rows, from maxTileRows down to
  /// minTileRows, whose tiles fit this many bytes where they exceed sharedLimit (dynamic
  /// shared memory, at two blocks per SM), before fewer rows in static memory; 0: none.
  int64_t dynamicSharedLimit = 0;
  /// With sharedLimit: the bytes of shared memory a row kernel takes (the target's count,
  /// e.g. with its warp chains' tiles in registers); unset: all its static tile buffers.
  std::function<int64_t(func::FuncOp)> sharedBytes;
  /// Element type of q, k, v, out, dL/dout and their gradients: f32, bf16 or f16.
  std::string inputType = "f32";
  /// Causal attention (CausalKernels.cpp): kv, causal_prefix, causal_readout and the causal
  /// backward instead of the bidirectional readout and backward.
  bool causal = false;
  /// Components with data statistics: also the params program and its adjoint as kernels
  /// (moments_params, moments_params_backward; ParamsKernels.cpp). A program they cannot
  /// lower leaves them out (the runtime then evaluates it with LibTorch).
  bool paramsKernels = false;
  /// Where the weight recipe draws W as antipodal blocks (antipodalPairs): the logits and
  /// the inputs' gradient contract half of W's rows (Dims::pairs), and the row kernels carry
  /// kKernelAntipodalPairsAttr. The CPU schedule takes it; the GPU schedule keeps W dense.
  bool antipodalWeights = false;
};

/// The rows P per block where `map`'s weight recipe draws W as blocks of a zero row, then
/// P, then -P: the degree-3 sparse grid (d pairs) or the spherical-radial rule (d + 1),
/// rotated or not, stacked by spectra.stack_blocks in whole blocks (m a multiple of the
/// block). 0 where it does not, or not visibly.
int64_t antipodalPairs(FeatureMapOp map);

/// Attributes of the kernel ABI (see above).
/// The module attribute naming, per feature map, why it has no backward kernels.
inline constexpr llvm::StringLiteral kBackwardErrorsAttr = "spectra.backward_errors";
inline constexpr llvm::StringLiteral kKernelKindAttr = "spectra.kernel";
inline constexpr llvm::StringLiteral kKernelGridAttr = "spectra.grid";
inline constexpr llvm::StringLiteral kKernelArgNamesAttr = "spectra.arg_names";
inline constexpr llvm::StringLiteral kKernelArgRolesAttr = "spectra.arg_roles";
/// On a row kernel built with antipodal weights (TileKernelOptions::antipodalWeights): the
/// pairs per block of W's rows it assumes (the ABI's "antipodal=PAIRS;", checked by the
/// runtime against the W it is given).
inline constexpr llvm::StringLiteral kKernelAntipodalPairsAttr = "spectra.antipodal_pairs";
/// The rows of q or k per tile of a row kernel (the launch description reports it).
inline constexpr llvm::StringLiteral kKernelTileRowsAttr = "spectra.tile_rows";
/// On a CPU kernel after vectorisation: the arguments it writes with non-temporal (streaming)
/// stores, which the caller must pass aligned to the vector's bytes (spectra.aligned_bytes).
inline constexpr llvm::StringLiteral kKernelStreamedArgsAttr = "spectra.streamed_args";
inline constexpr llvm::StringLiteral kKernelAlignedBytesAttr = "spectra.aligned_bytes";
/// On the loop over a kernel's row tiles (TileBuilder::forTiles, forTilesReversed): what a
/// GPU kernel's barriers per tile are counted in (the launch description's
/// barriers_per_tile).
inline constexpr llvm::StringLiteral kTileLoopAttr = "spectra.tile_loop";
/// On a tile loop that runs its tiles from the last to the first (the causal key backward):
/// the next tile is the previous rows (the staging prefetches them, VectorizeTiles.cpp).
inline constexpr llvm::StringLiteral kTileLoopReversedAttr = "spectra.tile_loop_reversed";
/// On the branch whose then-region runs a causal tile row by row (the exact fallback for a
/// tile whose factors' range is too wide, CausalKernels.cpp): not the path a tile takes
/// unless its inputs reach that range, so barriers_per_tile leaves it out.
inline constexpr llvm::StringLiteral kRowByRowAttr = "spectra.row_by_row";
/// With TileKernelOptions::sharedBytes: the bytes that count gave the kernel at its rows.
/// spectra-map-tiles-to-gpu checks its own count against it and drops it.
inline constexpr llvm::StringLiteral kKernelTileSharedBytesAttr = "spectra.tile_shared_bytes";

/// The bytes a static buffer of `type` takes (a tile in a GPU block's shared memory).
inline int64_t bufferBytes(MemRefType type) {
  return type.getNumElements() * ((type.getElementTypeBitWidth() + 7) / 8);
}

/// The alignment of each tile buffer in a GPU block's pool of dynamic shared memory
/// (spectra-launch-mapped-kernels: a memref.view of the pool per buffer).
inline constexpr int64_t kSharedPoolAlignment = 16;

/// The bytes a tile buffer of `type` takes in that pool: bufferBytes rounded up to
/// kSharedPoolAlignment, so that a kernel's count is its pool's size.
inline int64_t sharedPoolBytes(MemRefType type) {
  return (bufferBytes(type) + kSharedPoolAlignment - 1) / kSharedPoolAlignment *
         kSharedPoolAlignment;
}

/// The bytes of a kernel's static tile buffers (its allocas) in a GPU block's shared memory,
/// before any of them move to registers.
inline int64_t tileBufferBytes(func::FuncOp kernel) {
  int64_t bytes = 0;
  kernel.walk([&](memref::AllocaOp a) {
    if (a.getType().hasStaticShape())
      bytes += sharedPoolBytes(a.getType());
  });
  return bytes;
}

/// Every kernel kind, in launch order (forward, then backward). The statistics' kinds
/// (moments, moments_combine, moments_backward) exist only for components that use
/// statistics (usesStatistics); the causal_* kinds only in causal kernel sets, which have
/// no kv_combine, readout, query_backward, dsummary_combine or key_backward.
ArrayRef<StringLiteral> tileKernelKinds();

/// Whether the component's parameters depend on data statistics (spectra.statistic).
bool usesStatistics(ComponentOp component);

/// The names of the four kernels of `map`, in the order of TileKernels.h.
SmallVector<std::string, 4> tileKernelNames(StringRef map);

/// Adds the four tile kernels of `map` to `module` (next to it, so the
/// component and its derived partials resolve). Errors name the unsupported
/// option or the op that could not be differentiated (then only the forward
/// kernels are built and `backwardError` says why).
LogicalResult buildTileKernels(ModuleOp module, FeatureMapOp map, const TileKernelOptions &options,
                               std::string *backwardError = nullptr);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_TILEKERNELS_H
