//===- MergeNests.h - independent thread nests as one nest, one barrier ---===//
//
// Part of the GPU schedule (MapTilesToGpu.h), on the mapped IR, so gpu-emulated
// runs it too. Every thread nest of a mapped kernel ends with a barrier on the
// GPU (spectra-launch-mapped-kernels): the next nest may read what another
// thread wrote. Many nests in a row do not: the loads of a tile's q, k and v
// rows write three buffers and read three others; the row sums of q's and of
// k's logits read and write disjoint tiles. A barrier between them only waits.
//
// Here consecutive thread nests of a block (with only ops free of memory
// effects between them) become one nest while none of them touches what
// another writes: a nest joins the group unless it writes a buffer the group
// reads or writes, or reads one the group writes. Buffers are told apart by
// their roots under the views: an alloca (a tile in shared memory) or a kernel
// argument (distinct tensors, taken not to overlap, as RowLoopNests.h takes
// them); a nest with an effect on anything else, or an effect with no buffer,
// stays alone. The merged nest has the most threads of the group; each member's
// body runs in its threads (t < its count, a guard where that is fewer).
// Warp nests (tensor cores) and warp chains are left as they are and end a
// group, as do loops, branches and other ops with memory effects.
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

namespace mlir::spectra {

/// Merges, in `body` and the blocks nested in it, every run of consecutive independent
/// thread nests (marked `nestAttr`, at most `threads` threads each) into one nest.
/// Returns the nests removed (the barriers saved).
int64_t mergeIndependentNests(Block &body, int64_t threads, StringRef nestAttr);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_MERGENESTS_H
