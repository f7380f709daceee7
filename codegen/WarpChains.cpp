//===- WarpChains.cpp - an exponential kept in registers between two mma --===//
//
// See WarpChains.h. The lane maps are MapContractionsToMma.cpp's (g = lane / 4,
// t = lane % 4): accumulator element i of a 16 x 8 tile at (g + 8 (i / 2),
// 2t + i % 2); A register r, half h, of a k16 step at (g + 8 (r % 2),
// 2t + 8 (r / 2) + h), of a k8 step at (g + 8 r, 2t + h); B register r, half h
// at (2t + 8 r + h, g). So A register r of k16 step s is elements 2 (r % 2) and
// 2 (r % 2) + 1 of the accumulator tile 2 s + r / 2 (k8 step s: elements 2 r,
// 2 r + 1 of tile s), and a lane's two rows are g and g + 8.
//
//===----------------------------------------------------------------------===//

#include "codegen/WarpChains.h"
#include "codegen/Epilogue.h"
#include "codegen/MapContractionsToMma.h"
#include "codegen/TileKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <cmath>
#include <functional>

using namespace mlir;
using namespace mlir::spectra;

namespace {

/// The block-local buffer a view is of, or null: an alloca (in the mapped IR, and inside a
/// gpu.launch while its nests are lowered, before spectra-launch-mapped-kernels makes the
/// workgroup allocas views of the pool), a view of dynamic shared memory, or a workgroup
/// attribution (neither made by this project's pipeline any more; accepted for IR that has
/// them).
Value localRoot(Value v) {
  Value r = viewRoot(v);
  if (r.getDefiningOp<memref::AllocaOp>() || r.getDefiningOp<memref::ViewOp>())
    return r;
  if (auto arg = dyn_cast<BlockArgument>(r))
    if (auto launch = dyn_cast_or_null<gpu::LaunchOp>(arg.getOwner()->getParentOp()))
      if (llvm::is_contained(launch.getWorkgroupAttributions(), arg))
        return r;
  return Value();
}

SmallVector<unsigned> dimsOf(AffineMap map) {
  SmallVector<unsigned> dims;
  for (AffineExpr e : map.getResults()) {
    auto d = dyn_cast<AffineDimExpr>(e);
    if (!d)
      return {};
    dims.push_back(d.getPosition());
  }
  return dims;
}

bool isDims(AffineMap map, ArrayRef<unsigned> dims) {
  SmallVector<unsigned> got = dimsOf(map);
  return map.getNumResults() == dims.size() && ArrayRef<unsigned>(got) == dims;
}

/// Whether the body is scalar arith and math only.
bool scalarBody(linalg::GenericOp op) {
  for (Operation &inner : op.getRegion().front().without_terminator())
    if (inner.getNumRegions() != 0 ||
        !llvm::isa<arith::ArithDialect, math::MathDialect>(inner.getDialect()) ||
        !llvm::all_of(inner.getResultTypes(), [](Type t) { return t.isIntOrIndexOrFloat(); }))
      return false;
  return true;
}

enum class Kind {
  Elementwise,
  Reduce,
  Contract,
  Vector,
  Block,
  Produce,
  ZeroRows,
  /// Split only, over the tile's rows (R), each warp on its own features: a reduction
  /// out[F] (+)= f(tiles) (column sums), and a contraction C[F, n] += tile[R, F]^T B[R, n]
  /// whose A fragments are the tile's, transposed 8 x 8 at a time (movmatrix).
  ReduceRows,
  ContractRows
};

/// One op of the chain after the first contraction and its epilogue.
struct Step {
  Kind kind = Kind::Elementwise;
  linalg::GenericOp op;
  /// ZeroRows: the loop that zeroes the tiles' rows [from, T) (the rows past the end of the
  /// last, partial tile), and the tiles it zeroes.
  scf::ForOp zeroRows;
  Value zeroFrom;
  SmallVector<Value> zeroTiles;
  Operation *operation() const {
    return zeroRows ? const_cast<scf::ForOp &>(zeroRows).getOperation()
                    : const_cast<linalg::GenericOp &>(op).getOperation();
  }
  /// Elementwise, Reduce and ReduceRows: the loop dims of the tiles' rows (R, the kernel's rows) and
  /// columns (F, the features). Block: F and the other dim.
  unsigned rowDim = 0, colDim = 1;
  /// Contract and ContractRows: m, n, k of the mma; aInput the tile. Produce: the mma of a
  /// [T, M] tile from operands in memory, laid out as the first contraction's.
  MmaPlan plan;
  /// Reduce and ReduceRows, per output: its (+) (an addf or a maximumf with the output's
  /// block argument; ReduceRows also a subf from it), the (+)'s other operand, and (Reduce)
  /// whether a later op of the chain reads the output.
  SmallVector<Operation *> combiners;
  SmallVector<Value> terms;
  SmallVector<bool> combined;
};

/// Two ways to lay a [T, M] tile (T kernel rows R, M features F) on the mma's 16 x 8 tiles:
///  - Split (the readout): the mma's rows are R, its columns F; the warps split F. A
///    reduction over F is the lane's, then the quad's (shuffles), then the warps' (shared
///    memory); a contraction over F sums the warps' partial products.
///  - Transposed (kv): the mma's rows are F (16 per warp), its columns R. A reduction over R
///    is the lane's and the quad's; a contraction over R (phi^T V) writes the warp's own
///    feature rows; per-feature ops ([M] vectors, [M, X] rows) run on the warp's features.
///    No warp reads another's data: no barrier.
struct Chain {
  bool transposed = false;
  linalg::GenericOp first;
  MmaPlan plan;
  /// The first contraction's epilogue, if it has one (else its output is a register tile
  /// that later steps read).
  std::optional<Epilogue> epilogue;
  SmallVector<Step, 4> steps;
  /// The register tiles' buffers (allocas), the first contraction's output included.
  llvm::SmallPtrSet<Value, 8> tiles;
  /// The tiles that ops after the chain read: stored to their (shared) buffers as the
  /// chain ends, so they stay in workgroup memory.
  llvm::SmallPtrSet<Value, 8> escaping;
  /// Mapping: the fills that zeroed the outputs of Produce steps (they go with the chain).
  SmallVector<Operation *> produceFills;
  /// Mapping: ops between the chain's that it does not take (a contraction whose partials
  /// do not fit, an op under an scf.if), in order: they move after the chain's nest. Each
  /// commutes with the chain's later ops; an op that touches what one of them writes, or
  /// writes what one of them reads, is deferred with them.
  SmallVector<Operation *> deferred;
  /// Features per warp (cw), the 8-column mma tiles per lane (ntiles), the second
  /// contraction's k step.
  int64_t T = 0, M = 0, W = 0, cw = 0, ntiles = 0, ks2 = 16;

