//===- WarpChains.h - an exponential kept in registers between two mma ----===//
//
// The tensor-core schedule of MapContractionsToMma.h maps each contraction on
// its own: its 16 x 8 output tiles go to the warps in turn, and what the next
// contraction reads (the features phi after the logits) goes through a shared
// tile. A warp chain keeps it in registers instead. It takes, from the
// target-free tile kernels, a contraction X[T, M] = A B (T <= 16 rows, X set
// to 0 first) whose epilogue (Epilogue.h) forms [T, M] tiles, and the ops after
// it that read those tiles:
//   - elementwise ops on [T, M] (more register tiles; operands indexed by row,
//     by column or both),
//   - row reductions r[T] = r (+) f(...) with (+) an addf or a maximumf,
//   - contractions C[T, n] += tile B (the tile as the mma's A operand),
//   - a second contraction forming a [T, M] tile from operands in memory (the backward
//     kernels' gradient of the features beside their logits),
//   - the tile layer's loop zeroing the rows past the end of a partial tile,
//   - split only, ops over the tiles' rows R on the warp's own features: column reductions
//     out[F] (+)= f(tiles) (a lane folds its two rows, then shuffles xor 4, 8, 16 fold the
//     column's lanes) and contractions C[F, n] += tile[R, F]^T B[R, n] (the backward's dS and
//     dW), whose A fragments are the tile's accumulators transposed 8 x 8 (movmatrix),
// skipping ops that touch nothing the chain touches (they run before its nest). Ops the chain
// cannot take (a contraction over the features whose warps' partials the backward chains
// leave out, an op under an scf.if) are deferred: moved past the nest, where they commute
// with the chain's later ops (an op touching what a deferred op writes, or writing what it
// reads, is deferred too). The first contraction needs no epilogue (its output is then a
// register tile like the others). A register tile read after the chain escapes: the chain
// stores it to its shared buffer once its last reader in the chain is done (the backward
// kernels' dq, dk and dv contractions and dW read theirs there). A chain that would not fit
// the shared memory (its partials) or 64 values a lane (register tiles, and a row
// contraction's accumulators) is cut short, its tiles then escaping where later ops read
// them. The W warps of a block
// split the M columns: warp w owns columns [w M / W, (w + 1) M / W) of every
// tile, all 16 rows, as mma accumulator fragments (C layout). The C layout of
// two adjacent 16 x 8 tiles is the A layout of one k16 step (one tile: one k8
// step), so the second contraction takes its A fragments from the registers.
// A row reduction folds a lane's elements, then the quad's (shuffles xor 1, 2),
// then the warps' partials through shared memory: at once (a barrier) when a
// later op of the chain reads it (the row maximum the exponential subtracts),
// else after the chain, as do the second contraction's partial products
// (summed over the warps in warp order: no atomics).
//
//  mapped stage: a warp nest (W = threads / 32 warps) marked kWarpChainAttr
//      holding the chain's ops unchanged; its register tiles leave workgroup
//      memory (mapWarpChain).
//  gpu-emulated (emulateWarpChain) and the GPU (lowerWarpChain): one lowering,
//      written once against a warp's lanes and registers. On the GPU the
//      registers are SSA values, a shuffle gpu.shuffle xor and an mma
//      nvvm.mma.sync; emulated, they are a register file in memory
//      [warp][lane][register], each step a loop over the warps' lanes, a
//      shuffle a read of the partner lane's register, and an mma the PTX ISA's
//      model reading each operand element from the lane and register its
//      fragment tables name. A wrong lane map, fragment reuse or shuffle
//      pattern gives wrong numbers in every emulated test.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_WARPCHAINS_H
#define SPECTRA_CODEGEN_WARPCHAINS_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <optional>

namespace mlir::spectra {

/// The attribute marking a warp chain's nest: {type = the mma operand type, split = bf16x3}.
inline constexpr llvm::StringLiteral kWarpChainAttr = "spectra.warp_chain";

/// What mapWarpChain did: the nest, the ops it took (the chain's), the register tiles'
/// buffers (their allocas, now out of workgroup memory) and the bytes of shared memory the
/// warps' partials take.
struct WarpChainMapping {
  scf::ForallOp nest;
  SmallVector<Operation *> ops;
  SmallVector<Value> registerTiles;
  int64_t partialBytes = 0;
  /// The ops moved past the nest (deferred): mapped as before, but they start no chain
  /// (warpChainSharedBytes counts them so).
  SmallVector<Operation *> deferred;
};

/// Maps the warp chain starting at contraction `first`, when there is one (see above):
/// `threads` / 32 warps, mma operands of `mmaType` (`split`: bf16x3). The chain's ops move
/// into the nest (at the place of its last op: the fills of other buffers between them
/// run before it), the fill that zeroes the first contraction's output goes, and
/// `nestAttr` marks the nest. None when the ops after `first` do not form a chain or its
/// columns do not split into whole 8-column tiles per warp.
/// `sharedBytes`: the block's workgroup buffers now; none if, less the register tiles and
/// with the partials, they would exceed `sharedLimit`.
std::optional<WarpChainMapping> mapWarpChain(linalg::GenericOp first, int64_t threads,
                                             Type mmaType, bool split, StringRef nestAttr,
                                             int64_t sharedBytes, int64_t sharedLimit);

/// The workgroup bytes `kernel` (a target-free tile kernel) will take once mapped with
/// `threads` threads and its warp chains (mmaType: their operand type; none: no chains): its
/// tile buffers, less the chains' register tiles, with their partials; a chain counts where
/// the bytes stay within `sharedLimit`, as mapWarpChain decides. The tile kernels size their
/// rows by it (TileKernelOptions::sharedBytes).
int64_t warpChainSharedBytes(func::FuncOp kernel, int64_t threads, Type mmaType,
                             int64_t sharedLimit);

/// Whether `nest` is a warp chain's nest.
bool isWarpChain(scf::ForallOp nest);

/// The chain on the CPU (gpu-emulated): the nest becomes the lanes' steps over a register
/// file in memory.
LogicalResult emulateWarpChain(scf::ForallOp nest);

/// The chain on the GPU, inside `launch` (thread id `tid`, `threads` threads, which must be
/// the nest's warps x 32): straight-line per-thread code with shuffles, mma.sync and
/// barriers; the partials in new workgroup allocas at the start of `launch`'s body, which
/// spectra-launch-mapped-kernels places in the block's dynamic shared-memory pool.
LogicalResult lowerWarpChain(scf::ForallOp nest, gpu::LaunchOp launch, Value tid,
                             int64_t threads);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_WARPCHAINS_H
