//===- ReuseTileBuffers.cpp - an elementwise op writes over its dead input tile ===//
//
// A step of the CPU schedule (Passes.td, spectra-reuse-tile-buffers). The tile
// kernels give every tile its own buffer: kv's logits and its features
// phi = exp(l - c) are two [T x m] tiles, 16 KiB each at T = 32, m = 128, and
// with the weights, the summary and the staged rows the tile's working set
// overflows a 48 KiB L1. The logits are dead once phi is formed from them, so phi
// can be written over them, element for element: one tile less in the cache.
// (The GPU schedule keeps both: there a warp chain holds them in registers, and
// it matches distinct buffers.)
//
// In a tile loop's body (scf.for marked spectra.tile_loop), an all-parallel
// linalg.generic G with an input A and an output B, both indexed by the identity
// map and both stack allocations (memref.alloca) of the same type, writes B over A
// where
//  - every use of A and of B, through views of them too, is in the body (a use is
//    placed at its ancestor among the body's ops: a loop of stores at the loop), and
//    none passes the buffer on otherwise (a yield, an op with a memref result that is
//    no view of it), where its later uses could not be followed;
//  - A is not used after G, and its first use in the body writes it whole (a fill,
//    or an all-parallel generic with A an output by the identity map whose payload
//    does not read A's old value, and no input in A): what A holds on entry to the
//    body, from the last iteration, is never read;
//  - B's first use in the body is G, which writes it whole in that way;
//  - no other operand of G is A, B or a view of either.
// Then every use of B becomes a use of A: G reads each element of A before it writes
// it, and nothing reads A's old values after G. Repeated until nothing changes, so a
// chain of such ops shares one buffer.
//
//===----------------------------------------------------------------------===//

#include "codegen/Epilogue.h"
#include "codegen/Passes.h"
#include "codegen/TileKernels.h"

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAREUSETILEBUFFERS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;

namespace {

/// The ops of `body` that use a stack allocation, directly or through views of it (each use
/// as its ancestor in `body`, a view as itself and as its users' ancestors), in the body's
/// order; nullopt where a use is outside the body, a user passes the buffer on other than
/// as a view (a terminator, an op with a memref result), or the value is no memref.alloca
/// (a heap buffer's dealloc would move to the other buffer).
std::optional<SmallVector<Operation *>> bodyUses(Value buffer, Block &body) {
  if (!buffer.getDefiningOp<memref::AllocaOp>())
    return std::nullopt;
  SmallVector<Operation *> uses;
  SmallVector<Value> work = {buffer};
  while (!work.empty()) {
    Value v = work.pop_back_val();
    for (Operation *user : v.getUsers()) {
      Operation *at = body.findAncestorOpInBlock(*user);
      if (!at)
        return std::nullopt;
      if (!llvm::is_contained(uses, at))
        uses.push_back(at);
      if (auto view = dyn_cast<ViewLikeOpInterface>(user); view && view.getViewSource() == v) {
        llvm::append_range(work, user->getResults());
        continue;
      }
      if (user->hasTrait<OpTrait::IsTerminator>() ||
          llvm::any_of(user->getResultTypes(), [](Type t) { return isa<BaseMemRefType>(t); }))
        return std::nullopt;
    }
  }
  llvm::sort(uses, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  return uses;
}

/// How many of `op`'s operands are `buffer` or views of it.
int64_t operandsIn(Operation *op, Value buffer) {
  return llvm::count_if(op->getOperands(),
                        [&](Value v) { return spectra::viewRoot(v) == buffer; });
}

bool allParallel(linalg::GenericOp op) { return op.getNumParallelLoops() == op.getNumLoops(); }

/// Whether `op` writes all of `buffer` without reading what it held: a fill of it, or an
/// all-parallel generic with it an output by the identity map, its payload not reading the
/// output's old value, and no input in it.
bool writesWhole(Operation *op, Value buffer) {
  if (auto fill = dyn_cast<linalg::FillOp>(op))
    return fill.getOutputs().front() == buffer;
  auto generic = dyn_cast<linalg::GenericOp>(op);
  if (!generic || !allParallel(generic))
    return false;
  bool written = false;
  for (OpOperand &operand : generic->getOpOperands()) {
    if (operand.get() != buffer)
      continue;
    if (!generic.isDpsInit(&operand) || !generic.getMatchingIndexingMap(&operand).isIdentity() ||
        generic.payloadUsesValueFromOperand(&operand))
      return false;
    written = true;
  }
  return written;
}

/// Writes the output B of one generic in `body` over one of its inputs A (the file's
/// comment); returns whether it did.
bool reuseOne(Block &body) {
  for (Operation &op : body) {
    auto generic = dyn_cast<linalg::GenericOp>(&op);
    if (!generic || !allParallel(generic))
      continue;
    for (OpOperand &out : generic.getDpsInitsMutable()) {
      Value B = out.get();
      std::optional<SmallVector<Operation *>> bUses = bodyUses(B, body);
      if (!bUses || bUses->front() != generic || !writesWhole(generic, B))
        continue;
      for (OpOperand *in : generic.getDpsInputOperands()) {
        Value A = in->get();
        if (A == B || A.getType() != B.getType() ||
            !generic.getMatchingIndexingMap(in).isIdentity())
          continue;
        std::optional<SmallVector<Operation *>> aUses = bodyUses(A, body);
        if (!aUses || aUses->back() != generic || !writesWhole(aUses->front(), A))
          continue;
        // A and B once each among G's operands: a second read of A by another map, or A
        // also written by G, would see B's new values.
        if (operandsIn(generic, A) != 1 || operandsIn(generic, B) != 1)
          continue;
        Operation *alloc = B.getDefiningOp();
        B.replaceAllUsesWith(A);
        alloc->erase();
        return true;
      }
    }
  }
  return false;
}

struct ReuseTileBuffersPass
    : spectra::impl::SpectraReuseTileBuffersBase<ReuseTileBuffersPass> {
  void runOnOperation() override {
    getOperation()->walk([](scf::ForOp loop) {
      if (!loop->hasAttr(spectra::kTileLoopAttr))
        return;
      while (reuseOne(*loop.getBody())) {
      }
    });
  }
};

} // namespace