  SmallVector<Operation *> ops() const {
    SmallVector<Operation *> all = {first};
    if (epilogue)
      all.push_back(epilogue->op);
    for (const Step &s : steps)
      all.push_back(s.operation());
    return all;
  }
};

/// The mma of a contraction X[T, M] = A B over loop dims (0, 1, 2) (output map (d0, d1),
/// K reduced) laid out split (mma rows T) or transposed (mma rows M); none if it is not one.
/// With `T`/`M`: only for that output shape.
std::optional<MmaPlan> producerPlan(linalg::GenericOp g, bool transposed, int64_t T = 0,
                                    int64_t M = 0) {
  if (!g.hasPureBufferSemantics() || !contractionOutput(g) || g.getNumDpsInputs() != 2 ||
      !planMma(g))
    return std::nullopt;
  SmallVector<utils::IteratorType> it = g.getIteratorTypesArray();
  if (it[0] != utils::IteratorType::parallel || it[1] != utils::IteratorType::parallel ||
      it[2] != utils::IteratorType::reduction)
    return std::nullopt;
  SmallVector<AffineMap> maps = g.getIndexingMapsArray();
  auto sameSet = [](AffineMap map, unsigned x, unsigned y) {
    SmallVector<unsigned> d = dimsOf(map);
    return d.size() == 2 && llvm::is_contained(d, x) && llvm::is_contained(d, y);
  };
  MmaPlan plan;
  plan.mDim = transposed ? 1 : 0;
  plan.nDim = transposed ? 0 : 1;
  plan.kDim = 2;
  if (sameSet(maps[0], plan.mDim, 2) && sameSet(maps[1], plan.nDim, 2))
    plan.aInput = 0;
  else if (sameSet(maps[1], plan.mDim, 2) && sameSet(maps[0], plan.nDim, 2))
    plan.aInput = 1;
  else
    return std::nullopt;
  SmallVector<int64_t> ranges = g.getStaticLoopRanges();
  plan.kStep = ranges[2] > 8 ? 16 : 8;
  if ((T && ranges[0] != T) || (M && ranges[1] != M))
    return std::nullopt;
  return plan;
}

/// The buffers `op` reads and writes (roots of views); none where it has effects on memory
/// other than loads, stores and linalg ops on buffers.
std::optional<std::pair<llvm::SmallPtrSet<Value, 8>, llvm::SmallPtrSet<Value, 8>>>
bufferEffects(Operation *op) {
  std::pair<llvm::SmallPtrSet<Value, 8>, llvm::SmallPtrSet<Value, 8>> rw;
  bool known = true;
  op->walk<WalkOrder::PreOrder>([&](Operation *inner) {
    if (auto load = dyn_cast<memref::LoadOp>(inner)) {
      rw.first.insert(viewRoot(load.getMemRef()));
      return WalkResult::advance();
    }
    if (auto store = dyn_cast<memref::StoreOp>(inner)) {
      rw.second.insert(viewRoot(store.getMemRef()));
      return WalkResult::advance();
    }
    if (auto l = dyn_cast<linalg::LinalgOp>(inner)) {
      if (!l.hasPureBufferSemantics()) {
        known = false;
        return WalkResult::interrupt();
      }
      for (Value v : l.getDpsInputs())
        rw.first.insert(viewRoot(v));
      for (Value v : l.getDpsInits()) {
        rw.first.insert(viewRoot(v));
        rw.second.insert(viewRoot(v));
      }
      return WalkResult::skip();
    }
    if (isMemoryEffectFree(inner) || isa<scf::ForOp, scf::IfOp, scf::YieldOp>(inner))
      return WalkResult::advance();
    known = false;
    return WalkResult::interrupt();
  });
  if (!known)
    return std::nullopt;
  return rw;
}

/// The loop the tile layer zeroes the rows past the end of a partial tile with:
///   scf.for %i = %rows to T step 1 { (scf.for %j = 0 to M step 1 { store +0.0, t[%i, %j] })* }
/// over register tiles t, as a ZeroRows step; none otherwise.
std::optional<Step> zeroRowsStep(scf::ForOp loop, int64_t T, int64_t M,
                                 const llvm::SmallPtrSet<Value, 8> &tiles) {
  auto constIs = [](Value v, int64_t n) {
    std::optional<int64_t> c = getConstantIntValue(v);
    return c && *c == n;
  };
  if (!constIs(loop.getUpperBound(), T) || !constIs(loop.getStep(), 1))
    return std::nullopt;
  Step s;
  s.kind = Kind::ZeroRows;
  s.zeroRows = loop;
  s.zeroFrom = loop.getLowerBound();
  for (Operation &op : loop.getBody()->without_terminator()) {
    if (isMemoryEffectFree(&op))
      continue;
    auto inner = dyn_cast<scf::ForOp>(op);
    if (!inner || !constIs(inner.getLowerBound(), 0) || !constIs(inner.getUpperBound(), M) ||
        !constIs(inner.getStep(), 1))
      return std::nullopt;
    for (Operation &in : inner.getBody()->without_terminator()) {
      if (isMemoryEffectFree(&in))
        continue;
      auto store = dyn_cast<memref::StoreOp>(in);
      if (!store || !matchPattern(store.getValue(), m_PosZeroFloat()) ||
          !tiles.contains(store.getMemRef()) || store.getIndices().size() != 2 ||
          store.getIndices()[0] != loop.getInductionVar() ||
          store.getIndices()[1] != inner.getInductionVar())
        return std::nullopt;
      s.zeroTiles.push_back(store.getMemRef());
    }
  }
  if (s.zeroTiles.empty())
    return std::nullopt;
  return s;
}

/// The chain starting at `first`, a contraction whose output a fill just set to 0
/// (`zeroFill`, allowed to touch its output; null at the lowering, where it is gone), with
/// `W` warps splitting the features, laid out `transposed` or not; none if there is none.
std::optional<Chain> analyze(linalg::GenericOp first, int64_t W, bool transposed,
                             Operation *zeroFill, int64_t maxSteps = -1,
                             const llvm::SmallPtrSet<Operation *, 4> *exclude = nullptr) {
  Chain c;
  c.first = first;
  c.W = W;
  c.transposed = transposed;
  std::optional<MmaPlan> plan = W >= 1 ? producerPlan(first, transposed) : std::nullopt;
  if (!plan)
    return std::nullopt;
  c.plan = *plan;
  // An epilogue whose input is read elsewhere is an elementwise step like any other.
  std::optional<Epilogue> e = epilogueOf(first);
  if (e && !e->storeOutput)
    c.epilogue = *e;
  SmallVector<int64_t> ranges = first.getStaticLoopRanges();
  c.T = ranges[0];
  c.M = ranges[1];
  if (c.T < 1 || c.T > 16)
    return std::nullopt;
  if (transposed) {
    // 16-feature mma row blocks, one after the other in each warp; the rows are the mma's
    // (1 or 2) column tiles.
    if (c.M % (16 * W) != 0)
      return std::nullopt;
    c.cw = c.M / W;
    c.ntiles = (c.T + 7) / 8;
    c.ks2 = c.ntiles == 2 ? 16 : 8;
  } else {
    if (c.M % (8 * W) != 0)
      return std::nullopt;
    c.cw = c.M / W;
    c.ntiles = c.cw / 8;
    c.ks2 = c.cw % 16 == 0 ? 16 : 8;
    if (c.ks2 == 8 && c.cw != 8)
      return std::nullopt;
  }

  Value X = localRoot(first.getDpsInits()[0]);
  if (!X)
    return std::nullopt;
  c.tiles.insert(X);
  linalg::GenericOp E = c.epilogue ? c.epilogue->op : linalg::GenericOp();
  if (E) {
    if (!scalarBody(E))
      return std::nullopt;
    for (OpOperand &out : E.getDpsInitsMutable()) {
      Value t = localRoot(out.get());
      if (!t || !E.getMatchingIndexingMap(&out).isIdentity())
        return std::nullopt;
      c.tiles.insert(t);
    }
    for (OpOperand *in : E.getDpsInputOperands())
      if (in->getOperandNumber() != c.epilogue->input && c.tiles.contains(viewRoot(in->get())))
        return std::nullopt;
  }

  // Buffers the steps write outside the tiles. Per mma row (the lane's registers, read by
  // later steps through the mma-row dim alone): reduction outputs (their step and output
  // index) and, transposed, per-feature vectors. Written through memory: the split
  // layout's contraction outputs (summed after the chain: not read in it); transposed,
  // feature rows [M, X] (read back only where written, by the same lane).
  llvm::DenseMap<Value, std::pair<int, unsigned>> perRow;
  llvm::SmallPtrSet<Value, 8> viaMemory;
  // What the chain's ops read and write (every buffer they touch is in `touched`).
  llvm::SmallPtrSet<Value, 16> touched, written;
  auto touch = [&](Operation *op) {
    for (Value v : op->getOperands())
      if (isa<MemRefType>(v.getType()))
        touched.insert(viewRoot(v));
    if (auto g = dyn_cast<linalg::LinalgOp>(op))
      for (Value v : g.getDpsInits())
        written.insert(viewRoot(v));
  };
  touch(first);
  if (E)
    touch(E);
  // An op off the tiles that neither writes what the chain touches nor reads what it writes
  // runs before the chain's nest (the chain's ops move to the place of its last).
  auto independent = [&](Operation *op) {
    std::optional<std::pair<llvm::SmallPtrSet<Value, 8>, llvm::SmallPtrSet<Value, 8>>> rw =
        bufferEffects(op);
    if (!rw)
      return false;
    for (Value r : rw->first)
      if (written.contains(r) || c.tiles.contains(r))
        return false;
    for (Value w : rw->second)
      if (touched.contains(w) || c.tiles.contains(w))
        return false;
    return true;
  };

  // Inputs of a step whose loop dim `rowDim` runs over the mma's rows of this layout
  // (`mmaRowDim`, or none for ops off the tiles) and `rowDim`/`colDim` are the tiles' R, F.
  auto inputsOk = [&](linalg::GenericOp g, std::optional<unsigned> tileR,
                      std::optional<unsigned> tileF, std::optional<unsigned> mmaRowDim) {
    for (OpOperand *in : g.getDpsInputOperands()) {
      AffineMap map = g.getMatchingIndexingMap(in);
      Value r = viewRoot(in->get());
      if (dimsOf(map).size() != map.getNumResults())
        return false;
      if (c.tiles.contains(r)) {
        if (!tileR || !tileF || !isDims(map, {*tileR, *tileF}))
          return false;
        continue;
      }
      if (auto it = perRow.find(r); it != perRow.end()) {
        if (!mmaRowDim || !isDims(map, {*mmaRowDim}))
          return false;
        if (it->second.first >= 0)
          c.steps[it->second.first].combined[it->second.second] = true;
        continue;
      }
      if (viaMemory.contains(r))
        return false;
    }
    return true;
  };
  auto readsTile = [&](linalg::GenericOp g) {
    return llvm::any_of(g.getDpsInputs(), [&](Value v) { return c.tiles.contains(viewRoot(v)); });
  };
  // A write to a buffer the chain already writes, other than in place by per-row ops.
  auto freshOutput = [&](Value r) {
    return !c.tiles.contains(r) && !viaMemory.contains(r);
  };

  // Deferral (Chain::deferred), at the mapping only (the lowering sees the nest's ops
  // alone). A deferred contraction takes the fill that zeroes its output with it.
  llvm::SmallPtrSet<Value, 8> deferredReads, deferredWrites;
  auto conflictsDeferred = [&](Operation *op) {
    if (c.deferred.empty())
      return false;
    std::optional<std::pair<llvm::SmallPtrSet<Value, 8>, llvm::SmallPtrSet<Value, 8>>> rw =
        bufferEffects(op);
    if (!rw)
      return true;
    // By root, and an argument that may be another's buffer (spectra::mayAlias) as that one.
    auto meets = [](const llvm::SmallPtrSet<Value, 8> &set, Value v) {
      return set.contains(v) || llvm::any_of(set, [&](Value o) { return mayAlias(o, v); });
    };
    for (Value r : rw->first)
      if (meets(deferredWrites, r))
        return true;
    for (Value w : rw->second)
      if (meets(deferredReads, w) || meets(deferredWrites, w))
        return true;
    return false;
  };
  auto defer = [&](Operation *op) {
    if (!zeroFill || op->getNumResults() != 0)
      return false;
    std::optional<std::pair<llvm::SmallPtrSet<Value, 8>, llvm::SmallPtrSet<Value, 8>>> rw =
        bufferEffects(op);
    if (!rw)
      return false;
    linalg::FillOp fill;
    if (auto g = dyn_cast<linalg::GenericOp>(op))
      fill = zeroFillBefore(g);
    if (fill && !llvm::is_contained(c.deferred, fill.getOperation())) {
      Value r = viewRoot(fill.getDpsInits()[0]);
      if (touched.contains(r) || c.tiles.contains(r))
        return false;
      c.deferred.push_back(fill);
    }
    c.deferred.push_back(op);
    deferredReads.insert(rw->first.begin(), rw->first.end());
    deferredWrites.insert(rw->second.begin(), rw->second.end());
    return true;
  };

  Operation *last = E ? E.getOperation() : first.getOperation();
  for (Operation *op = last->getNextNode(); op && !op->hasTrait<OpTrait::IsTerminator>();
       op = op->getNextNode()) {
    if (maxSteps >= 0 && static_cast<int64_t>(c.steps.size()) >= maxSteps)
      break;
    if (isMemoryEffectFree(op))
      continue;
    if (conflictsDeferred(op) || (exclude && exclude->contains(op))) {
      if (defer(op))
        continue;
      break;
    }
    if (auto fill = dyn_cast<linalg::FillOp>(op)) {
      Value r = viewRoot(fill.getDpsInits()[0]);
      if (c.tiles.contains(r) || touched.contains(r))
        break;
      continue;
    }
    if (auto loop = dyn_cast<scf::ForOp>(op)) {
      if (std::optional<Step> z = zeroRowsStep(loop, c.T, c.M, c.tiles)) {
        c.steps.push_back(*z);
        continue;
      }
    }
    auto g = dyn_cast<linalg::GenericOp>(op);
    if (!g || !g.hasPureBufferSemantics() || !scalarBody(g)) {
      if (independent(op) || defer(op))
        continue;
      break;
    }
    SmallVector<int64_t> r = g.getStaticLoopRanges();
    SmallVector<utils::IteratorType> its = g.getIteratorTypesArray();
    Step s;
    s.op = g;
    bool tileIn = readsTile(g);
    // The tiles' (R, F) loop dims, from a tile input's map.
    std::optional<unsigned> tR, tF;
    for (OpOperand *in : g.getDpsInputOperands())
      if (c.tiles.contains(viewRoot(in->get()))) {
        SmallVector<unsigned> d = dimsOf(g.getMatchingIndexingMap(in));
        if (d.size() == 2) {
          tR = d[0];
          tF = d[1];
        }
        break;
      }
    if (tileIn && g.getNumLoops() == 2 && g.getNumReductionLoops() == 0) {
      s.kind = Kind::Elementwise;
      s.rowDim = 0;
      s.colDim = 1;
      if (r[0] != c.T || r[1] != c.M || !inputsOk(g, 0u, 1u, transposed ? 1u : 0u))
        return std::nullopt;
      for (OpOperand &out : g.getDpsInitsMutable()) {
        Value t = localRoot(out.get());
        if (!t || !g.getMatchingIndexingMap(&out).isIdentity() || touched.contains(t))
          return std::nullopt;
        c.tiles.insert(t);
      }
    } else if (!transposed && tileIn && g.getNumLoops() == 2 && g.getNumReductionLoops() == 1 &&
               tR && tF && its[*tR] == utils::IteratorType::reduction) {
      // Split, a reduction over the tile's rows: each warp's own features, per column.
      s.kind = Kind::ReduceRows;
      s.rowDim = *tR;
      s.colDim = *tF;
      bool ok = r[s.rowDim] == c.T && r[s.colDim] == c.M && inputsOk(g, s.rowDim, s.colDim, s.rowDim);
      Block &body = g.getRegion().front();
      Operation *yield = body.getTerminator();
      unsigned numIns = g.getNumDpsInputs();
      SmallVector<Value> outs;
      for (OpOperand &out : g.getDpsInitsMutable()) {
        if (!ok)
          break;
        unsigned o = out.getOperandNumber() - numIns;
        Value rr = viewRoot(out.get());
        BlockArgument arg = body.getArgument(numIns + o);
        Operation *comb = yield->getOperand(o).getDefiningOp();
        // out (+) term with (+) an addf or maximumf, or out - term (a sum subtracted).
        ok = isDims(g.getMatchingIndexingMap(&out), {s.colDim}) && freshOutput(rr) &&
             !perRow.count(rr) && !touched.contains(rr) && comb && arg.hasOneUse() &&
             ((isa<arith::AddFOp, arith::MaximumFOp>(comb) &&
               (comb->getOperand(0) == arg || comb->getOperand(1) == arg)) ||
              (isa<arith::SubFOp>(comb) && comb->getOperand(0) == arg &&
               comb->getOperand(1) != arg));
        if (!ok)
          break;
        s.combiners.push_back(comb);
        s.terms.push_back(comb->getOperand(0) == arg ? comb->getOperand(1) : comb->getOperand(0));
        outs.push_back(rr);
      }
      if (!ok) {
        if (defer(op))
          continue;
        break;
      }
      viaMemory.insert(outs.begin(), outs.end());
    } else if (tileIn && g.getNumLoops() == 2 && g.getNumReductionLoops() == 1 && tR && tF) {
      // A reduction over the mma's columns: F split, R transposed.
      s.kind = Kind::Reduce;
      s.rowDim = *tR;
      s.colDim = *tF;
      unsigned reduced = transposed ? s.rowDim : s.colDim, kept = transposed ? s.colDim : s.rowDim;
      if (its[reduced] != utils::IteratorType::reduction || r[s.rowDim] != c.T ||
          r[s.colDim] != c.M || !inputsOk(g, s.rowDim, s.colDim, kept))
        return std::nullopt;
      Block &body = g.getRegion().front();
      Operation *yield = body.getTerminator();
      unsigned numIns = g.getNumDpsInputs();
      for (OpOperand &out : g.getDpsInitsMutable()) {
        unsigned o = out.getOperandNumber() - numIns;
        Value rr = viewRoot(out.get());
        if (!isDims(g.getMatchingIndexingMap(&out), {kept}) || !freshOutput(rr) ||
            (!transposed && perRow.count(rr)))
          return std::nullopt;
        BlockArgument arg = body.getArgument(numIns + o);
        Operation *comb = yield->getOperand(o).getDefiningOp();
        if (!comb || !isa<arith::AddFOp, arith::MaximumFOp>(comb) || !arg.hasOneUse() ||
            (comb->getOperand(0) != arg && comb->getOperand(1) != arg))
          return std::nullopt;
        s.combiners.push_back(comb);
        s.terms.push_back(comb->getOperand(0) == arg ? comb->getOperand(1) : comb->getOperand(0));
        s.combined.push_back(false);
        perRow[rr] = {static_cast<int>(c.steps.size()), o};
      }
    } else if (tileIn && g.getNumLoops() == 3 && planMma(g)) {
      s.kind = Kind::Contract;
      SmallVector<unsigned> od = dimsOf(g.getMatchingIndexingMap(g.getDpsInitOperand(0)));
      unsigned k = its[0] == utils::IteratorType::reduction   ? 0
                   : its[1] == utils::IteratorType::reduction ? 1
                                                              : 2;
      if (od.size() != 2)
        return std::nullopt;
      s.plan.mDim = od[0];
      s.plan.nDim = od[1];
      s.plan.kDim = k;
      s.plan.kStep = c.ks2;
      int tileInput = -1;
      for (int i = 0; i < 2; ++i)
        if (c.tiles.contains(viewRoot(g.getDpsInputs()[i])))
          tileInput = i;
      if (tileInput < 0 || c.tiles.contains(viewRoot(g.getDpsInputs()[1 - tileInput])))
        return std::nullopt;
      s.plan.aInput = tileInput;
      AffineMap aMap = g.getIndexingMapsArray()[tileInput];
      Value bRoot = viewRoot(g.getDpsInputs()[1 - tileInput]);
      SmallVector<unsigned> bd = dimsOf(g.getIndexingMapsArray()[1 - tileInput]);
      Value outRoot = viewRoot(g.getDpsInits()[0]);
      // Split, over the rows: C[F, n] += tile[R, F]^T B[R, n] on the warp's own features
      // (16-feature mma row blocks).
      if (!transposed && isDims(aMap, {k, s.plan.mDim})) {
        s.kind = Kind::ContractRows;
        s.plan.kStep = c.T > 8 ? 16 : 8;
        if (c.cw % 16 != 0 || bd.size() != 2 || !llvm::is_contained(bd, k) ||
            !llvm::is_contained(bd, s.plan.nDim) || r[s.plan.mDim] != c.M || r[k] != c.T ||
            perRow.count(bRoot) || viaMemory.contains(bRoot) || perRow.count(outRoot) ||
            c.tiles.contains(outRoot) || viaMemory.contains(outRoot) || touched.contains(outRoot)) {
          if (defer(op))
            continue;
          break;
        }
        viaMemory.insert(outRoot);
        c.steps.push_back(s);
        touch(g);
        continue;
      }
      // Split: C[R, n] += tile[R, F] B[F, n]; transposed: C[F, n] += tile[R, F]^T B[R, n].
      SmallVector<unsigned> tileDims = transposed ? SmallVector<unsigned>{k, s.plan.mDim}
                                                  : SmallVector<unsigned>{s.plan.mDim, k};
      if (!isDims(aMap, tileDims) || bd.size() != 2 || !llvm::is_contained(bd, k) ||
          !llvm::is_contained(bd, s.plan.nDim) ||
          r[s.plan.mDim] != (transposed ? c.M : c.T) || r[k] != (transposed ? c.T : c.M) ||
          perRow.count(bRoot) || viaMemory.contains(bRoot) || perRow.count(outRoot) ||
          c.tiles.contains(outRoot) || (!transposed && viaMemory.contains(outRoot)))
        return std::nullopt;
      viaMemory.insert(outRoot);
    } else if (transposed && !tileIn && g.getNumLoops() == 1 && g.getNumReductionLoops() == 0 &&
               r[0] == c.M) {
      // Per feature, on [M] vectors (or scalars): the warp's features, in registers.
      s.kind = Kind::Vector;
      if (!inputsOk(g, std::nullopt, std::nullopt, 0u))
        return std::nullopt;
      for (OpOperand &out : g.getDpsInitsMutable()) {
        Value rr = viewRoot(out.get());
        if (!isDims(g.getMatchingIndexingMap(&out), {0}) || !freshOutput(rr))
          return std::nullopt;
        perRow[rr] = {-1, 0};
      }
    } else if (transposed && !tileIn && g.getNumLoops() == 2 && g.getNumReductionLoops() == 0 &&
               r[0] == c.M) {
      // Per feature row of [M, X] buffers (S rescaled): the warp's rows, through memory,
      // each element by the lane that holds it in the mma's accumulator layout.
      s.kind = Kind::Block;
      s.rowDim = 0;
      s.colDim = 1;
      if (!inputsOk(g, std::nullopt, std::nullopt, 0u))
        return std::nullopt;
      for (OpOperand *in : g.getDpsInputOperands())
        if (!perRow.count(viewRoot(in->get())) && !llvm::is_contained(dimsOf(g.getMatchingIndexingMap(in)), 0u) &&
            touched.contains(viewRoot(in->get())))
          return std::nullopt;
      for (OpOperand &out : g.getDpsInitsMutable()) {
        Value rr = viewRoot(out.get());
        if (!g.getMatchingIndexingMap(&out).isIdentity() || c.tiles.contains(rr) ||
            perRow.count(rr))
          return std::nullopt;
        viaMemory.insert(rr);
      }
    } else if (!tileIn && g.getNumLoops() == 3 && planMma(g)) {
      // A second contraction forming a [T, M] tile from operands in memory, laid out as the
      // first's (the gradient of the features beside the logits): a register tile.
      std::optional<MmaPlan> plan = producerPlan(g, transposed, c.T, c.M);
      Value outRoot = localRoot(g.getDpsInits()[0]);
      linalg::FillOp fill = zeroFill ? zeroFillBefore(g) : linalg::FillOp();
      bool inputsFree = llvm::none_of(g.getDpsInputs(), [&](Value v) {
        return written.contains(viewRoot(v)) || c.tiles.contains(viewRoot(v));
      });
      if (!plan || !outRoot || touched.contains(outRoot) || !inputsFree || (zeroFill && !fill)) {
        if (independent(op) || defer(op))
          continue;
        break;
      }
      s.kind = Kind::Produce;
      s.plan = *plan;
      c.tiles.insert(outRoot);
      if (fill)
        c.produceFills.push_back(fill);
    } else if (!tileIn) {
      if (independent(op) || defer(op))
        continue;
      break;
    } else {
      if (defer(op))
        continue;
      return std::nullopt;
    }
    c.steps.push_back(s);
    touch(g);
  }
  // Ops after the last one that reads a tile are not the chain's (nor a Produce step, whose
  // tile nothing in the chain then reads).
  while (!c.steps.empty() && c.steps.back().kind != Kind::ZeroRows &&
         !readsTile(c.steps.back().op)) {
    if (c.steps.back().kind == Kind::Produce) {
      c.tiles.erase(localRoot(c.steps.back().op.getDpsInits()[0]));
      if (zeroFill)
        c.produceFills.pop_back();
    }
    c.steps.pop_back();
  }
  // A chain pays for itself where a second contraction reads or forms a register tile.
  if (llvm::none_of(c.steps, [](const Step &s) {
        return s.kind == Kind::Contract || s.kind == Kind::Produce ||
               s.kind == Kind::ContractRows;
      }))
    return std::nullopt;
  // Transposed, buffers written per feature must not be read by the chain across features.
  // The register tiles are read and written by the chain alone.
  // A tile that an op after the chain reads escapes: the chain stores it as it ends. Any
  // other user outside the chain (before it) leaves no chain.
  // Deferred ops past the chain's last op stay where they are.
  Operation *lastOp = c.ops().back();
  llvm::erase_if(c.deferred, [&](Operation *d) { return !d->isBeforeInBlock(lastOp); });
  llvm::SmallPtrSet<Operation *, 16> mine;
  for (Operation *op : c.ops())
    mine.insert(op);
  if (zeroFill)
    mine.insert(zeroFill);
  for (Operation *fill : c.produceFills)
    mine.insert(fill);
  Operation *chainEnd = c.ops().back();
  for (Value t : c.tiles) {
    SmallVector<Value> work = {t};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      for (Operation *user : v.getUsers()) {
        if (auto view = dyn_cast<ViewLikeOpInterface>(user); view && view.getViewSource() == v) {
          work.append(user->result_begin(), user->result_end());
          continue;
        }
        Operation *at = user;
        while (at && !mine.contains(at))
          at = at->getParentOp();
        if (at)
          continue;
        Operation *outer = chainEnd->getBlock()->findAncestorOpInBlock(*user);
        // At the lowering the chain is its nest's whole body: its users are past the nest.
        // At the mapping they are past its last op, or deferred (moved past it).
        if (zeroFill && (!outer || (!chainEnd->isBeforeInBlock(outer) &&
                                    !llvm::is_contained(c.deferred, outer))))
          return std::nullopt;
        if (!zeroFill && outer)
          return std::nullopt;
        c.escaping.insert(t);
      }
    }
  }
  return c;
}

