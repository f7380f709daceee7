//===- StripTiles.cpp - a chain of tile ops one feature strip at a time ---===//
//
// An optional cache step of the CPU schedule (Passes.td, spectra-strip-tiles;
// spectra-cpu-pipeline's strip-features, off by default: measured neutral on a
// Zen 3 core, docs/kernels-at-the-limit.md). The tile
// kernels are written whole-tile: kv computes the logits of a 32-row tile for
// all m features, then their exponentials, then the summary's update, each a
// [32 x m] or [m x d] buffer. At m = 128 those are 16 KiB each, and with the
// weights the chain's working set is three times a 32 KiB L1. Every op of that
// chain is parallel along the features (the key stabiliser is a per-feature
// maximum), so it can run strip by strip: the logits, features and summary of
// 16 features, then the next 16, each strip's tiles a few KiB.
//
// Legality, checked per run of consecutive ops (only pure ops between):
//  - each op is a linalg.fill or linalg.generic on buffers whose loops include
//    exactly one parallel loop of extent E, with projected-permutation maps, and
//    a body that neither reads its indices (linalg.index) nor touches memory;
//  - each buffer the run touches is a function argument or an allocation (no
//    view whose base another operand may share), and is indexed along that loop
//    by the same axis in every op of the run, or by none in every op and then
//    never written by the run;
//  - a function argument the run writes may be the same memory as another
//    argument (spectra::mayAlias: an in-place call's pair, as moments_backward's
//    dx and dxin), so every such argument is indexed by the written one's axis.
// Strip j of every op then reads strip j of the buffers the run writes and
// whole buffers it does not write, so running the ops strip after strip gives
// the same values as running each op whole.
//
//===----------------------------------------------------------------------===//

#include "codegen/Epilogue.h"
#include "codegen/Passes.h"

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRASTRIPTILES
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;

