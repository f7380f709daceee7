//===- RowLoopNests.h - a tile's row loops as one thread nest -------------===//
//
// Part of the GPU schedule (MapTilesToGpu.h), on the mapped IR, so gpu-emulated
// runs it too. The tile layer writes the work on a partial tile's rows as a
// loop over the rows present, one op per row: the loads of q, k, v and the
// mask into the tile buffers, the stores of output rows and their statistics.
// Mapped op by op, each row became a thread nest of a row's width (32 threads
// of 256 at d = 32) followed by a barrier on the GPU: 16 rows, 16 global-load
// latencies one after another and 16 barriers, where one nest over rows x
// width takes one of each; a row op left at block level (a mask entry) became
// a one-thread nest looping over the rows.
//
// Here such a loop becomes one nest over (row, element) pairs, each pair one
// thread's: where the loop's iterations are independent, which is checked, not
// assumed. Iteration r may write only its own row of a buffer from outside the
// loop (through a subview at offset r, or r plus a value from outside the loop,
// size 1, with no view made in the loop above it; or a scalar store indexed
// so), and may access a buffer the loop writes only in that row of the same
// view; its ops outside the nest are free of memory effects. Distinct buffers
// (allocas, the kernel's arguments) are taken not to overlap, but for two
// arguments marked spectra.may_alias (spectra::mayAlias), which count as one.
// The loop's rows are bounded by a constant (its upper bound one, or the min of
// one and a value), so the nest's size is static; each thread's rows run up to
// the loop's upper bound. A loop over the rows past the end of a partial tile
// (from min(x, C) to C: the zeroing of those rows) is left as it is: it runs
// in the last tile only, where one nest would take a barrier in every tile.
//
// Rows that depend on each other column by column (the causal kernels' running
// maximum of the key logits down a tile's rows: row r reads row r - 1 of the
// buffer it writes) take a barrier per row as well. Where each thread of the
// loop's nest keeps to a column of its own in every buffer the loop writes (the
// same offset along the last dimension, the thread's index, in every access;
// other buffers read anyhow), the loop moves inside the nest: each thread runs
// the rows in order on its column (runRowsInThreads).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_ROWLOOPNESTS_H
#define SPECTRA_CODEGEN_ROWLOOPNESTS_H

#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Block.h"
#include "mlir/IR/Value.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Support/LLVM.h"

#include <optional>

namespace mlir::spectra {

/// A constant bounding the index `v` from above: v itself, or min(x, C) (the rows left in a
/// tile). None otherwise. (Also the CPU work model's trip counts, KernelWork.cpp.)
std::optional<int64_t> constantUpperBound(Value v);

/// Whether `loop` runs over the rows past the end of a partial tile: from min(x, C) to C,
/// none in a full tile.
bool isRowsPastTheEnd(scf::ForOp loop);

/// A thread nest of `nestAttr` (over threads, not warps) with a constant count and no shared
/// outputs: its count, or none. (Also MergeNests.cpp's members.)
std::optional<int64_t> threadNestSize(Operation *op, StringRef nestAttr);

/// Calls `visit` on each memory effect on a memref (allocations and frees aside) of the ops
/// in `region`, with its op. False, having stopped, where an op's effects are unknown (no
/// effect interface, no regions, not free of effects) or name no memref, or where `visit`
/// returns false. (Also MergeNests.cpp's footprints.)
bool forEachMemrefEffect(
    Region &region, function_ref<bool(Operation *, const MemoryEffects::EffectInstance &)> visit);

/// Where `op`'s access to `memref` (a view of a buffer), in thread nest `nest` of `count`
/// threads, reaches along the buffer's last dimension, where that is the thread's own
/// column: the thread's index (or that modulo a bound no smaller than `count`) plus the
/// constant returned. None where it is not (another index, an offset from outside the nest,
/// a view other than a unit-stride subview keeping the last dimension, more than one
/// column). (Also MergeNests.cpp's footprints.)
std::optional<int64_t> threadColumn(Operation *op, Value memref, scf::ForallOp nest,
                                    int64_t count);

/// Rewrites, in `body` (a mapped kernel's block), every scf.for whose body is one thread
/// nest (marked `nestAttr`) over independent rows, and every one-thread nest whose body is
/// one such loop of scalar ops, into one thread nest over the loop's rows (at most
/// `threads` threads, a block-stride loop past that). Returns how many loops it rewrote.
int64_t mergeRowLoopsIntoNests(Block &body, int64_t threads, StringRef nestAttr);

/// Rewrites, in `body`, every scf.for whose body is one thread nest (marked `nestAttr`, at
/// most `threads` threads) and ops free of memory effects, where each thread keeps to a
/// column of its own in every buffer the loop writes, into one nest whose threads run the
/// loop's rows in order: a recurrence down the rows (a running maximum), one barrier where
/// there was one per row. Returns how many loops it rewrote.
int64_t runRowsInThreads(Block &body, int64_t threads, StringRef nestAttr);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_ROWLOOPNESTS_H