/// A lane's ids: its warp, lane, group g = lane / 4, t = lane % 4 and 2t.
struct Lane {
  Value warp, lane, g, t, t2;
};

/// An mma operand fragment: emulated, its registers' first slot (parts x regs x 2 halves,
/// each an f32 holding the rounded part); on the GPU the packed registers per part.
struct Fragment {
  int64_t slot = 0, regs = 0;
  SmallVector<SmallVector<Value>> packed;
};

/// The two executors of the one lowering (see WarpChains.h).
class Exec {
public:
  Exec(OpBuilder &b, Location loc, int64_t warps, Type mmaType, bool split, bool emulate)
      : b(b), loc(loc), W(warps), mmaType(mmaType), split(split), emulate(emulate) {}

  OpBuilder &b;
  Location loc;
  int64_t W;
  Type mmaType;
  bool split, emulate;
  // GPU
  Value tid;
  int64_t threads = 0;
  gpu::LaunchOp launch;
  Lane gpuLane;
  SmallVector<Value> regs;
  // Emulated
  memref::AllocaOp file;
  int64_t slots = 0;

  int parts() const { return split ? 2 : 1; }
  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value f32(double v) { return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v)); }

  /// The insertion point for allocations that live through the kernel.
  void atEntry(OpBuilder &at) {
    auto fn = b.getInsertionBlock()->getParentOp()->getParentOfType<FunctionOpInterface>();
    at.setInsertionPointToStart(&fn.getFunctionBody().front());
  }

  void start() {
    if (!emulate) {
      Value w = idx(32);
      gpuLane = ids(arith::DivUIOp::create(b, loc, tid, w), arith::RemUIOp::create(b, loc, tid, w));
      return;
    }
    OpBuilder at(b.getContext());
    atEntry(at);
    file = memref::AllocaOp::create(at, loc, MemRefType::get({W, 32, 1}, b.getF32Type()));
  }
  void finish() {
    if (emulate)
      file.getResult().setType(MemRefType::get({W, 32, std::max<int64_t>(slots, 1)}, b.getF32Type()));
  }

  Lane ids(Value warp, Value lane) {
    Value t = arith::RemUIOp::create(b, loc, lane, idx(4));
    return {warp, lane, arith::DivUIOp::create(b, loc, lane, idx(4)), t,
            arith::MulIOp::create(b, loc, t, idx(2))};
  }

  int64_t alloc(int64_t n) {
    int64_t s = slots;
    slots += n;
    if (!emulate)
      regs.resize(slots);
    return s;
  }

  /// `fn` on every lane of every warp.
  void lanes(function_ref<void(const Lane &)> fn) {
    if (!emulate)
      return fn(gpuLane);
    OpBuilder::InsertionGuard guard(b);
    auto warps = scf::ForOp::create(b, loc, idx(0), idx(W), idx(1));
    b.setInsertionPointToStart(warps.getBody());
    auto ls = scf::ForOp::create(b, loc, idx(0), idx(32), idx(1));
    b.setInsertionPointToStart(ls.getBody());
    fn(ids(warps.getInductionVar(), ls.getInductionVar()));
  }

  Value get(const Lane &l, int64_t s) {
    if (!emulate)
      return regs[s];
    return memref::LoadOp::create(b, loc, file, ValueRange{l.warp, l.lane, idx(s)});
  }
  void set(const Lane &l, int64_t s, Value v) {
    if (!emulate) {
      regs[s] = v;
      return;
    }
    memref::StoreOp::create(b, loc, v, file, ValueRange{l.warp, l.lane, idx(s)});
  }
  /// Register `s` of the lane `l.lane xor mask` (of the same warp).
  Value getXor(const Lane &l, int64_t s, int64_t mask) {
    if (!emulate)
      return gpu::ShuffleOp::create(b, loc, regs[s], mask, 32, gpu::ShuffleMode::XOR)
          .getShuffleResult();
    Value other = arith::XOrIOp::create(b, loc, l.lane, idx(mask));
    return memref::LoadOp::create(b, loc, file, ValueRange{l.warp, other, idx(s)});
  }
  void barrier() {
    if (!emulate)
      gpu::BarrierOp::create(b, loc);
  }
  /// Orders the memory accesses of a warp's lanes (bar.warp.sync): the emulation runs the
  /// steps one after the other.
  void warpSync() {
    if (!emulate)
      NVVM::SyncWarpOp::create(b, loc, arith::ConstantIntOp::create(b, loc, b.getI32Type(), -1));
  }
  /// A buffer shared by the block's warps: a workgroup alloca at the start of the launch's
  /// body, which spectra-launch-mapped-kernels places in the block's pool of dynamic shared
  /// memory with the tiles' buffers once every nest is lowered.
  Value shared(ArrayRef<int64_t> shape) {
    if (!emulate) {
      auto type = MemRefType::get(shape, b.getF32Type(), MemRefLayoutAttrInterface(),
                                  gpu::AddressSpaceAttr::get(b.getContext(),
                                                             gpu::AddressSpace::Workgroup));
      OpBuilder at = OpBuilder::atBlockBegin(&launch.getBody().front());
      return memref::AllocaOp::create(at, loc, type);
    }
    OpBuilder at(b.getContext());
    atEntry(at);
    return memref::AllocaOp::create(at, loc, MemRefType::get(shape, b.getF32Type()));
  }
  /// `fn` on elements [0, n) spread over the block's threads.
  void eachElement(int64_t n, function_ref<void(Value)> fn) {
    OpBuilder::InsertionGuard guard(b);
    scf::ForOp loop = emulate ? scf::ForOp::create(b, loc, idx(0), idx(n), idx(1))
                              : scf::ForOp::create(b, loc, tid, idx(n), idx(threads));
    b.setInsertionPointToStart(loop.getBody());
    fn(loop.getInductionVar());
  }

  /// x's part p in the operand type (mmaOperandPart), widened back to f32.
  Value part(Value x, int p) {
    return arith::ExtFOp::create(b, loc, b.getF32Type(), mmaOperandPart(b, loc, mmaType, x, p));
  }
  /// The fragment of `values` (register r, half h at 2 r + h), inside lanes().
  Fragment fragment(const Lane &l, ArrayRef<Value> values) {
    Fragment f;
    f.regs = values.size() / 2;
    if (!emulate) {
      for (int p = 0; p < parts(); ++p) {
        f.packed.emplace_back();
        for (int64_t r = 0; r < f.regs; ++r)
          f.packed.back().push_back(packMmaPair(b, loc, mmaType, values[2 * r], values[2 * r + 1], p));
      }
      return f;
    }
    f.slot = alloc(parts() * f.regs * 2);
    for (int p = 0; p < parts(); ++p)
      for (int64_t r = 0; r < f.regs; ++r)
        for (int64_t h = 0; h < 2; ++h)
          set(l, f.slot + (p * f.regs + r) * 2 + h, part(values[2 * r + h], p));
    return f;
  }
  /// The 8 x 8 transpose of one operand register (movmatrix.sync.aligned.m8n8.trans.b16:
  /// lane 4 g + t's pair, row g and columns 2t, 2t + 1 of an 8 x 8 matrix, becomes row g and
  /// columns 2t, 2t + 1 of its transpose).
  Value movmatrix(Value packed) {
    Type i32 = b.getI32Type(), type = packed.getType();
    Value bits = type == i32 ? packed : LLVM::BitcastOp::create(b, loc, i32, packed).getResult();
    Value moved =
        LLVM::InlineAsmOp::create(b, loc, i32, ValueRange{bits},
                                  "movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", "=r,r",
                                  /*has_side_effects=*/true, /*is_align_stack=*/false,
                                  LLVM::tailcallkind::TailCallKind::None,
                                  /*asm_dialect=*/LLVM::AsmDialectAttr(),
                                  /*operand_attrs=*/ArrayAttr())
            .getResult(0);
    return type == i32 ? moved : LLVM::BitcastOp::create(b, loc, type, moved).getResult();
  }
  /// A fragment of `regs` registers whose register r is the 8 x 8 transpose of the lanes'
  /// pairs `pair(l, r)` (in the accumulator layout: row g, columns 2t and 2t + 1 of an 8 x 8
  /// block): lane (g, t) receives elements (2t, g) and (2t + 1, g), which lanes 4 (2t) + g / 2
  /// and 4 (2t + 1) + g / 2 hold as their pair's half g % 2. On the GPU each part's packed
  /// register goes through movmatrix; emulated, each lane reads the two source lanes.
  Fragment transposed(int64_t regs, function_ref<std::pair<Value, Value>(const Lane &, int64_t)> pair) {
    Fragment f;
    f.regs = regs;
    if (!emulate) {
      f.packed.resize(parts());
      for (int64_t r = 0; r < regs; ++r) {
        auto [first, second] = pair(gpuLane, r);
        for (int p = 0; p < parts(); ++p)
          f.packed[p].push_back(movmatrix(packMmaPair(b, loc, mmaType, first, second, p)));
      }
      return f;
    }
    int64_t src = alloc(2 * regs);
    lanes([&](const Lane &l) {
      for (int64_t r = 0; r < regs; ++r) {
        auto [first, second] = pair(l, r);
        set(l, src + 2 * r, first);
        set(l, src + 2 * r + 1, second);
      }
    });
    f.slot = alloc(parts() * regs * 2);
    lanes([&](const Lane &l) {
      Value odd = arith::RemUIOp::create(b, loc, l.g, idx(2));
      Value quad = arith::DivUIOp::create(b, loc, l.g, idx(2));
      for (int64_t h = 0; h < 2; ++h) {
        Value row = arith::AddIOp::create(b, loc, l.t2, idx(h));
        Value from = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, row, idx(4)), quad);
        for (int64_t r = 0; r < regs; ++r) {
          Value at = arith::AddIOp::create(b, loc, idx(src + 2 * r), odd);
          Value v = memref::LoadOp::create(b, loc, file, ValueRange{l.warp, from, at});
          for (int p = 0; p < parts(); ++p)
            set(l, f.slot + (p * regs + r) * 2 + h, part(v, p));
        }
      }
    });
    return f;
  }
  /// D = A B + C on every warp, C and D the four registers from `c`; k = `ks`; bf16x3's three
  /// mma in mmaPartOrder.
  void mma(const Fragment &a, const Fragment &bf, int64_t c, int64_t ks) {
    if (!emulate) {
      for (auto [pa, pb] : mmaPartOrder(split))
        emitMmaSync(b, loc, mmaType, ks, a.packed[pa], bf.packed[pb],
                    MutableArrayRef<Value>(regs).slice(c, 4));
      return;
    }
    // The ISA's model (emitMmaModel) on each warp's registers in the file.
    OpBuilder::InsertionGuard guard(b);
    auto warps = scf::ForOp::create(b, loc, idx(0), idx(W), idx(1));
    b.setInsertionPointToStart(warps.getBody());
    Value w = warps.getInductionVar();
    auto at = [&](Value lane, int64_t base, Value reg, Value half) -> Value {
      Value slot = arith::AddIOp::create(
          b, loc, idx(base),
          arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, reg, idx(2)), half));
      return memref::LoadOp::create(b, loc, file, ValueRange{w, lane, slot});
    };
    auto elem = [&](Value e) { return arith::AddIOp::create(b, loc, idx(c), e).getResult(); };
    for (auto [pa, pb] : mmaPartOrder(split)) {
      auto av = [&](Value lane, Value reg, Value half) {
        return at(lane, a.slot + pa * a.regs * 2, reg, half);
      };
      auto bv = [&](Value lane, Value reg, Value half) {
        return at(lane, bf.slot + pb * bf.regs * 2, reg, half);
      };
      auto loadC = [&](Value lane, Value e) -> Value {
        return memref::LoadOp::create(b, loc, file, ValueRange{w, lane, elem(e)});
      };
      auto storeD = [&](Value v, Value lane, Value e) {
        memref::StoreOp::create(b, loc, v, file, ValueRange{w, lane, elem(e)});
      };
      emitMmaModel(b, loc, ks, {av, bv, loadC, storeD});
    }
  }
};

