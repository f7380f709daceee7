//===- VectorizeTiles.cpp - linalg on static tiles to register-tiled vectors ===//
//
// The CPU mapping of the tile kernels (TileKernels.h). Every linalg op on
// static memref tiles becomes loops of 1-D vector code:
//  - contractions C[m, n] += A[m, k] B[k, n] (A possibly read transposed)
//    become register tiles of `register-rows` x (`register-vectors` x
//    `vector-width`) accumulators held in loop-carried vectors across k:
//    per k one load of B's row segment, one broadcast of A per row, and
//    register-rows x register-vectors vector.fma (the outer-product form of
//    an FMA micro-kernel); C is read and written once per tile; an
//    elementwise generic right after it that reads C element by element (the
//    features after the logits) runs on the finished accumulators as the
//    tile's epilogue, and C is stored only if something else reads it; an
//    elementwise generic that updates C in place before it (kv's rescale of the
//    summary), with nothing between touching C or writing what it reads, runs as
//    the tile's prologue on the accumulators as they are loaded (on its own at the
//    contraction where that takes another form: AMX, dot products, a column tail);
//  - contractions C[m, n] += A[m, k] B[n, k] (both operands contiguous along
//    k: the causal kernels' q k^T products) become dot products: per
//    (row, column) pair of a register tile a vector accumulator along k,
//    the tile's accumulators reduced horizontally together (folded in pairs
//    by shuffles), so no transposed copy of B is made;
//  - elementwise generics (the component's features region, the stabiliser
//    and guard arithmetic) run along their innermost dimension in vectors:
//    operands indexed by it are loaded as vectors, the others broadcast, and
//    the body is cloned with vector types;
//  - reductions along the innermost dimension keep a vector accumulator and
//    reduce it horizontally once per row; reductions along the outer
//    dimension accumulate whole vectors, in four partial accumulators that
//    take the rows in turn where each combiner is addf, maximumf or a subf
//    from the output, and the rows are at least 8 and a multiple of 4;
//  - linalg.fill becomes vector stores.
// Tails narrower than the vector width use narrower vectors, except a few columns past
// the last whole vector of a body with an exp (SGQ's 65th feature at 16 lanes): those run
// down the rows, a vector of rows at a time, so a row's lane does not take a whole vector's
// exp. That is an elementwise generic's tail of at most VL / 4 columns over a whole number
// of vectors of rows, and the epilogue of a single dot-product column on a register tile of
// 4, 8 or 16 rows.
//
//===----------------------------------------------------------------------===//

#include "codegen/Epilogue.h"
#include "codegen/Passes.h"
#include "codegen/TileKernels.h"
#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <optional>

#define DEBUG_TYPE "spectra-vectorize-tiles"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAVECTORIZETILES
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;

namespace {

class Vectorizer {
public:
  Vectorizer(OpBuilder &b, Location loc, int64_t vl, int64_t mr, int64_t nv)
      : b(b), loc(loc), VL(vl), MR(mr), NV(nv) {}

  /// For a contraction: whether its output holds zeros on entry (the fill before it was
  /// dropped): the accumulators start at 0 and C is only written.
  bool zeroOutput = false;
  /// For a contraction: its epilogue (Epilogue.h), run on the accumulators of each register
  /// tile as they are complete, so C is not read back; C is still stored where the epilogue's
  /// storeOutput says something else reads it.
  const spectra::Epilogue *epilogue = nullptr;
  /// For a contraction: its prologue (prologueOf), an elementwise update of C in place that
  /// runs on each register tile's accumulators as they are loaded, so C is read and written
  /// once; on the other paths (AMX, dot products, narrow tails) it runs first, on its own.
  linalg::GenericOp prologue;
  /// Contractions on AMX tiles where their shape allows (lowerAmxContraction).
  bool amx = false;
  /// The bf16 parts of operands the whole function only reads (W, the summaries), packed once
  /// at its entry; shared by the function's ops.
  llvm::DenseMap<Value, std::pair<Value, Value>> *entryPacks = nullptr;
  /// The next tile's rows of the arguments a tile stages, to be prefetched a register tile's
  /// rows at a time through the next contraction of the staging's block whose rows are the
  /// tile's (spreadableBase, lowerContraction); shared by the function's ops.
  struct NextTileRows {
    Value source;  // the kernel argument [N, W]
    Value base;    // the staged tile's first row
    Block *block;  // the block of the staging loop and of the contraction
  };
  SmallVector<NextTileRows> *pendingPrefetches = nullptr;

  LogicalResult lower(Operation *op) {
    if (auto fill = dyn_cast<linalg::FillOp>(op))
      return lowerFill(fill);
    auto generic = cast<linalg::GenericOp>(op);
    for (Value v : generic->getOperands()) {
      auto type = dyn_cast<MemRefType>(v.getType());
      if (!type || !type.hasStaticShape())
        return op->emitOpError("spectra-vectorize-tiles: operands must be memrefs of static shape");
    }
    SmallVector<utils::IteratorType> iters = generic.getIteratorTypesArray();
    if (iters.size() == 3)
      return lowerContraction(generic);
    int reductions = llvm::count(iters, utils::IteratorType::reduction);
    if (reductions == 0 && iters.size() <= 2)
      return lowerElementwise(generic);
    if (reductions == 1 && iters.size() == 2)
      return iters[1] == utils::IteratorType::reduction ? lowerRowReduction(generic)
                                                        : lowerColumnReduction(generic);
    return op->emitOpError("spectra-vectorize-tiles: unsupported iteration space");
  }

private:
  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  VectorType vec(int64_t w, Type elt) { return VectorType::get({w}, elt); }
  Value splat(Value scalar, int64_t w) {
    return vector::BroadcastOp::create(b, loc, vec(w, scalar.getType()), scalar);
  }
  Value vload(Value mem, ValueRange at, int64_t w) {
    return vector::LoadOp::create(b, loc, vec(w, cast<MemRefType>(mem.getType()).getElementType()),
                                  mem, at);
  }
  void vstore(Value v, Value mem, ValueRange at) { vector::StoreOp::create(b, loc, v, mem, at); }

  /// Vector widths covering n: full vectors, then one narrower tail.
  SmallVector<int64_t> widths(int64_t n, int64_t per) {
    SmallVector<int64_t> w(n / per, per);
    if (n % per)
      w.push_back(n % per);
    return w;
  }

  /// for (iv = lb; iv < ub; iv += step) body(iv, carried) -> next carried.
  SmallVector<Value> loop(int64_t lb, int64_t ub, int64_t step, ValueRange init,
                          function_ref<SmallVector<Value>(Value, ValueRange)> body) {
    auto op = scf::ForOp::create(b, loc, idx(lb), idx(ub), idx(step), init);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    SmallVector<Value> next = body(op.getInductionVar(), op.getRegionIterArgs());
    // Without loop-carried values the builder has added the terminator itself.
    if (!init.empty())
      scf::YieldOp::create(b, loc, next);
    return SmallVector<Value>(op.getResults());
  }
  /// Runs body(j0, w) over [0, n) in chunks of the vector width: a loop over the
  /// full chunks, then the tail once.
  void chunks(int64_t n, function_ref<void(Value, int64_t)> body) {
    if (n >= VL)
      loop(0, n - n % VL, VL, {}, [&](Value j0, ValueRange) {
        body(j0, VL);
        return SmallVector<Value>();
      });
    if (n % VL)
      body(idx(n - n % VL), n % VL);
  }

  /// The indices of an operand at loop position `ivs` (one value per loop dim).
  SmallVector<Value> indices(AffineMap map, ArrayRef<Value> ivs) {
    SmallVector<Value> at;
    for (AffineExpr e : map.getResults())
      at.push_back(ivs[cast<AffineDimExpr>(e).getPosition()]);
    return at;
  }
  /// Whether the operand's innermost index is the loop dim `dim` (vector loads along it).
  static bool alongDim(AffineMap map, unsigned dim) {
    return map.getNumResults() > 0 && map.getResults().back() == getAffineDimExpr(dim, map.getContext());
  }
  static LogicalResult checkMaps(linalg::GenericOp op, unsigned dim) {
    for (AffineMap map : op.getIndexingMapsArray()) {
      for (AffineExpr e : map.getResults())
        if (!isa<AffineDimExpr>(e))
          return op.emitOpError("spectra-vectorize-tiles: indexing maps must be projections");
      // A vector dim that is not innermost would need a gather.
      for (unsigned r = 0; r + 1 < map.getNumResults(); ++r)
        if (map.getResult(r) == getAffineDimExpr(dim, map.getContext()))
          return op.emitOpError("spectra-vectorize-tiles: the vector dimension must be innermost "
                                "in every operand");
    }
    return success();
  }
  /// Operand `i` of the generic at `ivs` as a vector of width w along `dim`
  /// (loaded, or a loaded scalar broadcast).
  Value operandAt(linalg::GenericOp op, unsigned i, ArrayRef<Value> ivs, unsigned dim, int64_t w) {
    AffineMap map = op.getIndexingMapsArray()[i];
    Value mem = op->getOperand(i);
    if (alongDim(map, dim))
      return vload(mem, indices(map, ivs), w);
    return splat(memref::LoadOp::create(b, loc, mem, indices(map, ivs)), w);
  }

  /// Clones the generic's body with every value a vector of width w; `args` map
  /// the block arguments; values defined above the body are broadcast.
  SmallVector<Value> cloneBody(linalg::GenericOp op, ArrayRef<Value> args, int64_t w) {
    Block &body = op.getRegion().front();
    IRMapping map;
    for (auto [arg, v] : llvm::zip(body.getArguments(), args))
      if (v)
        map.map(arg, v);
    auto lookup = [&](Value v) {
      if (Value m = map.lookupOrNull(v))
        return m;
      Value s = splat(v, w);
      map.map(v, s);
      return s;
    };
    for (Operation &inner : body.without_terminator()) {
      if (auto cst = dyn_cast<arith::ConstantOp>(inner)) {
        auto type = vec(w, cst.getType());
        map.map(cst.getResult(),
                arith::ConstantOp::create(b, loc, type,
                                          DenseElementsAttr::get(type, cst.getValue())));
        continue;
      }
      for (Value operand : inner.getOperands())
        lookup(operand);
      Operation *clone = b.clone(inner, map);
      for (Value r : clone->getResults())
        r.setType(vec(w, r.getType()));
    }
    SmallVector<Value> yields;
    for (Value y : body.getTerminator()->getOperands())
      yields.push_back(lookup(y));
    return yields;
  }
  LogicalResult checkBody(linalg::GenericOp op) {
    for (Operation &inner : op.getRegion().front().without_terminator())
      if (inner.getNumRegions() != 0 ||
          !llvm::isa<arith::ArithDialect, math::MathDialect>(inner.getDialect()) ||
          !llvm::all_of(inner.getResultTypes(), [](Type t) { return t.isIntOrIndexOrFloat(); }))
        return inner.emitOpError("spectra-vectorize-tiles: cannot vectorise this op of a tile body");
    return success();
  }

