//===- MapContractionsToMma.cpp - tile contractions on tensor cores -------===//
//
// See MapContractionsToMma.h. The lane maps are those of the PTX ISA's
// mma.sync.aligned.m16n8k16 / m16n8k8 .row.col with 16-bit operands and f32
// accumulators (g = lane / 4, t = lane % 4; a 32-bit register holds two
// operand elements, the lower k in the low half):
//   A (16 x k), k16: reg r = (g + 8 (r % 2), 2t + 8 (r / 2) + {0, 1});
//                k8: reg r = (g + 8 r, 2t + {0, 1})
//   B (k x 8),  k16: reg r = (2t + 8 r + {0, 1}, g);  k8: reg 0 = (2t + {0, 1}, g)
//   C, D (16 x 8): element i = (g + 8 (i / 2), 2t + i % 2)
// (../shared/examples/mma-fused checks them in a lane model against numpy.)
//
//===----------------------------------------------------------------------===//

#include "codegen/MapContractionsToMma.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace mlir::spectra;

namespace {

constexpr int64_t kTileM = 16, kTileN = 8;

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The loop dims an indexing map reads, in result order.
SmallVector<unsigned> dimsOf(AffineMap map) {
  SmallVector<unsigned> dims;
  for (AffineExpr e : map.getResults())
    dims.push_back(cast<AffineDimExpr>(e).getPosition());
  return dims;
}

bool sameSet(ArrayRef<unsigned> dims, unsigned x, unsigned y) {
  return dims.size() == 2 && llvm::is_contained(dims, x) && llvm::is_contained(dims, y);
}

/// Whether the body is `yield out + a * b` over the block arguments (a, b, out).
bool isMultiplyAdd(linalg::GenericOp op) {
  Block &body = op.getRegion().front();
  if (body.getOperations().size() != 3)
    return false;
  auto mul = dyn_cast<arith::MulFOp>(body.front());
  auto add = dyn_cast<arith::AddFOp>(*std::next(body.begin()));
  auto yield = dyn_cast<linalg::YieldOp>(body.getTerminator());
  if (!mul || !add || !yield || yield.getNumOperands() != 1 || yield.getOperand(0) != add)
    return false;
  Value a = body.getArgument(0), b = body.getArgument(1), out = body.getArgument(2);
  bool mulOk = (mul.getLhs() == a && mul.getRhs() == b) || (mul.getLhs() == b && mul.getRhs() == a);
  bool addOk = (add.getLhs() == out && add.getRhs() == mul) ||
               (add.getLhs() == mul && add.getRhs() == out);
  return mulOk && addOk;
}

/// The coordinates of an operand's element at loop position (m, n, k) of `plan`.
SmallVector<Value> coordinates(AffineMap map, const MmaPlan &plan, Value m, Value n, Value k) {
  SmallVector<Value> at;
  for (unsigned d : dimsOf(map))
    at.push_back(d == plan.mDim ? m : d == plan.nDim ? n : k);
  return at;
}

} // namespace

std::optional<MmaPlan> mlir::spectra::planMma(linalg::GenericOp op) {
  if (op.getNumDpsInputs() != 2 || op.getNumDpsInits() != 1 || op.getNumLoops() != 3 ||
      op.getNumReductionLoops() != 1 || !op.hasPureBufferSemantics() || !isMultiplyAdd(op))
    return std::nullopt;
  for (OpOperand &operand : op->getOpOperands()) {
    auto type = dyn_cast<MemRefType>(operand.get().getType());
    if (!type || !type.getElementType().isF32())
      return std::nullopt;
  }
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  if (llvm::any_of(ranges, ShapedType::isDynamic))
    return std::nullopt;
  SmallVector<AffineMap> maps = op.getIndexingMapsArray();
  if (!llvm::all_of(maps, [](AffineMap map) { return map.isProjectedPermutation(); }))
    return std::nullopt;
  SmallVector<unsigned> parallel;
  unsigned k = 0;
  for (auto [d, it] : llvm::enumerate(op.getIteratorTypesArray())) {
    if (it == utils::IteratorType::parallel)
      parallel.push_back(d);
    else
      k = d;
  }
  if (!sameSet(dimsOf(maps[2]), parallel[0], parallel[1]))
    return std::nullopt;
  // Of the two orientations (which parallel dim is the mma's 16-row m), the one with the
  // smaller padded tile area.
  std::optional<MmaPlan> best;
  int64_t bestArea = 0;
  for (auto [m, n] : {std::pair(parallel[0], parallel[1]), std::pair(parallel[1], parallel[0])}) {
    MmaPlan plan;
    plan.mDim = m;
    plan.nDim = n;
    plan.kDim = k;
    if (sameSet(dimsOf(maps[0]), m, k) && sameSet(dimsOf(maps[1]), n, k))
      plan.aInput = 0;
    else if (sameSet(dimsOf(maps[1]), m, k) && sameSet(dimsOf(maps[0]), n, k))
      plan.aInput = 1;
    else
      continue;
    plan.kStep = ranges[k] > 8 ? 16 : 8;
    int64_t area = ceilDiv(ranges[m], kTileM) * kTileM * ceilDiv(ranges[n], kTileN) * kTileN;
    if (!best || area < bestArea) {
      best = plan;
      bestArea = area;
    }
  }
  if (!best)
    return std::nullopt;
  int64_t padded = bestArea * ceilDiv(ranges[k], best->kStep) * best->kStep;
  if (4 * ranges[0] * ranges[1] * ranges[2] < padded)
    return std::nullopt;
  return best;
}

