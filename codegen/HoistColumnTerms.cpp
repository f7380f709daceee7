//===- HoistColumnTerms.cpp - a tile op's column-only terms summed once ----===//
//
// A step of the CPU schedule (Passes.td, spectra-hoist-column-terms). A component's
// exponent is a sum of terms over a tile's [T, M] elements: OPRF's
//   a0 ||w_j||^2 + a1 w_j.x_i - ||x_i||^2 / 2 + a2,
// to which the stabiliser adds its per-feature constant c_j and subtracts the row's
// maximum. Some terms depend on the column j alone (a0 ||w_j||^2, a2, c_j): the same for
// every row of every tile, yet computed for every element, a vector operation each per
// vector of features. This pass sums them once, before the tile loop, into an [M]
// buffer that the op reads in their place.
//
// For an all-parallel 2-D linalg.generic G with a static column count in a tile loop's
// body (scf.for marked spectra.tile_loop) with its outputs by the identity map, each maximal
// chain of addf and subf in G's payload (its inner sums used only within the chain) is a
// signed sum of terms. A term is a column term when it is
//  - a value defined above the tile loop (a parameter loaded before it), or
//  - computed by arith and math ops of the payload from such values, constants and block
//    arguments of inputs indexed by the column alone ((d0, d1) -> (d1)) whose memref is
//    defined above the tile loop and written by nothing in it (no write through it or a view
//    of it, nor through an argument that may be its memory: spectra::mayAlias), with at
//    least one such input or constant among them (a product of two parameters computed in
//    the payload stays: it is a scalar the vector stage splats once). Where a chain
// has two column terms or more, they are summed in that order, with their signs, by a
// new 1-D generic before the tile loop, and the chain becomes the sum of its other terms
// in their order plus that buffer, read by G as a new column input (the inputs G no
// longer reads are dropped). The sum is
// reassociated (f32 rounding differs from the chain's order at the level of a few
// ulps). The GPU schedule keeps the chains as they are: its warp chains match the ops'
// operands.
//
//===----------------------------------------------------------------------===//

#include "codegen/Epilogue.h"
#include "codegen/Passes.h"
#include "codegen/TileKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAHOISTCOLUMNTERMS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;

