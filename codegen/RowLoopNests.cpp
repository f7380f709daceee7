//===- RowLoopNests.cpp - a tile's row loops as one thread nest -----------===//

#include "codegen/RowLoopNests.h"
#include "codegen/Epilogue.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

using namespace mlir;

std::optional<int64_t> mlir::spectra::constantUpperBound(Value v) {
  if (std::optional<int64_t> c = getConstantIntValue(v))
    return c;
  auto min = v.getDefiningOp<arith::MinSIOp>();
  if (!min)
    return std::nullopt;
  std::optional<int64_t> l = getConstantIntValue(min.getLhs()),
                         r = getConstantIntValue(min.getRhs());
  if (l && r)
    return std::min(*l, *r);
  return l ? l : r;
}

bool mlir::spectra::isRowsPastTheEnd(scf::ForOp loop) {
  std::optional<int64_t> last = getConstantIntValue(loop.getUpperBound());
  return last && !getConstantIntValue(loop.getLowerBound()) &&
         constantUpperBound(loop.getLowerBound()) == last;
}

std::optional<int64_t> mlir::spectra::threadNestSize(Operation *op, StringRef nestAttr) {
  auto nest = dyn_cast<scf::ForallOp>(op);
  if (!nest || !nest->hasAttr(nestAttr) || nest.getRank() != 1 || !nest.getOutputs().empty())
    return std::nullopt;
  std::optional<ArrayAttr> mapping = nest.getMapping();
  if (!mapping || mapping->size() != 1 || !isa<gpu::GPUThreadMappingAttr>((*mapping)[0]))
    return std::nullopt;
  return getConstantIntValue(nest.getMixedUpperBound()[0]);
}

