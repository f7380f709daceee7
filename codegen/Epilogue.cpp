//===- Epilogue.cpp - contraction epilogues, for both schedules -----------===//
//
// See Epilogue.h.
//
//===----------------------------------------------------------------------===//

#include "codegen/Epilogue.h"
#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

using namespace mlir;
using namespace mlir::spectra;

Value mlir::spectra::viewRoot(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    // A memref.view carves a buffer of its own out of a byte pool (the block's dynamic
    // shared memory): it is the root, not the pool.
    if (isa<memref::ViewOp>(def))
      break;
    if (auto view = dyn_cast<ViewLikeOpInterface>(def))
      v = view.getViewSource();
    else
      break;
  }
  return v;
}

namespace {
Value root(Value v) { return viewRoot(v); }

/// Whether x and y are unit-stride subviews of one source, at static offsets and sizes,
/// whose index ranges miss each other in some dimension (SGQ's features for P and -P:
/// columns 1-32 and 33-64 of one tile).
bool disjointViews(Value x, Value y) {
  auto sx = x.getDefiningOp<memref::SubViewOp>(), sy = y.getDefiningOp<memref::SubViewOp>();
  if (!sx || !sy || sx.getSource() != sy.getSource())
    return false;
  ArrayRef<int64_t> ox = sx.getStaticOffsets(), oy = sy.getStaticOffsets(),
                    nx = sx.getStaticSizes(), ny = sy.getStaticSizes();
  auto known = [](ArrayRef<int64_t> v) { return llvm::none_of(v, ShapedType::isDynamic); };
  auto unit = [](ArrayRef<int64_t> v) { return llvm::all_of(v, [](int64_t s) { return s == 1; }); };
  if (!known(ox) || !known(oy) || !known(nx) || !known(ny) || !unit(sx.getStaticStrides()) ||
      !unit(sy.getStaticStrides()) || ox.size() != oy.size())
    return false;
  for (size_t d = 0; d < ox.size(); ++d)
    if (ox[d] + nx[d] <= oy[d] || oy[d] + ny[d] <= ox[d])
      return true;
  return false;
}
} // namespace

Value mlir::spectra::contractionOutput(linalg::GenericOp op) {
  MLIRContext *ctx = op.getContext();
  if (op.getNumLoops() != 3 || op.getNumDpsInits() != 1 ||
      op.getIndexingMapsArray().back() !=
          AffineMap::get(3, 0, {getAffineDimExpr(0, ctx), getAffineDimExpr(1, ctx)}, ctx))
    return Value();
  return op.getDpsInits()[0];
}

bool mlir::spectra::mayAlias(Value x, Value y) {
  Value rx = root(x), ry = root(y);
  if (rx == ry)
    return true;
  auto marked = [](Value r) {
    auto arg = dyn_cast<BlockArgument>(r);
    auto fn = arg ? dyn_cast<FunctionOpInterface>(arg.getOwner()->getParentOp()) : nullptr;
    return fn && arg.getOwner()->isEntryBlock() &&
           fn.getArgAttr(arg.getArgNumber(), kMayAliasArgAttr);
  };
  return marked(rx) && marked(ry) && rx.getType() == ry.getType();
}

