//===- FullTilesInPlace.cpp - full tiles read and write their rows in place ===//
//
// A step of the CPU schedule (Passes.td, spectra-full-tiles-in-place). The tile
// kernels are written target-free, for tiles of T rows whatever the rows left:
// a row tile is staged (its rows of q, k, x, ... copied into a [T, W] buffer,
// zeros below the last row), worked on whole, and what it produced is unstaged
// (its rows copied out). Only the last tile of a slice can be short. For a full
// tile the copies are pure overhead, and in the kernels that do little else
// (the statistics' moments and their backward: a sum or one multiply-add per
// element) they are most of the work: the fills, copies and copy-backs are
// three times the loads and stores of the arithmetic.
//
// For each tile loop (scf.for marked spectra.tile_loop) without a contraction
// (a linalg op of three or more loops, whose work the copies do not weigh on), the
// body runs under `scf.if rows == T`: its full-tile copy reads the arguments' rows
// through [T, W] views of them and writes them the same way, and the short tile
// keeps the staged body. A buffer B is read in place when
//  - it is an allocation only this loop's body uses, filled with zeros (a fill of B
//    or a loop of fills of its rows, whatever the value: the full tile drops it)
//    and then staged by a loop over the tile's rows whose body copies row r0 + i
//    of a kernel argument into row i of B (a linalg.generic that yields its input
//    unchanged, or a load and store of one element for a mask), and
//  - the body's other uses of B (through its subviews too) come after that copy
//    and only read it;
// a buffer B is written in place when
//  - it is an allocation only this loop's body uses, unstaged by a loop that
//    copies row i of B into row r0 + i of an argument, and written before that by
//    one op W: a fill, or an all-parallel linalg.generic whose payload does not
//    read B's old value, with B its only output.
// Two arguments may be the same memory where both are marked spectra.may_alias
// (spectra::mayAlias: moments_backward's dx and dxin), and the rewrite moves reads
// and writes of the arguments:
//  - a buffer written in place writes its argument at W, no longer at its copy, so
//    no op between W and that copy may read or write the argument's memory;
//  - a buffer read in place reads its argument where B was read, no longer at its
//    copy, so every such read must come before the first write to the argument's
//    memory, or be that write W's own element-for-element read (identity maps),
//    which reads each element before W writes it, as the staged body did.
// An op whose effects are unknown counts as touching every argument.
//
//===----------------------------------------------------------------------===//

#include "codegen/Epilogue.h"
#include "codegen/Passes.h"
#include "codegen/TileKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAFULLTILESINPLACE
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;