/// The chain's lowering, once for both executors.
class Lowering {
public:
  Lowering(Exec &x, Chain &c) : x(x), b(x.b), loc(x.loc), c(c), ntiles(c.ntiles) {}

  void run() {
    x.start();
    // Transposed, a warp's 16-feature blocks touch disjoint features: the whole chain runs
    // for one block, then the next (each block's registers dead before the next's).
    for (block16 = 0; block16 < (c.transposed ? c.cw / 16 : 1); ++block16)
      chain();
    if (!afters.empty()) {
      x.barrier();
      for (auto &after : afters)
        after();
    }
    x.finish();
  }

private:
  void chain() {
    tileSlot.clear();
    rowSlot.clear();
    // Each escaping tile is stored once the last step that reads or zeroes it is done (-1:
    // none after the first contraction and its epilogue), so its registers need not live to
    // the chain's end.
    llvm::DenseMap<Value, int64_t> lastUse;
    for (Value t : c.escaping)
      lastUse[t] = -1;
    for (auto [i, s] : llvm::enumerate(c.steps)) {
      auto use = [&](Value v) {
        if (auto it = lastUse.find(viewRoot(v)); it != lastUse.end())
          it->second = static_cast<int64_t>(i);
      };
      if (s.kind == Kind::ZeroRows)
        llvm::for_each(s.zeroTiles, use);
      else
        for (Value v : s.op->getOperands())
          if (isa<MemRefType>(v.getType()))
            use(v);
    }
    auto escapeAfter = [&](int64_t step) {
      for (Value t : c.escaping)
        if (lastUse.lookup(t) == step)
          escape(t);
    };
    X = produce(c.first, c.plan);
    if (c.epilogue)
      epilogue();
    else
      tileSlot[viewRoot(c.first.getDpsInits()[0])] = X;
    escapeAfter(-1);
    for (auto [step, s] : llvm::enumerate(c.steps)) {
      switch (s.kind) {
      case Kind::Elementwise:
        elementwise(s);
        break;
      case Kind::Reduce:
        reduce(s);
        break;
      case Kind::Contract:
        contract(s);
        break;
      case Kind::Vector:
        vector(s);
        break;
      case Kind::Block:
        block(s);
        break;
      case Kind::Produce:
        tileSlot[viewRoot(s.op.getDpsInits()[0])] = produce(s.op, s.plan);
        break;
      case Kind::ZeroRows:
        zeroRows(s);
        break;
      case Kind::ReduceRows:
        reduceRows(s);
        break;
      case Kind::ContractRows:
        contractRows(s);
        break;
      }
      escapeAfter(static_cast<int64_t>(step));
    }
  }