void mlir::spectra::mapContractionToWarps(linalg::GenericOp op, const MmaPlan &plan,
                                          int64_t warps, Type mmaType, bool split,
                                          StringRef nestAttr, const Epilogue *epilogue,
                                          bool zeroInit) {
  MLIRContext *ctx = op.getContext();
  Location loc = op.getLoc();
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  int64_t rm = ranges[plan.mDim], rn = ranges[plan.nDim];
  int64_t tilesN = ceilDiv(rn, kTileN), total = ceilDiv(rm, kTileM) * tilesN;
  int64_t n = std::min(total, warps);
  OpBuilder b(op);
  auto idx = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };
  auto nest = scf::ForallOp::create(
      b, loc, ArrayRef<OpFoldResult>{b.getIndexAttr(n)}, ValueRange{},
      b.getArrayAttr({gpu::GPUWarpMappingAttr::get(ctx, gpu::MappingId::DimX)}));
  nest->setAttr(nestAttr, b.getUnitAttr());
  b.setInsertionPointToStart(nest.getBody());
  Value tile = nest.getInductionVar(0);
  if (total > n) {
    auto loop = scf::ForOp::create(b, loc, tile, idx(total), idx(n));
    b.setInsertionPointToStart(loop.getBody());
    tile = loop.getInductionVar();
  }
  Value offM = arith::MulIOp::create(b, loc, arith::DivUIOp::create(b, loc, tile, idx(tilesN)),
                                     idx(kTileM));
  Value offN = arith::MulIOp::create(b, loc, arith::RemUIOp::create(b, loc, tile, idx(tilesN)),
                                     idx(kTileN));
  // An edge tile is clipped to the contraction's range.
  auto size = [&](int64_t range, int64_t step, Value off) -> OpFoldResult {
    if (range % step == 0)
      return b.getIndexAttr(step);
    return OpFoldResult(arith::MinSIOp::create(b, loc, idx(step),
                                               arith::SubIOp::create(b, loc, idx(range), off)));
  };
  OpFoldResult sizeM = size(rm, kTileM, offM), sizeN = size(rn, kTileN, offN);
  SmallVector<Value> operands;
  for (OpOperand &operand : op->getOpOperands()) {
    SmallVector<OpFoldResult> offsets, sizes, strides;
    for (unsigned d : dimsOf(op.getMatchingIndexingMap(&operand))) {
      offsets.push_back(d == plan.mDim   ? OpFoldResult(offM)
                        : d == plan.nDim ? OpFoldResult(offN)
                                         : OpFoldResult(b.getIndexAttr(0)));
      sizes.push_back(d == plan.mDim   ? sizeM
                      : d == plan.nDim ? sizeN
                                       : OpFoldResult(b.getIndexAttr(ranges[d])));
      strides.push_back(b.getIndexAttr(1));
    }
    operands.push_back(memref::SubViewOp::create(b, loc, operand.get(), offsets, sizes, strides));
  }
  if (zeroInit)
    linalg::FillOp::create(b, loc, ValueRange{arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0))},
                           ValueRange{operands[2]});
  auto tileOp = linalg::GenericOp::create(
      b, loc, TypeRange{}, ValueRange{operands[0], operands[1]}, ValueRange{operands[2]},
      op.getIndexingMapsArray(), op.getIteratorTypesArray(), "", "",
      [&](OpBuilder &nb, Location l, ValueRange args) {
        auto round = [&](Value x) {
          Value narrow = arith::TruncFOp::create(nb, l, mmaType, x);
          return arith::ExtFOp::create(nb, l, nb.getF32Type(), narrow).getResult();
        };
        Value a = args[0], b = args[1], c = args[2];
        Value ah = round(a), bh = round(b);
        if (split) {
          // The three mma of a split step, in their order: lo x hi, hi x lo, hi x hi.
          Value al = round(arith::SubFOp::create(nb, l, a, ah)),
                bl = round(arith::SubFOp::create(nb, l, b, bh));
          c = arith::AddFOp::create(nb, l, c, arith::MulFOp::create(nb, l, al, bh));
          c = arith::AddFOp::create(nb, l, c, arith::MulFOp::create(nb, l, ah, bl));
        }
        Value prod = arith::MulFOp::create(nb, l, ah, bh);
        linalg::YieldOp::create(nb, l, ValueRange{arith::AddFOp::create(nb, l, c, prod)});
      });
  tileOp->setAttr(kMmaAttr,
                  b.getDictionaryAttr({b.getNamedAttr("m", b.getI64IntegerAttr(plan.mDim)),
                                       b.getNamedAttr("n", b.getI64IntegerAttr(plan.nDim)),
                                       b.getNamedAttr("k", b.getI64IntegerAttr(plan.kDim)),
                                       b.getNamedAttr("a", b.getI64IntegerAttr(plan.aInput)),
                                       b.getNamedAttr("k_step", b.getI64IntegerAttr(plan.kStep)),
                                       b.getNamedAttr("split", b.getBoolAttr(split)),
                                       b.getNamedAttr("type", TypeAttr::get(mmaType))}));
  if (epilogue) {
    // The epilogue on the tile's window (its dims are the contraction's loop dims 0 and 1),
    // right after the tile (the windows' views above it).
    linalg::GenericOp e = epilogue->op;
    b.setInsertionPoint(tileOp);
    SmallVector<Value> windows;
    for (OpOperand &operand : e->getOpOperands()) {
      SmallVector<OpFoldResult> offsets, sizes, strides;
      for (AffineExpr x : e.getMatchingIndexingMap(&operand).getResults()) {
        bool rows = cast<AffineDimExpr>(x).getPosition() == plan.mDim;
        offsets.push_back(rows ? OpFoldResult(offM) : OpFoldResult(offN));
        sizes.push_back(rows ? sizeM : sizeN);
        strides.push_back(b.getIndexAttr(1));
      }
      windows.push_back(memref::SubViewOp::create(b, loc, operand.get(), offsets, sizes, strides));
    }
    unsigned numIns = e.getNumDpsInputs();
    b.setInsertionPointAfter(tileOp);
    auto window = linalg::GenericOp::create(
        b, loc, TypeRange{}, ArrayRef<Value>(windows).take_front(numIns),
        ArrayRef<Value>(windows).drop_front(numIns), e.getIndexingMapsArray(),
        e.getIteratorTypesArray());
    IRMapping same;
    e.getRegion().cloneInto(&window.getRegion(), same);
    window->setAttr(kMmaEpilogueAttr,
                    b.getDictionaryAttr({b.getNamedAttr("input", b.getI64IntegerAttr(epilogue->input)),
                                         b.getNamedAttr("store", b.getBoolAttr(epilogue->storeOutput))}));
    e->erase();
  }
  op->erase();
}