namespace {

/// No axis along the strip loop: the buffer is read whole.
constexpr int64_t kWhole = -1;

struct Run {
  SmallVector<linalg::LinalgOp> ops;
  /// Each buffer's axis along the strip (kWhole: read whole), in first-use order.
  llvm::MapVector<Value, int64_t> axes;
  llvm::DenseSet<Value> written;
};

bool isStripOp(Operation *op) { return isa<linalg::FillOp, linalg::GenericOp>(op); }

/// The op's one parallel loop of extent `extent`, if it has exactly one and its maps allow it.
std::optional<unsigned> stripDim(linalg::LinalgOp op, int64_t extent) {
  if (!op.hasPureBufferSemantics() || op.hasIndexSemantics())
    return std::nullopt;
  // A body that loads from a buffer it captures would see the strip's subview's indices.
  for (Block &body : op->getRegions().front())
    for (Operation &inner : body)
      if (!isMemoryEffectFree(&inner) || llvm::any_of(inner.getOperandTypes(), [](Type t) {
            return isa<BaseMemRefType>(t);
          }))
        return std::nullopt;
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  SmallVector<utils::IteratorType> iterators = op.getIteratorTypesArray();
  std::optional<unsigned> dim;
  for (auto [d, range] : llvm::enumerate(ranges)) {
    if (range != extent || iterators[d] != utils::IteratorType::parallel)
      continue;
    if (dim)
      return std::nullopt; // two candidates: which one is the features' is not known
    dim = d;
  }
  if (!dim)
    return std::nullopt;
  for (OpOperand &operand : op->getOpOperands())
    if (isa<MemRefType>(operand.get().getType()) &&
        !op.getMatchingIndexingMap(&operand).isProjectedPermutation())
      return std::nullopt;
  return dim;
}

/// The buffer's axis indexed by loop `dim` under `map`, or kWhole.
int64_t axisOf(AffineMap map, unsigned dim) {
  for (auto [p, e] : llvm::enumerate(map.getResults()))
    if (auto d = dyn_cast<AffineDimExpr>(e); d && d.getPosition() == dim)
      return p;
  return kWhole;
}

bool isPlainBuffer(Value v) {
  if (auto arg = dyn_cast<BlockArgument>(v))
    return isa<FunctionOpInterface>(arg.getOwner()->getParentOp()) && arg.getOwner()->isEntryBlock();
  return v.getDefiningOp<memref::AllocaOp>() || v.getDefiningOp<memref::AllocOp>();
}

/// Adds `op` to `run` if the run stays legal (the header's rules); false leaves `run` as it was.
bool extend(Run &run, linalg::LinalgOp op, int64_t extent) {
  std::optional<unsigned> dim = stripDim(op, extent);
  if (!dim)
    return false;
  llvm::MapVector<Value, int64_t> axes = run.axes;
  llvm::DenseSet<Value> written = run.written;
  for (OpOperand &operand : op->getOpOperands()) {
    Value buffer = operand.get();
    if (!isa<MemRefType>(buffer.getType()))
      continue;
    if (!isPlainBuffer(buffer))
      return false;
    int64_t axis = axisOf(op.getMatchingIndexingMap(&operand), *dim);
    bool writes = op.isDpsInit(&operand);
    if (writes && axis == kWhole)
      return false;
    auto [it, inserted] = axes.insert({buffer, axis});
    if (!inserted && it->second != axis)
      return false;
    if (writes)
      written.insert(buffer);
  }
  for (auto &[buffer, axis] : axes) {
    if (axis == kWhole && written.contains(buffer))
      return false;
    // An argument written here may be another argument (an in-place call's pair).
    if (isa<BlockArgument>(buffer) && written.contains(buffer))
      for (auto &[other, otherAxis] : axes)
        if (other != buffer && otherAxis != axis && spectra::mayAlias(other, buffer))
          return false;
  }
  run.ops.push_back(op);
  run.axes = std::move(axes);
  run.written = std::move(written);
  return true;
}

/// Whether the run is worth a loop: something carries a reduction (a contraction or a
/// reduction, so a tile is read more than once), and at least one temporary shrinks.
bool worthStripping(const Run &run, const llvm::SetVector<Value> &shrunk) {
  if (run.ops.size() < 2 || shrunk.empty())
    return false;
  return llvm::any_of(run.ops, [](linalg::LinalgOp op) { return op.getNumReductionLoops() > 0; });
}

/// Whether `op` sets every element of `buffer` without reading it: a fill, or a generic
/// with `buffer` as an output only, whose body does not read that output.
bool overwrites(linalg::LinalgOp op, Value buffer) {
  if (isa<linalg::FillOp>(op))
    return op.getDpsInits()[0] == buffer;
  auto generic = dyn_cast<linalg::GenericOp>(op.getOperation());
  if (!generic || llvm::is_contained(generic.getDpsInputs(), buffer))
    return false;
  for (OpOperand &init : generic.getDpsInitsMutable())
    if (init.get() == buffer &&
        (!generic.getMatchingBlockArgument(&init).use_empty() ||
         generic.getNumReductionLoops() != 0))
      return false;
  return llvm::is_contained(generic.getDpsInits(), buffer);
}

/// The allocas only the run uses, each first set whole by the run (so no value crosses
/// from one strip, or one trip of an enclosing loop, to the next): one strip of them is
/// enough.
llvm::SetVector<Value> temporaries(const Run &run) {
  llvm::DenseSet<Operation *> inRun;
  for (linalg::LinalgOp op : run.ops)
    inRun.insert(op);
  auto firstUser = [&](Value buffer) {
    for (linalg::LinalgOp op : run.ops)
      if (llvm::is_contained(op->getOperands(), buffer))
        return op;
    return linalg::LinalgOp();
  };
  llvm::SetVector<Value> out;
  for (auto &[buffer, axis] : run.axes)
    if (axis != kWhole && buffer.getDefiningOp<memref::AllocaOp>() &&
        cast<MemRefType>(buffer.getType()).hasStaticShape() &&
        llvm::all_of(buffer.getUsers(), [&](Operation *u) { return inRun.contains(u); }) &&
        overwrites(firstUser(buffer), buffer))
      out.insert(buffer);
  return out;
}

scf::ForOp rewrite(Run &run, int64_t extent, int64_t strip, const llvm::SetVector<Value> &shrunk) {
  Operation *first = run.ops.front();
  Operation *last = run.ops.back();
  // Pure ops between the run's ops go before the loop (the bodies may capture them).
  llvm::DenseSet<Operation *> inRun;
  for (linalg::LinalgOp op : run.ops)
    inRun.insert(op);
  for (Operation *op = first->getNextNode(); op != last;) {
    Operation *next = op->getNextNode();
    if (!inRun.contains(op))
      op->moveBefore(first);
    op = next;
  }
  Location loc = first->getLoc();
  OpBuilder b(first);
  // The shrunk temporaries: the same alloca with `strip` along the axis.
  IRMapping strips;
  for (Value buffer : shrunk) {
    auto alloca = buffer.getDefiningOp<memref::AllocaOp>();
    auto type = cast<MemRefType>(buffer.getType());
    SmallVector<int64_t> shape(type.getShape());
    shape[run.axes.lookup(buffer)] = strip;
    OpBuilder at(alloca);
    Value small = memref::AllocaOp::create(
        at, alloca.getLoc(),
        MemRefType::get(shape, type.getElementType(), MemRefLayoutAttrInterface(),
                        type.getMemorySpace()),
        alloca.getAlignmentAttr());
    strips.map(buffer, small);
  }
  Value lb = arith::ConstantIndexOp::create(b, loc, 0);
  Value ub = arith::ConstantIndexOp::create(b, loc, extent);
  Value step = arith::ConstantIndexOp::create(b, loc, strip);
  auto loop = scf::ForOp::create(b, loc, lb, ub, step);
  b.setInsertionPointToStart(loop.getBody());
  Value j = loop.getInductionVar();
  IRMapping mapping;
  for (auto &[buffer, axis] : run.axes) {
    if (axis == kWhole)
      continue;
    if (Value small = strips.lookupOrNull(buffer)) {
      mapping.map(buffer, small);
      continue;
    }
    auto type = cast<MemRefType>(buffer.getType());
    SmallVector<OpFoldResult> offsets(type.getRank(), b.getIndexAttr(0));
    SmallVector<OpFoldResult> sizes, strides(type.getRank(), b.getIndexAttr(1));
    for (int64_t r = 0; r < type.getRank(); ++r)
      sizes.push_back(type.isDynamicDim(r)
                          ? OpFoldResult(memref::DimOp::create(b, loc, buffer, r).getResult())
                          : OpFoldResult(b.getIndexAttr(type.getDimSize(r))));
    offsets[axis] = j;
    sizes[axis] = b.getIndexAttr(strip);
    mapping.map(buffer, memref::SubViewOp::create(b, loc, buffer, offsets, sizes, strides));
  }
  for (linalg::LinalgOp op : run.ops) {
    b.clone(*op, mapping);
    op->erase();
  }
  for (Value buffer : shrunk)
    buffer.getDefiningOp()->erase();
  return loop;
}

/// The extents worth a strip loop: loop ranges that are multiples of `strip` above it,
/// largest first.
SmallVector<int64_t> extents(func::FuncOp fn, int64_t strip) {
  llvm::SetVector<int64_t> found;
  fn.walk([&](linalg::LinalgOp op) {
    for (int64_t r : op.getStaticLoopRanges())
      if (!ShapedType::isDynamic(r) && r > strip && r % strip == 0)
        found.insert(r);
  });
  SmallVector<int64_t> out(found.begin(), found.end());
  llvm::sort(out, std::greater<>());
  return out;
}

struct StripTilesPass : spectra::impl::SpectraStripTilesBase<StripTilesPass> {
  using Base::Base;
  llvm::DenseSet<Operation *> made;