  /// ZeroRows: the register tiles' rows from the loop's lower bound on are 0.
  void zeroRows(Step &s) {
    x.lanes([&](const Lane &l) {
      for (Value t : s.zeroTiles) {
        int64_t slot = tileSlot.lookup(viewRoot(t));
        for (int64_t j = 0; j < ntiles; ++j)
          for (int64_t i = 0; i < 4; ++i) {
            Value keep = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, rOf(l, j, i),
                                               s.zeroFrom);
            x.set(l, slot + 4 * j + i,
                  arith::SelectOp::create(b, loc, keep, x.get(l, slot + 4 * j + i), x.f32(0)));
          }
      }
    });
  }

  /// An escaping tile, each element by the lane that holds it, to its buffer [T, M] (the
  /// nest's closing barrier orders the stores before the ops that read it).
  void escape(Value t) {
    int64_t slot = tileSlot.lookup(t);
    x.lanes([&](const Lane &l) {
      for (int64_t j = 0; j < ntiles; ++j)
        for (int64_t i = 0; i < 4; ++i) {
          Value R = rOf(l, j, i);
          storeIf(rowOk(R), x.get(l, slot + 4 * j + i), t, ValueRange{R, fOf(l, j, i)});
        }
    });
  }

  Exec &x;
  OpBuilder &b;
  Location loc;
  Chain &c;
  int64_t ntiles;
  /// Each register tile's first register (element i of mma tile j at + 4 j + i).
  llvm::DenseMap<Value, int64_t> tileSlot;
  /// Per mma row (the lane's rows g, g + 8: +0, +1): combined reductions' outputs and,
  /// transposed, per-feature vectors.
  llvm::DenseMap<Value, int64_t> rowSlot;
  SmallVector<std::function<void()>> afters;
  int64_t X = 0;
  /// Transposed: the warp's 16-feature block being lowered.
  int64_t block16 = 0;

  Value idx(int64_t v) { return x.idx(v); }
  Value add(Value a, int64_t v) {
    return v ? arith::AddIOp::create(b, loc, a, idx(v)).getResult() : a;
  }
  Value addv(Value a, Value v) { return arith::AddIOp::create(b, loc, a, v); }
  Value mul(Value a, int64_t v) { return arith::MulIOp::create(b, loc, a, idx(v)); }
  Value eq(Value a, int64_t v) {
    return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, a, idx(v));
  }
  /// The first feature of the warp's columns (split) or of its current block (transposed).
  Value featureBase(const Lane &l) { return add(mul(l.warp, c.cw), 16 * block16); }
  /// The mma row of a lane's half h (0: g, 1: g + 8).
  Value mmaRow(const Lane &l, int64_t h) { return add(l.g, 8 * h); }
  /// The mma column of element i of tile j.
  Value mmaCol(const Lane &l, int64_t j, int64_t i) { return add(l.t2, 8 * j + i % 2); }
  /// The kernel row R and the feature F of element i of tile j.
  Value rOf(const Lane &l, int64_t j, int64_t i) {
    return c.transposed ? mmaCol(l, j, i) : mmaRow(l, i / 2);
  }
  Value fOf(const Lane &l, int64_t j, int64_t i) {
    Value base = featureBase(l);
    return addv(base, c.transposed ? mmaRow(l, i / 2) : mmaCol(l, j, i));
  }
  Value below(Value i, int64_t n) {
    return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, i, idx(n));
  }
  Value both(Value p, Value q) {
    if (!p)
      return q;
    if (!q)
      return p;
    return arith::AndIOp::create(b, loc, p, q);
  }
  /// Kernel row `r` is a real row (not padding of the mma's 16 rows or 8-column tiles), or
  /// null if every row is.
  Value rowOk(Value r) {
    int64_t padded = c.transposed ? 8 * ntiles : 16;
    return c.T < padded ? below(r, c.T) : Value();
  }
  /// `mem` at `at`, 0 where `ok` is false.
  Value load(Value mem, ValueRange at, Value ok) { return loadIf(b, loc, mem, at, ok); }
  /// `fn` where `ok` holds (always if null).
  void where(Value ok, function_ref<void()> fn) {
    if (!ok)
      return fn();
    auto branch = scf::IfOp::create(b, loc, ok, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(branch.thenBlock()->getTerminator());
    fn();
  }
  void storeIf(Value ok, Value v, Value mem, ValueRange at) {
    where(ok, [&] { memref::StoreOp::create(b, loc, v, mem, at); });
  }
  /// The indices of an operand (map over loop dims) with `dim` -> value.
  SmallVector<Value> indices(AffineMap map, ArrayRef<std::pair<unsigned, Value>> dims) {
    SmallVector<Value> at;
    for (unsigned d : dimsOf(map))
      for (auto [dim, v] : dims)
        if (d == dim)
          at.push_back(v);
    return at;
  }

  /// Clones `g`'s body with each used block argument from `arg` (by operand number).
  IRMapping body(linalg::GenericOp g, function_ref<Value(unsigned)> arg) {
    Block &blk = g.getRegion().front();
    IRMapping map;
    for (BlockArgument a : blk.getArguments())
      if (!a.use_empty())
        map.map(a, arg(a.getArgNumber()));
    for (Operation &inner : blk.without_terminator())
      b.clone(inner, map);
    return map;
  }

  /// The value of input `operand` of a tile op (loop dims rowDim = R, colDim = F) at
  /// element (j, i) of lane `l`.
  Value input(const Lane &l, linalg::GenericOp g, OpOperand &operand, unsigned rowDim,
              unsigned colDim, int64_t j, int64_t i) {
    Value r = viewRoot(operand.get());
    if (auto it = tileSlot.find(r); it != tileSlot.end())
      return x.get(l, it->second + 4 * j + i);
    if (auto it = rowSlot.find(r); it != rowSlot.end())
      return x.get(l, it->second + i / 2);
    AffineMap map = g.getMatchingIndexingMap(&operand);
    Value R = rOf(l, j, i);
    SmallVector<Value> at = indices(map, {{rowDim, R}, {colDim, fOf(l, j, i)}});
    return load(operand.get(), at, llvm::is_contained(dimsOf(map), rowDim) ? rowOk(R) : Value());
  }

  /// A contraction X[T, M] = A B from operands in memory (the first, a Produce step) into
  /// new register tiles laid out as the chain's: their first slot.
  int64_t produce(linalg::GenericOp g, const MmaPlan &plan) {
    int64_t ks = plan.kStep, K = g.getStaticLoopRanges()[2];
    OpOperand &A = g->getOpOperand(plan.aInput), &B = g->getOpOperand(1 - plan.aInput);
    AffineMap mapA = g.getMatchingIndexingMap(&A), mapB = g.getMatchingIndexingMap(&B);
    int64_t X = x.alloc(4 * ntiles);
    x.lanes([&](const Lane &l) {
      for (int64_t e = 0; e < 4 * ntiles; ++e)
        x.set(l, X + e, x.f32(0));
    });
    auto kOk = [&](Value k) { return K % ks ? below(k, K) : Value(); };
    // The kernel coordinate of an mma row (A) or column (B) and whether it is real.
    auto coord = [&](const Lane &l, Value mma, bool isRow) -> std::pair<Value, Value> {
      bool isR = isRow != c.transposed;  // split: the mma's rows are R
      if (isR)
        return {mma, rowOk(mma)};
      return {addv(featureBase(l), mma), Value()};
    };
    for (int64_t k0 = 0; k0 < K; k0 += ks) {
      Fragment a;
      x.lanes([&](const Lane &l) {
        SmallVector<Value> vals;
        for (int64_t r = 0; r < ks / 4; ++r)
          for (int64_t h = 0; h < 2; ++h) {
            auto [m, ok] = coord(l, mmaRow(l, ks == 16 ? r % 2 : r), true);
            Value k = add(l.t2, k0 + (ks == 16 ? 8 * (r / 2) : 0) + h);
            vals.push_back(load(A.get(), indices(mapA, {{plan.mDim, m}, {2, k}}), both(ok, kOk(k))));
          }
        a = x.fragment(l, vals);
      });
      for (int64_t j = 0; j < ntiles; ++j) {
        Fragment bf;
        x.lanes([&](const Lane &l) {
          SmallVector<Value> vals;
          auto [n, ok] = coord(l, add(l.g, 8 * j), false);
          for (int64_t r = 0; r < ks / 8; ++r)
            for (int64_t h = 0; h < 2; ++h) {
              Value k = add(l.t2, k0 + 8 * r + h);
              vals.push_back(load(B.get(), indices(mapB, {{plan.nDim, n}, {2, k}}), both(ok, kOk(k))));
            }
          bf = x.fragment(l, vals);
        });
        x.mma(a, bf, X + 4 * j, ks);
      }
    }
    return X;
  }

  /// An elementwise tile op's outputs (E's included) as new register tiles.
  void elementwiseOn(linalg::GenericOp g, function_ref<Value(const Lane &, OpOperand &, int64_t, int64_t)> in) {
    unsigned numIns = g.getNumDpsInputs();
    SmallVector<int64_t> out;
    for (unsigned o = 0; o < g.getNumDpsInits(); ++o)
      out.push_back(x.alloc(4 * ntiles));
    x.lanes([&](const Lane &l) {
      for (int64_t j = 0; j < ntiles; ++j)
        for (int64_t i = 0; i < 4; ++i) {
          IRMapping map = body(g, [&](unsigned k) -> Value {
            OpOperand &operand = g->getOpOperand(k);
            if (k >= numIns) {
              auto it = tileSlot.find(viewRoot(operand.get()));
              return it != tileSlot.end() ? x.get(l, it->second + 4 * j + i) : x.f32(0);
            }
            return in(l, operand, j, i);
          });
          Operation *yield = g.getRegion().front().getTerminator();
          for (unsigned o = 0; o < out.size(); ++o)
            x.set(l, out[o] + 4 * j + i, map.lookupOrDefault(yield->getOperand(o)));
        }
    });
    for (unsigned o = 0; o < out.size(); ++o)
      tileSlot[viewRoot(g.getDpsInits()[o])] = out[o];
  }

  void epilogue() {
    Epilogue &e = *c.epilogue;
    // E's loop dims are the first contraction's 0 (R) and 1 (F).
    elementwiseOn(e.op, [&](const Lane &l, OpOperand &operand, int64_t j, int64_t i) {
      if (operand.getOperandNumber() == e.input)
        return x.get(l, X + 4 * j + i);
      return input(l, e.op, operand, 0, 1, j, i);
    });
  }

  void elementwise(Step &s) {
    elementwiseOn(s.op, [&](const Lane &l, OpOperand &operand, int64_t j, int64_t i) {
      return input(l, s.op, operand, s.rowDim, s.colDim, j, i);
    });
  }

  /// Two partials of a reduction combined (a subf's terms are summed).
  Value combine(Operation *comb, Value p, Value q) {
    if (isa<arith::MaximumFOp>(comb))
      return arith::MaximumFOp::create(b, loc, p, q);
    return arith::AddFOp::create(b, loc, p, q);
  }
  /// A reduction's output combined with the total of its terms.
  Value combineOut(Operation *comb, Value out, Value total) {
    if (isa<arith::SubFOp>(comb))
      return arith::SubFOp::create(b, loc, out, total);
    return combine(comb, out, total);
  }

  /// Folds `count` registers from `from` across the lanes, one shuffle step per mask (the
  /// register e's (+) `combinerOf(e)`): the slot the folded registers end in.
  int64_t foldLanes(int64_t from, int64_t count, ArrayRef<int64_t> masks,
                    function_ref<Operation *(int64_t)> combinerOf) {
    for (int64_t mask : masks) {
      int64_t to = x.alloc(count);
      x.lanes([&](const Lane &l) {
        for (int64_t e = 0; e < count; ++e)
          x.set(l, to + e, combine(combinerOf(e), x.get(l, from + e), x.getXor(l, from + e, mask)));
      });
      from = to;
    }
    return from;
  }

  /// The accumulators Z (element i of column tile jn at Z + 4 jn + i) of C rows that are the
  /// warp's own features (feature featureBase + `rowOffset` + the mma row), loaded from `out`
  /// or stored to it, each element by the lane that holds it.
  void ownRows(Value out, AffineMap outMap, unsigned mDim, unsigned nDim, int64_t N, int64_t Z,
               int64_t rowOffset, bool store) {
    x.lanes([&](const Lane &l) {
      for (int64_t jn = 0; jn < (N + 7) / 8; ++jn)
        for (int64_t i = 0; i < 4; ++i) {
          Value f = addv(featureBase(l), add(mmaRow(l, i / 2), rowOffset)), n = mmaCol(l, jn, i);
          SmallVector<Value> at = indices(outMap, {{mDim, f}, {nDim, n}});
          Value ok = N % 8 ? below(n, N) : Value();
          if (store)
            storeIf(ok, x.get(l, Z + 4 * jn + i), out, at);
          else
            x.set(l, Z + 4 * jn + i, load(out, at, ok));
        }
    });
  }

  void reduce(Step &s) {
    linalg::GenericOp g = s.op;
    unsigned numIns = g.getNumDpsInputs(), n = g.getNumDpsInits();
    // A lane's partial per output and mma row (g, g + 8) over its columns (the padding
    // columns of a transposed tile left out), then the quad's (xor 1, xor 2).
    int64_t own = x.alloc(2 * n);
    x.lanes([&](const Lane &l) {
      SmallVector<Value> acc(2 * n);
      for (int64_t j = 0; j < ntiles; ++j)
        for (int64_t i = 0; i < 4; ++i) {
          IRMapping map = body(g, [&](unsigned k) -> Value {
            if (k >= numIns)
              return x.f32(0);  // only the (+) reads it, and the (+) is not used
            return input(l, g, g->getOpOperand(k), s.rowDim, s.colDim, j, i);
          });
          Value real = c.transposed ? rowOk(rOf(l, j, i)) : Value();
          for (unsigned o = 0; o < n; ++o) {
            Value term = map.lookupOrDefault(s.terms[o]);
            Value &a = acc[2 * o + i / 2];
            if (!real) {
              a = a ? combine(s.combiners[o], a, term) : term;
              continue;
            }
            // Padding columns are left out: the fold starts at the (+)'s identity.
            if (!a)
              a = x.f32(isa<arith::MaximumFOp>(s.combiners[o]) ? -INFINITY : 0.0);
            a = arith::SelectOp::create(b, loc, real, combine(s.combiners[o], a, term), a);
          }
        }
      for (unsigned e = 0; e < 2 * n; ++e)
        x.set(l, own + e, acc[e]);
    });
    int64_t quad = foldLanes(own, 2 * n, {1, 2}, [&](int64_t e) { return s.combiners[e / 2]; });
    if (c.transposed)
      return reduceOwnRows(s, quad);
    for (unsigned o = 0; o < n; ++o) {
      Value out = g.getDpsInits()[o];
      Operation *comb = s.combiners[o];
      Value partials = x.shared({c.W, 16});
      x.lanes([&](const Lane &l) {
        for (int64_t h = 0; h < 2; ++h)
          storeIf(eq(l.t, 0), x.get(l, quad + 2 * o + h), partials, ValueRange{l.warp, mmaRow(l, h)});
      });
      if (!s.combined[o]) {
        // Summed over the warps once the chain is done.
        afters.push_back([this, out, comb, partials] {
          x.eachElement(c.T, [&](Value e) {
            Value v = memref::LoadOp::create(b, loc, out, ValueRange{e});
            for (int64_t w = 0; w < c.W; ++w)
              v = combine(comb, v, memref::LoadOp::create(b, loc, partials, ValueRange{idx(w), e}));
            memref::StoreOp::create(b, loc, v, out, ValueRange{e});
          });
        });
        continue;
      }
      // Read later in the chain: every lane combines the warps' partials for its rows now.
      x.barrier();
      int64_t slot = x.alloc(2);
      x.lanes([&](const Lane &l) {
        for (int64_t h = 0; h < 2; ++h) {
          Value r = mmaRow(l, h);
          Value v = load(out, ValueRange{r}, rowOk(r));
          for (int64_t w = 0; w < c.W; ++w)
            v = combine(comb, v, memref::LoadOp::create(b, loc, partials, ValueRange{idx(w), r}));
          x.set(l, slot + h, v);
        }
      });
      rowSlot[viewRoot(out)] = slot;
      // Stored once every warp has read the initial value (after the chain's last barrier).
      afters.push_back([this, out, slot] {
        x.lanes([&](const Lane &l) {
          Value owner = both(eq(l.warp, 0), eq(l.t, 0));
          for (int64_t h = 0; h < 2; ++h) {
            Value r = mmaRow(l, h);
            storeIf(both(owner, rowOk(r)), x.get(l, slot + h), out, ValueRange{r});
          }
        });
      });
    }
  }

  /// Transposed: stores the lanes' per-feature registers `slot` (+0, +1) to `mem` at
  /// `at(lane, feature)`, by one lane of each quad, once every lane has read what the step
  /// read (a step that updates a vector in place reads it in every lane of the quad): in a
  /// step of their own, after bar.warp.sync on the GPU (lanes may run apart).
  void storeRows(Value mem, function_ref<SmallVector<Value>(const Lane &, Value)> at, int64_t slot) {
    x.warpSync();
    x.lanes([&](const Lane &l) {
      for (int64_t h = 0; h < 2; ++h) {
        Value f = addv(featureBase(l), mmaRow(l, h));
        storeIf(eq(l.t, 0), x.get(l, slot + h), mem, at(l, f));
      }
    });
  }

  /// Transposed: each output's feature rows are the warp's own: the quad's value combined
  /// with the output's (its registers, or memory), kept in registers and stored.
  void reduceOwnRows(Step &s, int64_t quad) {
    linalg::GenericOp g = s.op;
    for (unsigned o = 0; o < g.getNumDpsInits(); ++o) {
      Value out = g.getDpsInits()[o];
      auto old = rowSlot.find(viewRoot(out));
      std::optional<int64_t> from;
      if (old != rowSlot.end())
        from = old->second;
      int64_t slot = x.alloc(2);
      x.lanes([&](const Lane &l) {
        for (int64_t h = 0; h < 2; ++h) {
          Value f = addv(featureBase(l), mmaRow(l, h));
          Value v = from ? x.get(l, *from + h) : memref::LoadOp::create(b, loc, out, ValueRange{f}).getResult();
          x.set(l, slot + h, combine(s.combiners[o], v, x.get(l, quad + 2 * o + h)));
        }
      });
      storeRows(out, [&](const Lane &l, Value f) { return SmallVector<Value>{f}; }, slot);
      rowSlot[viewRoot(out)] = slot;
    }
  }

  /// Transposed: a per-feature op on [M] vectors, for the lane's two features.
  void vector(Step &s) {
    linalg::GenericOp g = s.op;
    unsigned numIns = g.getNumDpsInputs();
    SmallVector<int64_t> out;
    for (unsigned o = 0; o < g.getNumDpsInits(); ++o)
      out.push_back(x.alloc(2));
    x.lanes([&](const Lane &l) {
      for (int64_t h = 0; h < 2; ++h) {
        Value f = addv(featureBase(l), mmaRow(l, h));
        IRMapping map = body(g, [&](unsigned k) -> Value {
          OpOperand &operand = g->getOpOperand(k);
          if (auto it = rowSlot.find(viewRoot(operand.get())); it != rowSlot.end())
            return x.get(l, it->second + h);
          return memref::LoadOp::create(b, loc, operand.get(),
                                        indices(g.getMatchingIndexingMap(&operand), {{0, f}}));
        });
        Operation *yield = g.getRegion().front().getTerminator();
        for (unsigned o = 0; o < out.size(); ++o)
          x.set(l, out[o] + h, map.lookupOrDefault(yield->getOperand(o)));
      }
    });
    for (unsigned o = 0; o < out.size(); ++o) {
      OpOperand &init = g->getOpOperand(numIns + o);
      AffineMap map = g.getMatchingIndexingMap(&init);
      storeRows(init.get(), [&](const Lane &, Value f) { return indices(map, {{0, f}}); }, out[o]);
      rowSlot[viewRoot(init.get())] = out[o];
    }
  }

  /// Transposed: a per-feature op on [M, X] rows, each element by the lane whose mma
  /// accumulator it is (the contraction that writes these rows next reads them there).
  void block(Step &s) {
    linalg::GenericOp g = s.op;
    unsigned numIns = g.getNumDpsInputs();
    int64_t cols = g.getStaticLoopRanges()[1], nx = (cols + 7) / 8;
    x.lanes([&](const Lane &l) {
      for (int64_t jx = 0; jx < nx; ++jx)
        for (int64_t i = 0; i < 4; ++i) {
          Value f = addv(featureBase(l), mmaRow(l, i / 2)), col = mmaCol(l, jx, i);
          where(cols % 8 ? below(col, cols) : Value(), [&] {
            IRMapping map = body(g, [&](unsigned k) -> Value {
              OpOperand &operand = g->getOpOperand(k);
              if (auto it = rowSlot.find(viewRoot(operand.get())); it != rowSlot.end())
                return x.get(l, it->second + i / 2);
              return memref::LoadOp::create(b, loc, operand.get(),
                                            indices(g.getMatchingIndexingMap(&operand), {{0, f}, {1, col}}));
            });
            Operation *yield = g.getRegion().front().getTerminator();
            for (unsigned o = 0; o < g.getNumDpsInits(); ++o) {
              OpOperand &init = g->getOpOperand(numIns + o);
              memref::StoreOp::create(b, loc, map.lookupOrDefault(yield->getOperand(o)), init.get(),
                                      indices(g.getMatchingIndexingMap(&init), {{0, f}, {1, col}}));
            }
          });
        }
    });
  }

  /// Split, a reduction over the tile's rows into per-feature outputs: a lane folds its two
  /// rows (g, g + 8; the mma's padding rows left out), then the lanes of its column (shuffles
  /// xor 4, 8, 16); lane t of group 0 combines the column's total with the output. The
  /// features are the warp's own: no other warp touches them.
  void reduceRows(Step &s) {
    linalg::GenericOp g = s.op;
    unsigned numIns = g.getNumDpsInputs(), n = g.getNumDpsInits();
    // Per output, tile and column parity (element i % 2).
    int64_t per = 2 * ntiles, own = x.alloc(n * per);
    x.lanes([&](const Lane &l) {
      SmallVector<Value> acc(n * per);
      for (int64_t j = 0; j < ntiles; ++j)
        for (int64_t i = 0; i < 4; ++i) {
          IRMapping map = body(g, [&](unsigned k) -> Value {
            if (k >= numIns)
              return x.f32(0);  // only the (+) reads it, and the (+) is not used
            return input(l, g, g->getOpOperand(k), s.rowDim, s.colDim, j, i);
          });
          Value real = rowOk(rOf(l, j, i));
          for (unsigned o = 0; o < n; ++o) {
            Value term = map.lookupOrDefault(s.terms[o]);
            Value &a = acc[o * per + 2 * j + i % 2];
            if (real) {
              Value identity = x.f32(isa<arith::MaximumFOp>(s.combiners[o]) ? -INFINITY : 0.0);
              term = arith::SelectOp::create(b, loc, real, term, identity);
            }
            a = a ? combine(s.combiners[o], a, term) : term;
          }
        }
      for (int64_t e = 0; e < n * per; ++e)
        x.set(l, own + e, acc[e]);
    });
    int64_t from =
        foldLanes(own, n * per, {4, 8, 16}, [&](int64_t e) { return s.combiners[e / per]; });
    x.lanes([&](const Lane &l) {
      Value owner = eq(l.g, 0);
      for (unsigned o = 0; o < n; ++o) {
        Value out = g.getDpsInits()[o];
        for (int64_t j = 0; j < ntiles; ++j)
          for (int64_t i = 0; i < 2; ++i) {
            Value f = fOf(l, j, i);
            where(owner, [&] {
              Value v = memref::LoadOp::create(b, loc, out, ValueRange{f});
              memref::StoreOp::create(b, loc,
                                      combineOut(s.combiners[o], v, x.get(l, from + o * per + 2 * j + i)),
                                      out, ValueRange{f});
            });
          }
      }
    });
  }

  /// For each 8-column tile jn of B's N columns: B's fragment (register r, half h at mma row
  /// k = 2t + 8 r + h + k0, its kernel index and whether it is real from `kAt`; column g) read
  /// from memory, and the mma of `a` with it into the accumulators Z + 4 jn.
  void mmaWithB(const Fragment &a, OpOperand &Bop, unsigned kDim, unsigned nDim, int64_t N,
                int64_t k0, int64_t ks, int64_t Z,
                function_ref<std::pair<Value, Value>(const Lane &, Value)> kAt) {
    AffineMap mapB = cast<linalg::GenericOp>(Bop.getOwner()).getMatchingIndexingMap(&Bop);
    for (int64_t jn = 0; jn < (N + 7) / 8; ++jn) {
      Fragment bf;
      x.lanes([&](const Lane &l) {
        SmallVector<Value> vals;
        Value n = add(l.g, 8 * jn);
        Value nOk = N % 8 ? below(n, N) : Value();
        for (int64_t r = 0; r < ks / 8; ++r)
          for (int64_t h = 0; h < 2; ++h) {
            auto [k, kOk] = kAt(l, add(l.t2, k0 + 8 * r + h));
            vals.push_back(load(Bop.get(), indices(mapB, {{kDim, k}, {nDim, n}}), both(nOk, kOk)));
          }
        bf = x.fragment(l, vals);
      });
      x.mma(a, bf, Z + 4 * jn, ks);
    }
  }

  /// Split, C[F, n] += tile[R, F]^T B[R, n] over the tile's rows: per 16-feature block of the
  /// warp's own, A is the tile's accumulator tiles 2 b and 2 b + 1 transposed (Exec::transposed),
  /// B is read from memory, C accumulated where it is (the block's rows are the warp's).
  void contractRows(Step &s) {
    linalg::GenericOp g = s.op;
    OpOperand &Bop = g->getOpOperand(1 - s.plan.aInput);
    int64_t t0 = tileSlot.lookup(viewRoot(g.getDpsInputs()[s.plan.aInput]));
    int64_t N = g.getStaticLoopRanges()[s.plan.nDim], nn = (N + 7) / 8, ks = s.plan.kStep;
    Value out = g.getDpsInits()[0];
    AffineMap outMap = g.getMatchingIndexingMap(g.getDpsInitOperand(0));
    unsigned mDim = s.plan.mDim, nDim = s.plan.nDim, kDim = s.plan.kDim;
    for (int64_t blk = 0; blk < c.cw / 16; ++blk) {
      int64_t Z = x.alloc(4 * nn);
      ownRows(out, outMap, mDim, nDim, N, Z, 16 * blk, /*store=*/false);
      // A register r (k16: rows g + 8 (r % 2), columns 2t + 8 (r / 2); k8: rows g + 8 r) is
      // the transpose of the 8 x 8 block of rows R in [8 rb, 8 rb + 8) of accumulator tile j
      // (the lane's elements 2 rb, 2 rb + 1; the mma's padding rows past T as 0).
      Fragment a = x.transposed(ks / 4, [&](const Lane &l, int64_t r) -> std::pair<Value, Value> {
        int64_t j = 2 * blk + (ks == 16 ? r % 2 : r), rb = ks == 16 ? r / 2 : 0;
        Value real = rowOk(mmaRow(l, rb));
        auto elem = [&](int64_t i) {
          Value v = x.get(l, t0 + 4 * j + 2 * rb + i);
          return real ? arith::SelectOp::create(b, loc, real, v, x.f32(0)).getResult() : v;
        };
        return {elem(0), elem(1)};
      });
      mmaWithB(a, Bop, kDim, nDim, N, /*k0=*/0, ks, Z,
               [&](const Lane &, Value k) { return std::pair(k, rowOk(k)); });
      ownRows(out, outMap, mDim, nDim, N, Z, 16 * blk, /*store=*/true);
    }
  }

  void contract(Step &s) {
    linalg::GenericOp g = s.op;
    OpOperand &Bop = g->getOpOperand(1 - s.plan.aInput);
    int64_t t0 = tileSlot.lookup(viewRoot(g.getDpsInputs()[s.plan.aInput]));
    int64_t N = g.getStaticLoopRanges()[s.plan.nDim], nn = (N + 7) / 8, ks = c.ks2;
    int64_t kRange = c.transposed ? 8 * ntiles : c.cw;
    Value out = g.getDpsInits()[0];
    AffineMap outMap = g.getMatchingIndexingMap(g.getDpsInitOperand(0));
    unsigned mDim = s.plan.mDim, nDim = s.plan.nDim, kDim = s.plan.kDim;
    auto nOk = [&](Value n) { return N % 8 ? below(n, N) : Value(); };
    int64_t Z = x.alloc(4 * nn);
    if (c.transposed) {
      // The warp's own feature rows: accumulated where they are.
      ownRows(out, outMap, mDim, nDim, N, Z, 0, /*store=*/false);
    } else {
      x.lanes([&](const Lane &l) {
        for (int64_t e = 0; e < 4 * nn; ++e)
          x.set(l, Z + e, x.f32(0));
      });
    }
    for (int64_t k0 = 0; k0 < kRange; k0 += ks) {
      Fragment a;
      // The accumulators of the tile's 8-column mma tiles are this step's A registers
      // (transposed, the padding rows past T read as 0).
      x.lanes([&](const Lane &l) {
        SmallVector<Value> vals;
        for (int64_t r = 0; r < ks / 4; ++r)
          for (int64_t h = 0; h < 2; ++h) {
            int64_t j = ks == 16 ? k0 / 8 + r / 2 : k0 / 8;
            int64_t i = ks == 16 ? 2 * (r % 2) + h : 2 * r + h;
            Value v = x.get(l, t0 + 4 * j + i);
            if (Value real = c.transposed ? rowOk(rOf(l, j, i)) : Value())
              v = arith::SelectOp::create(b, loc, real, v, x.f32(0));
            vals.push_back(v);
          }
        a = x.fragment(l, vals);
      });
      mmaWithB(a, Bop, kDim, nDim, N, k0, ks, Z, [&](const Lane &l, Value kLocal) {
        if (c.transposed)
          return std::pair(kLocal, rowOk(kLocal));
        return std::pair(addv(featureBase(l), kLocal), Value());
      });
    }
    if (c.transposed)
      return ownRows(out, outMap, mDim, nDim, N, Z, 0, /*store=*/true);
    // The warps' partial products, summed in warp order once the chain is done.
    Value partials = x.shared({c.W, 16, N});
    x.lanes([&](const Lane &l) {
      for (int64_t jn = 0; jn < nn; ++jn)
        for (int64_t i = 0; i < 4; ++i) {
          Value n = mmaCol(l, jn, i);
          storeIf(nOk(n), x.get(l, Z + 4 * jn + i), partials, ValueRange{l.warp, mmaRow(l, i / 2), n});
        }
    });
    afters.push_back([this, out, outMap, mDim, nDim, partials, N] {
      x.eachElement(c.T * N, [&](Value e) {
        Value r = arith::DivUIOp::create(b, loc, e, idx(N));
        Value n = arith::RemUIOp::create(b, loc, e, idx(N));
        SmallVector<Value> at = indices(outMap, {{mDim, r}, {nDim, n}});
        Value v = memref::LoadOp::create(b, loc, out, at);
        for (int64_t w = 0; w < c.W; ++w)
          v = arith::AddFOp::create(b, loc, v,
                                    memref::LoadOp::create(b, loc, partials, ValueRange{idx(w), r, n}));
        memref::StoreOp::create(b, loc, v, out, at);
      });
    });
  }
};