namespace {

/// One marked warp tile being lowered: its plan, operands and extents, and the lane maps
/// (g = lane / 4, t = lane % 4) shared by the GPU lowering and the lane emulation.
struct WarpTile {
  mutable linalg::GenericOp op;
  MmaPlan plan;
  Type mmaType;
  bool split = false;
  Value A, B, C;
  AffineMap mapA, mapB, mapC;
  int64_t staticM = 0, staticN = 0, staticK = 0;
  Value sizeM, sizeN;

  /// The tile's epilogue (the next op, marked kMmaEpilogueAttr: its input that reads the
  /// tile, and whether the tile is still stored), or none.
  std::optional<Epilogue> epilogue;
  /// The fill of the tile with 0 just before it (the accumulators start at 0), or null.
  mutable linalg::FillOp zeroFill;

  /// The accumulator's initial element at (row, col): 0, or the tile's.
  Value initial(OpBuilder &b, Value row, Value col) const {
    if (zeroFill)
      return arith::ConstantOp::create(b, op.getLoc(), b.getF32FloatAttr(0));
    return loadC(b, row, col);
  }

  /// Reads the spectra.mma attribute; the builder's insertion point must be at `op`.
  static FailureOr<WarpTile> get(OpBuilder &b, linalg::GenericOp op, StringRef pass);

  /// Element i of the lane's finished accumulator fragment, `value`: stored to the tile
  /// (unless only the epilogue reads it), and the epilogue's body run on it at its (row,
  /// column), its other operands loaded there, its results stored; nothing outside the
  /// clipped window.
  void finish(OpBuilder &b, Value g, Value t2, int64_t i, Value value) const {
    auto [row, col] = cAt(b, g, t2, i);
    if (!epilogue || epilogue->storeOutput)
      storeC(b, value, row, col);
    if (!epilogue)
      return;
    Location loc = op.getLoc();
    OpBuilder::InsertionGuard guard(b);
    if (Value ok = both(b, rowOk(b, row), colOk(b, col))) {
      auto branch = scf::IfOp::create(b, loc, ok, /*withElseRegion=*/false);
      b.setInsertionPoint(branch.thenBlock()->getTerminator());
    }
    // The epilogue's dims are the contraction's loop dims 0 and 1.
    auto at = [&](AffineMap map) {
      SmallVector<Value> idx;
      for (AffineExpr x : map.getResults())
        idx.push_back(cast<AffineDimExpr>(x).getPosition() == plan.mDim ? row : col);
      return idx;
    };
    linalg::GenericOp e = epilogue->op;
    Block &body = e.getRegion().front();
    IRMapping map;
    for (OpOperand &operand : e->getOpOperands()) {
      unsigned k = operand.getOperandNumber();
      BlockArgument arg = body.getArgument(k);
      if (k == epilogue->input)
        map.map(arg, value);
      else if (!arg.use_empty())
        map.map(arg, memref::LoadOp::create(b, loc, operand.get(),
                                            at(e.getMatchingIndexingMap(&operand))));
    }
    for (Operation &inner : body.without_terminator())
      b.clone(inner, map);
    unsigned numIns = e.getNumDpsInputs();
    for (auto [k, y] : llvm::enumerate(body.getTerminator()->getOperands())) {
      OpOperand &out = e->getOpOperand(numIns + k);
      memref::StoreOp::create(b, loc, map.lookupOrDefault(y), out.get(),
                              at(e.getMatchingIndexingMap(&out)));
    }
  }
  /// Erases the epilogue and the zero fill once the fragments took their place.
  void dropEpilogue() const {
    if (epilogue)
      epilogue->op->erase();
    if (zeroFill)
      zeroFill->erase();
  }