bool mlir::spectra::forEachMemrefEffect(
    Region &region, function_ref<bool(Operation *, const MemoryEffects::EffectInstance &)> visit) {
  WalkResult r = region.walk([&](Operation *op) {
    auto effects = dyn_cast<MemoryEffectOpInterface>(op);
    if (!effects) {
      // Loops, branches and nests: their ops are visited on their own.
      if (op->getNumRegions() != 0 || op->hasTrait<OpTrait::IsTerminator>() ||
          isMemoryEffectFree(op))
        return WalkResult::advance();
      return WalkResult::interrupt();
    }
    SmallVector<MemoryEffects::EffectInstance> list;
    effects.getEffects(list);
    for (const MemoryEffects::EffectInstance &e : list) {
      if (isa<MemoryEffects::Allocate, MemoryEffects::Free>(e.getEffect()))
        continue;
      Value v = e.getValue();
      if (!v || !isa<MemRefType>(v.getType()) || !visit(op, e))
        return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return !r.wasInterrupted();
}

namespace {

/// Whether the index `v` is the row of iteration `iv` of `loop`: iv, or iv plus a value
/// defined outside the loop (the tile's first row), so that distinct iterations give
/// distinct rows.
bool isRowIndex(Value v, scf::ForOp loop) {
  Value iv = loop.getInductionVar();
  if (v == iv)
    return true;
  auto add = v.getDefiningOp<arith::AddIOp>();
  if (!add)
    return false;
  Value l = add.getLhs(), r = add.getRhs();
  return (isRowIndex(l, loop) && loop.isDefinedOutsideOfLoop(r)) ||
         (isRowIndex(r, loop) && loop.isDefinedOutsideOfLoop(l));
}

/// A memory access of one iteration: the buffer under its views, and the view whose
/// leading dimension the access stays in one row of, the iteration's (none where it does
/// not): the source of a subview at offset row, size 1 there, or the memref a scalar load
/// or store indexes by row, with only views defined outside the loop above it (so distinct
/// iterations reach distinct rows of the buffer).
struct Access {
  Value root, rowsOf;
};

Access trace(Value memref, scf::ForOp loop, Value rowsOf = Value()) {
  Access a{memref, rowsOf};
  while (Operation *def = a.root.getDefiningOp()) {
    Value source;
    if (auto view = dyn_cast<memref::SubViewOp>(def))
      source = view.getSource();
    else if (auto viewLike = dyn_cast<ViewLikeOpInterface>(def))
      source = viewLike.getViewSource();
    else
      break;
    if (!loop.isDefinedOutsideOfLoop(a.root)) {
      // A view made in the loop: one row of its source, or a view that may move with the
      // iteration (a row below it no longer tells the buffer's row apart).
      auto view = dyn_cast<memref::SubViewOp>(def);
      SmallVector<OpFoldResult> offsets, sizes;
      if (view) {
        offsets = view.getMixedOffsets();
        sizes = view.getMixedSizes();
      }
      Value offset = offsets.empty() ? Value() : llvm::dyn_cast_if_present<Value>(offsets[0]);
      bool row = offset && isRowIndex(offset, loop) && isConstantIntValue(sizes[0], 1);
      a.rowsOf = row ? source : Value();
    }
    a.root = source;
  }
  return a;
}

/// Whether the iterations of `loop` are independent (RowLoopNests.h): every write goes to
/// the iteration's row of a buffer defined outside the loop, every access to a buffer the
/// loop writes stays in that row of the same view, and no effect is unknown. Distinct
/// buffers (allocas, the kernel's arguments: distinct tensors) do not overlap, but for
/// arguments marked as possibly one buffer (spectra::mayAlias): a loop that writes one of
/// them and touches the other is not independent.
/// `topLevelPure`: the ops directly in the loop's body, but `nest`, must be free of memory
/// effects.
bool independentRows(scf::ForOp loop, Operation *nest, bool topLevelPure) {
  SmallVector<Access> accesses;
  llvm::SmallPtrSet<Value, 4> written;
  for (Operation &top : loop.getBody()->without_terminator())
    if (topLevelPure && &top != nest && !isMemoryEffectFree(&top))
      return false;
  auto visit = [&](Operation *op, const MemoryEffects::EffectInstance &e) {
    Value v = e.getValue();
    // A scalar load or store indexed by the row in the leading dimension.
    Value rowsOf;
    auto indexed = [&](ValueRange indices) {
      if (!indices.empty() && isRowIndex(indices[0], loop))
        rowsOf = v;
    };
    if (auto store = dyn_cast<memref::StoreOp>(op))
      indexed(store.getIndices());
    if (auto load = dyn_cast<memref::LoadOp>(op))
      indexed(load.getIndices());
    Access a = trace(v, loop, rowsOf);
    if (isa<MemoryEffects::Write>(e.getEffect())) {
      if (!a.rowsOf || !loop.isDefinedOutsideOfLoop(a.root))
        return false;
      written.insert(a.root);
    }
    accesses.push_back(a);
    return true;
  };
  if (!spectra::forEachMemrefEffect(loop.getRegion(), visit) || written.empty())
    return false;
  for (const Access &a : accesses)
    for (Value w : written)
      if (a.root && a.root != w && spectra::mayAlias(a.root, w))
        return false;
  // Each buffer the loop writes: every access to it in one row of one view.
  llvm::DenseMap<Value, Value> rowsOfBuffer;
  for (const Access &a : accesses) {
    if (!written.contains(a.root))
      continue;
    auto it = rowsOfBuffer.try_emplace(a.root, a.rowsOf).first;
    if (!a.rowsOf || it->second != a.rowsOf)
      return false;
  }
  return true;
}

/// The one nest in `loop`'s body, a thread nest (threadNestSize); none where there is no
/// nest, another kind, or more than one.
scf::ForallOp soleThreadNest(scf::ForOp loop, StringRef nestAttr) {
  scf::ForallOp unit;
  for (Operation &inner : loop.getBody()->without_terminator()) {
    if (!isa<scf::ForallOp>(inner))
      continue;
    if (unit || !spectra::threadNestSize(&inner, nestAttr))
      return scf::ForallOp();
    unit = cast<scf::ForallOp>(inner);
  }
  return unit;
}

/// One rewrite: `replaced` (the loop, or the one-thread nest around it) becomes a nest over
/// rows [first, last) of `loop` x `width` elements: for each (r, c), the loop body's ops at
/// r, the ops of `unit` (the thread nest in the loop body, or none) at element c.
void rewrite(Operation *replaced, scf::ForOp loop, scf::ForallOp unit, int64_t width,
             int64_t first, int64_t last, int64_t threads, StringRef nestAttr) {
  OpBuilder b(replaced);
  Location loc = loop.getLoc();
  auto idx = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };
  int64_t total = (last - first) * width;
  if (total <= 0) {
    replaced->erase();
    return;
  }
  int64_t n = std::min(total, threads);
  auto nest = spectra::createThreadNest(b, loc, n, nestAttr);
  b.setInsertionPointToStart(nest.getBody());
  // Thread t takes element t mod width of rows t / width, then every (n / width)-th row on,
  // up to the loop's upper bound (n a multiple of the width; or the width past the threads:
  // then a row's elements in turn, and a guard).
  std::optional<int64_t> lower = getConstantIntValue(loop.getLowerBound()),
                         upper = getConstantIntValue(loop.getUpperBound());
  bool lowerExact = lower && *lower == first, upperExact = upper && *upper == last;
  Value t = nest.getInductionVar(0);
  Value row, element;
  if (n % width == 0) {
    row = width == 1 ? t : arith::DivUIOp::create(b, loc, t, idx(width)).getResult();
    element = width == 1 ? idx(0) : arith::RemUIOp::create(b, loc, t, idx(width)).getResult();
    if (total > n || !upperExact) {
      Value end = idx(last - first);
      if (!upperExact) {
        end = first ? arith::SubIOp::create(b, loc, loop.getUpperBound(), idx(first)).getResult()
                    : loop.getUpperBound();
        upperExact = true;  // the loop's bound now
      }
      auto stride = scf::ForOp::create(b, loc, row, end, idx(n / width));
      b.setInsertionPointToStart(stride.getBody());
      row = stride.getInductionVar();
    }
  } else {
    Value linear = t;
    if (total > n) {
      auto stride = scf::ForOp::create(b, loc, linear, idx(total), idx(n));
      b.setInsertionPointToStart(stride.getBody());
      linear = stride.getInductionVar();
    }
    row = arith::DivUIOp::create(b, loc, linear, idx(width));
    element = arith::RemUIOp::create(b, loc, linear, idx(width));
  }
  if (first != 0)
    row = arith::AddIOp::create(b, loc, row, idx(first));
  // Rows outside the loop's [lower, upper) the loops above did not exclude: skipped.
  Value keep;
  auto also = [&](Value c) {
    keep = keep ? arith::AndIOp::create(b, loc, keep, c).getResult() : c;
  };
  if (!lowerExact)
    also(arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, row, loop.getLowerBound()));
  if (!upperExact)
    also(arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, row, loop.getUpperBound()));
  if (keep) {
    auto guard = scf::IfOp::create(b, loc, keep, /*withElseRegion=*/false);
    b.setInsertionPoint(guard.thenBlock()->getTerminator());
  }
  IRMapping map;
  map.map(loop.getInductionVar(), row);
  for (Operation &op : loop.getBody()->without_terminator()) {
    if (&op != unit.getOperation()) {
      b.clone(op, map);
      continue;
    }
    map.map(unit.getInductionVar(0), element);
    for (Operation &inner : unit.getBody()->without_terminator())
      b.clone(inner, map);
  }
  replaced->erase();
}

/// Where an access of a thread nest reaches along its buffer's last dimension (its
/// column): the offsets of the views under it summed, the one made in the nest (`inNest`)
/// apart from the constant rest. None where a view is not a unit-stride subview keeping the
/// last dimension, where another offset is not constant, or where the access spans more
/// than one column.
struct Column {
  Value root, inNest;
  int64_t outside = 0;
};

std::optional<Column> columnOf(Value memref, std::optional<Value> index, scf::ForallOp nest) {
  Column c;
  auto offset = [&](OpFoldResult o) {
    if (std::optional<int64_t> k = getConstantIntValue(o)) {
      c.outside += *k;
      return true;
    }
    Value v = cast<Value>(o);
    if (c.inNest || !nest.getBody()->getParentOp()->isAncestor(v.getParentBlock()->getParentOp()))
      return false;
    c.inNest = v;
    return true;
  };
  auto type = cast<MemRefType>(memref.getType());
  if (type.getRank() == 0)
    return std::nullopt;
  if (index) {
    if (!offset(*index))
      return std::nullopt;
  } else if (type.getShape().back() != 1) {
    return std::nullopt;
  }
  Value v = memref;
  while (Operation *def = v.getDefiningOp()) {
    if (isa<memref::AllocaOp, memref::AllocOp>(def))
      break;
    auto view = dyn_cast<memref::SubViewOp>(def);
    if (!view)
      return std::nullopt;
    unsigned last = view.getSourceType().getRank() - 1;
    if (!view.hasUnitStride() || view.getDroppedDims().test(last) ||
        !offset(view.getMixedOffsets()[last]))
      return std::nullopt;
    v = view.getSource();
  }
  c.root = v;
  return c;
}

/// Whether `v` tells the threads of `nest` apart: its induction variable (divided by 1, as
/// the mapping leaves it before canonicalisation), or that modulo a constant no smaller than
/// its count.
bool isThreadColumn(Value v, scf::ForallOp nest, int64_t count) {
  Value t = nest.getInductionVar(0);
  auto thread = [&](Value x) {
    if (auto div = x.getDefiningOp<arith::DivUIOp>(); div && isConstantIntValue(div.getRhs(), 1))
      x = div.getLhs();
    return x == t;
  };
  if (thread(v))
    return true;
  auto rem = v.getDefiningOp<arith::RemUIOp>();
  std::optional<int64_t> k = rem ? getConstantIntValue(rem.getRhs()) : std::nullopt;
  return rem && thread(rem.getLhs()) && k && *k >= count;
}

} // namespace