/// The chain held by a chain nest, re-derived from its ops.
FailureOr<Chain> chainOf(scf::ForallOp nest, StringRef pass) {
  linalg::GenericOp first;
  for (Operation &op : nest.getBody()->without_terminator())
    if ((first = dyn_cast<linalg::GenericOp>(op)))
      break;
  std::optional<int64_t> warps = getConstantIntValue(nest.getMixedUpperBound()[0]);
  auto attr = nest->getAttrOfType<DictionaryAttr>(kWarpChainAttr);
  auto transposed = attr ? attr.getAs<BoolAttr>("transposed") : nullptr;
  std::optional<Chain> c = first && warps && transposed
                               ? analyze(first, *warps, transposed.getValue(), nullptr)
                               : std::nullopt;
  if (!c)
    return nest.emitOpError(pass) << ": a spectra.warp_chain nest (type, split, transposed) "
                                     "must hold a contraction, its epilogue and the ops that "
                                     "read its register tiles";
  return *c;
}

/// The chain at `first` (split, else transposed; one whose tiles all stay in registers
/// first), of at most `maxSteps` steps, if any.
std::optional<Chain> chainAt(linalg::GenericOp first, int64_t W, Operation *zeroFill,
                             int64_t maxSteps = -1,
                             const llvm::SmallPtrSet<Operation *, 4> *exclude = nullptr) {
  std::optional<Chain> c = analyze(first, W, /*transposed=*/false, zeroFill, maxSteps, exclude);
  if (c && c->escaping.empty())
    return c;
  std::optional<Chain> t = analyze(first, W, /*transposed=*/true, zeroFill, maxSteps, exclude);
  if (t && (!c || t->escaping.empty()))
    return t;
  return c;
}