  Value idx(OpBuilder &b, int64_t v) const {
    return arith::ConstantIndexOp::create(b, op.getLoc(), v);
  }
  Value plus(OpBuilder &b, Value x, int64_t c) const {
    return c ? arith::AddIOp::create(b, op.getLoc(), x, idx(b, c)).getResult() : x;
  }
  /// The lane's group g = lane / 4 and 2t = 2 (lane % 4), the maps' two coordinates.
  std::pair<Value, Value> group(OpBuilder &b, Value lane) const {
    Location loc = op.getLoc();
    Value g = arith::DivUIOp::create(b, loc, lane, idx(b, 4));
    Value t2 = arith::MulIOp::create(b, loc, arith::RemUIOp::create(b, loc, lane, idx(b, 4)),
                                     idx(b, 2));
    return {g, t2};
  }
  int64_t kRegsA() const { return plan.kStep / 4; }
  int64_t kRegsB() const { return plan.kStep / 8; }

  /// A (16 x k) register r, half h of the lane: (row, k - k0).
  std::pair<Value, Value> aAt(OpBuilder &b, Value g, Value t2, int64_t r, int64_t h) const {
    bool high = plan.kStep == 16 ? r % 2 : r;
    int64_t kOff = plan.kStep == 16 ? 8 * (r / 2) : 0;
    return {plus(b, g, high ? 8 : 0), plus(b, t2, kOff + h)};
  }
  /// B (k x 8) register r, half h of the lane: (k - k0, column).
  std::pair<Value, Value> bAt(OpBuilder &b, Value g, Value t2, int64_t r, int64_t h) const {
    return {plus(b, t2, 8 * r + h), g};
  }
  /// C/D element i of the lane: (row, column).
  std::pair<Value, Value> cAt(OpBuilder &b, Value g, Value t2, int64_t i) const {
    return {plus(b, g, 8 * (i / 2)), plus(b, t2, i % 2)};
  }

  /// `i < size`, or null where the window is statically the whole mma extent.
  Value below(OpBuilder &b, Value i, Value size, int64_t staticSize, int64_t tile) const {
    if (staticSize == tile)
      return Value();
    return arith::CmpIOp::create(b, op.getLoc(), arith::CmpIPredicate::ult, i, size);
  }
  Value both(OpBuilder &b, Value x, Value y) const {
    if (!x)
      return y;
    if (!y)
      return x;
    return arith::AndIOp::create(b, op.getLoc(), x, y);
  }
  Value rowOk(OpBuilder &b, Value row) const { return below(b, row, sizeM, staticM, 16); }
  Value colOk(OpBuilder &b, Value col) const { return below(b, col, sizeN, staticN, 8); }
  /// The last k step reads past a reduction that is no multiple of it.
  Value kOk(OpBuilder &b, Value k) const {
    if (staticK % plan.kStep == 0)
      return Value();
    return arith::CmpIOp::create(b, op.getLoc(), arith::CmpIPredicate::ult, k, idx(b, staticK));
  }