std::optional<int64_t> mlir::spectra::threadColumn(Operation *op, Value memref,
                                                   scf::ForallOp nest, int64_t count) {
  std::optional<Value> index;
  if (auto load = dyn_cast<memref::LoadOp>(op))
    index = load.getIndices().empty() ? Value() : load.getIndices().back();
  if (auto store = dyn_cast<memref::StoreOp>(op))
    index = store.getIndices().empty() ? Value() : store.getIndices().back();
  std::optional<Column> c = columnOf(memref, index, nest);
  if (!c || !c->inNest || !isThreadColumn(c->inNest, nest, count))
    return std::nullopt;
  return c->outside;
}

namespace {

/// Whether each thread of `nest`, the one thread nest in `loop`'s body, keeps to a column
/// of its own in every buffer the loop writes (RowLoopNests.h): then the loop's rows may
/// run inside each thread, in order.
bool columnsPerThread(scf::ForOp loop, scf::ForallOp nest, int64_t count) {
  for (Operation &top : loop.getBody()->without_terminator())
    if (&top != nest.getOperation() && !isMemoryEffectFree(&top))
      return false;
  struct Access {
    Value root;
    std::optional<int64_t> column;
    bool write;
  };
  SmallVector<Access> accesses;
  auto visit = [&](Operation *op, const MemoryEffects::EffectInstance &e) {
    Value v = e.getValue();
    Value root = v;
    while (auto view = root.getDefiningOp<ViewLikeOpInterface>())
      root = view.getViewSource();
    if (Operation *made = root.getDefiningOp(); made && nest->isProperAncestor(made))
      return true;  // a buffer of the thread's own, made in the nest
    accesses.push_back(Access{root, spectra::threadColumn(op, v, nest, count),
                              isa<MemoryEffects::Write>(e.getEffect())});
    return true;
  };
  if (!spectra::forEachMemrefEffect(nest.getRegion(), visit))
    return false;
  llvm::SmallPtrSet<Value, 4> written;
  for (const Access &a : accesses)
    if (a.write) {
      if (!loop.isDefinedOutsideOfLoop(a.root))
        return false;
      written.insert(a.root);
    }
  if (written.empty())
    return false;
  // Every access to a written buffer: the thread's own column of it, the same each time.
  llvm::DenseMap<Value, int64_t> columns;
  for (const Access &a : accesses) {
    if (!written.contains(a.root))
      continue;
    if (!a.column)
      return false;
    if (columns.try_emplace(a.root, *a.column).first->second != *a.column)
      return false;
  }
  return true;
}

} // namespace

