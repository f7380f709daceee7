//===- MergeNests.h - independent thread nests as one nest, one barrier ---===//
//
// Part of the GPU schedule (MapTilesToGpu.h), on the mapped IR, so gpu-emulated
// runs it too. Every thread nest of a mapped kernel ends with a barrier on the
// GPU (spectra-launch-mapped-kernels): the next nest may read what another
// thread wrote. Many nests in a row do not: the loads of a tile's q, k and v
// rows write three buffers and read three others; the row sums of q's and of
// k's logits read and write disjoint tiles. A barrier between them only waits.
//
// Here the nests of a run (consecutive nests of a block, with only ops free of
// memory effects between them) are scheduled into phases, one barrier each. Two
// nests conflict where one writes a buffer the other reads or writes, unless each
// thread keeps to a column of its own in both (the same offset along the last
// dimension from the thread's index, in every access: RowLoopNests.h's
// threadColumn), so that a thread only meets what it wrote itself: then the later
// nest may share the earlier one's phase, after it (a row's statistics set,
// updated and stored by the same threads). A nest goes to the first phase after
// every phase holding a nest it conflicts with, so it moves above the nests it is
// independent of: a tile's fill, its load, the next tile's fill and load, which
// a causal kernel's prologue runs in turn, become one phase of fills and one of
// loads. The thread nests of a phase become one
// nest, with the most threads of the phase; each member's body runs in its
// threads (t < its count, a guard where that is fewer). A warp nest (tensor
// cores) moves too and joins a phase as well, as a nest of its own with no
// barrier between it and the next nest of its phase (kNoBarrierAttr). A guarded
// nest (an scf.if on a flag uniform over the block, as the learnable-W switch
// around dW, holding one nest and its indices) is scheduled as its nest, the guard
// moving with it, never merged; the barrier left out is the nest's, inside the
// guard. Warp chains, loops, other branches and other ops with memory effects end a
// run. No two
// nests of a phase reduce (a linalg op with a reduction loop) over a common
// buffer: with two, the compilers below load the common operand once for both,
// hoisted above either, and the registers overflow.
// Buffers are told apart by their roots under the views: an alloca (a tile in
// shared memory) or a kernel argument (distinct tensors, taken not to overlap,
// as RowLoopNests.h takes them, but for two marked spectra.may_alias, which
// count as one: spectra::mayAlias); a nest with an effect on anything else, or
// an effect with no buffer, ends a run.
//
// Emulated on the CPU, the merged nest runs each thread's share of every member
// before the next thread's: a member reading what another member wrote in
// another thread would read it too early there, as on the GPU.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_MERGENESTS_H
#define SPECTRA_CODEGEN_MERGENESTS_H

#include "mlir/IR/Block.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/StringRef.h"

namespace mlir::spectra {

/// Marks a nest that needs no barrier after it: the next nest of its phase is independent
/// of it (spectra-launch-mapped-kernels leaves the barrier out).
inline constexpr llvm::StringLiteral kNoBarrierAttr = "spectra.no_barrier";

/// The first warp of a warp nest that runs beside the warp nests before it in its phase, on
/// the warps they leave (an index attribute; absent: warp 0). Two dW-sized contractions of 4
/// warps each run side by side on a block of 8, not one after the other on warps 0-3.
inline constexpr llvm::StringLiteral kFirstWarpAttr = "spectra.first_warp";

/// Schedules, in `body` and the blocks nested in it, every run of nests (marked `nestAttr`,
/// thread nests of at most `threads` threads and warp nests) into phases, the thread nests
/// of a phase merged into one nest. Returns the nests removed (the barriers saved).
int64_t mergeIndependentNests(Block &body, int64_t threads, StringRef nestAttr);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_MERGENESTS_H