  LogicalResult lowerFill(linalg::FillOp op) {
    Value out = op.getOutputs()[0];
    auto type = dyn_cast<MemRefType>(out.getType());
    if (!type || !type.hasStaticShape() || type.getRank() > 2 || type.getRank() == 0)
      return op.emitOpError("spectra-vectorize-tiles: fill of a static rank-1 or rank-2 memref only");
    ArrayRef<int64_t> shape = type.getShape();
    auto rows = [&](function_ref<void(Value)> body) {
      if (shape.size() == 1)
        return body(Value());
      loop(0, shape[0], 1, {}, [&](Value i, ValueRange) {
        body(i);
        return SmallVector<Value>();
      });
    };
    Value value = op.getInputs()[0];
    rows([&](Value i) {
      chunks(shape.back(), [&](Value j0, int64_t w) {
        vstore(splat(value, w), out, i ? ValueRange{i, j0} : ValueRange{j0});
      });
    });
    return success();
  }

  LogicalResult lowerElementwise(linalg::GenericOp op) {
    SmallVector<int64_t> shape = op.getStaticLoopRanges();
    unsigned last = shape.size() - 1;
    if (failed(checkMaps(op, last)) || failed(checkBody(op)))
      return failure();
    unsigned numIns = op.getNumDpsInputs();
    for (unsigned a = 0; a < numIns; ++a)
      prefetchNextTile(op, op->getOperand(a));
    Block &body = op.getRegion().front();
    auto chunk = [&](Value i, Value j0, int64_t w) {
      SmallVector<Value> ivs = shape.size() == 2 ? SmallVector<Value>{i, j0} : SmallVector<Value>{j0};
      SmallVector<Value> args;
      for (unsigned a = 0; a < op->getNumOperands(); ++a)
        args.push_back(a < numIns || !body.getArgument(a).use_empty() ? operandAt(op, a, ivs, last, w)
                                                                      : Value());
      SmallVector<Value> yields = cloneBody(op, args, w);
      for (auto [k, y] : llvm::enumerate(yields)) {
        unsigned o = numIns + k;
        Value out = op->getOperand(o);
        // A whole vector into a row of a kernel argument (out, dq, dk, dv): written once and
        // read by the next kernel or LibTorch, so it streams past the caches (no read for
        // ownership; the tiles, W and the summaries stay cached). The store needs the row on
        // the vector's bytes, which the kernel's ABI asks of the caller (aligned=...).
        BlockArgument arg = streamedArgument(op, out);
        bool stream = arg && w == VL;
        if (stream)
          recordStreamed(op, arg);
        vector::StoreOp::create(b, loc, y, out, indices(op.getIndexingMapsArray()[o], ivs),
                                /*nontemporal=*/stream,
                                stream ? llvm::MaybeAlign(VL * 4) : llvm::MaybeAlign());
      }
    };
    if (shape.size() == 1) {
      chunks(shape[0], [&](Value j0, int64_t w) { chunk(Value(), j0, w); });
      return success();
    }
    // A few columns past the last whole vector (SGQ's 65th feature) whose body has an exp:
    // each row would take that exp narrow, a vector's work for a lane or two. They run down
    // the rows instead, VL rows per vector (columnDownRows). A wider tail stays per row: its
    // gathers and lane-by-lane stores would cost more than the exps save.
    const int64_t tail = shape[1] % VL;
    bool down = tail > 0 && tail * 4 <= VL && shape[1] > VL && shape[0] % VL == 0 &&
                downRowsShaped(op);
    loop(0, shape[0], 1, {}, [&](Value i, ValueRange) {
      chunks(down ? shape[1] - tail : shape[1], [&](Value j0, int64_t w) { chunk(i, j0, w); });
      return SmallVector<Value>();
    });
    if (down)
      for (int64_t j = shape[1] - tail; j < shape[1]; ++j)
        columnDownRows(op, shape[0], idx(j));
    return success();
  }

  /// Whether a 2-D elementwise generic's tail columns can run down the rows: its body has an
  /// exp (what a lane's worth of work costs a whole vector for), each operand is indexed by
  /// (row, column), the row alone (a rank-1 buffer of unit stride), the column alone or
  /// nothing, and each output by (row, column).
  bool downRowsShaped(linalg::GenericOp op) {
    bool hasExp = false;
    op.getRegion().front().walk([&](math::ExpOp) { hasExp = true; });
    if (!hasExp)
      return false;
    MLIRContext *ctx = op.getContext();
    AffineExpr r = getAffineDimExpr(0, ctx), c = getAffineDimExpr(1, ctx);
    unsigned numIns = op.getNumDpsInputs();
    for (auto [a, map] : llvm::enumerate(op.getIndexingMapsArray())) {
      bool isOut = a >= numIns;
      ArrayRef<AffineExpr> at = map.getResults();
      bool rowCol = at.size() == 2 && at[0] == r && at[1] == c;
      bool row = at.size() == 1 && at[0] == r &&
                 cast<MemRefType>(op->getOperand(a).getType()).isLastDimUnitStride();
      bool colOrNone = (at.size() == 1 && at[0] == c) || at.empty();
      if (!(isOut ? rowCol : rowCol || row || colOrNone))
        return false;
    }
    // The tail column now runs after every row's whole vectors: an output may share a buffer
    // with an input only where both are read and written element for element.
    for (unsigned o = numIns; o < op->getNumOperands(); ++o)
      for (unsigned a = 0; a < numIns; ++a)
        if (spectra::viewRoot(op->getOperand(o)) == spectra::viewRoot(op->getOperand(a)) &&
            (op->getOperand(o) != op->getOperand(a) ||
             op.getIndexingMapsArray()[a] != op.getIndexingMapsArray()[o]))
          return false;
    return true;
  }

  /// Column `col` of a 2-D elementwise generic over `rows` rows, VL rows per vector
  /// (downRows).
  void columnDownRows(linalg::GenericOp op, int64_t rows, Value col) {
    loop(0, rows, VL, {}, [&](Value r0, ValueRange) {
      SmallVector<Value> rowAt;
      for (int64_t l = 0; l < VL; ++l)
        rowAt.push_back(arith::AddIOp::create(b, loc, r0, idx(l)));
      downRows(op, rowAt, col, -1, Value());
      return SmallVector<Value>();
    });
  }

  /// The epilogue at column `col` of a register tile's rows `rowAt` (consecutive), on one
  /// vector down them; `done` the finished accumulators of those rows at that column.
  void epilogueDownRows(ArrayRef<Value> done, ArrayRef<Value> rowAt, Value col) {
    Value acc = vector::FromElementsOp::create(
        b, loc, vec(done.size(), done.front().getType()), done);
    downRows(epilogue->op, rowAt, col, epilogue->input, acc);
  }

  /// The body of a 2-D elementwise generic (downRowsShaped) at column `col` of the
  /// consecutive rows `rowAt`, one lane each: operands indexed by (row, column) gathered from
  /// their rows, by the row alone loaded as a vector, by the column alone broadcast; operand
  /// `given` (if any) is `value`; outputs written back lane by lane.
  void downRows(linalg::GenericOp op, ArrayRef<Value> rowAt, Value col, int64_t given,
                Value value) {
    unsigned numIns = op.getNumDpsInputs();
    Block &body = op.getRegion().front();
    const int64_t w = rowAt.size();
    SmallVector<Value> args;
    for (unsigned a = 0; a < op->getNumOperands(); ++a) {
      if (int64_t(a) == given) {
        args.push_back(value);
        continue;
      }
      if (a >= numIns && body.getArgument(a).use_empty()) {
        args.push_back(Value());
        continue;
      }
      Value mem = op->getOperand(a);
      ArrayRef<AffineExpr> at = op.getIndexingMapsArray()[a].getResults();
      if (at.size() != 2) {  // the row alone as a vector, the column alone (or none) broadcast
        args.push_back(operandAt(op, a, {rowAt.front(), col}, /*dim=*/0, w));
        continue;
      }
      SmallVector<Value> lanes;
      for (Value row : rowAt)
        lanes.push_back(memref::LoadOp::create(b, loc, mem, ValueRange{row, col}));
      args.push_back(vector::FromElementsOp::create(
          b, loc, vec(w, cast<MemRefType>(mem.getType()).getElementType()), lanes));
    }
    SmallVector<Value> yields = cloneBody(op, args, w);
    for (auto [k, y] : llvm::enumerate(yields)) {
      Value out = op->getOperand(numIns + k);
      for (auto [l, row] : llvm::enumerate(rowAt))
        memref::StoreOp::create(b, loc,
                                vector::ExtractOp::create(b, loc, y, ArrayRef<int64_t>{int64_t(l)}),
                                out, ValueRange{row, col});
    }
  }

  /// The row window `operand` is of a row kernel's [N, W] argument (q, k, v, out, dq, ...,
  /// W static), or null.
  memref::SubViewOp rowOfArgument(linalg::GenericOp op, Value operand) {
    auto row = operand.getDefiningOp<memref::SubViewOp>();
    auto fn = op->getParentOfType<func::FuncOp>();
    if (!row || !fn || !fn->getAttrOfType<IntegerAttr>(spectra::kKernelTileRowsAttr))
      return {};
    auto arg = dyn_cast<BlockArgument>(row.getSource());
    auto type = cast<MemRefType>(row.getSource().getType());
    if (!arg || arg.getOwner() != &fn.getBody().front() || type.getRank() != 2 ||
        !type.isDynamicDim(0) || type.isDynamicDim(1) || !type.getElementType().isIntOrFloat())
      return {};
    return row;
  }
  /// The argument whose row `operand` is, where its f32 rows span whole vectors (W a multiple
  /// of the lanes): the outputs written with streaming stores; null otherwise.
  BlockArgument streamedArgument(linalg::GenericOp op, Value operand) {
    memref::SubViewOp row = rowOfArgument(op, operand);
    if (!row)
      return {};
    auto type = cast<MemRefType>(row.getSource().getType());
    if (!type.getElementType().isF32() || type.getDimSize(1) % VL != 0 ||
        !type.getLayout().isIdentity())
      return {};
    return cast<BlockArgument>(row.getSource());
  }
  /// Records on the kernel that argument `arg` is written with streaming stores.
  void recordStreamed(linalg::GenericOp op, BlockArgument arg) {
    auto fn = op->getParentOfType<func::FuncOp>();
    SmallVector<int64_t> streamed;
    if (auto old = fn->getAttrOfType<DenseI64ArrayAttr>(spectra::kKernelStreamedArgsAttr))
      llvm::append_range(streamed, old.asArrayRef());
    if (llvm::is_contained(streamed, int64_t(arg.getArgNumber())))
      return;
    streamed.push_back(arg.getArgNumber());
    fn->setAttr(spectra::kKernelStreamedArgsAttr, b.getDenseI64ArrayAttr(streamed));
    fn->setAttr(spectra::kKernelAlignedBytesAttr, b.getI64IntegerAttr(VL * 4));
  }