  /// The element of `mem` (indexed by `map`) at (m, n, k), 0 where `ok` is false.
  Value load(OpBuilder &b, Value mem, AffineMap map, Value m, Value n, Value k, Value ok) const {
    Location loc = op.getLoc();
    return loadIf(b, loc, mem, coordinates(map, plan, m, n, k), ok);
  }
  Value loadA(OpBuilder &b, Value row, Value k) const {
    return load(b, A, mapA, row, Value(), k, both(b, rowOk(b, row), kOk(b, k)));
  }
  Value loadB(OpBuilder &b, Value k, Value col) const {
    return load(b, B, mapB, Value(), col, k, both(b, colOk(b, col), kOk(b, k)));
  }
  Value loadC(OpBuilder &b, Value row, Value col) const {
    return load(b, C, mapC, row, col, Value(), both(b, rowOk(b, row), colOk(b, col)));
  }
  void storeC(OpBuilder &b, Value value, Value row, Value col) const {
    SmallVector<Value> at = coordinates(mapC, plan, row, col, Value());
    Value ok = both(b, rowOk(b, row), colOk(b, col));
    if (!ok) {
      memref::StoreOp::create(b, op.getLoc(), value, C, at);
      return;
    }
    auto branch = scf::IfOp::create(b, op.getLoc(), ok, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(branch.thenBlock()->getTerminator());
    memref::StoreOp::create(b, op.getLoc(), value, C, at);
  }
  /// x rounded to the operand type (part 0) or what that rounding left, rounded (part 1).
  Value part(OpBuilder &b, Value x, int p) const {
    return mmaOperandPart(b, op.getLoc(), mmaType, x, p);
  }
};

FailureOr<WarpTile> WarpTile::get(OpBuilder &b, linalg::GenericOp op, StringRef pass) {
  auto attr = op->getAttrOfType<DictionaryAttr>(kMmaAttr);
  auto get = [&](StringRef name) -> int64_t {
    auto v = attr ? attr.getAs<IntegerAttr>(name) : nullptr;
    return v ? v.getInt() : -1;
  };
  auto typeAttr = attr ? attr.getAs<TypeAttr>("type") : nullptr;
  int64_t m = get("m"), n = get("n"), k = get("k"), a = get("a"), ks = get("k_step");
  if (m < 0 || n < 0 || k < 0 || (a != 0 && a != 1) || (ks != 8 && ks != 16) || !typeAttr ||
      op.getNumDpsInputs() != 2 || op.getNumDpsInits() != 1)
    return op.emitOpError(pass) << ": a spectra.mma contraction needs m, n, k, a, k_step "
                                   "(8 or 16) and type";
  WarpTile w;
  w.op = op;
  w.mmaType = typeAttr.getValue();
  if (!w.mmaType.isBF16() && !w.mmaType.isF16())
    return op.emitOpError(pass) << ": mma operands must be bf16 or f16";
  auto split = attr.getAs<BoolAttr>("split");
  w.split = split && split.getValue();
  w.plan.mDim = m;
  w.plan.nDim = n;
  w.plan.kDim = k;
  w.plan.aInput = a;
  w.plan.kStep = ks;
  SmallVector<AffineMap> maps = op.getIndexingMapsArray();
  w.A = op.getDpsInputs()[a];
  w.B = op.getDpsInputs()[1 - a];
  w.C = op.getDpsInits()[0];
  w.mapA = maps[a];
  w.mapB = maps[1 - a];
  w.mapC = maps[2];
  // The extent of loop dim `d`: a window's size, static unless the tile is clipped.
  auto extent = [&](unsigned d) -> std::pair<Value, int64_t> {
    for (OpOperand &operand : op->getOpOperands()) {
      SmallVector<unsigned> dims = dimsOf(op.getMatchingIndexingMap(&operand));
      auto it = llvm::find(dims, d);
      if (it == dims.end())
        continue;
      unsigned pos = it - dims.begin();
      auto type = cast<MemRefType>(operand.get().getType());
      if (!type.isDynamicDim(pos))
        return {w.idx(b, type.getDimSize(pos)), type.getDimSize(pos)};
      return {memref::DimOp::create(b, op.getLoc(), operand.get(), pos), ShapedType::kDynamic};
    }
    return {Value(), ShapedType::kDynamic};
  };
  Operation *prev = op->getPrevNode();
  while (prev && isMemoryEffectFree(prev))
    prev = prev->getPrevNode();
  if (auto fill = dyn_cast_or_null<linalg::FillOp>(prev);
      fill && fill.getDpsInits()[0] == w.C && matchPattern(fill.getInputs()[0], m_PosZeroFloat()))
    w.zeroFill = fill;
  if (auto next = dyn_cast_or_null<linalg::GenericOp>(op->getNextNode())) {
    if (auto e = next->getAttrOfType<DictionaryAttr>(kMmaEpilogueAttr)) {
      auto input = e.getAs<IntegerAttr>("input");
      auto store = e.getAs<BoolAttr>("store");
      if (!input || !store || input.getInt() < 0 ||
          input.getInt() >= static_cast<int64_t>(next.getNumDpsInputs()) ||
          next.getDpsInputs()[input.getInt()].getType() != w.C.getType())
        return next.emitOpError(pass) << ": a spectra.mma_epilogue needs its input (the "
                                         "tile, an input of the tile's type) and store";
      w.epilogue = Epilogue{next, static_cast<unsigned>(input.getInt()), store.getValue()};
    }
  }
  std::tie(w.sizeM, w.staticM) = extent(m);
  std::tie(w.sizeN, w.staticN) = extent(n);
  w.staticK = extent(k).second;
  if (w.staticK == ShapedType::kDynamic || (w.staticM != ShapedType::kDynamic && w.staticM > 16) ||
      (w.staticN != ShapedType::kDynamic && w.staticN > 8))
    return op.emitOpError(pass) << ": a spectra.mma tile is at most 16 x 8 with a static "
                                   "reduction";
  return w;
}

} // namespace

Value mlir::spectra::mmaOperandPart(OpBuilder &b, Location loc, Type mmaType, Value x, int part) {
  Value narrow = arith::TruncFOp::create(b, loc, mmaType, x);
  if (part == 1) {
    Value rest = arith::SubFOp::create(b, loc, x, arith::ExtFOp::create(b, loc, b.getF32Type(), narrow));
    narrow = arith::TruncFOp::create(b, loc, mmaType, rest);
  }
  return narrow;
}

SmallVector<std::pair<int, int>> mlir::spectra::mmaPartOrder(bool split) {
  if (split)
    return {{1, 0}, {0, 1}, {0, 0}};
  return {{0, 0}};
}

void mlir::spectra::emitMmaSync(OpBuilder &b, Location loc, Type mmaType, int64_t ks,
                                ValueRange aRegs, ValueRange bRegs, MutableArrayRef<Value> acc) {
  Type f32 = b.getF32Type();
  Type accType = LLVM::LLVMStructType::getLiteral(b.getContext(), {f32, f32, f32, f32});
  NVVM::MMATypes ptx = mmaType.isBF16() ? NVVM::MMATypes::bf16 : NVVM::MMATypes::f16;
  auto op = NVVM::MmaOp::create(b, loc, accType, aRegs, bRegs, ValueRange(acc),
                                ArrayRef<int64_t>{16, 8, ks}, std::nullopt, std::nullopt,
                                std::array<NVVM::MMATypes, 2>{ptx, ptx},
                                std::array<NVVM::MMALayout, 2>{NVVM::MMALayout::row,
                                                                NVVM::MMALayout::col});
  for (int64_t i = 0; i < 4; ++i)
    acc[i] = LLVM::ExtractValueOp::create(b, loc, op, ArrayRef<int64_t>{i});
}

void mlir::spectra::emitMmaModel(OpBuilder &b, Location loc, int64_t ks,
                                 const MmaModelAccess &access) {
  // A (row, k): lane 4 (row % 8) + (k % 8) / 2, register (row / 8) + 2 (k / 8) for k16
  // (row / 8 for k8), half k % 2; B (k, col): lane 4 col + (k % 8) / 2, register k / 8,
  // half k % 2; D (row, col): lane 4 (row % 8) + col / 2, element 2 (row / 8) + col % 2.
  OpBuilder::InsertionGuard guard(b);
  auto c = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v).getResult(); };
  auto div = [&](Value x, int64_t v) { return arith::DivUIOp::create(b, loc, x, c(v)).getResult(); };
  auto rem = [&](Value x, int64_t v) { return arith::RemUIOp::create(b, loc, x, c(v)).getResult(); };
  auto add = [&](Value x, Value y) { return arith::AddIOp::create(b, loc, x, y).getResult(); };
  auto mul = [&](Value x, int64_t v) { return arith::MulIOp::create(b, loc, x, c(v)).getResult(); };
  auto loop = [&](int64_t n) {
    auto l = scf::ForOp::create(b, loc, c(0), c(n), c(1));
    b.setInsertionPointToStart(l.getBody());
    return l.getInductionVar();
  };
  Value row = loop(16), col = loop(8);
  Value dLane = add(mul(rem(row, 8), 4), div(col, 2));
  Value dElem = add(mul(div(row, 8), 2), rem(col, 2));
  auto kLoop = scf::ForOp::create(b, loc, c(0), c(ks), c(1), ValueRange{access.loadC(dLane, dElem)});
  {
    OpBuilder::InsertionGuard inner(b);
    b.setInsertionPointToStart(kLoop.getBody());
    Value k = kLoop.getInductionVar();
    Value aLane = add(mul(rem(row, 8), 4), div(rem(k, 8), 2));
    Value aReg = ks == 16 ? add(div(row, 8), mul(div(k, 8), 2)) : div(row, 8);
    Value av = access.a(aLane, aReg, rem(k, 2));
    Value bv = access.b(add(mul(col, 4), div(rem(k, 8), 2)), div(k, 8), rem(k, 2));
    Value sum = arith::AddFOp::create(b, loc, kLoop.getRegionIterArgs()[0],
                                      arith::MulFOp::create(b, loc, av, bv));
    scf::YieldOp::create(b, loc, ValueRange{sum});
  }
  access.storeD(kLoop.getResult(0), dLane, dElem);
}

