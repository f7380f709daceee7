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
// (allocas, the kernel's arguments) are taken not to overlap. The loop's rows
// are bounded by a constant (its upper bound one, or the min of one and a
// value), so the nest's size is static; each thread's rows run up to the
// loop's upper bound. A loop over the rows past the end of a partial tile
// (from min(x, C) to C: the zeroing of those rows) is left as it is: it runs
// in the last tile only, where one nest would take a barrier in every tile.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_ROWLOOPNESTS_H
#define SPECTRA_CODEGEN_ROWLOOPNESTS_H

#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Block.h"
#include "mlir/IR/Value.h"
#include "mlir/Support/LLVM.h"

#include <optional>

namespace mlir::spectra {

/// A constant bounding the index `v` from above: v itself, or min(x, C) (the rows left in a
/// tile). None otherwise. (Also the CPU work model's trip counts, KernelWork.cpp.)
std::optional<int64_t> constantUpperBound(Value v);

/// Whether `loop` runs over the rows past the end of a partial tile: from min(x, C) to C,
/// none in a full tile.
bool isRowsPastTheEnd(scf::ForOp loop);

/// Rewrites, in `body` (a mapped kernel's block), every scf.for whose body is one thread
/// nest (marked `nestAttr`) over independent rows, and every one-thread nest whose body is
/// one such loop of scalar ops, into one thread nest over the loop's rows (at most
/// `threads` threads, a block-stride loop past that). Returns how many loops it rewrote.
int64_t mergeRowLoopsIntoNests(Block &body, int64_t threads, StringRef nestAttr);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_ROWLOOPNESTS_H