  /// A row staged from a kernel argument (q, k, v, gout, ... in memory, not in cache):
  /// the same row of the next tile (the kernel's spectra.tile_rows further, the last row
  /// at the end) is prefetched line by line, so its lines arrive while this tile computes.
  /// Without it the staging copies waited on memory: 4-6% of kv and readout. The lines go to
  /// L2, not L1 (prefetcht2: locality 1): brought into L1 a tile early, they evicted the
  /// working tile's buffers (the one-thread pass 4% slower in the median of six alternating
  /// rounds on a Zen 4, docs/kernels-at-the-limit.md); the staging copy reads them from L2.
  /// Where a contraction over the tile's rows follows the staging (every row kernel's logits),
  /// the prefetches are left to it (spreadableBase): each of its register tiles' row blocks
  /// prefetches its rows of the next tile, so the lines go out through the contraction.
  void prefetchNextTile(linalg::GenericOp op, Value operand) {
    memref::SubViewOp row = rowOfArgument(op, operand);
    if (!row)
      return;
    Value src = row.getSource();
    Value at = getValueOrCreateConstantIndexOp(b, loc, row.getMixedOffsets()[0]);
    if (Value base = spreadableBase(op, at)) {
      pendingPrefetches->push_back({src, base, op->getParentOfType<scf::ForOp>()->getBlock()});
      return;
    }
    prefetchRow(src, at, 0);
  }
  /// Prefetches row min(at + offset + tile rows, N - 1) of the kernel argument `src` [N, W]
  /// line by line, into L2; in a tile loop that runs backwards (kTileLoopReversedAttr), row
  /// max(at + offset - tile rows, 0), the next tile it takes.
  void prefetchRow(Value src, Value at, int64_t offset) {
    auto type = cast<MemRefType>(src.getType());
    Region *region = b.getInsertionBlock()->getParent();
    auto fn = region->getParentOfType<func::FuncOp>();
    int64_t tileRows = tileRowsOf(fn);
    bool reversed = false;
    for (Operation *p = region->getParentOp(); p && p != fn; p = p->getParentOp())
      if (p->hasAttr(spectra::kTileLoopAttr)) {
        reversed = p->hasAttr(spectra::kTileLoopReversedAttr);
        break;
      }
    Value next;
    if (reversed) {
      next = arith::MaxSIOp::create(
          b, loc, arith::AddIOp::create(b, loc, at, idx(offset - tileRows)), idx(0));
    } else {
      Value last = arith::SubIOp::create(b, loc, memref::DimOp::create(b, loc, src, 0), idx(1));
      next = arith::MinSIOp::create(
          b, loc, arith::AddIOp::create(b, loc, at, idx(tileRows + offset)), last);
    }
    int64_t perLine = std::max<int64_t>(1, 64 * 8 / type.getElementTypeBitWidth());
    for (int64_t c = 0; c < type.getDimSize(1); c += perLine)
      memref::PrefetchOp::create(b, loc, src, ValueRange{next, idx(c)}, /*isWrite=*/false,
                                 /*localityHint=*/1, /*isDataCache=*/true);
  }
  /// The rows of a tile of the kernel `op` is in (or is): its spectra.tile_rows, else 0.
  static int64_t tileRowsOf(Operation *op) {
    auto fn = isa<func::FuncOp>(op) ? cast<func::FuncOp>(op) : op->getParentOfType<func::FuncOp>();
    auto rows = fn ? fn->getAttrOfType<IntegerAttr>(spectra::kKernelTileRowsAttr) : IntegerAttr();
    return rows ? rows.getInt() : 0;
  }
  /// Where the staging of row `at` (= base + i, i the staging loop's row from 0) is followed,
  /// in the same tile, by a contraction over the tile's rows whose register tiles can issue
  /// the next tile's prefetches: `base`, else null. Issued with the staging, all of a tile's
  /// prefetches went out in one burst beside the staging's own loads, and they came no sooner
  /// than none (scripts/staging-prefetch.c: 640-810 cycles of staging per tile either way,
  /// 400-450 spread through the compute; docs/kernels-at-the-limit.md).
  Value spreadableBase(linalg::GenericOp op, Value at) {
    if (!pendingPrefetches)
      return {};
    auto add = at.getDefiningOp<arith::AddIOp>();
    auto loop = op->getParentOfType<scf::ForOp>();
    if (!add || !loop || !matchPattern(loop.getLowerBound(), m_Zero()))
      return {};
    Value base = add.getLhs() == loop.getInductionVar() ? add.getRhs() : add.getLhs();
    if (!llvm::is_contained(add->getOperands(), loop.getInductionVar()) ||
        loop->isAncestor(base.getParentBlock()->getParentOp()))
      return {};
    int64_t tileRows = tileRowsOf(op);
    // A contraction after the staging loop in its block (not nested in another op: a strip
    // loop would issue them once per strip), over the tile rows, that lowerContraction lowers
    // to register tiles (B not transposed: no dot products; no AMX tiles), where it issues
    // them.
    MLIRContext *ctx = op.getContext();
    AffineExpr n = getAffineDimExpr(1, ctx), k = getAffineDimExpr(2, ctx);
    for (Operation *next = loop->getNextNode(); next; next = next->getNextNode()) {
      auto g = dyn_cast<linalg::GenericOp>(next);
      if (!amx && g && g.getNumLoops() == 3 && g.getNumDpsInputs() == 2 &&
          g.getStaticLoopRanges()[0] == tileRows && tileRows % MR == 0 &&
          g.getIndexingMapsArray()[1] == AffineMap::get(3, 0, {k, n}, ctx))
        return base;
    }
    return {};
  }

  /// The op yielding output k where the body is combiner(x, out_k) and out_k has no other
  /// use; null otherwise.
  Operation *combinerOp(linalg::GenericOp op, unsigned k) {
    Block &body = op.getRegion().front();
    BlockArgument acc = body.getArgument(op.getNumDpsInputs() + k);
    Operation *def = body.getTerminator()->getOperand(k).getDefiningOp();
    if (!def || !acc.hasOneUse() || !llvm::is_contained(def->getOperands(), acc))
      return nullptr;
    return def;
  }

  /// The combiner of output k of a row reduction: yield k = combiner(x, out_k).
  FailureOr<vector::CombiningKind> combiner(linalg::GenericOp op, unsigned k) {
    Operation *def = combinerOp(op, k);
    if (!def)
      return op.emitOpError("spectra-vectorize-tiles: a row reduction must yield combiner(x, acc)");
    if (isa<arith::AddFOp>(def))
      return vector::CombiningKind::ADD;
    if (isa<arith::MaximumFOp>(def))
      return vector::CombiningKind::MAXIMUMF;
    return op.emitOpError("spectra-vectorize-tiles: row reductions combine with addf or maximumf");
  }

  /// The lanes of `v` combined into a scalar, as a tree: a sum reassociates (the lanes hold
  /// partial sums in no order a sequential sum would keep), and a maximum halves the vector
  /// with shuffles and arith.maximumf, which keeps its semantics (IEEE's, or the CPU
  /// lowering's compare-and-select) where llvm.vector.reduce.fmaximum would expand to a
  /// lane-by-lane chain with NaN tests.
  Value acrossLanes(vector::CombiningKind kind, Value v) {
    auto type = cast<VectorType>(v.getType());
    int64_t n = type.getNumElements();
    if (kind == vector::CombiningKind::ADD || !llvm::isPowerOf2_64(n))
      return vector::ReductionOp::create(b, loc, kind, v, arith::FastMathFlags::reassoc);
    for (int64_t w = n / 2; w >= 1; w /= 2) {
      SmallVector<int64_t> lo, hi;
      for (int64_t l = 0; l < w; ++l)
        lo.push_back(l), hi.push_back(w + l);
      Value a = vector::ShuffleOp::create(b, loc, v, v, lo);
      Value c = vector::ShuffleOp::create(b, loc, v, v, hi);
      v = arith::MaximumFOp::create(b, loc, a, c);
    }
    return vector::ExtractOp::create(b, loc, v, ArrayRef<int64_t>{0});
  }

  /// Two vectors of a row group folded into one (lowerRowReduction): x and y each hold 2^s
  /// rows' partial results in blocks of B = VL / 2^s lanes (row r of x in block r); the
  /// result holds x's rows then y's in blocks of B / 2, each the combination of its block's
  /// two halves (two shuffles and one op). After log2 VL levels lane r holds row r.
  Value foldRows(vector::CombiningKind kind, Value x, Value y, int64_t s) {
    const int64_t block = VL >> s, half = block / 2, rowsIn = int64_t(1) << s;
    SmallVector<int64_t> lo, hi;
    for (int64_t t = 0; t < VL; ++t) {
      int64_t at = t / half, source = at < rowsIn ? 0 : VL, lane = (at % rowsIn) * block + t % half;
      lo.push_back(source + lane);
      hi.push_back(source + lane + half);
    }
    // Two statements: the shuffles' order in the IR must not depend on the compiler.
    Value low = vector::ShuffleOp::create(b, loc, x, y, lo);
    Value high = vector::ShuffleOp::create(b, loc, x, y, hi);
    if (kind == vector::CombiningKind::ADD)
      return arith::AddFOp::create(b, loc, low, high);
    return arith::MaximumFOp::create(b, loc, low, high);
  }