Value mlir::spectra::loadIf(OpBuilder &b, Location loc, Value mem, ValueRange at, Value ok) {
  if (!ok)
    return memref::LoadOp::create(b, loc, mem, at);
  auto branch = scf::IfOp::create(b, loc, TypeRange{b.getF32Type()}, ok, true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(branch.thenBlock());
  scf::YieldOp::create(b, loc, ValueRange{memref::LoadOp::create(b, loc, mem, at)});
  b.setInsertionPointToStart(branch.elseBlock());
  scf::YieldOp::create(b, loc, ValueRange{arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0))});
  return branch.getResult(0);
}

Value mlir::spectra::packMmaPair(OpBuilder &b, Location loc, Type mmaType, Value first,
                                 Value second, int part) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  // Two f32 rounded (RN) as one register, the first in the low half: a vector<2xf16> for
  // f16, an i32 for bf16 (what nvvm.mma.sync takes for each). One cvt.rn.{f16,bf16}x2.f32
  // as NVVM's op (its a, the upper half, is the second), opaque to LLVM, which would
  // otherwise split a pair whose low half alone is read back into two scalar conversions.
  auto convert = [&](Value lo, Value hi) -> Value {
    Type pair = VectorType::get({2}, mmaType);
    if (mmaType.isF16())
      return NVVM::ConvertF32x2ToF16x2Op::create(b, loc, pair, /*src_hi=*/hi, /*src_lo=*/lo,
                                                 /*random_bits=*/Value(), NVVM::FPRoundingMode::RN);
    Value v = NVVM::ConvertF32x2ToBF16x2Op::create(b, loc, pair, /*src_hi=*/hi, /*src_lo=*/lo,
                                                   /*random_bits=*/Value(),
                                                   NVVM::FPRoundingMode::RN);
    return LLVM::BitcastOp::create(b, loc, i32, v);
  };
  Value hi = convert(first, second);
  if (part == 0)
    return hi;
  // Only bf16x3 splits (bf16): the lo part reads the rounded pair's halves back as f32 from
  // its bits (a bf16 is an f32's top half), so a part costs one conversion per pair.
  assert(mmaType.isBF16() && "only bf16x3 splits its operands");
  auto asF32 = [&](Value bits) { return arith::BitcastOp::create(b, loc, f32, bits); };
  Value lowHalf = asF32(arith::ShLIOp::create(
      b, loc, hi, arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(16))));
  Value highHalf = asF32(arith::AndIOp::create(
      b, loc, hi, arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(int32_t(0xFFFF0000u)))));
  return convert(arith::SubFOp::create(b, loc, first, lowHalf),
                 arith::SubFOp::create(b, loc, second, highHalf));
}