int64_t mlir::spectra::mergeRowLoopsIntoNests(Block &body, int64_t threads, StringRef nestAttr) {
  struct Candidate {
    Operation *replaced;
    scf::ForOp loop;
    scf::ForallOp unit;
    int64_t width, first, last;
  };
  SmallVector<Candidate> found;
  auto rows = [](scf::ForOp loop) -> std::optional<std::pair<int64_t, int64_t>> {
    std::optional<int64_t> step = getConstantIntValue(loop.getStep());
    std::optional<int64_t> last = spectra::constantUpperBound(loop.getUpperBound());
    if (!step || *step != 1 || !last || loop.getNumResults() != 0)
      return std::nullopt;
    // The rows past the end of a partial tile: none in a full tile, where one nest would
    // still take its barrier.
    if (spectra::isRowsPastTheEnd(loop))
      return std::nullopt;
    // A lower bound not known: rows from 0 (a row below 0 would index its buffer outside it:
    // every write is at row iv of a buffer).
    int64_t first = getConstantIntValue(loop.getLowerBound()).value_or(0);
    return std::pair(first, *last);
  };
  body.walk([&](Operation *op) {
    if (auto loop = dyn_cast<scf::ForOp>(op)) {
      // A loop whose body is one thread nest (and ops free of memory effects).
      scf::ForallOp unit = soleThreadNest(loop, nestAttr);
      std::optional<std::pair<int64_t, int64_t>> range = rows(loop);
      if (!unit || !range || !independentRows(loop, unit, /*topLevelPure=*/true))
        return;
      int64_t width = *spectra::threadNestSize(unit, nestAttr);
      if (width > threads)
        return;
      found.push_back({loop, loop, unit, width, range->first, range->second});
      return;
    }
    // A one-thread nest whose body is one such loop of scalar work.
    std::optional<int64_t> size = spectra::threadNestSize(op, nestAttr);
    if (!size || *size != 1)
      return;
    auto nest = cast<scf::ForallOp>(op);
    Block *inner = nest.getBody();
    if (inner->getOperations().size() != 2)
      return;
    auto loop = dyn_cast<scf::ForOp>(inner->front());
    if (!loop)
      return;
    bool holdsNest = false;
    loop.getBody()->walk([&](scf::ForallOp) { holdsNest = true; });
    std::optional<std::pair<int64_t, int64_t>> range = rows(loop);
    if (holdsNest || !range || !independentRows(loop, nullptr, /*topLevelPure=*/false))
      return;
    found.push_back({nest, loop, scf::ForallOp(), 1, range->first, range->second});
  });
  for (const Candidate &c : found)
    rewrite(c.replaced, c.loop, c.unit, c.width, c.first, c.last, threads, nestAttr);
  return found.size();
}