  /// Whether output k of a reduction is reduced (its map leaves out the reduction dim
  /// `dim`) rather than written element by element (a fused elementwise output).
  static bool reducedOutput(linalg::GenericOp op, unsigned k, unsigned dim) {
    AffineMap map = op.getIndexingMapsArray()[op.getNumDpsInputs() + k];
    return !llvm::is_contained(map.getResults(), getAffineDimExpr(dim, op.getContext()));
  }
  /// A reduction's outputs are reduced (their map leaves the reduction dim out) or written
  /// element by element: those have the identity map and do not read an accumulator (a
  /// lane's accumulator along a row is a partial sum, not the running value).
  LogicalResult checkReductionOutputs(linalg::GenericOp op, ArrayRef<bool> reduced) {
    Block &body = op.getRegion().front();
    unsigned numIns = op.getNumDpsInputs();
    llvm::SmallPtrSet<Value, 8> accumulators;
    for (auto [k, red] : llvm::enumerate(reduced))
      if (red)
        accumulators.insert(body.getArgument(numIns + k));
    for (auto [k, red] : llvm::enumerate(reduced)) {
      if (red)
        continue;
      if (!op.getIndexingMapsArray()[numIns + k].isIdentity())
        return op.emitOpError("spectra-vectorize-tiles: an output of a reduction must leave the "
                              "reduction dimension out or be written element by element "
                              "(identity map)");
      SmallVector<Value> work = {body.getTerminator()->getOperand(k)};
      llvm::SmallPtrSet<Value, 16> seen;
      while (!work.empty()) {
        Value v = work.pop_back_val();
        if (!seen.insert(v).second)
          continue;
        if (accumulators.contains(v))
          return op.emitOpError("spectra-vectorize-tiles: an elementwise output of a reduction "
                                "must not read the accumulator");
        if (Operation *def = v.getDefiningOp(); def && def->getBlock() == &body)
          work.append(def->operand_begin(), def->operand_end());
      }
    }
    return success();
  }

  /// One iteration of a reduction at `ivs`, w lanes: the inputs loaded, the reduced outputs'
  /// accumulators `acc` (in output order), the elementwise outputs loaded where the body
  /// reads them; the body cloned, its elementwise results stored. Returns the accumulators.
  SmallVector<Value> reductionStep(linalg::GenericOp op, ArrayRef<bool> reduced,
                                   ArrayRef<Value> ivs, unsigned dim, int64_t w, ValueRange acc) {
    unsigned numIns = op.getNumDpsInputs();
    Block &body = op.getRegion().front();
    SmallVector<Value> args;
    for (unsigned a = 0; a < numIns; ++a)
      args.push_back(operandAt(op, a, ivs, dim, w));
    unsigned next = 0;
    for (auto [k, red] : llvm::enumerate(reduced)) {
      if (red)
        args.push_back(acc[next++]);
      else
        args.push_back(body.getArgument(numIns + k).use_empty()
                           ? Value()
                           : operandAt(op, numIns + k, ivs, dim, w));
    }
    SmallVector<Value> yields = cloneBody(op, args, w), carried;
    for (auto [k, red] : llvm::enumerate(reduced)) {
      if (red)
        carried.push_back(yields[k]);
      else
        vstore(yields[k], op->getOperand(numIns + k),
               indices(op.getIndexingMapsArray()[numIns + k], ivs));
    }
    return carried;
  }

  /// Reductions along the innermost dim (a vector accumulator per row, its lanes combined
  /// once), or along the outer one (whole vectors accumulated down the rows). Outputs whose
  /// map keeps the reduction dim are written element by element on the way (an elementwise
  /// result and its reduction in one generic).
  LogicalResult lowerRowReduction(linalg::GenericOp op) {
    SmallVector<int64_t> shape = op.getStaticLoopRanges();
    if (failed(checkMaps(op, 1)) || failed(checkBody(op)))
      return failure();
    unsigned numIns = op.getNumDpsInputs(), numOuts = op.getNumDpsInits();
    SmallVector<bool> reduced;
    SmallVector<vector::CombiningKind> kinds;
    for (unsigned k = 0; k < numOuts; ++k) {
      reduced.push_back(reducedOutput(op, k, 1));
      if (!reduced.back())
        continue;
      FailureOr<vector::CombiningKind> kind = combiner(op, k);
      if (failed(kind))
        return failure();
      kinds.push_back(*kind);
    }
    if (failed(checkReductionOutputs(op, reduced)))
      return failure();
    // Rows of whole vectors go in groups of VL: each row's accumulators are folded into the
    // group's as it completes (foldRows), so one vector per output holds the group's results,
    // row r in lane r, combined into the output with one vector load and store where the
    // output is contiguous along the rows. A row's own lane tree (log2 VL shuffles and ops,
    // an extract, a scalar load, op and store) becomes 3 (VL - 1) / VL operations. A row
    // that ends in part of a vector (SGQ's 65 features) folds its tail into its accumulator
    // first: the tail's r lanes padded with the identity to VL (one blend) and combined.
    const int64_t rows = shape[0], n = shape[1];
    const int64_t grouped = n > 0 && VL >= 2 && llvm::isPowerOf2_64(VL) && !kinds.empty() &&
                                    rows >= VL
                                ? rows - rows % VL
                                : 0;
    // Row i's accumulators over its first `bound` columns, whole vectors (bound % VL == 0).
    auto rowAccumulators = [&](Value i, int64_t bound) {
      SmallVector<Value> init;
      for (vector::CombiningKind kind : kinds)
        init.push_back(splat(combinerIdentity(kind), VL));
      return loop(0, bound, VL, init, [&](Value j0, ValueRange carried) {
        return reductionStep(op, reduced, {i, j0}, 1, VL, carried);
      });
    };
    // Row i's accumulators over all n columns, VL lanes: the whole vectors, then the tail's
    // lanes (n % VL of them) combined into lanes 0 .. n % VL - 1.
    auto wholeRow = [&](Value i) {
      const int64_t full = n - n % VL, tail = n % VL;
      SmallVector<Value> acc = rowAccumulators(i, full);
      if (tail == 0)
        return acc;
      // The tail's own accumulators start at -0 for a sum (x + -0 is x for every x, so the
      // add folds away; +0 would not fold, as -0 + 0 is +0) and -inf for a maximum.
      SmallVector<Value> init;
      for (vector::CombiningKind kind : kinds)
        init.push_back(splat(kind == vector::CombiningKind::ADD
                                 ? arith::ConstantOp::create(b, loc, b.getF32FloatAttr(-0.0f))
                                       .getResult()
                                 : combinerIdentity(kind),
                             tail));
      SmallVector<Value> part = reductionStep(op, reduced, {i, idx(full)}, 1, tail, init);
      // Lanes 0 .. tail - 1 from the tail (widened by a shuffle of itself), the rest from
      // the identity: LLVM makes the two shuffles one blend.
      SmallVector<int64_t> widen(VL, 0), blend;
      for (int64_t t = 0; t < VL; ++t) {
        if (t < tail)
          widen[t] = t;
        blend.push_back(t < tail ? t : VL + t);
      }
      for (unsigned k = 0; k < kinds.size(); ++k) {
        Value wide = vector::ShuffleOp::create(b, loc, part[k], part[k], widen);
        Value padded =
            vector::ShuffleOp::create(b, loc, wide, splat(combinerIdentity(kinds[k]), VL), blend);
        acc[k] = combineWith(kinds[k], acc[k], padded);
      }
      return acc;
    };
    auto rowOf = [&](Value i0, int64_t r) -> Value {
      return r == 0 ? i0 : arith::AddIOp::create(b, loc, i0, idx(r)).getResult();
    };
    // out[at] = combine(out[at], value): one scalar element.
    auto combineInto = [&](vector::CombiningKind kind, Value out, ArrayRef<Value> at, Value value) {
      Value old = memref::LoadOp::create(b, loc, out, at);
      memref::StoreOp::create(b, loc, combineWith(kind, old, value), out, at);
    };
    if (grouped > 0)
      loop(0, grouped, VL, {}, [&](Value i0, ValueRange) {
        // Pending folds: (level, accumulators), level s holding 2^s rows.
        SmallVector<std::pair<int64_t, SmallVector<Value>>> pending;
        for (int64_t r = 0; r < VL; ++r) {
          SmallVector<Value> acc = wholeRow(rowOf(i0, r));
          int64_t level = 0;
          while (!pending.empty() && pending.back().first == level) {
            for (unsigned k = 0; k < kinds.size(); ++k)
              acc[k] = foldRows(kinds[k], pending.back().second[k], acc[k], level);
            pending.pop_back();
            ++level;
          }
          pending.push_back({level, acc});
        }
        SmallVector<Value> folded = pending.front().second;
        unsigned next = 0;
        for (unsigned k = 0; k < numOuts; ++k) {
          if (!reduced[k])
            continue;
          Value out = op->getOperand(numIns + k), v = folded[next];
          AffineMap map = op.getIndexingMapsArray()[numIns + k];
          vector::CombiningKind kind = kinds[next++];
          if (alongDim(map, 0) && cast<MemRefType>(out.getType()).isLastDimUnitStride()) {
            SmallVector<Value> at = indices(map, {i0, Value()});
            vstore(combineWith(kind, vload(out, at, VL), v), out, at);
            continue;
          }
          for (int64_t r = 0; r < VL; ++r) {
            SmallVector<Value> at = indices(map, {rowOf(i0, r), Value()});
            combineInto(kind, out, at, vector::ExtractOp::create(b, loc, v, ArrayRef<int64_t>{r}));
          }
        }
        return SmallVector<Value>();
      });
    if (grouped == rows)
      return success();
    loop(grouped, rows, 1, {}, [&](Value i, ValueRange) {
      int64_t full = n - n % VL;
      SmallVector<Value> sums;
      for (vector::CombiningKind kind : kinds)
        sums.push_back(combinerIdentity(kind));
      if (full > 0) {
        SmallVector<Value> acc = rowAccumulators(i, full);
        for (unsigned k = 0; k < kinds.size(); ++k)
          sums[k] = acrossLanes(kinds[k], acc[k]);
      }
      if (n % VL) {
        SmallVector<Value> init;
        for (vector::CombiningKind kind : kinds)
          init.push_back(splat(combinerIdentity(kind), n % VL));
        SmallVector<Value> tail = reductionStep(op, reduced, {i, idx(full)}, 1, n % VL, init);
        for (unsigned k = 0; k < kinds.size(); ++k)
          sums[k] = combineWith(kinds[k], sums[k], acrossLanes(kinds[k], tail[k]));
      }
      unsigned next = 0;
      for (unsigned k = 0; k < numOuts; ++k) {
        if (!reduced[k])
          continue;
        SmallVector<Value> at = indices(op.getIndexingMapsArray()[numIns + k], {i, Value()});
        combineInto(kinds[next], op->getOperand(numIns + k), at, sums[next]);
        ++next;
      }
      return SmallVector<Value>();
    });
    return success();
  }