LogicalResult mlir::spectra::lowerWarpMma(linalg::GenericOp op, Value lane) {
  OpBuilder b(op);
  FailureOr<WarpTile> tile = WarpTile::get(b, op, "spectra-launch-mapped-kernels");
  if (failed(tile))
    return failure();
  const WarpTile &w = *tile;
  Location loc = op.getLoc();
  int64_t ks = w.plan.kStep;
  auto pack = [&](Value first, Value second, int p) {
    return packMmaPair(b, loc, w.mmaType, first, second, p);
  };
  auto [g, t2] = w.group(b, lane);
  SmallVector<Value> acc;
  for (int64_t i = 0; i < 4; ++i) {
    auto [row, col] = w.cAt(b, g, t2, i);
    acc.push_back(w.initial(b, row, col));
  }
  int64_t steps = ceilDiv(w.staticK, ks);
  auto loop = scf::ForOp::create(b, loc, w.idx(b, 0), w.idx(b, steps * ks), w.idx(b, ks), acc);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value k0 = loop.getInductionVar();
    SmallVector<std::pair<Value, Value>> aPairs, bPairs;
    for (int64_t r = 0; r < w.kRegsA(); ++r) {
      Value x[2];
      for (int64_t h = 0; h < 2; ++h) {
        auto [row, k] = w.aAt(b, g, t2, r, h);
        x[h] = w.loadA(b, row, arith::AddIOp::create(b, loc, k0, k));
      }
      aPairs.push_back({x[0], x[1]});
    }
    for (int64_t r = 0; r < w.kRegsB(); ++r) {
      Value x[2];
      for (int64_t h = 0; h < 2; ++h) {
        auto [k, col] = w.bAt(b, g, t2, r, h);
        x[h] = w.loadB(b, arith::AddIOp::create(b, loc, k0, k), col);
      }
      bPairs.push_back({x[0], x[1]});
    }
    auto regs = [&](ArrayRef<std::pair<Value, Value>> pairs, int p) {
      SmallVector<Value> r;
      for (auto [x, y] : pairs)
        r.push_back(pack(x, y, p));
      return r;
    };
    SmallVector<Value> c(loop.getRegionIterArgs().begin(), loop.getRegionIterArgs().end());
    auto mma = [&](ArrayRef<Value> aRegs, ArrayRef<Value> bRegs) {
      emitMmaSync(b, loc, w.mmaType, ks, aRegs, bRegs, c);
    };
    SmallVector<Value> aHigh = regs(aPairs, 0), bHigh = regs(bPairs, 0);
    if (w.split) {
      // f32-grade products from 16-bit parts, small terms first: x = hi + lo with hi the
      // rounding of x and lo the rounding of what is left, then lo hi + hi lo + hi hi.
      mma(regs(aPairs, 1), bHigh);
      mma(aHigh, regs(bPairs, 1));
    }
    mma(aHigh, bHigh);
    scf::YieldOp::create(b, loc, c);
  }
  for (int64_t i = 0; i < 4; ++i)
    w.finish(b, g, t2, i, loop.getResult(i));
  w.dropEpilogue();
  op->erase();
  return success();
}

