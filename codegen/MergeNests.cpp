//===- MergeNests.cpp - independent thread nests as one nest, one barrier -===//

#include "codegen/MergeNests.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/Passes.h"
#include "codegen/RowLoopNests.h"
#include "codegen/WarpChains.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

using namespace mlir;

namespace {

/// The buffers a nest reads and writes, by root; `opaque` where an effect's buffer is not
/// known (the nest then stays alone).
struct Footprint {
  llvm::SmallPtrSet<Value, 8> reads, writes;
  bool opaque = false;

  bool conflictsWith(const Footprint &o) const {
    auto meets = [](const llvm::SmallPtrSet<Value, 8> &a, const llvm::SmallPtrSet<Value, 8> &b) {
      return llvm::any_of(a, [&](Value v) { return b.contains(v); });
    };
    return meets(writes, o.reads) || meets(writes, o.writes) || meets(reads, o.writes);
  }
  void add(const Footprint &o) {
    reads.insert(o.reads.begin(), o.reads.end());
    writes.insert(o.writes.begin(), o.writes.end());
  }
};

/// The buffer under `v`'s views: an alloca or a kernel argument; none for anything else.
Value rootOf(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (isa<memref::AllocaOp, memref::AllocOp>(def))
      return v;
    auto view = dyn_cast<ViewLikeOpInterface>(def);
    if (!view)
      return Value();
    v = view.getViewSource();
  }
  auto arg = cast<BlockArgument>(v);
  Operation *owner = arg.getOwner()->getParentOp();
  bool kernelArgument = owner && isa<FunctionOpInterface>(owner) &&
                        arg.getOwner()->isEntryBlock();
  return kernelArgument ? v : Value();
}

Footprint footprintOf(scf::ForallOp nest) {
  Footprint f;
  f.opaque = !spectra::forEachMemrefEffect(
      nest.getRegion(), [&](Operation *, const MemoryEffects::EffectInstance &e) {
        Value root = rootOf(e.getValue());
        if (!root)
          return false;
        if (Operation *made = root.getDefiningOp(); made && nest->isProperAncestor(made))
          return true;  // a buffer of the thread's own, made in the nest
        (isa<MemoryEffects::Write>(e.getEffect()) ? f.writes : f.reads).insert(root);
        return true;
      });
  return f;
}

/// A thread nest (threadNestSize) of at most `threads` threads, not a warp chain: its count,
/// or none.
std::optional<int64_t> threadCount(Operation *op, int64_t threads, StringRef nestAttr) {
  std::optional<int64_t> n = spectra::threadNestSize(op, nestAttr);
  if (!n || *n < 1 || *n > threads || spectra::isWarpChain(cast<scf::ForallOp>(op)))
    return std::nullopt;
  return n;
}

/// One nest, at the last member's place, running each member's body in its threads.
void merge(ArrayRef<scf::ForallOp> group, ArrayRef<int64_t> counts, StringRef nestAttr) {
  scf::ForallOp last = group.back();
  OpBuilder b(last);
  Location loc = last.getLoc();
  int64_t n = *llvm::max_element(counts);
  auto nest = spectra::createThreadNest(b, loc, n, nestAttr);
  b.setInsertionPointToStart(nest.getBody());
  Value t = nest.getInductionVar(0);
  for (auto [i, count] : llvm::enumerate(counts)) {
    scf::ForallOp member = group[i];
    OpBuilder::InsertionGuard guard(b);
    if (count < n) {
      Value live = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, t,
                                         arith::ConstantIndexOp::create(b, loc, count));
      auto inside = scf::IfOp::create(b, loc, live, /*withElseRegion=*/false);
      b.setInsertionPoint(inside.thenBlock()->getTerminator());
    }
    IRMapping map;
    map.map(member.getInductionVar(0), t);
    for (Operation &op : member.getBody()->without_terminator())
      b.clone(op, map);
  }
  for (scf::ForallOp member : group)
    member->erase();
}

} // namespace

int64_t mlir::spectra::mergeIndependentNests(Block &block, int64_t threads, StringRef nestAttr) {
  int64_t removed = 0;
  SmallVector<scf::ForallOp> group;
  SmallVector<int64_t> counts;
  Footprint phase;
  auto flush = [&] {
    if (group.size() > 1) {
      merge(group, counts, nestAttr);
      removed += group.size() - 1;
    }
    group.clear();
    counts.clear();
    phase = Footprint();
  };
  for (Operation &op : llvm::make_early_inc_range(block)) {
    if (std::optional<int64_t> n = threadCount(&op, threads, nestAttr)) {
      auto nest = cast<scf::ForallOp>(op);
      Footprint f = footprintOf(nest);
      if (f.opaque) {
        flush();
        continue;
      }
      if (!group.empty() && f.conflictsWith(phase))
        flush();
      group.push_back(nest);
      counts.push_back(*n);
      phase.add(f);
      continue;
    }
    // Index arithmetic and views between nests run in every thread alike.
    if (op.getNumRegions() == 0 && isMemoryEffectFree(&op))
      continue;
    flush();
    // Inside a nest the ops are one thread's; elsewhere (loops, branches) blocks of nests.
    if (isa<scf::ForallOp>(op) && op.hasAttr(nestAttr))
      continue;
    for (Region &region : op.getRegions())
      for (Block &inner : region)
        removed += mergeIndependentNests(inner, threads, nestAttr);
  }
  flush();
  return removed;
}

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAMERGENESTS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

namespace {

struct MergeNestsPass : mlir::spectra::impl::SpectraMergeNestsBase<MergeNestsPass> {
  using SpectraMergeNestsBase::SpectraMergeNestsBase;
  void runOnOperation() override {
    for (Region &region : getOperation()->getRegions())
      for (Block &block : region)
        mlir::spectra::mergeIndependentNests(block, threads, mlir::spectra::kThreadNestAttr);
  }
};

} // namespace