  /// How the partials of reduced output k combine, where the body is combiner(x, out_k)
  /// with addf or maximumf, or out_k - x with subf (the partials then combine by addf: each
  /// starts from -0, and -0 - x is -x exactly, zeros included), and x reads no output's
  /// value (a running value of another output would be a partial's, not the column's); none
  /// otherwise (no diagnostic: the caller then keeps one accumulator).
  std::optional<vector::CombiningKind> simpleCombiner(linalg::GenericOp op, unsigned k) {
    Block &body = op.getRegion().front();
    unsigned numIns = op.getNumDpsInputs();
    BlockArgument acc = body.getArgument(numIns + k);
    Operation *def = combinerOp(op, k);
    if (!def || !isa<arith::AddFOp, arith::MaximumFOp, arith::SubFOp>(def) ||
        (isa<arith::SubFOp>(def) && def->getOperand(0) != acc))
      return std::nullopt;
    // x and what it is computed from, within the body: no output argument among them.
    SmallVector<Value> work;
    for (Value operand : def->getOperands())
      if (operand != acc)
        work.push_back(operand);
    llvm::SmallPtrSet<Operation *, 8> seen;
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        if (arg.getOwner() == &body && arg.getArgNumber() >= numIns)
          return std::nullopt;
        continue;
      }
      Operation *from = v.getDefiningOp();
      if (!from || from->getBlock() != &body || !seen.insert(from).second)
        continue;
      llvm::append_range(work, from->getOperands());
    }
    return isa<arith::MaximumFOp>(def) ? vector::CombiningKind::MAXIMUMF : vector::CombiningKind::ADD;
  }

  /// Reductions down the rows: whole vectors of columns, accumulated row by row. One
  /// accumulator per output would be one chain as long as the tile's rows (32 dependent
  /// maxima or adds, each waiting the op's latency: kv's column maximum took 3% of kv on an
  /// Intel core for 1% of its operations). Where each reduced output combines with addf,
  /// maximumf or subf from it (simpleCombiner), kColumnPartials accumulators take the rows
  /// in turn (row i into partial i mod kColumnPartials; the first starts from the output,
  /// the others from the identity, -0 for a sum or a difference) and are combined as a tree
  /// at the end (a difference's partials by addf). A sum's order changes; a maximum's result does
  /// not for NaN-free data (the CPU's maxima become compare-and-select, which orders NaN).
  static constexpr int64_t kColumnPartials = 4;
  LogicalResult lowerColumnReduction(linalg::GenericOp op) {
    SmallVector<int64_t> shape = op.getStaticLoopRanges();
    if (failed(checkMaps(op, 1)) || failed(checkBody(op)))
      return failure();
    unsigned numIns = op.getNumDpsInputs(), numOuts = op.getNumDpsInits();
    SmallVector<bool> reduced;
    for (unsigned k = 0; k < numOuts; ++k)
      reduced.push_back(reducedOutput(op, k, 0));
    if (failed(checkReductionOutputs(op, reduced)))
      return failure();
    SmallVector<vector::CombiningKind> kinds;
    bool combinable = true;
    for (unsigned k = 0; k < numOuts; ++k)
      if (reduced[k]) {
        std::optional<vector::CombiningKind> kind = simpleCombiner(op, k);
        combinable = combinable && kind.has_value();
        if (kind)
          kinds.push_back(*kind);
      }
    const int64_t parts = combinable && !kinds.empty() && shape[0] >= 2 * kColumnPartials &&
                                  shape[0] % kColumnPartials == 0
                              ? kColumnPartials
                              : 1;
    const size_t numReduced = llvm::count(reduced, true);
    chunks(shape[1], [&](Value j0, int64_t w) {
      SmallVector<Value> init;
      // The other partials start from the identity: -0 for a sum (x + -0 is x for every x,
      // -0 included) and -inf for a maximum.
      for (int64_t p = 0; p < parts; ++p)
        for (unsigned k = 0, next = 0; k < numOuts; ++k) {
          if (!reduced[k])
            continue;
          if (p == 0) {
            init.push_back(operandAt(op, numIns + k, {Value(), j0}, 1, w));
            continue;
          }
          vector::CombiningKind kind = kinds[next++];
          init.push_back(splat(kind == vector::CombiningKind::ADD
                                   ? arith::ConstantOp::create(b, loc, b.getF32FloatAttr(-0.0f))
                                         .getResult()
                                   : combinerIdentity(kind),
                               w));
        }
      SmallVector<Value> acc = loop(0, shape[0], parts, init, [&](Value i, ValueRange carried) {
        SmallVector<Value> next;
        for (int64_t p = 0; p < parts; ++p) {
          Value row = p == 0 ? i : arith::AddIOp::create(b, loc, i, idx(p)).getResult();
          llvm::append_range(next, reductionStep(op, reduced, {row, j0}, 1, w,
                                                 ValueRange(carried).slice(p * numReduced,
                                                                           numReduced)));
        }
        return next;
      });
      // The partials combined pairwise: (0 1) (2 3), then those two.
      for (int64_t span = 1; span < parts; span *= 2)
        for (int64_t p = 0; p + span < parts; p += 2 * span)
          for (size_t k = 0; k < numReduced; ++k)
            acc[p * numReduced + k] = combineWith(kinds[k], acc[p * numReduced + k],
                                                  acc[(p + span) * numReduced + k]);
      unsigned next = 0;
      for (unsigned k = 0; k < numOuts; ++k)
        if (reduced[k])
          vstore(acc[next++], op->getOperand(numIns + k),
                 indices(op.getIndexingMapsArray()[numIns + k], {Value(), j0}));
    });
    return success();
  }
  /// The identity of a reduction's combiner (0 for a sum, -inf for a maximum), as an f32.
  Value combinerIdentity(vector::CombiningKind kind) {
    double v = kind == vector::CombiningKind::ADD ? 0.0 : -std::numeric_limits<double>::infinity();
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(static_cast<float>(v))).getResult();
  }
  /// x combined with y by the reduction's combiner (addf or maximumf).
  Value combineWith(vector::CombiningKind kind, Value x, Value y) {
    if (kind == vector::CombiningKind::ADD)
      return arith::AddFOp::create(b, loc, x, y);
    return arith::MaximumFOp::create(b, loc, x, y);
  }

  LogicalResult lowerContraction(linalg::GenericOp op) {
    MLIRContext *ctx = op.getContext();
    SmallVector<AffineMap> maps = op.getIndexingMapsArray();
    AffineExpr m = getAffineDimExpr(0, ctx), n = getAffineDimExpr(1, ctx), k = getAffineDimExpr(2, ctx);
    bool plainA = maps[0] == AffineMap::get(3, 0, {m, k}, ctx);
    bool transposedA = maps[0] == AffineMap::get(3, 0, {k, m}, ctx);
    bool transposedB = plainA && maps[1] == AffineMap::get(3, 0, {n, k}, ctx);
    SmallVector<utils::IteratorType> iters = op.getIteratorTypesArray();
    if (op.getNumDpsInputs() != 2 || op.getNumDpsInits() != 1 || (!plainA && !transposedA) ||
        (maps[1] != AffineMap::get(3, 0, {k, n}, ctx) && !transposedB) ||
        maps[2] != AffineMap::get(3, 0, {m, n}, ctx) ||
        iters[0] != utils::IteratorType::parallel || iters[1] != utils::IteratorType::parallel ||
        iters[2] != utils::IteratorType::reduction)
      return op.emitOpError("spectra-vectorize-tiles: contractions must be C[m,n] += A[m,k] B[k,n] "
                            "(A possibly transposed) or C[m,n] += A[m,k] B[n,k]");
    Block &body = op.getRegion().front();
    auto add = dyn_cast_or_null<arith::AddFOp>(body.getTerminator()->getOperand(0).getDefiningOp());
    auto mul = add ? dyn_cast_or_null<arith::MulFOp>(
                         (add.getLhs() == body.getArgument(2) ? add.getRhs() : add.getLhs()).getDefiningOp())
                   : arith::MulFOp();
    if (!add || !mul || !llvm::is_contained(add->getOperands(), body.getArgument(2)))
      return op.emitOpError("spectra-vectorize-tiles: a contraction's body must be acc + a * b");
    Value A = op->getOperand(0), B = op->getOperand(1), C = op->getOperand(2);
    SmallVector<int64_t> shape = op.getStaticLoopRanges();
    int64_t M = shape[0], N = shape[1], K = shape[2], NR = NV * VL;
    const bool onAmx = amx && amxShaped(A, B, C, M, N, K);
    // The prologue on the accumulators: the register tiles of whole vectors only.
    if (prologue && (onAmx || transposedB || N % VL != 0)) {
      if (failed(lowerElementwise(prologue)))
        return failure();
      prologue = {};
    }
    if (onAmx)
      return lowerAmxContraction(A, B, C, M, N, K, transposedA, transposedB);
    if (transposedB) {
      // The dot form stores C; an epilogue then runs as its own elementwise loop.
      if (failed(lowerDotContraction(A, B, C, M, N, K)))
        return failure();
      return epilogue ? lowerElementwise(epilogue->op) : success();
    }

    // One register tile: `rows` x widths accumulators, loop-carried across k.
    auto tile = [&](Value row0, int64_t rows, Value col0, ArrayRef<int64_t> ws) {
      SmallVector<Value> colAt, rowAt;
      int64_t offset = 0;
      for (int64_t w : ws) {
        colAt.push_back(arith::AddIOp::create(b, loc, col0, idx(offset)));
        offset += w;
      }
      for (int64_t r = 0; r < rows; ++r)
        rowAt.push_back(arith::AddIOp::create(b, loc, row0, idx(r)));
      SmallVector<Value> init;
      Value zero = zeroOutput ? arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0)).getResult()
                              : Value();
      EpilogueReads prologueReads;
      for (int64_t r = 0; r < rows; ++r)
        for (auto [v, w] : llvm::enumerate(ws)) {
          if (zeroOutput) {
            init.push_back(splat(zero, w));
            continue;
          }
          Value old = vload(C, {rowAt[r], colAt[v]}, w);
          init.push_back(prologue ? bodyAt(prologue, prologue.getNumDpsInputs(), old, rowAt[r],
                                           colAt[v], w, prologueReads)
                                        .front()
                                  : old);
        }
      SmallVector<Value> acc = loop(0, K, 1, init, [&](Value kk, ValueRange carried) {
        SmallVector<Value> bv, next(carried.begin(), carried.end());
        for (auto [v, w] : llvm::enumerate(ws))
          bv.push_back(vload(B, {kk, colAt[v]}, w));
        for (int64_t r = 0; r < rows; ++r) {
          Value a = memref::LoadOp::create(b, loc, A,
                                           transposedA ? ValueRange{kk, rowAt[r]} : ValueRange{rowAt[r], kk});
          std::map<int64_t, Value> broadcasts;
          for (auto [v, w] : llvm::enumerate(ws)) {
            Value &ab = broadcasts[w];
            if (!ab)
              ab = splat(a, w);
            size_t at = r * ws.size() + v;
            next[at] = vector::FMAOp::create(b, loc, ab, bv[v], next[at]);
          }
        }
        return next;
      });
      // An epilogue's operands indexed by the row alone or the columns alone are read once
      // per register tile.
      EpilogueReads reads;
      for (int64_t r = 0; r < rows; ++r)
        for (auto [v, w] : llvm::enumerate(ws)) {
          Value done = acc[r * ws.size() + v];
          if (!epilogue || epilogue->storeOutput)
            vstore(done, C, {rowAt[r], colAt[v]});
          if (epilogue)
            epilogueAt(done, rowAt[r], colAt[v], w, reads);
        }
    };
    // A few columns past the last whole vector (SGQ's 65th feature at 16 lanes) as dot
    // products along k: a register tile spends K FMAs of one narrow vector per row on them,
    // and a broadcast of A for each; here each row takes K / VL FMAs per column on A's row
    // and B's column (its K entries gathered into vectors once per contraction), and the
    // rows' lane sums are taken together (sumLanes).
    const int64_t tailW = N % VL;
    const bool dotTail = tailW > 0 && plainA && K % VL == 0 && llvm::isPowerOf2_64(VL) &&
                         tailW * (K / VL + 4) < K;
    Type element = cast<MemRefType>(B.getType()).getElementType();
    SmallVector<SmallVector<Value>> tailColumns;  // [tail column][chunk of k]
    if (dotTail)
      for (int64_t c = 0; c < tailW; ++c) {
        Value col = idx(N - tailW + c);
        SmallVector<Value> column;
        for (int64_t k0 = 0; k0 < K; k0 += VL) {
          SmallVector<Value> entries;
          for (int64_t l = 0; l < VL; ++l)
            entries.push_back(memref::LoadOp::create(b, loc, B, ValueRange{idx(k0 + l), col}));
          column.push_back(vector::FromElementsOp::create(b, loc, vec(VL, element), entries));
        }
        tailColumns.push_back(column);
      }
    auto dotTailTile = [&](Value row0, int64_t rows) {
      Value col0 = idx(N - tailW);
      SmallVector<Value> rowAt, products;
      for (int64_t r = 0; r < rows; ++r) {
        rowAt.push_back(arith::AddIOp::create(b, loc, row0, idx(r)));
        SmallVector<Value> aRow;
        for (int64_t k0 = 0; k0 < K; k0 += VL)
          aRow.push_back(vload(A, {rowAt[r], idx(k0)}, VL));
        for (int64_t c = 0; c < tailW; ++c) {
          Value acc = arith::MulFOp::create(b, loc, aRow[0], tailColumns[c][0]);
          for (size_t j = 1; j < aRow.size(); ++j)
            acc = vector::FMAOp::create(b, loc, aRow[j], tailColumns[c][j], acc);
          products.push_back(acc);
        }
      }
      SmallVector<Value> sums = sumLanes(products, VL);
      // One column whose epilogue has an exp: the epilogue runs down the register tile's rows,
      // on one vector, where each row would take a vector's work for one lane.
      if (epilogue && tailW == 1 && rows >= 4 && llvm::isPowerOf2_64(rows) &&
          downRowsShaped(epilogue->op)) {
        SmallVector<Value> done;
        for (int64_t r = 0; r < rows; ++r) {
          Value s = sums[r];
          if (!zeroOutput) {
            Value old = memref::LoadOp::create(b, loc, C, ValueRange{rowAt[r], col0});
            s = arith::AddFOp::create(b, loc, old, s);
          }
          if (epilogue->storeOutput)
            memref::StoreOp::create(b, loc, s, C, ValueRange{rowAt[r], col0});
          done.push_back(s);
        }
        epilogueDownRows(done, rowAt, col0);
        return;
      }
      EpilogueReads reads;
      for (int64_t r = 0; r < rows; ++r) {
        ArrayRef<Value> row = ArrayRef<Value>(sums).slice(r * tailW, tailW);
        Value done = tailW == 1
                         ? splat(row[0], 1)
                         : vector::FromElementsOp::create(b, loc, vec(tailW, element), row).getResult();
        if (!zeroOutput)
          done = arith::AddFOp::create(b, loc, vload(C, {rowAt[r], col0}, tailW), done);
        if (!epilogue || epilogue->storeOutput)
          vstore(done, C, {rowAt[r], col0});
        if (epilogue)
          epilogueAt(done, rowAt[r], col0, tailW, reads);
      }
    };
    // Full column blocks of NR in a loop, the remaining columns once (full vectors and a tail).
    auto rowBlock = [&](Value row0, int64_t rows) {
      int64_t fullCols = N - N % NR;
      if (fullCols > 0)
        loop(0, fullCols, NR, {}, [&](Value col0, ValueRange) {
          tile(row0, rows, col0, SmallVector<int64_t>(NV, VL));
          return SmallVector<Value>();
        });
      if (int64_t rest = N % NR - (dotTail ? tailW : 0))
        tile(row0, rows, idx(fullCols), widths(rest, VL));
      if (dotTail)
        dotTailTile(row0, rows);
    };
    int64_t fullRows = M - M % MR;
    // The next tile's rows the staging left to this contraction: each register tile's rows
    // prefetch the same rows of the next tile, spread through the contraction.
    SmallVector<NextTileRows> spread;
    if (pendingPrefetches && M % MR == 0 && tileRowsOf(op) == M) {
      for (NextTileRows p : *pendingPrefetches)
        if (p.block == op->getBlock())
          spread.push_back(p);
      llvm::erase_if(*pendingPrefetches,
                     [&](const NextTileRows &p) { return p.block == op->getBlock(); });
    }
    if (fullRows > 0)
      loop(0, fullRows, MR, {}, [&](Value row0, ValueRange) {
        for (NextTileRows p : spread) {
          Value first = arith::AddIOp::create(b, loc, p.base, row0);
          for (int64_t r = 0; r < MR; ++r)
            prefetchRow(p.source, first, r);
        }
        rowBlock(row0, MR);
        return SmallVector<Value>();
      });
    if (M % MR)
      rowBlock(idx(fullRows), M % MR);
    return success();
  }


  /// Whether a contraction fits AMX's tiles: f32 operands, 16 x 16 output tiles, k in steps
  /// of 32 (two bf16 per 32-bit lane of a 16 x 64-byte tile row).
  bool amxShaped(Value A, Value B, Value C, int64_t M, int64_t N, int64_t K) {
    for (Value v : {A, B, C})
      if (!cast<MemRefType>(v.getType()).getElementType().isF32())
        return false;
    return M % 16 == 0 && N % 16 == 0 && K % 32 == 0;
  }

  /// An f32 vector split in two bf16 parts, hi = bf16(x) and lo = bf16(x - hi) (both rounded
  /// to nearest): hi + lo carries x to about 2^-17 of it, and the products
  /// hi hi' + hi lo' + lo hi' carry f32 operands to about 2^-16 (bf16x3).
  std::pair<Value, Value> split(Value x) {
    auto type = cast<VectorType>(x.getType());
    auto half = VectorType::get(type.getShape(), b.getBF16Type());
    Value hi = arith::TruncFOp::create(b, loc, half, x);
    Value rest = arith::SubFOp::create(b, loc, x, arith::ExtFOp::create(b, loc, type, hi));
    return {hi, arith::TruncFOp::create(b, loc, half, rest)};
  }

  /// The entry block of the function being lowered.
  Block &entryBlock() {
    return b.getInsertionBlock()->getParent()->getParentOfType<func::FuncOp>().getBody().front();
  }
  /// A static buffer allocated once, at the function's entry (PackTileBuffers places it).
  Value entryAlloca(MemRefType type) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&entryBlock());
    return memref::AllocaOp::create(b, loc, type);
  }
  /// Whether `v` is an argument of the function that nothing in it writes, and that no
  /// other argument may be the buffer of (spectra::mayAlias): a pack of it holds for the
  /// whole call.
  bool readOnlyArgument(Value v) {
    auto arg = dyn_cast<BlockArgument>(v);
    if (!arg || arg.getOwner() != &entryBlock())
      return false;
    for (BlockArgument other : entryBlock().getArguments())
      if (other != arg && spectra::mayAlias(other, arg))
        return false;
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      if (auto generic = dyn_cast<linalg::GenericOp>(user)) {
        if (generic.isDpsInit(&use))
          return false;
        continue;
      }
      if (!isa<vector::LoadOp, memref::LoadOp>(user))
        return false;
    }
    return true;
  }

  /// A[m, k] (`transposed`: stored [k, m]) as two [M x K] bf16 buffers, row-major: AMX's A
  /// tiles are 16 rows of 32 k.
  std::pair<Value, Value> packA(Value A, int64_t M, int64_t K, bool transposed) {
    auto type = MemRefType::get({M, K}, b.getBF16Type());
    Value hi = entryAlloca(type), lo = entryAlloca(type);
    if (!transposed) {
      loop(0, M, 1, {}, [&](Value r, ValueRange) {
        for (int64_t k0 = 0; k0 < K; k0 += 16) {
          auto [h, l] = split(vload(A, {r, idx(k0)}, 16));
          vstore(h, hi, {r, idx(k0)});
          vstore(l, lo, {r, idx(k0)});
        }
        return SmallVector<Value>();
      });
      return {hi, lo};
    }
    // Stored [K x M]: 16 x 16 blocks transposed in registers (transpose16).
    loop(0, K, 16, {}, [&](Value k0, ValueRange) {
      for (int64_t m0 = 0; m0 < M; m0 += 16) {
        SmallVector<Value> rows;
        for (int64_t r = 0; r < 16; ++r)
          rows.push_back(vload(A, {arith::AddIOp::create(b, loc, k0, idx(r)), idx(m0)}, 16));
        SmallVector<Value> cols = transpose16(rows);
        for (int64_t c = 0; c < 16; ++c) {
          auto [h, l] = split(cols[c]);
          vstore(h, hi, {idx(m0 + c), k0});
          vstore(l, lo, {idx(m0 + c), k0});
        }
      }
      return SmallVector<Value>();
    });
    return {hi, lo};
  }

  /// B[k, n] (`transposed`: stored [n, k]) as two bf16 buffers in AMX's B layout, [K/2 x 2N]:
  /// row i holds, for each n, the pair B[2i, n], B[2i + 1, n].
  std::pair<Value, Value> packB(Value B, int64_t N, int64_t K, bool transposed) {
    auto type = MemRefType::get({K / 2, 2 * N}, b.getBF16Type());
    Value hi = entryAlloca(type), lo = entryAlloca(type);
    if (!transposed) {
      loop(0, K / 2, 1, {}, [&](Value i, ValueRange) {
        Value k0 = arith::MulIOp::create(b, loc, i, idx(2));
        Value k1 = arith::AddIOp::create(b, loc, k0, idx(1));
        for (int64_t n0 = 0; n0 < N; n0 += 16) {
          auto [h0, l0] = split(vload(B, {k0, idx(n0)}, 16));
          auto [h1, l1] = split(vload(B, {k1, idx(n0)}, 16));
          vstore(vector::InterleaveOp::create(b, loc, h0, h1), hi, {i, idx(2 * n0)});
          vstore(vector::InterleaveOp::create(b, loc, l0, l1), lo, {i, idx(2 * n0)});
        }
        return SmallVector<Value>();
      });
      return {hi, lo};
    }
    // Stored [N x K]: row n's bf16 parts, read as 32-bit pairs, are column n of the packed
    // buffer's pairs: 16 x 16 blocks of pairs transposed in registers.
    auto pairs = VectorType::get({16}, b.getI32Type());
    auto halfRow = VectorType::get({32}, b.getBF16Type());
    loop(0, N, 16, {}, [&](Value n0, ValueRange) {
      for (int64_t k0 = 0; k0 < K; k0 += 32) {
        SmallVector<Value> his, los;
        for (int64_t r = 0; r < 16; ++r) {
          Value n = arith::AddIOp::create(b, loc, n0, idx(r));
          auto [h0, l0] = split(vload(B, {n, idx(k0)}, 16));
          auto [h1, l1] = split(vload(B, {n, idx(k0 + 16)}, 16));
          auto join = [&](Value x, Value y) {
            Value both = vector::ShuffleOp::create(b, loc, x, y,
                                                   llvm::to_vector(llvm::seq<int64_t>(0, 32)));
            return vector::BitCastOp::create(b, loc, pairs, both).getResult();
          };
          his.push_back(join(h0, h1));
          los.push_back(join(l0, l1));
        }
        Value col = arith::MulIOp::create(b, loc, n0, idx(2));
        for (auto [parts, out] : {std::pair(&his, hi), std::pair(&los, lo)}) {
          SmallVector<Value> t = transpose16(*parts);
          for (int64_t i = 0; i < 16; ++i)
            vstore(vector::BitCastOp::create(b, loc, halfRow, t[i]), out, {idx(k0 / 2 + i), col});
        }
      }
      return SmallVector<Value>();
    });
    return {hi, lo};
  }

  /// The 16 x 16 transpose of 16 vectors of 16 lanes: four rounds of two-vector shuffles
  /// (round s pairs vectors s apart and swaps their s-lane blocks), 64 shuffles.
  SmallVector<Value> transpose16(ArrayRef<Value> rows) {
    SmallVector<Value> v(rows.begin(), rows.end());
    for (int64_t s = 8; s >= 1; s /= 2) {
      SmallVector<Value> next(16);
      for (int64_t i = 0; i < 16; ++i) {
        if (i & s)
          continue;
        // Lane l of the pair (i, i + s): x keeps its blocks with bit s clear and takes y's
        // there; y keeps its blocks with bit s set and takes x's.
        SmallVector<int64_t> lo, hi;
        for (int64_t l = 0; l < 16; ++l) {
          lo.push_back(l & s ? 16 + (l - s) : l);
          hi.push_back(l & s ? 16 + l : l + s);
        }
        next[i] = vector::ShuffleOp::create(b, loc, v[i], v[i + s], lo);
        next[i + s] = vector::ShuffleOp::create(b, loc, v[i], v[i + s], hi);
      }
      v = std::move(next);
    }
    return v;
  }

  /// C[m, n] += A[m, k] B[k, n] on AMX tiles. The f32 operands are split in two bf16 parts
  /// (split) and packed: A row-major (packA), B in pairs along k (packB); B once per call
  /// where the function only reads it (W, the summaries). Per 16 x 16 tile of C, the
  /// accumulator tile (zeroed or loaded) takes three tile products per 32 k, lo hi', hi lo',
  /// hi hi' (TDPBF16PS, f32 accumulation); then C is stored, and an epilogue runs over it as
  /// its own elementwise loop.
  LogicalResult lowerAmxContraction(Value A, Value B, Value C, int64_t M, int64_t N, int64_t K,
                                    bool transposedA, bool transposedB) {
    auto [aHi, aLo] = packA(A, M, K, transposedA);
    std::pair<Value, Value> bParts;
    if (entryPacks && readOnlyArgument(B)) {
      auto &packed = (*entryPacks)[B];
      if (!packed.first) {
        OpBuilder::InsertionGuard guard(b);
        Block &entry = entryBlock();
        b.setInsertionPoint(&*llvm::find_if(entry, [](Operation &op) {
          return !isa<memref::AllocaOp>(op);
        }));
        packed = packB(B, N, K, transposedB);
      }
      bParts = packed;
    } else {
      bParts = packB(B, N, K, transposedB);
    }
    auto [bHi, bLo] = bParts;
    auto operand = amx::TileType::get({16, 32}, b.getBF16Type());
    auto accumulator = amx::TileType::get({16, 16}, b.getF32Type());
    loop(0, M, 16, {}, [&](Value m0, ValueRange) {
      loop(0, N, 16, {}, [&](Value n0, ValueRange) {
        Value acc = zeroOutput ? amx::TileZeroOp::create(b, loc, accumulator).getResult()
                               : amx::TileLoadOp::create(b, loc, accumulator, C, ValueRange{m0, n0})
                                     .getResult();
        Value pairCol = arith::MulIOp::create(b, loc, n0, idx(2));
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
          auto load = [&](Value mem, Value row, Value col) {
            return amx::TileLoadOp::create(b, loc, operand, mem, ValueRange{row, col}).getResult();
          };
          Value ah = load(aHi, m0, idx(k0)), al = load(aLo, m0, idx(k0));
          Value bh = load(bHi, idx(k0 / 2), pairCol), bl = load(bLo, idx(k0 / 2), pairCol);
          acc = amx::TileMulFOp::create(b, loc, accumulator, al, bh, acc);
          acc = amx::TileMulFOp::create(b, loc, accumulator, ah, bl, acc);
          acc = amx::TileMulFOp::create(b, loc, accumulator, ah, bh, acc);
        }
        amx::TileStoreOp::create(b, loc, C, ValueRange{m0, n0}, acc);
        return SmallVector<Value>();
      });
      return SmallVector<Value>();
    });
    return epilogue ? lowerElementwise(epilogue->op) : success();
  }

  /// The epilogue's body at (row, col0 ...) on w lanes, the input that reads C the finished
  /// accumulator `acc`; its results stored.
  /// `reads`: the operands read by the row alone or the columns alone so far in this
  /// register tile, by (operand, row or first column, width).
  using EpilogueReads = std::map<std::tuple<unsigned, const void *, int64_t>, Value>;
  void epilogueAt(Value acc, Value row, Value col0, int64_t w, EpilogueReads &reads) {
    linalg::GenericOp op = epilogue->op;
    SmallVector<Value> ivs = {row, col0};
    SmallVector<Value> yields = bodyAt(op, epilogue->input, acc, row, col0, w, reads);
    for (auto [k, y] : llvm::enumerate(yields)) {
      unsigned o = op.getNumDpsInputs() + k;
      vstore(y, op->getOperand(o), indices(op.getIndexingMapsArray()[o], ivs));
    }
  }

  /// The body of a 2-D elementwise generic `op` at (row, col0 ...) on w lanes, operand `given`
  /// the vector `value`, the others read (those by the row alone or the columns alone once
  /// per `reads`); its results, not stored.
  SmallVector<Value> bodyAt(linalg::GenericOp op, unsigned given, Value value, Value row,
                            Value col0, int64_t w, EpilogueReads &reads) {
    unsigned numIns = op.getNumDpsInputs();
    Block &body = op.getRegion().front();
    SmallVector<Value> ivs = {row, col0}, args;
    for (unsigned a = 0; a < op->getNumOperands(); ++a) {
      if (a == given) {
        args.push_back(value);
        continue;
      }
      if (a >= numIns && body.getArgument(a).use_empty()) {
        args.push_back(Value());
        continue;
      }
      AffineMap map = op.getIndexingMapsArray()[a];
      if (map.getNumResults() != 1) {
        args.push_back(operandAt(op, a, ivs, 1, w));
        continue;
      }
      Value &read = reads[{a, (alongDim(map, 1) ? col0 : row).getAsOpaquePointer(), w}];
      if (!read)
        read = operandAt(op, a, ivs, 1, w);
      args.push_back(read);
    }
    return cloneBody(op, args, w);
  }

  /// The lane sums of `vs` (vectors of `width` lanes, a power of two), computed together: the
  /// vectors are folded in pairs, each half of a block of lanes from either vector (two
  /// shuffles and one add per pair), until every lane holds one vector's whole sum. n >= width
  /// vectors take n - 1 folds, where n separate reductions take n log2(width) shuffle-adds.
  SmallVector<Value> sumLanes(ArrayRef<Value> vs, int64_t width) {
    if (vs.size() == 1 || !llvm::isPowerOf2_64(width)) {
      SmallVector<Value> sums;
      for (Value v : vs)
        sums.push_back(acrossLanes(vector::CombiningKind::ADD, v));
      return sums;
    }
    // A folded vector: blocks of `w` lanes, block j partial sums of vs[ids[j]] (-1: none).
    struct Part {
      Value v;
      SmallVector<int64_t> ids;
    };
    SmallVector<Part> parts;
    for (auto [i, v] : llvm::enumerate(vs))
      parts.push_back({v, {static_cast<int64_t>(i)}});
    for (int64_t w = width; w > 1; w /= 2) {
      const int64_t h = w / 2;
      SmallVector<Part> next;
      for (size_t i = 0; i < parts.size(); i += 2) {
        // An odd one out folds with itself; the copy's blocks are marked unused.
        const Part &x = parts[i];
        Part y = i + 1 < parts.size() ? parts[i + 1]
                                      : Part{x.v, SmallVector<int64_t>(x.ids.size(), -1)};
        SmallVector<int64_t> lo, hi, ids;
        for (size_t j = 0; j < x.ids.size(); ++j) {
          for (int64_t l = 0; l < h; ++l)
            lo.push_back(j * w + l), hi.push_back(j * w + h + l);
          for (int64_t l = 0; l < h; ++l)
            lo.push_back(width + j * w + l), hi.push_back(width + j * w + h + l);
          ids.append({x.ids[j], y.ids[j]});
        }
        // Two statements: the shuffles' order in the IR must not depend on the compiler.
        Value low = vector::ShuffleOp::create(b, loc, x.v, y.v, lo);
        Value high = vector::ShuffleOp::create(b, loc, x.v, y.v, hi);
        Value sum = arith::AddFOp::create(b, loc, low, high);
        next.push_back({sum, ids});
      }
      parts = std::move(next);
    }
    SmallVector<Value> sums(vs.size());
    for (const Part &part : parts)
      for (auto [lane, id] : llvm::enumerate(part.ids))
        if (id >= 0)
          sums[id] = vector::ExtractOp::create(b, loc, part.v, ArrayRef<int64_t>{int64_t(lane)});
    return sums;
  }

  /// C[m, n] += sum_k A[m, k] B[n, k]: register tiles of `register-rows` rows x 2 columns
  /// (4 at 16 lanes, with 32 vector registers), each (row, column) pair a vector accumulator
  /// along k (full vectors in a loop, the tail narrower), their lane sums taken together
  /// (sumLanes) and added into C once.
  LogicalResult lowerDotContraction(Value A, Value B, Value C, int64_t M, int64_t N, int64_t K) {
    const int64_t NC = VL >= 16 ? 4 : 2, full = K - K % VL;
    Type f32 = b.getF32Type();
    auto zero = [&](int64_t w) {
      return splat(arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0)).getResult(), w);
    };
    auto tile = [&](Value row0, int64_t rows, Value col0, int64_t cols) {
      SmallVector<Value> rowAt, colAt;
      for (int64_t r = 0; r < rows; ++r)
        rowAt.push_back(arith::AddIOp::create(b, loc, row0, idx(r)));
      for (int64_t c = 0; c < cols; ++c)
        colAt.push_back(arith::AddIOp::create(b, loc, col0, idx(c)));
      // Accumulates the chunk at kk of width w into acc (rows x cols vectors).
      auto step = [&](Value kk, int64_t w, ValueRange acc) {
        SmallVector<Value> av, bv, next;
        for (int64_t r = 0; r < rows; ++r)
          av.push_back(vload(A, {rowAt[r], kk}, w));
        for (int64_t c = 0; c < cols; ++c)
          bv.push_back(vload(B, {colAt[c], kk}, w));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            next.push_back(vector::FMAOp::create(b, loc, av[r], bv[c], acc[r * cols + c]));
        return next;
      };
      SmallVector<Value> sums(rows * cols);
      if (full > 0) {
        SmallVector<Value> acc = loop(0, full, VL, SmallVector<Value>(rows * cols, zero(VL)),
                                      [&](Value kk, ValueRange carried) { return step(kk, VL, carried); });
        sums = sumLanes(acc, VL);
      }
      if (K % VL) {
        SmallVector<Value> acc = step(idx(full), K % VL, SmallVector<Value>(rows * cols, zero(K % VL)));
        SmallVector<Value> tail = sumLanes(acc, K % VL);
        for (size_t i = 0; i < acc.size(); ++i)
          sums[i] = sums[i] ? arith::AddFOp::create(b, loc, sums[i], tail[i]).getResult() : tail[i];
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          Value sum = sums[r * cols + c];
          if (!zeroOutput)
            sum = arith::AddFOp::create(
                b, loc, memref::LoadOp::create(b, loc, C, ValueRange{rowAt[r], colAt[c]}), sum);
          memref::StoreOp::create(b, loc, sum, C, ValueRange{rowAt[r], colAt[c]});
        }
    };
    (void)f32;
    auto rowBlock = [&](Value row0, int64_t rows) {
      if (N >= NC)
        loop(0, N - N % NC, NC, {}, [&](Value col0, ValueRange) {
          tile(row0, rows, col0, NC);
          return SmallVector<Value>();
        });
      if (N % NC)
        tile(row0, rows, idx(N - N % NC), N % NC);
    };
    if (M >= MR)
      loop(0, M - M % MR, MR, {}, [&](Value row0, ValueRange) {
        rowBlock(row0, MR);
        return SmallVector<Value>();
      });
    if (M % MR)
      rowBlock(idx(M - M % MR), M % MR);
    return success();
  }

  OpBuilder &b;
  Location loc;
  int64_t VL, MR, NV;
};