namespace {

/// A staging copy of one buffer: `loop` over the tile's rows copies between row r0 + i of the
/// argument `arg` and row i of the allocation `buffer` (into the buffer: `in`).
struct Staging {
  scf::ForOp loop;
  Value buffer, arg, rows, r0;
  bool in = true;
  /// A stage-in's fills of its buffer; a stage-out's one writer.
  SmallVector<Operation *> fills;
  Operation *writer = nullptr;
  /// Every use of the buffer and of its views, as (user, the value used) (usesOf).
  SmallVector<std::pair<Operation *, Value>> uses;
};

/// The value x of `offset` = x + iv (either order), or null.
Value offsetBase(Value offset, Value iv) {
  auto add = offset.getDefiningOp<arith::AddIOp>();
  if (!add)
    return {};
  if (add.getLhs() == iv)
    return add.getRhs();
  if (add.getRhs() == iv)
    return add.getLhs();
  return {};
}

bool isEntryAlloca(Value v, func::FuncOp fn) {
  auto alloca = v.getDefiningOp<memref::AllocaOp>();
  return alloca && alloca->getBlock() == &fn.getBody().front() &&
         alloca.getType().hasStaticShape();
}

bool isArgument(Value v, func::FuncOp fn) {
  auto arg = dyn_cast<BlockArgument>(v);
  return arg && arg.getOwner() == &fn.getBody().front();
}

/// A whole row of `row` (a subview [1, W] at [at, 0] of a rank-2 memref of width W): its
/// source and `at`; null where it is not one.
std::pair<Value, Value> wholeRow(Value row) {
  auto sv = row.getDefiningOp<memref::SubViewOp>();
  if (!sv)
    return {};
  auto source = cast<MemRefType>(sv.getSource().getType());
  if (source.getRank() != 2 || source.isDynamicDim(1) || sv.getMixedOffsets().size() != 2 ||
      !isConstantIntValue(sv.getMixedOffsets()[1], 0) ||
      !isConstantIntValue(sv.getMixedSizes()[0], 1) ||
      !isConstantIntValue(sv.getMixedSizes()[1], source.getDimSize(1)) ||
      !llvm::all_of(sv.getMixedStrides(), [](OpFoldResult s) { return isConstantIntValue(s, 1); }) ||
      cast<MemRefType>(sv.getType()).getRank() != 2)
    return {};
  auto at = dyn_cast<Value>(sv.getMixedOffsets()[0]);
  if (!at)
    return {};
  return {sv.getSource(), at};
}

/// The staging copy `copy` is, if it is one (see the file comment).
std::optional<Staging> matchStaging(scf::ForOp copy, func::FuncOp fn) {
  if (copy.getNumResults() != 0 || !isConstantIntValue(copy.getLowerBound(), 0) ||
      !isConstantIntValue(copy.getStep(), 1))
    return std::nullopt;
  Value iv = copy.getInductionVar();
  SmallVector<Operation *> effects;
  for (Operation &op : copy.getBody()->without_terminator()) {
    if (isa<memref::SubViewOp, arith::AddIOp, arith::ConstantOp>(op))
      continue;
    effects.push_back(&op);
  }
  Staging s;
  s.loop = copy;
  s.rows = copy.getUpperBound();
  if (effects.size() == 1) {
    auto generic = dyn_cast<linalg::GenericOp>(effects[0]);
    if (!generic || generic.getNumDpsInputs() != 1 || generic.getNumDpsInits() != 1 ||
        generic.getNumReductionLoops() != 0 ||
        !llvm::all_of(generic.getIndexingMapsArray(), [](AffineMap m) { return m.isIdentity(); }))
      return std::nullopt;
    Block &payload = generic.getRegion().front();
    auto yield = cast<linalg::YieldOp>(payload.getTerminator());
    if (payload.getOperations().size() != 1 || yield.getValues()[0] != payload.getArgument(0))
      return std::nullopt;
    auto [from, fromAt] = wholeRow(generic.getDpsInputs()[0]);
    auto [to, toAt] = wholeRow(generic.getDpsInits()[0]);
    if (!from || !to)
      return std::nullopt;
    if (isEntryAlloca(to, fn) && isArgument(from, fn) && toAt == iv) {
      s.buffer = to, s.arg = from, s.r0 = offsetBase(fromAt, iv), s.in = true;
    } else if (isEntryAlloca(from, fn) && isArgument(to, fn) && fromAt == iv) {
      s.buffer = from, s.arg = to, s.r0 = offsetBase(toAt, iv), s.in = false;
    } else {
      return std::nullopt;
    }
  } else if (effects.size() == 2) {
    // A mask: kept[i] = keep[r0 + i].
    auto load = dyn_cast<memref::LoadOp>(effects[0]);
    auto store = dyn_cast<memref::StoreOp>(effects[1]);
    if (!load || !store || store.getValueToStore() != load.getResult() ||
        load.getIndices().size() != 1 || store.getIndices().size() != 1 ||
        store.getIndices()[0] != iv || !isArgument(load.getMemRef(), fn) ||
        !isEntryAlloca(store.getMemRef(), fn))
      return std::nullopt;
    s.buffer = store.getMemRef(), s.arg = load.getMemRef(), s.in = true;
    s.r0 = offsetBase(load.getIndices()[0], iv);
  } else {
    return std::nullopt;
  }
  auto buffer = cast<MemRefType>(s.buffer.getType()), arg = cast<MemRefType>(s.arg.getType());
  // r0 comes from outside the copy (it must dominate the views built above the copies).
  if (!s.r0 || copy->isAncestor(s.r0.getParentRegion()->getParentOp()) ||
      buffer.getRank() != arg.getRank() || !arg.isDynamicDim(0) ||
      buffer.getElementType() != arg.getElementType() ||
      (buffer.getRank() == 2 && buffer.getDimSize(1) != arg.getDimSize(1)))
    return std::nullopt;
  return s;
}

/// The top-level op of `body` that holds `op`.
Operation *topLevel(Operation *op, Block &body) {
  Operation *top = body.findAncestorOpInBlock(*op);
  assert(top && "an op outside the tile body");
  return top;
}

/// Every use of `buffer`, and of the views of it, as (user, the value used).
void usesOf(Value buffer, SmallVectorImpl<std::pair<Operation *, Value>> &uses) {
  for (Operation *user : buffer.getUsers()) {
    uses.push_back({user, buffer});
    if (auto sv = dyn_cast<memref::SubViewOp>(user))
      usesOf(sv.getResult(), uses);
  }
}

/// Whether `user` only reads `value` (a buffer or a view of one).
bool onlyReads(Operation *user, Value value) {
  if (isa<memref::SubViewOp, memref::LoadOp, memref::DimOp>(user))
    return true;
  if (auto linalg = dyn_cast<linalg::LinalgOp>(user))
    return !llvm::is_contained(linalg.getDpsInits(), value);
  return false;
}

/// A fill of `buffer` at the top level of the tile body: linalg.fill of it, or a loop whose
/// body only fills rows of it.
bool isFillOf(Operation *op, Value buffer) {
  if (auto fill = dyn_cast<linalg::FillOp>(op))
    return fill.getOutputs()[0] == buffer;
  auto loop = dyn_cast<scf::ForOp>(op);
  if (!loop || loop.getNumResults() != 0)
    return false;
  for (Operation &inner : loop.getBody()->without_terminator()) {
    if (auto sv = dyn_cast<memref::SubViewOp>(inner); sv && sv.getSource() == buffer)
      continue;
    if (isa<arith::ConstantOp>(inner))
      continue;
    auto fill = dyn_cast<linalg::FillOp>(inner);
    auto sv = fill ? fill.getOutputs()[0].getDefiningOp<memref::SubViewOp>() : nullptr;
    if (!sv || sv.getSource() != buffer || sv->getBlock() != loop.getBody())
      return false;
  }
  return true;
}

/// The one writer of a stage-out buffer, if it is one: a fill, or an all-parallel generic
/// with `buffer` its only output (identity map) whose payload does not read the output.
bool isPureWriterOf(Operation *op, Value buffer) {
  if (auto fill = dyn_cast<linalg::FillOp>(op))
    return fill.getOutputs()[0] == buffer;
  auto generic = dyn_cast<linalg::GenericOp>(op);
  if (!generic || generic.getNumDpsInits() != 1 || generic.getDpsInits()[0] != buffer ||
      generic.getNumReductionLoops() != 0 ||
      !generic.getMatchingIndexingMap(generic.getDpsInitOperand(0)).isIdentity())
    return false;
  return generic.getMatchingBlockArgument(generic.getDpsInitOperand(0)).use_empty();
}


/// Rebuilds the views in `block` taken of `roots` (the [T, W] views of arguments, whose
/// dynamic offset the buffers they replace did not have), and of those views in turn, in
/// program order, each with the type its new source gives it.
void retypeViews(Block &block, ArrayRef<Value> roots) {
  llvm::DenseSet<Value> retyped(roots.begin(), roots.end());
  SmallVector<memref::SubViewOp> views;
  block.walk([&](memref::SubViewOp sv) { views.push_back(sv); });
  for (memref::SubViewOp sv : views) {
    if (!retyped.contains(sv.getSource()))
      continue;
    auto type = cast<MemRefType>(sv.getType());
    MemRefType inferred = memref::SubViewOp::inferRankReducedResultType(
        type.getShape(), cast<MemRefType>(sv.getSource().getType()), sv.getStaticOffsets(),
        sv.getStaticSizes(), sv.getStaticStrides());
    if (inferred == type) {
      retyped.insert(sv.getResult());
      continue;
    }
    OpBuilder b(sv);
    auto view = memref::SubViewOp::create(b, sv.getLoc(), inferred, sv.getSource(),
                                          sv.getMixedOffsets(), sv.getMixedSizes(),
                                          sv.getMixedStrides());
    sv.getResult().replaceAllUsesWith(view.getResult());
    sv->erase();
    retyped.insert(view.getResult());
  }
}

/// Rewrites one tile loop; returns whether it did.
bool rewriteTileLoop(scf::ForOp loop, func::FuncOp fn) {
  if (loop.getNumResults() != 0)
    return false;
  bool contraction = false;
  loop->walk([&](linalg::LinalgOp op) { contraction |= op.getNumLoops() >= 3; });
  if (contraction)
    return false;
  Block &body = *loop.getBody();
  SmallVector<Staging> stagings;
  for (Operation &op : body.without_terminator())
    if (auto copy = dyn_cast<scf::ForOp>(op))
      if (std::optional<Staging> s = matchStaging(copy, fn))
        stagings.push_back(*s);
  if (stagings.empty())
    return false;
  Value rows = stagings.front().rows, r0 = stagings.front().r0;
  int64_t T = cast<MemRefType>(stagings.front().buffer.getType()).getDimSize(0);

  // Each buffer's uses: its staging, its fills, and reads (stage-in) or its one writer
  // (stage-out); nothing outside this loop.
  SmallVector<Staging> chosen;
  llvm::DenseSet<Value> seen;
  for (Staging &s : stagings) {
    if (s.rows != rows || s.r0 != r0 ||
        cast<MemRefType>(s.buffer.getType()).getDimSize(0) != T || !seen.insert(s.buffer).second)
      return false;
    usesOf(s.buffer, s.uses);
    bool ok = true;
    for (auto [user, value] : s.uses) {
      if (!loop->isProperAncestor(user) || user->getParentOp() == s.loop) {
        ok &= loop->isProperAncestor(user);
        continue;
      }
      Operation *top = topLevel(user, body);
      if (s.in) {
        // Zeros, then the rows, then only reads: the full tile reads the rows in their place.
        if (isFillOf(top, s.buffer)) {
          ok &= top->isBeforeInBlock(s.loop);
          if (!llvm::is_contained(s.fills, top))
            s.fills.push_back(top);
        } else {
          ok &= onlyReads(user, value) && s.loop->isBeforeInBlock(top);
        }
      } else {
        ok &= user == top && value == s.buffer && !s.writer && isPureWriterOf(user, s.buffer) &&
              user->isBeforeInBlock(s.loop);
        s.writer = user;
      }
    }
    // A stage-in without zeros below the rows would leave a short tile's tail to whatever
    // the last full tile left there, which is no longer the buffer.
    if (ok && (s.in ? !s.fills.empty() : s.writer != nullptr))
      chosen.push_back(s);
  }

  // A stage-out written in place writes its argument at its writer, no longer at its copy:
  // nothing between the two may touch its memory (a staging copy of it or of an argument
  // that may be the same memory, another copy-out). Dropping one only moves writes back.
  llvm::erase_if(chosen, [&](Staging &s) {
    if (s.in)
      return false;
    for (Operation *op = s.writer->getNextNode(); op != s.loop.getOperation();
         op = op->getNextNode())
      if (spectra::mayTouch(op, s.arg, /*reads=*/true))
        return true;
    return false;
  });

  // Arguments read in place are read before their memory is written (through them or an
  // argument that may be their buffer), but for an in-place writer's own
  // element-for-element reads.
  auto position = [&](Operation *op) {
    return std::distance(body.begin(), Block::iterator(topLevel(op, body)));
  };
  auto readsTooLate = [&](const Staging &s) {
    Operation *firstWrite = nullptr;
    for (Operation &op : body.without_terminator()) {
      bool writes = spectra::mayTouch(&op, s.arg, /*reads=*/false);
      for (const Staging &o : chosen)
        writes |= !o.in && spectra::mayAlias(o.arg, s.arg) && (&op == o.writer || &op == o.loop);
      if (writes) {
        firstWrite = &op;
        break;
      }
    }
    if (!firstWrite)
      return false;
    for (auto [user, value] : s.uses) {
      if (user->getParentOp() == s.loop || llvm::is_contained(s.fills, topLevel(user, body)) ||
          position(user) < position(firstWrite))
        continue;
      auto generic = dyn_cast<linalg::GenericOp>(user);
      bool writer = llvm::any_of(chosen, [&](const Staging &o) { return o.writer == user; });
      if (user != firstWrite || !generic || !writer || value != s.buffer)
        return true;
      for (OpOperand &in : generic->getOpOperands())
        if (in.get() == s.buffer && !generic.getMatchingIndexingMap(&in).isIdentity())
          return true;
    }
    return false;
  };
  llvm::DenseSet<Value> late;
  for (const Staging &s : chosen)
    if (s.in && readsTooLate(s))
      late.insert(s.buffer);
  llvm::erase_if(chosen, [&](const Staging &s) { return late.contains(s.buffer); });
  if (chosen.empty())
    return false;

  // The body after rows and r0 are known runs under scf.if rows == T: the full tile on
  // views of the arguments, the short one as it was.
  int64_t start = 0;
  for (Value v : {rows, r0})
    if (Operation *def = v.getDefiningOp(); def && def->getBlock() == &body)
      start = std::max<int64_t>(start, position(def) + 1);
  for (const Staging &s : chosen) {
    for (auto [user, value] : s.uses)
      if (position(user) < start)
        return false;
  }
  Block::iterator from = std::next(body.begin(), start);
  OpBuilder b(&body, from);
  Location loc = loop.getLoc();
  Value full = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, rows,
                                     arith::ConstantIndexOp::create(b, loc, T));
  auto branch = scf::IfOp::create(b, loc, TypeRange{}, full, /*withElseRegion=*/true);
  Block &staged = branch.getElseRegion().front();
  staged.getOperations().splice(staged.getTerminator()->getIterator(), body.getOperations(),
                                std::next(Block::iterator(branch)),
                                body.getTerminator()->getIterator());