/// The workgroup bytes of the warps' partials: split, a [W][16] row per reduction output and
/// a [W][16][N] product per contraction; transposed, none (each warp writes its own rows).
int64_t partialBytes(const Chain &c) {
  int64_t bytes = 0;
  for (Step s : c.steps) {
    if (c.transposed)
      break;
    // Each partial a buffer of the pool, padded as the pool places it (these sizes are
    // multiples of 16 already).
    if (s.kind == Kind::Reduce)
      bytes += s.op.getNumDpsInits() * llvm::alignTo(c.W * 16 * 4, kSharedPoolAlignment);
    if (s.kind == Kind::Contract)
      bytes += llvm::alignTo(c.W * 16 * s.op.getStaticLoopRanges()[s.plan.nDim] * 4,
                             kSharedPoolAlignment);
  }
  return bytes;
}

/// What mapping the chain changes in the block's workgroup bytes: the partials in, the
/// register tiles out.
int64_t sharedBytesChange(const Chain &c) {
  int64_t bytes = partialBytes(c);
  for (Value t : c.tiles)
    if (!c.escaping.contains(t))
      bytes -= sharedPoolBytes(cast<MemRefType>(t.getType()));
  return bytes;
}

/// The f32 values a lane may hold in a chain's register tiles: with the fragments and the
/// indices, what keeps a chain within the 128 registers that two blocks of 256 threads
/// leave each thread (the backward chains at m = 256 would hold 80 and spill).
constexpr int64_t kChainTileValues = 64;
/// The same in the causal set's kernels, which hold their recurrence's state and flags
/// beside a chain: PosRF's causal key backward formed a chain of 32 values (the logits and
/// the features' gradient, 8 rows, for one elementwise op) once no column sum took the
/// gradient of its constant coefficient, and spilled at 128 registers where it did not
/// without the chain (ptxas, bf16: 56 B on sm_80 against 0, 200 B on sm_90a against 88).
/// No causal_* kernel forms a chain within it at the heads tested (d = 32, 64); the causal
/// set's kv is the bidirectional kv (kind "kv", under kChainTileValues) and keeps its chain.
constexpr int64_t kCausalChainTileValues = 24;