/// Whether `g` can run as the prologue of a contraction into C ([M x N]): a 2-D all-parallel
/// generic over C's shape whose one output is C by the identity map (its payload may read
/// C's old value: an update in place), whose inputs are not in C's memory, that runs on
/// the accumulators (spectra::runsOnAccumulators), and whose operands are static memrefs.
bool prologueShaped(linalg::GenericOp g, Value C, int64_t M, int64_t N) {
  for (Value v : g->getOperands()) {
    auto type = dyn_cast<MemRefType>(v.getType());
    if (!type || !type.hasStaticShape())
      return false;
  }
  if (g.getNumLoops() != 2 || g.getNumReductionLoops() != 0 || !g.hasPureBufferSemantics() ||
      g.getNumDpsInits() != 1 || g.getDpsInits()[0] != C ||
      !g.getMatchingIndexingMap(g.getDpsInitOperand(0)).isIdentity())
    return false;
  SmallVector<int64_t> shape = g.getStaticLoopRanges();
  if (shape[0] != M || shape[1] != N || !spectra::runsOnAccumulators(g))
    return false;
  return llvm::none_of(g.getDpsInputs(), [&](Value in) { return spectra::mayAlias(in, C); });
}

/// The prologue of a contraction C[m, n] += A B (2 inputs, C by (m, n)): the last op before
/// it that may touch C's memory, where that op is prologueShaped and no op between the two
/// (linalg ops, or ops without memory effects) writes memory it reads. It can then run at
/// the contraction, on each register tile's accumulators as they are loaded (kv's rescale
/// of the summary S by exp(old - new) before phi^T v is added: S read and written once per
/// tile, not twice). Null otherwise.
linalg::GenericOp prologueOf(linalg::GenericOp op) {
  Value C = spectra::contractionOutput(op);
  if (!C || op.getNumDpsInputs() != 2)
    return {};
  SmallVector<int64_t> shape = op.getStaticLoopRanges();
  SmallVector<Value> written;  // what the ops between write
  for (Operation *prev = op->getPrevNode(); prev; prev = prev->getPrevNode()) {
    if (isMemoryEffectFree(prev))
      continue;
    auto linalgOp = dyn_cast<linalg::LinalgOp>(prev);
    if (!linalgOp)
      return {};
    bool touchesC = llvm::any_of(prev->getOperands(), [&](Value v) {
      return isa<MemRefType>(v.getType()) && spectra::mayAlias(v, C);
    });
    if (!touchesC) {
      llvm::append_range(written, linalgOp.getDpsInits());
      continue;
    }
    auto g = dyn_cast<linalg::GenericOp>(prev);
    if (!g || !prologueShaped(g, C, shape[0], shape[1]))
      return {};
    for (Value in : g.getDpsInputs())
      if (llvm::any_of(written, [&](Value w) { return spectra::mayAlias(in, w); }))
        return {};
    return g;
  }
  return {};
}