  llvm::DenseSet<Operation *> dropped;
  IRMapping mapping;
  SmallVector<Value> roots;
  b.setInsertionPointToStart(&branch.getThenRegion().front());
  for (Staging &s : chosen) {
    dropped.insert(s.loop);
    dropped.insert(s.fills.begin(), s.fills.end());
    auto type = cast<MemRefType>(s.buffer.getType());
    SmallVector<OpFoldResult> offsets{r0}, sizes{b.getIndexAttr(T)}, strides{b.getIndexAttr(1)};
    if (type.getRank() == 2) {
      offsets.push_back(b.getIndexAttr(0));
      sizes.push_back(b.getIndexAttr(type.getDimSize(1)));
      strides.push_back(b.getIndexAttr(1));
    }
    Value view = memref::SubViewOp::create(b, loc, s.arg, offsets, sizes, strides);
    mapping.map(s.buffer, view);
    roots.push_back(view);
  }
  for (Operation &op : staged.without_terminator())
    if (!dropped.contains(&op))
      b.clone(op, mapping);
  retypeViews(branch.getThenRegion().front(), roots);
  return true;
}

struct FullTilesInPlacePass
    : spectra::impl::SpectraFullTilesInPlaceBase<FullTilesInPlacePass> {
  void runOnOperation() override {
    func::FuncOp fn = getOperation();
    SmallVector<scf::ForOp> loops;
    fn.walk([&](scf::ForOp loop) {
      if (loop->hasAttr(spectra::kTileLoopAttr))
        loops.push_back(loop);
    });
    for (scf::ForOp loop : loops)
      rewriteTileLoop(loop, fn);
  }
};

} // namespace