bool mlir::spectra::mayTouch(Operation *op, Value buffer, bool reads) {
  WalkResult result = op->walk([&](Operation *inner) {
    // Its own effects (a linalg op's on its operands), and those of what it holds, which the
    // walk visits too.
    auto effects = dyn_cast<MemoryEffectOpInterface>(inner);
    if (!effects)
      return inner->hasTrait<OpTrait::HasRecursiveMemoryEffects>() ? WalkResult::advance()
                                                                     : WalkResult::interrupt();
    SmallVector<MemoryEffects::EffectInstance> list;
    effects.getEffects(list);
    for (MemoryEffects::EffectInstance &e : list) {
      if (!isa<MemoryEffects::Write>(e.getEffect()) &&
          !(reads && isa<MemoryEffects::Read>(e.getEffect())))
        continue;
      Value v = e.getValue();
      if (!v || mayAlias(v, buffer))
        return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return result.wasInterrupted();
}

bool mlir::spectra::readElsewhere(Value tile, Operation *writer, Operation *reader) {
  Value base = root(tile);
  if (!base.getDefiningOp<memref::AllocaOp>() && !base.getDefiningOp<memref::AllocOp>())
    return true;
  SmallVector<Value> work = {base};
  while (!work.empty()) {
    Value v = work.pop_back_val();
    for (Operation *user : v.getUsers()) {
      if (user == writer || user == reader || isa<linalg::FillOp>(user))
        continue;
      if (auto view = dyn_cast<ViewLikeOpInterface>(user); view && view.getViewSource() == v) {
        work.append(user->result_begin(), user->result_end());
        continue;
      }
      return true;
    }
  }
  return false;
}

bool mlir::spectra::runsOnAccumulators(linalg::GenericOp e) {
  for (Operation &inner : e.getRegion().front().without_terminator())
    if (inner.getNumRegions() != 0 ||
        !llvm::isa<arith::ArithDialect, math::MathDialect>(inner.getDialect()) ||
        !llvm::all_of(inner.getResultTypes(), [](Type t) { return t.isIntOrIndexOrFloat(); }))
      return false;
  AffineExpr col = getAffineDimExpr(1, e.getContext());
  for (AffineMap map : e.getIndexingMapsArray()) {
    for (AffineExpr x : map.getResults())
      if (!isa<AffineDimExpr>(x))
        return false;
    // Vectors run along the column dim: it must be innermost wherever it appears.
    for (unsigned r = 0; r + 1 < map.getNumResults(); ++r)
      if (map.getResult(r) == col)
        return false;
  }
  return true;
}

std::optional<Epilogue> mlir::spectra::epilogueOf(linalg::GenericOp op) {
  Value C = contractionOutput(op);
  if (!C || op.getNumDpsInputs() != 2)
    return std::nullopt;
  Value A = op.getDpsInputs()[0], B = op.getDpsInputs()[1];
  Operation *next = op->getNextNode();
  while (next && isMemoryEffectFree(next))
    next = next->getNextNode();
  auto e = dyn_cast_or_null<linalg::GenericOp>(next);
  if (!e || e.getNumLoops() != 2 || e.getNumReductionLoops() != 0 ||
      !e.hasPureBufferSemantics())
    return std::nullopt;
  SmallVector<int64_t> shape = op.getStaticLoopRanges(), eshape = e.getStaticLoopRanges();
  if (eshape[0] != shape[0] || eshape[1] != shape[1] || !runsOnAccumulators(e))
    return std::nullopt;
  std::optional<unsigned> input;
  for (OpOperand &operand : e->getOpOperands()) {
    AffineMap map = e.getMatchingIndexingMap(&operand);
    unsigned i = operand.getOperandNumber();
    bool isInit = i >= e.getNumDpsInputs();
    if (isInit) {
      // Written as each register tile finishes, while later tiles still read A and B, and
      // load C (another view of C's buffer that overlaps it would be written before it is
      // read).
      if (!map.isIdentity() || mayAlias(operand.get(), A) || mayAlias(operand.get(), B) ||
          (operand.get() != C && root(operand.get()) == root(C) &&
           !disjointViews(operand.get(), C)))
        return std::nullopt;
      continue;
    }
    if (operand.get() == C && map.isIdentity() && !input) {
      input = i;
      continue;
    }
    if (mayAlias(operand.get(), C))
      return std::nullopt;
  }
  if (!input)
    return std::nullopt;
  // What E reads may be computed between the two (views, indices: nothing with memory
  // effects, and the contraction has no results): it moves above the contraction.
  for (Operation *between = op->getNextNode(); between != e.getOperation();) {
    Operation *move = between;
    between = between->getNextNode();
    move->moveBefore(op);
  }
  // Written in place, C's last store is the epilogue's.
  bool writesC = llvm::is_contained(e.getDpsInits(), C);
  return Epilogue{e, *input, !writesC && readElsewhere(C, op, e)};
}


linalg::FillOp mlir::spectra::zeroFillBefore(linalg::GenericOp op) {
  Value C = contractionOutput(op);
  if (!C)
    return {};
  // Back over ops that touch no memory, and fills of buffers that cannot be C's memory (they
  // write nothing the contraction writes), to the fill of C.
  Operation *prev = op->getPrevNode();
  auto otherFill = [&](Operation *o) {
    auto f = dyn_cast<linalg::FillOp>(o);
    return f && !mayAlias(f.getDpsInits()[0], C);
  };
  while (prev && (isMemoryEffectFree(prev) || otherFill(prev)))
    prev = prev->getPrevNode();
  auto fill = dyn_cast_or_null<linalg::FillOp>(prev);
  if (!fill || fill.getDpsInits()[0] != C || !matchPattern(fill.getInputs()[0], m_PosZeroFloat()))
    return {};
  // An operand in the same buffer would have read the zeros.
  if (llvm::any_of(op.getDpsInputs(), [&](Value in) { return mayAlias(in, C); }))
    return {};
  return fill;
}