struct VectorizeTilesPass
    : mlir::spectra::impl::SpectraVectorizeTilesBase<VectorizeTilesPass> {
  using SpectraVectorizeTilesBase::SpectraVectorizeTilesBase;
  void runOnOperation() override {
    if (vectorWidth < 1 || registerRows < 1 || registerVectors < 1) {
      getOperation().emitError("spectra-vectorize-tiles: vector-width, register-rows and "
                               "register-vectors must be positive");
      return signalPassFailure();
    }
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) {
      if (isa<linalg::FillOp, linalg::GenericOp>(op))
        ops.push_back(op);
    });
    // A contraction into a tile that the fill just before it (between them nothing with
    // memory effects but fills of buffers that cannot be the tile's memory) set to +0 writes
    // the whole tile: its accumulators start at 0 and the fill goes, so the tile is neither
    // stored as zeros nor loaded back.
    llvm::DenseSet<Operation *> zeroed, dropped;
    for (Operation *op : ops)
      if (auto generic = dyn_cast<linalg::GenericOp>(op))
        if (linalg::FillOp fill = spectra::zeroFillBefore(generic)) {
          zeroed.insert(op);
          dropped.insert(fill);
        }
    // Epilogues: an elementwise generic right after a contraction (nothing with memory
    // effects between) that reads the contraction's output tile C element by element, and
    // may write neither its inputs nor a view that overlaps C, runs on the register tiles'
    // accumulators; C is then stored only if something else reads it.
    llvm::DenseMap<Operation *, spectra::Epilogue> epilogues;
    llvm::DenseSet<Operation *> fused;
    for (Operation *op : ops)
      if (auto generic = dyn_cast<linalg::GenericOp>(op))
        if (std::optional<spectra::Epilogue> e = spectra::epilogueOf(generic)) {
          epilogues[op] = *e;
          fused.insert(e->op);
        }
    // Prologues: an elementwise update of a contraction's output tile C in place, with
    // nothing between the two touching C or writing what it reads, runs at the contraction
    // on each register tile's accumulators as they are loaded.
    llvm::DenseMap<Operation *, linalg::GenericOp> prologues;
    for (Operation *op : ops)
      if (auto generic = dyn_cast<linalg::GenericOp>(op); generic && !zeroed.contains(op))
        if (linalg::GenericOp p = prologueOf(generic); p && !fused.contains(p)) {
          // The contraction's epilogue writes as the register tiles finish, while later
          // tiles' prologues still read: it must write nothing the prologue reads.
          auto e = epilogues.find(op);
          if (e != epilogues.end() &&
              llvm::any_of(e->second.op.getDpsInits(), [&](Value out) {
                return llvm::any_of(p.getDpsInputs(),
                                    [&](Value in) { return spectra::mayAlias(in, out); });
              }))
            continue;
          prologues[op] = p;
          fused.insert(p);
        }
    OpBuilder b(&getContext());
    llvm::DenseMap<Value, std::pair<Value, Value>> entryPacks;
    SmallVector<Vectorizer::NextTileRows> pendingPrefetches;
    for (Operation *op : ops) {
      if (!dropped.contains(op) && !fused.contains(op)) {
        b.setInsertionPoint(op);
        Vectorizer v(b, op->getLoc(), vectorWidth, registerRows, registerVectors);
        v.amx = amx;
        v.entryPacks = &entryPacks;
        v.pendingPrefetches = &pendingPrefetches;
        v.zeroOutput = zeroed.contains(op);
        if (auto it = epilogues.find(op); it != epilogues.end())
          v.epilogue = &it->second;
        if (auto it = prologues.find(op); it != prologues.end())
          v.prologue = it->second;
        if (failed(v.lower(op)))
          return signalPassFailure();
      }
      if (!fused.contains(op))
        op->erase();
    }
    for (Operation *op : fused)
      op->erase();
  }
};

} // namespace