/// The f32 values a lane holds at once in a chain's registers, as kChainTileValues counts
/// them: its register tiles, and beside them the accumulators of the widest step over the
/// rows (a contraction's C[F, n] for one 16-feature block, a column reduction's partials).
int64_t chainValues(const Chain &c) {
  int64_t values = static_cast<int64_t>(c.tiles.size()) * 4 * c.ntiles, acc = 0;
  for (const Step &s : c.steps) {
    linalg::GenericOp op = s.op;
    if (s.kind == Kind::ContractRows)
      acc = std::max(acc, 4 * ((op.getStaticLoopRanges()[s.plan.nDim] + 7) / 8));
    if (s.kind == Kind::ReduceRows)
      acc = std::max<int64_t>(acc, op.getNumDpsInits() * 2 * c.ntiles);
  }
  return values + acc;
}

/// The longest chain at `first` whose workgroup bytes, with `sharedBytes` already taken,
/// fit `sharedLimit`, and whose register tiles fit kChainTileValues (kCausalChainTileValues in
/// the causal set; a chain cut short of a step stores the tiles that step read).
std::optional<Chain> fittingChainAt(linalg::GenericOp first, int64_t W, Operation *zeroFill,
                                    int64_t sharedBytes, int64_t sharedLimit) {
  llvm::SmallPtrSet<Operation *, 4> exclude;
  int64_t maxSteps = -1;
  std::optional<Chain> c = chainAt(first, W, zeroFill, maxSteps, &exclude);
  // A split contraction over the features (its warps' partials summed through shared
  // memory) runs after the chain instead (deferred, its tile stored) where the chain keeps
  // a contraction without it: beside the backward chains' tiles its accumulators take the
  // kernels past 128 registers (SADERF's query backward spilled 72 bytes), and its
  // partials, 16 KiB at dv = 32, double the kernel's shared memory.
  auto deferContracts = [&] {
    if (!zeroFill || !c || c->transposed)
      return;
    SmallVector<Operation *> contracts;
    for (const Step &s : c->steps)
      if (s.kind == Kind::Contract)
        contracts.push_back(s.op);
    for (Operation *op : contracts) {
      // Taken where the chain keeps its layout and every other step (a deferral that fails
      // cuts the chain at the contraction instead).
      exclude.insert(op);
      std::optional<Chain> without = chainAt(first, W, zeroFill, maxSteps, &exclude);
      if (without && !without->transposed && without->steps.size() + 1 >= c->steps.size())
        c = without;
      else
        exclude.erase(op);
    }
  };
  deferContracts();
  auto fn = first->getParentOfType<func::FuncOp>();
  auto kind = fn ? fn->getAttrOfType<StringAttr>(kKernelKindAttr) : StringAttr();
  const int64_t values = kind && kind.getValue().starts_with("causal_") ? kCausalChainTileValues
                                                                        : kChainTileValues;
  auto fits = [&](const Chain &ch) {
    return sharedBytes + sharedBytesChange(ch) <= sharedLimit && chainValues(ch) <= values;
  };
  while (c && !fits(*c)) {
    if (c->steps.empty())
      return std::nullopt;
    maxSteps = static_cast<int64_t>(c->steps.size()) - 1;
    c = chainAt(first, W, zeroFill, maxSteps, &exclude);
    deferContracts();  // a shorter chain may reach a contraction the longer one deferred
  }
  return c;
}

struct ChainType {
  Type mmaType;
  bool split = false;
};

FailureOr<ChainType> chainType(scf::ForallOp nest, StringRef pass) {
  auto attr = nest->getAttrOfType<DictionaryAttr>(kWarpChainAttr);
  auto type = attr ? attr.getAs<TypeAttr>("type") : nullptr;
  auto split = attr ? attr.getAs<BoolAttr>("split") : nullptr;
  if (!type || !split || !(type.getValue().isBF16() || type.getValue().isF16()))
    return nest.emitOpError(pass) << ": spectra.warp_chain needs type (bf16 or f16) and split";
  return ChainType{type.getValue(), split.getValue()};
}

} // namespace

std::optional<WarpChainMapping> mlir::spectra::mapWarpChain(linalg::GenericOp first,
                                                            int64_t threads, Type mmaType,
                                                            bool split, StringRef nestAttr,
                                                            int64_t sharedBytes,
                                                            int64_t sharedLimit) {
  if (threads % 32 != 0 || !mmaType)
    return std::nullopt;
  linalg::FillOp zero = zeroFillBefore(first);
  std::optional<Chain> c =
      zero ? fittingChainAt(first, threads / 32, zero, sharedBytes, sharedLimit) : std::nullopt;
  if (!c)
    return std::nullopt;
  int64_t W = c->W;
  WarpChainMapping m;
  m.partialBytes = partialBytes(*c);
  for (Value t : c->tiles)
    if (!c->escaping.contains(t))
      m.registerTiles.push_back(t);
  m.ops = c->ops();
  Operation *last = m.ops.back();
  OpBuilder b(last->getContext());
  b.setInsertionPointAfter(last);
  Location loc = first.getLoc();
  auto nest = scf::ForallOp::create(
      b, loc, ArrayRef<OpFoldResult>{b.getIndexAttr(W)}, ValueRange{},
      b.getArrayAttr({gpu::GPUWarpMappingAttr::get(b.getContext(), gpu::MappingId::DimX)}));
  nest->setAttr(nestAttr, b.getUnitAttr());
  nest->setAttr(kWarpChainAttr,
                b.getDictionaryAttr({b.getNamedAttr("type", TypeAttr::get(mmaType)),
                                     b.getNamedAttr("split", b.getBoolAttr(split)),
                                     b.getNamedAttr("transposed", b.getBoolAttr(c->transposed))}));
  for (Operation *op : m.ops)
    op->moveBefore(nest.getBody()->getTerminator());
  Operation *after = nest;
  for (Operation *op : c->deferred) {
    op->moveAfter(after);
    after = op;
  }
  m.deferred = c->deferred;
  m.ops.push_back(zero);
  zero->erase();
  for (Operation *fill : c->produceFills) {
    m.ops.push_back(fill);
    fill->erase();
  }
  m.nest = nest;
  return m;
}

int64_t mlir::spectra::warpChainSharedBytes(func::FuncOp kernel, int64_t threads, Type mmaType,
                                             int64_t sharedLimit) {
  int64_t bytes = tileBufferBytes(kernel);
  if (threads % 32 != 0 || !mmaType)
    return bytes;
  // As spectra-map-tiles-to-gpu maps them: in program order, each chain where the bytes so
  // far, less its register tiles and with its partials, fit sharedLimit.
  // A deferred op starts no chain (the mapping meets it past the nest, in another order).
  llvm::DenseSet<Operation *> chained, deferred;
  kernel.walk([&](linalg::GenericOp op) {
    if (chained.contains(op) || deferred.contains(op) || !planMma(op))
      return;
    linalg::FillOp zero = zeroFillBefore(op);
    std::optional<Chain> c =
        zero ? fittingChainAt(op, threads / 32, zero, bytes, sharedLimit) : std::nullopt;
    if (!c)
      return;
    bytes += sharedBytesChange(*c);
    for (Operation *chainOp : c->ops())
      chained.insert(chainOp);
    deferred.insert(c->deferred.begin(), c->deferred.end());
  });
  return bytes;
}

bool mlir::spectra::isWarpChain(scf::ForallOp nest) { return nest->hasAttr(kWarpChainAttr); }

LogicalResult mlir::spectra::emulateWarpChain(scf::ForallOp nest) {
  StringRef pass = "spectra-emulate-warp-mma";
  FailureOr<ChainType> type = chainType(nest, pass);
  if (failed(type))
    return failure();
  FailureOr<Chain> c = chainOf(nest, pass);
  if (failed(c))
    return failure();
  OpBuilder b(nest);
  Exec x(b, nest.getLoc(), c->W, type->mmaType, type->split, /*emulate=*/true);
  Lowering(x, *c).run();
  nest->erase();
  return success();
}

LogicalResult mlir::spectra::lowerWarpChain(scf::ForallOp nest, gpu::LaunchOp launch, Value tid,
                                            int64_t threads) {
  StringRef pass = "spectra-launch-mapped-kernels";
  FailureOr<ChainType> type = chainType(nest, pass);
  if (failed(type))
    return failure();
  FailureOr<Chain> c = chainOf(nest, pass);
  if (failed(c))
    return failure();
  if (c->W * 32 != threads)
    return nest.emitOpError(pass) << ": a warp chain takes every warp of the block (its "
                                     "barriers), " << c->W << " warps of " << threads << " threads";
  OpBuilder b(nest);
  Exec x(b, nest.getLoc(), c->W, type->mmaType, type->split, /*emulate=*/false);
  x.tid = tid;
  x.threads = threads;
  x.launch = launch;
  Lowering(x, *c).run();
  gpu::BarrierOp::create(b, nest.getLoc());
  nest->erase();
  return success();
}
