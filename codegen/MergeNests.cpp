//===- MergeNests.cpp - independent thread nests as one nest, one barrier -===//

#include "codegen/MergeNests.h"
#include "codegen/Epilogue.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/Passes.h"
#include "codegen/RowLoopNests.h"
#include "codegen/WarpChains.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

using namespace mlir;
using mlir::spectra::kFirstWarpAttr;
using mlir::spectra::kNoBarrierAttr;

namespace {

/// The buffers a nest reads and writes, by root; `opaque` where an effect's buffer is not
/// known (the nest then ends a run). For a thread nest, the buffers it touches only in each
/// thread's own column (RowLoopNests.h's threadColumn), the same one each time: the column's
/// offset from the thread's index.
struct Footprint {
  llvm::SmallPtrSet<Value, 8> reads, writes;
  llvm::DenseMap<Value, std::optional<int64_t>> columns;
  bool opaque = false;
};

/// How a nest must follow an earlier one: in any phase (they share no buffer one of them
/// writes), in the same phase or a later one (where they share, each thread keeps to the
/// same column of its own in both: a thread reads or writes what it wrote itself, merged in
/// order), or in a later phase.
enum class Follow { Anywhere, SamePhase, Later };

Follow follow(const Footprint &earlier, const Footprint &later) {
  Follow how = Follow::Anywhere;
  auto shared = [&](Value root) {
    auto a = earlier.columns.find(root), b = later.columns.find(root);
    if (a == earlier.columns.end() || b == later.columns.end() || !a->second || !b->second ||
        *a->second != *b->second)
      return false;
    how = Follow::SamePhase;
    return true;
  };
  // A root the later nest touches that may be `root`'s memory: the root itself (ordered
  // unless each thread keeps to its own column in both), or another kernel argument that
  // may be its buffer (spectra::mayAlias: moments_backward's dx and dxin), always ordered.
  auto meets = [&](Value root, const llvm::SmallPtrSet<Value, 8> &set) {
    for (Value other : set)
      if (other == root ? !shared(root) : spectra::mayAlias(other, root))
        return true;
    return false;
  };
  for (Value root : earlier.writes)
    if (meets(root, later.reads) || meets(root, later.writes))
      return Follow::Later;
  for (Value root : earlier.reads)
    if (meets(root, later.writes))
      return Follow::Later;
  return how;
}

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

/// The footprint of `nest`, a thread nest of `threads` threads or (none) a warp nest.
Footprint footprintOf(scf::ForallOp nest, std::optional<int64_t> threads) {
  Footprint f;
  f.opaque = !spectra::forEachMemrefEffect(
      nest.getRegion(), [&](Operation *op, const MemoryEffects::EffectInstance &e) {
        Value root = rootOf(e.getValue());
        if (!root)
          return false;
        if (Operation *made = root.getDefiningOp(); made && nest->isProperAncestor(made))
          return true;  // a buffer of the thread's own, made in the nest
        (isa<MemoryEffects::Write>(e.getEffect()) ? f.writes : f.reads).insert(root);
        std::optional<int64_t> column;
        if (threads)
          column = spectra::threadColumn(op, e.getValue(), nest, *threads);
        auto [it, first] = f.columns.try_emplace(root, column);
        if (!first && it->second != column)
          it->second = std::nullopt;
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

/// A nest over warps (tensor-core tiles, marked `nestAttr`), not a warp chain: not merged,
/// but scheduled as the thread nests are.
bool isMovableWarpNest(Operation *op, StringRef nestAttr) {
  auto nest = dyn_cast<scf::ForallOp>(op);
  if (!nest || !nest->hasAttr(nestAttr) || nest.getRank() != 1 || !nest.getOutputs().empty() ||
      spectra::isWarpChain(nest))
    return false;
  std::optional<ArrayAttr> mapping = nest.getMapping();
  return mapping && mapping->size() == 1 && isa<gpu::GPUWarpMappingAttr>((*mapping)[0]);
}

/// The nest of a guarded nest: an scf.if with no results and no else whose then-block holds
/// one nest (a thread nest of at most `threads` threads or a warp nest, not a chain) and
/// otherwise only ops free of memory effects and regions (the nest's indices). A guard is
/// uniform over the block (a kernel argument's flag, as the learnable-W switch that guards
/// dW), so it is scheduled as the nest would be, all of it moving as one op; the barrier
/// after the nest, inside the guard, is the nest's own (left out where its phase goes on).
scf::ForallOp guardedNest(Operation *op, int64_t threads, StringRef nestAttr) {
  auto guard = dyn_cast<scf::IfOp>(op);
  if (!guard || guard->getNumResults() != 0 || !guard.getElseRegion().empty())
    return nullptr;
  scf::ForallOp nest;
  for (Operation &inner : guard.thenBlock()->without_terminator()) {
    auto candidate = dyn_cast<scf::ForallOp>(inner);
    if (candidate && !nest &&
        (threadCount(candidate, threads, nestAttr) || isMovableWarpNest(candidate, nestAttr))) {
      nest = candidate;
      continue;
    }
    if (inner.getNumRegions() != 0 || !isMemoryEffectFree(&inner))
      return nullptr;
  }
  return nest;
}

/// One nest at `where` in `block`, running each member's body in its threads (a sole
/// member moves there as it is).
Operation *merge(ArrayRef<scf::ForallOp> group, ArrayRef<int64_t> counts, Block &block,
                 Block::iterator where, StringRef nestAttr) {
  if (group.size() == 1) {
    group.front()->moveBefore(&block, where);
    return group.front();
  }
  OpBuilder b(&block, where);
  Location loc = group.back()->getLoc();
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
  return nest;
}

/// A nest of a run: the op that moves (the nest, or the guard around it), its footprint, its
/// thread count where it may merge (none for a warp nest or a guarded nest, which join a
/// phase but are not merged), and the buffers its reductions read (of a contraction or a
/// row sum: a linalg op with a reduction loop), by root.
struct Item {
  Operation *op;
  scf::ForallOp nest;
  Footprint footprint;
  std::optional<int64_t> threads;
  llvm::SmallPtrSet<Value, 4> reduced;

  bool guarded() const { return op != nest; }
};

/// Drops the marks an earlier schedule set on `nest`: this one sets its own.
void dropMarks(Operation *nest) {
  nest->removeAttr(kNoBarrierAttr);
  nest->removeAttr(kFirstWarpAttr);
}

/// A phase of a run: the nests that run between two barriers (its thread nests merged into
/// one, its warp nests one after another with no barrier between); the buffers their
/// reductions read.
struct Phase {
  SmallVector<unsigned> members;
  llvm::SmallPtrSet<Value, 8> reduced;
};

/// Puts a phase's warp nests (`placed`, its nests in their order) of half the block's `warps`
/// or more side by side while they fit (kFirstWarpAttr), from warp 0 again where the next
/// does not: independent, they need no order among them. Narrower ones stay on warp 0: side
/// by side, the causal key backward's two 2-warp nests raised its spills at the
/// 128-register cap by 16-32 bytes.
void spreadOverWarps(ArrayRef<Operation *> placed, int64_t warps, StringRef nestAttr) {
  int64_t used = 0;
  for (Operation *op : placed) {
    auto nest = cast<scf::ForallOp>(op);
    std::optional<int64_t> n = getConstantIntValue(nest.getMixedUpperBound()[0]);
    if (!isMovableWarpNest(nest, nestAttr) || !n || 2 * *n < warps)
      continue;
    if (used + *n > warps)
      used = 0;
    if (used)
      nest->setAttr(kFirstWarpAttr, IntegerAttr::get(IndexType::get(nest.getContext()), used));
    used += *n;
  }
}

/// Schedules a run's nests into phases and puts them, phase by phase, at `where` in `block`
/// (the run's end). A nest goes to the first phase after every phase holding a nest it
/// conflicts with: it joins the first phase it may from there, or opens one of its own
/// there where it may join none. Only the last op of a phase keeps its barrier (the others
/// are marked kNoBarrierAttr): its nests are independent of one another. A phase's guarded
/// nests go first, so that its barrier is not one a guard may skip (a phase of guarded nests
/// alone keeps every barrier), and its wide warp nests go side by side (spreadOverWarps).
/// The phases'
/// order keeps every conflicting pair in its order; a nest moves above only nests it is
/// independent of. The ops between the nests of a run have no effects and no results the
/// nests define (a nest has none), so the phases go below them, at the run's end (where
/// sinkToFirstUse then moves each down to its first user). Returns the barriers saved.
///
/// No two nests of a phase reduce over a common buffer. Two such reductions in one body
/// let the compilers below load the common operand once for both and hoist the loads above
/// either (nothing orders them once the barrier between them is gone): merged, a causal
/// readout's two one-row logits (k = 32 each, both over W in global memory) took 192
/// registers where they had taken 128, and the causal kernels' spills at the 128-register
/// cap grew 1.5-8x (posrf-orf f32 on sm_90a: 128 to 900 bytes).
int64_t schedule(MutableArrayRef<Item> items, Block &block, Block::iterator where,
                 int64_t threads, StringRef nestAttr) {
  SmallVector<Phase, 4> phases;
  SmallVector<unsigned> phaseOf(items.size());
  for (auto [i, item] : llvm::enumerate(items)) {
    // The first phase it may join, and the first place a phase of its own may go.
    unsigned join = 0, open = 0;
    for (unsigned j = 0; j < i; ++j) {
      Follow how = follow(items[j].footprint, item.footprint);
      if (how == Follow::Anywhere)
        continue;
      join = std::max(join, phaseOf[j] + (how == Follow::Later ? 1 : 0));
      open = std::max(open, phaseOf[j] + 1);
    }
    unsigned at = join;
    auto clash = [&](const Phase &p) {
      return llvm::any_of(item.reduced, [&](Value v) { return p.reduced.contains(v); });
    };
    while (at < phases.size() && clash(phases[at]))
      ++at;
    if (at == phases.size()) {
      at = open;
      phases.insert(phases.begin() + at, Phase());
      for (unsigned j = 0; j < i; ++j)
        if (phaseOf[j] >= at)
          ++phaseOf[j];
    }
    phases[at].members.push_back(i);
    phases[at].reduced.insert(item.reduced.begin(), item.reduced.end());
    phaseOf[i] = at;
  }
  for (const Phase &phase : phases) {
    // Its warp nests in order, its thread nests as one where the first of them stood.
    SmallVector<scf::ForallOp> group;
    SmallVector<int64_t> counts;
    for (unsigned m : phase.members)
      if (items[m].threads) {
        group.push_back(items[m].nest);
        counts.push_back(*items[m].threads);
      }
    // Its guarded nests first: a barrier inside a guard is passed only where the guard
    // holds, so the phase's barrier goes after a nest that always runs. A guarded nest keeps
    // no column, so it is independent of every other member and its place among them is
    // free.
    SmallVector<unsigned> order;
    for (bool guarded : {true, false})
      for (unsigned m : phase.members)
        if (items[m].guarded() == guarded)
          order.push_back(m);
    SmallVector<Operation *> placed;  // the nests, in their order
    bool unguarded = false;
    for (unsigned m : order) {
      unguarded |= !items[m].guarded();
      if (!items[m].threads) {
        items[m].op->moveBefore(&block, where);
        placed.push_back(items[m].nest);
      } else if (items[m].nest == group.front()) {
        placed.push_back(merge(group, counts, block, where, nestAttr));
      }
    }
    // Only the phase's last op keeps its barrier; where every member is guarded, each keeps
    // its own (one guard may hold where another does not).
    if (unguarded)
      for (Operation *op : ArrayRef(placed).drop_back())
        op->setAttr(kNoBarrierAttr, UnitAttr::get(op->getContext()));
    spreadOverWarps(placed, threads / 32, nestAttr);
  }
  return static_cast<int64_t>(items.size() - phases.size());
}

/// Moves each of `ops` (free of effects, in block order) down to just above its first user
/// in its block, last op first: after the nests moved, an index or a view is computed where
/// it is used, not held (in registers, on the GPU) across the nests before.
void sinkToFirstUse(ArrayRef<Operation *> ops) {
  for (Operation *op : llvm::reverse(ops)) {
    Block *block = op->getBlock();
    Operation *first = nullptr;
    for (Operation *user : op->getUsers())
      if (Operation *at = block->findAncestorOpInBlock(*user);
          at && (!first || at->isBeforeInBlock(first)))
        first = at;
    if (first && op->isBeforeInBlock(first))
      op->moveBefore(first);
  }
}

} // namespace

int64_t mlir::spectra::mergeIndependentNests(Block &block, int64_t threads, StringRef nestAttr) {
  int64_t removed = 0;
  SmallVector<Item, 4> run;
  SmallVector<Operation *> between;
  auto flush = [&](Block::iterator where) {
    if (run.size() > 1) {
      removed += schedule(run, block, where, threads, nestAttr);
      sinkToFirstUse(between);
    }
    run.clear();
    between.clear();
  };
  for (Operation &op : llvm::make_early_inc_range(block)) {
    // Marks from an earlier schedule no longer hold (nor where a nest is not scheduled).
    if (isa<scf::ForallOp>(op) && op.hasAttr(nestAttr))
      dropMarks(&op);
    std::optional<int64_t> n = threadCount(&op, threads, nestAttr);
    scf::ForallOp guarded = guardedNest(&op, threads, nestAttr);
    if (n || isMovableWarpNest(&op, nestAttr) || guarded) {
      auto nest = guarded ? guarded : cast<scf::ForallOp>(op);
      if (guarded)
        dropMarks(nest);
      // A guarded nest is not merged: it keeps no column of its own.
      Footprint f = footprintOf(nest, n);
      if (!f.opaque) {
        llvm::SmallPtrSet<Value, 4> reduced;
        nest->walk([&](linalg::LinalgOp l) {
          if (l.getNumReductionLoops() != 0)
            for (Value in : l.getDpsInputs())
              if (Value root = rootOf(in))
                reduced.insert(root);
        });
        run.push_back(Item{&op, nest, std::move(f), n, std::move(reduced)});
        continue;
      }
    }
    // Index arithmetic and views between nests run in every thread alike.
    if (op.getNumRegions() == 0 && isMemoryEffectFree(&op) &&
        !op.hasTrait<OpTrait::IsTerminator>()) {
      between.push_back(&op);
      continue;
    }
    flush(op.getIterator());
    // Inside a nest the ops are one thread's; elsewhere (loops, branches) blocks of nests.
    if (isa<scf::ForallOp>(op) && op.hasAttr(nestAttr))
      continue;
    for (Region &region : op.getRegions())
      for (Block &inner : region)
        removed += mergeIndependentNests(inner, threads, nestAttr);
  }
  flush(block.end()); // a block without a terminator
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