int64_t mlir::spectra::runRowsInThreads(Block &body, int64_t threads, StringRef nestAttr) {
  SmallVector<std::pair<scf::ForOp, scf::ForallOp>> found;
  body.walk([&](scf::ForOp loop) {
    // The rows past the end of a partial tile: none in a full tile, where one nest would
    // still take its barrier.
    if (loop.getNumResults() != 0 || spectra::isRowsPastTheEnd(loop))
      return;
    scf::ForallOp unit = soleThreadNest(loop, nestAttr);
    if (!unit)
      return;
    int64_t count = *spectra::threadNestSize(unit, nestAttr);
    if (count > threads || !columnsPerThread(loop, unit, count))
      return;
    found.push_back({loop, unit});
  });
  for (auto [loop, unit] : found) {
    OpBuilder b(loop);
    Location loc = loop.getLoc();
    int64_t count = *spectra::threadNestSize(unit, nestAttr);
    auto nest = spectra::createThreadNest(b, loc, count, nestAttr);
    b.setInsertionPointToStart(nest.getBody());
    auto rows = scf::ForOp::create(b, loc, loop.getLowerBound(), loop.getUpperBound(), loop.getStep());
    b.setInsertionPointToStart(rows.getBody());
    IRMapping map;
    map.map(loop.getInductionVar(), rows.getInductionVar());
    map.map(unit.getInductionVar(0), nest.getInductionVar(0));
    for (Operation &op : loop.getBody()->without_terminator()) {
      if (&op != unit.getOperation()) {
        b.clone(op, map);
        continue;
      }
      for (Operation &inner : unit.getBody()->without_terminator())
        b.clone(inner, map);
    }
    loop->erase();
  }
  return found.size();
}

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAROWLOOPNESTS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

namespace {

struct RowLoopNestsPass : mlir::spectra::impl::SpectraRowLoopNestsBase<RowLoopNestsPass> {
  using SpectraRowLoopNestsBase::SpectraRowLoopNestsBase;
  void runOnOperation() override {
    for (Region &region : getOperation()->getRegions())
      for (Block &block : region)
        mlir::spectra::mergeRowLoopsIntoNests(block, threads, mlir::spectra::kThreadNestAttr);
    if (columns)
      for (Region &region : getOperation()->getRegions())
        for (Block &block : region)
          mlir::spectra::runRowsInThreads(block, threads, mlir::spectra::kThreadNestAttr);
  }
};

} // namespace