namespace {


/// Whether `v` is defined above `loop`: in a block that holds the loop (through its
/// ancestors), before it.
bool definedAbove(Value v, scf::ForOp loop) {
  Operation *at = v.getParentBlock()->findAncestorOpInBlock(*loop);
  if (!at)
    return false;
  Operation *def = v.getDefiningOp();
  return !def || (def != at && def->isBeforeInBlock(at));
}

struct Term {
  Value value;
  bool negative = false;
};

/// The signed terms of the chain of addf/subf rooted at `root` (its inner sums have one use).
void flatten(Value v, bool negative, Operation *root, SmallVectorImpl<Term> &terms) {
  Operation *def = v.getDefiningOp();
  bool sum = def && isa<arith::AddFOp, arith::SubFOp>(def) &&
             (def == root || v.hasOneUse()) && def->getBlock() == root->getBlock();
  if (!sum) {
    terms.push_back({v, negative});
    return;
  }
  flatten(def->getOperand(0), negative, root, terms);
  flatten(def->getOperand(1), isa<arith::SubFOp>(def) ? !negative : negative, root, terms);
}

/// The terms summed in their order with their signs (each value through `mapping`).
Value signedSum(OpBuilder &b, Location loc, ArrayRef<Term> terms, const IRMapping &mapping) {
  Value acc;
  for (const Term &t : terms) {
    Value v = mapping.lookupOrDefault(t.value);
    if (!acc)
      acc = t.negative ? arith::NegFOp::create(b, loc, v).getResult() : v;
    else
      acc = t.negative ? arith::SubFOp::create(b, loc, acc, v).getResult()
                       : arith::AddFOp::create(b, loc, acc, v).getResult();
  }
  return acc;
}

/// (d0, d1) -> (d1): an operand indexed by the column alone.
AffineMap columnMap(MLIRContext *ctx) {
  return AffineMap::get(2, 0, {getAffineDimExpr(1, ctx)}, ctx);
}

struct HoistColumnTermsPass
    : spectra::impl::SpectraHoistColumnTermsBase<HoistColumnTermsPass> {
  void runOnOperation() override {
    SmallVector<std::pair<linalg::GenericOp, scf::ForOp>> ops;
    getOperation().walk([&](linalg::GenericOp op) {
      auto loop = op->getParentOfType<scf::ForOp>();
      while (loop && !loop->hasAttr(spectra::kTileLoopAttr))
        loop = loop->getParentOfType<scf::ForOp>();
      if (loop)
        ops.push_back({op, loop});
    });
    SmallVector<Operation *> rewritten;
    for (auto [op, loop] : ops) {
      bool any = false;
      while (hoistOne(op, loop))
        any = true;
      if (any)
        rewritten.push_back(op);
    }
    // The inputs the rewritten ops no longer read (the column inputs of the hoisted terms).
    if (rewritten.empty())
      return;
    RewritePatternSet patterns(&getContext());
    linalg::populateEraseUnusedOperandsAndResultsPatterns(patterns);
    if (failed(applyOpPatternsGreedily(rewritten, std::move(patterns))))
      return signalPassFailure();
  }

  /// Hoists the column terms of one chain of `op`'s payload; returns whether it did (the
  /// op is then a new one, so `op` is updated).
  bool hoistOne(linalg::GenericOp &op, scf::ForOp loop) {
    if (op.getNumLoops() != 2 || op.getNumReductionLoops() != 0 || !op.hasPureBufferSemantics() ||
        ShapedType::isDynamic(op.getStaticLoopRanges()[1]))
      return false;
    AffineMap colMap = columnMap(op.getContext());
    for (OpOperand &out : op.getDpsInitsMutable())
      if (!op.getMatchingIndexingMap(&out).isIdentity())
        return false;
    Block &body = op.getRegion().front();
    // The payload's column values: block arguments of invariant column inputs, values from
    // above the tile loop, constants; and what is computed from those alone.
    llvm::DenseSet<Value> column, colInputs;
    for (OpOperand *in : op.getDpsInputOperands()) {
      if (op.getMatchingIndexingMap(in) == colMap && isa<MemRefType>(in->get().getType()) &&
          definedAbove(in->get(), loop) &&
          !spectra::mayTouch(loop, in->get(), /*reads=*/false)) {
        column.insert(op.getMatchingBlockArgument(in));
        colInputs.insert(op.getMatchingBlockArgument(in));
      }
    }
    llvm::DenseSet<Value> touchesInput;  // a column value computed from a column input
    for (Operation &inner : body.without_terminator()) {
      // Arithmetic only: linalg.index has no operands, yet names a row or a column.
      bool all = isa<arith::ArithDialect, math::MathDialect>(inner.getDialect()) &&
                 inner.getNumRegions() == 0 && isMemoryEffectFree(&inner) &&
                 inner.getNumResults() == 1;
      bool input = false;
      for (Value operand : inner.getOperands()) {
        all &= column.contains(operand) || definedAbove(operand, loop);
        input |= colInputs.contains(operand) || touchesInput.contains(operand);
      }
      if (!all)
        continue;
      column.insert(inner.getResult(0));
      if (input || isa<arith::ConstantOp>(inner))
        touchesInput.insert(inner.getResult(0));
    }
    // The chains: an addf/subf whose result is not a one-use operand of another in the block.
    for (Operation &inner : body.without_terminator()) {
      if (!isa<arith::AddFOp, arith::SubFOp>(inner))
        continue;
      Value result = inner.getResult(0);
      if (result.hasOneUse() && isa<arith::AddFOp, arith::SubFOp>(*result.user_begin()) &&
          result.user_begin()->getBlock() == &body)
        continue;  // inside a longer chain
      SmallVector<Term> terms, hoisted, kept;
      flatten(result, false, &inner, terms);
      for (const Term &t : terms) {
        // A column input's value, one computed from it, a constant, or a value from above the
        // tile loop (a parameter).
        Value v = t.value;
        bool isColumn = (column.contains(v) &&
                         (touchesInput.contains(v) || colInputs.contains(v))) ||
                        definedAbove(v, loop);
        (isColumn ? hoisted : kept).push_back(t);
      }
      if (hoisted.size() < 2 || kept.empty())
        continue;
      rewrite(op, loop, inner, hoisted, kept, colInputs);
      return true;
    }
    return false;
  }

  void rewrite(linalg::GenericOp &op, scf::ForOp loop, Operation &root, ArrayRef<Term> hoisted,
               ArrayRef<Term> kept, const llvm::DenseSet<Value> &colInputs) {
    MLIRContext *ctx = op.getContext();
    Location loc = op.getLoc();
    Block &body = op.getRegion().front();
    const int64_t M = op.getStaticLoopRanges()[1];
    Type f32 = root.getResult(0).getType();
    // The sum of the column terms, [M], before the tile loop: the ops that compute them
    // cloned into a 1-D generic over the column inputs they read.
    OpBuilder b(loop);
    auto type = MemRefType::get({M}, f32);
    Value sum = memref::AllocaOp::create(b, loc, type);
    // Allocas belong at the function's entry (the vector stage and the pool expect them
    // there): moved there where the tile loop is nested in another op.
    if (auto fn = op->getParentOfType<func::FuncOp>(); fn && loop->getBlock() != &fn.front())
      sum.getDefiningOp()->moveBefore(&fn.front().front());
    // The payload ops the column terms need, in order, and the column inputs they read.
    llvm::SetVector<Operation *> needed;
    llvm::SetVector<Value> reads;
    std::function<void(Value)> collect = [&](Value v) {
      if (colInputs.contains(v))
        reads.insert(v);
      Operation *def = v.getDefiningOp();
      if (!def || def->getBlock() != &body || needed.contains(def))
        return;
      for (Value operand : def->getOperands())
        collect(operand);
      needed.insert(def);
    };
    for (const Term &t : hoisted)
      collect(t.value);
    SmallVector<Operation *> order(needed.begin(), needed.end());
    llvm::sort(order, [](Operation *x, Operation *y) { return x->isBeforeInBlock(y); });
    SmallVector<Value> ins;
    SmallVector<BlockArgument> args;
    for (OpOperand *in : op.getDpsInputOperands())
      if (reads.contains(op.getMatchingBlockArgument(in))) {
        ins.push_back(in->get());
        args.push_back(op.getMatchingBlockArgument(in));
      }
    AffineMap id1 = AffineMap::getMultiDimIdentityMap(1, ctx);
    SmallVector<AffineMap> maps(ins.size() + 1, id1);
    SmallVector<utils::IteratorType> iters = {utils::IteratorType::parallel};
    linalg::GenericOp::create(
        b, loc, ValueRange(ins), ValueRange{sum}, maps, iters,
        [&](OpBuilder &nb, Location nl, ValueRange blockArgs) {
          IRMapping mapping;
          for (auto [k, arg] : llvm::enumerate(args))
            mapping.map(arg, blockArgs[k]);
          for (Operation *o : order)
            nb.clone(*o, mapping);
          linalg::YieldOp::create(nb, nl, signedSum(nb, nl, hoisted, mapping));
        });
    // The op with the sum as one more column input.
    OpBuilder ob(op);
    SmallVector<Value> newIns(op.getDpsInputs());
    newIns.push_back(sum);
    SmallVector<AffineMap> newMaps;
    for (OpOperand *in : op.getDpsInputOperands())
      newMaps.push_back(op.getMatchingIndexingMap(in));
    newMaps.push_back(columnMap(ctx));
    for (OpOperand &out : op.getDpsInitsMutable())
      newMaps.push_back(op.getMatchingIndexingMap(&out));
    auto next = linalg::GenericOp::create(ob, loc, op.getResultTypes(), newIns,
                                          op.getDpsInits(), newMaps,
                                          op.getIteratorTypesArray());
    next->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    Region &region = next.getRegion();
    region.takeBody(op.getRegion());
    Block &moved = region.front();
    unsigned at = op.getNumDpsInputs();
    BlockArgument colSum = moved.insertArgument(at, f32, loc);
    // The chain's root becomes the kept terms in their order, then + the column sum.
    OpBuilder rb(&root);
    Value acc = arith::AddFOp::create(rb, loc, signedSum(rb, loc, kept, IRMapping()), colSum);
    root.getResult(0).replaceAllUsesWith(acc);
    // The chain and the column terms' ops die with it.
    SmallVector<Operation *> payload;
    for (Operation &o : moved.without_terminator())
      payload.push_back(&o);
    for (Operation *o : llvm::reverse(payload))  // users before what they use
      if (o->use_empty() && isMemoryEffectFree(o))
        o->erase();
    op->erase();
    op = next;
  }
};

} // namespace