  void runOnOperation() override {
    if (strip < 1) {
      getOperation().emitError("spectra-strip-tiles: strip must be positive");
      return signalPassFailure();
    }
    for (int64_t extent : extents(getOperation(), strip)) {
      SmallVector<Block *> blocks;
      // Not inside a strip loop already made (its ops are one strip wide).
      getOperation().walk([&](Block *block) {
        for (Operation *p = block->getParentOp(); p; p = p->getParentOp())
          if (made.contains(p))
            return;
        blocks.push_back(block);
      });
      for (Block *block : blocks)
        stripBlock(*block, extent);
    }
  }

  void stripBlock(Block &block, int64_t extent) {
    SmallVector<Run> runs;
    Run current;
    auto close = [&] {
      if (!current.ops.empty())
        runs.push_back(std::move(current));
      current = Run();
    };
    for (Operation &op : block) {
      if (isStripOp(&op)) {
        if (extend(current, cast<linalg::LinalgOp>(op), extent))
          continue;
        close();
        extend(current, cast<linalg::LinalgOp>(op), extent);
        continue;
      }
      if (!isMemoryEffectFree(&op) || op.getNumRegions() != 0)
        close();
    }
    close();
    for (Run &run : runs) {
      llvm::SetVector<Value> shrunk = temporaries(run);
      if (worthStripping(run, shrunk))
        made.insert(rewrite(run, extent, strip, shrunk));
    }
  }
};

} // namespace