LogicalResult mlir::spectra::emulateWarpMma(linalg::GenericOp op) {
  OpBuilder b(op);
  FailureOr<WarpTile> tile = WarpTile::get(b, op, "spectra-emulate-warp-mma");
  if (failed(tile))
    return failure();
  const WarpTile &w = *tile;
  Location loc = op.getLoc();
  Type f32 = b.getF32Type();
  int64_t ks = w.plan.kStep, parts = w.split ? 2 : 1;
  // The warp's registers, one row per lane: A [part][lane][reg][half], B likewise, the
  // accumulators [lane][element]; the operands hold their 16-bit parts widened to f32.
  // At the function's entry: one register file per call, not a new one per tile.
  auto alloc = [&](ArrayRef<int64_t> shape) {
    OpBuilder::InsertionGuard guard(b);
    if (auto fn = op->getParentOfType<FunctionOpInterface>())
      b.setInsertionPointToStart(&fn.getFunctionBody().front());
    return memref::AllocaOp::create(b, loc, MemRefType::get(shape, f32)).getResult();
  };
  Value regA = alloc({parts, 32, w.kRegsA(), 2}), regB = alloc({parts, 32, w.kRegsB(), 2});
  Value regC = alloc({32, 4});
  auto forRange = [&](Value lo, int64_t hi, int64_t step, function_ref<void(Value)> body) {
    auto loop = scf::ForOp::create(b, loc, lo, w.idx(b, hi), w.idx(b, step));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    body(loop.getInductionVar());
  };
  auto zero = w.idx(b, 0);
  // Each lane's share, through the same lane maps as the GPU lowering.
  auto eachLane = [&](function_ref<void(Value, Value, Value)> body) {
    forRange(zero, 32, 1, [&](Value lane) {
      auto [g, t2] = w.group(b, lane);
      body(lane, g, t2);
    });
  };
  auto widen = [&](Value x, int p) { return arith::ExtFOp::create(b, loc, f32, w.part(b, x, p)); };
  eachLane([&](Value lane, Value g, Value t2) {
    for (int64_t i = 0; i < 4; ++i) {
      auto [row, col] = w.cAt(b, g, t2, i);
      memref::StoreOp::create(b, loc, w.initial(b, row, col), regC, ValueRange{lane, w.idx(b, i)});
    }
  });
  forRange(zero, ceilDiv(w.staticK, ks) * ks, ks, [&](Value k0) {
    eachLane([&](Value lane, Value g, Value t2) {
      for (int64_t r = 0; r < w.kRegsA(); ++r)
        for (int64_t h = 0; h < 2; ++h) {
          auto [row, k] = w.aAt(b, g, t2, r, h);
          Value x = w.loadA(b, row, arith::AddIOp::create(b, loc, k0, k));
          for (int64_t p = 0; p < parts; ++p)
            memref::StoreOp::create(b, loc, widen(x, p), regA,
                                    ValueRange{w.idx(b, p), lane, w.idx(b, r), w.idx(b, h)});
        }
      for (int64_t r = 0; r < w.kRegsB(); ++r)
        for (int64_t h = 0; h < 2; ++h) {
          auto [k, col] = w.bAt(b, g, t2, r, h);
          Value x = w.loadB(b, arith::AddIOp::create(b, loc, k0, k), col);
          for (int64_t p = 0; p < parts; ++p)
            memref::StoreOp::create(b, loc, widen(x, p), regB,
                                    ValueRange{w.idx(b, p), lane, w.idx(b, r), w.idx(b, h)});
        }
    });
    // The warp's mma (emitMmaModel) on the register files. Split: lo hi, hi lo, then hi hi,
    // as the GPU runs them.
    for (auto [pa, pb] : mmaPartOrder(w.split)) {
      Value partA = w.idx(b, pa), partB = w.idx(b, pb);
      auto a = [&](Value lane, Value reg, Value half) -> Value {
        return memref::LoadOp::create(b, loc, regA, ValueRange{partA, lane, reg, half});
      };
      auto bv = [&](Value lane, Value reg, Value half) -> Value {
        return memref::LoadOp::create(b, loc, regB, ValueRange{partB, lane, reg, half});
      };
      auto loadC = [&](Value lane, Value elem) -> Value {
        return memref::LoadOp::create(b, loc, regC, ValueRange{lane, elem});
      };
      auto storeD = [&](Value v, Value lane, Value elem) {
        memref::StoreOp::create(b, loc, v, regC, ValueRange{lane, elem});
      };
      emitMmaModel(b, loc, ks, {a, bv, loadC, storeD});
    }
  });
  eachLane([&](Value lane, Value g, Value t2) {
    for (int64_t i = 0; i < 4; ++i)
      w.finish(b, g, t2, i, memref::LoadOp::create(b, loc, regC, ValueRange{lane, w.idx(b, i)}));
  });
  w.dropEpilogue();
  op->erase();
  return success();
}
