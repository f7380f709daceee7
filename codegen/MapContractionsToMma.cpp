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
                                          StringRef nestAttr) {
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
  op->erase();
}

LogicalResult mlir::spectra::lowerWarpMma(linalg::GenericOp op, Value lane) {
  auto attr = op->getAttrOfType<DictionaryAttr>(kMmaAttr);
  auto get = [&](StringRef name) -> int64_t {
    auto v = attr ? attr.getAs<IntegerAttr>(name) : nullptr;
    return v ? v.getInt() : -1;
  };
  auto typeAttr = attr ? attr.getAs<TypeAttr>("type") : nullptr;
  MmaPlan plan;
  int64_t m = get("m"), n = get("n"), k = get("k"), a = get("a"), ks = get("k_step");
  if (m < 0 || n < 0 || k < 0 || (a != 0 && a != 1) || (ks != 8 && ks != 16) || !typeAttr ||
      op.getNumDpsInputs() != 2 || op.getNumDpsInits() != 1)
    return op.emitOpError("spectra-launch-mapped-kernels: a spectra.mma contraction needs m, n, "
                          "k, a, k_step (8 or 16) and type");
  Type mmaType = typeAttr.getValue();
  auto splitAttr = attr.getAs<BoolAttr>("split");
  bool split = splitAttr && splitAttr.getValue();
  NVVM::MMATypes ptxType;
  if (mmaType.isBF16())
    ptxType = NVVM::MMATypes::bf16;
  else if (mmaType.isF16())
    ptxType = NVVM::MMATypes::f16;
  else
    return op.emitOpError("spectra-launch-mapped-kernels: mma operands must be bf16 or f16");
  plan.mDim = m;
  plan.nDim = n;
  plan.kDim = k;
  plan.aInput = a;
  plan.kStep = ks;

  Location loc = op.getLoc();
  OpBuilder b(op);
  Type f32 = b.getF32Type(), i32 = b.getI32Type(), i16 = b.getI16Type();
  auto idx = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };
  SmallVector<AffineMap> maps = op.getIndexingMapsArray();
  Value A = op.getDpsInputs()[a], B = op.getDpsInputs()[1 - a], C = op.getDpsInits()[0];
  AffineMap mapA = maps[a], mapB = maps[1 - a], mapC = maps[2];
  // The extent of loop dim `d` (a window's size, static unless clipped).
  auto extent = [&](unsigned d) -> std::pair<Value, int64_t> {
    for (OpOperand &operand : op->getOpOperands()) {
      SmallVector<unsigned> dims = dimsOf(op.getMatchingIndexingMap(&operand));
      auto it = llvm::find(dims, d);
      if (it == dims.end())
        continue;
      unsigned pos = it - dims.begin();
      auto type = cast<MemRefType>(operand.get().getType());
      if (!type.isDynamicDim(pos))
        return {idx(type.getDimSize(pos)), type.getDimSize(pos)};
      return {memref::DimOp::create(b, loc, operand.get(), pos), ShapedType::kDynamic};
    }
    return {Value(), ShapedType::kDynamic};
  };
  auto [sizeM, staticM] = extent(m);
  auto [sizeN, staticN] = extent(n);
  int64_t staticK = extent(k).second;
  if (staticK == ShapedType::kDynamic || (staticM != ShapedType::kDynamic && staticM > 16) ||
      (staticN != ShapedType::kDynamic && staticN > 8))
    return op.emitOpError("spectra-launch-mapped-kernels: a spectra.mma tile is at most 16 x 8 "
                          "with a static reduction");
  // Bounds checks only where the window may be smaller than the mma tile.
  auto below = [&](Value i, Value size, int64_t staticSize, int64_t tile) -> Value {
    if (staticSize == tile)
      return Value();
    return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, i, size);
  };
  auto both = [&](Value x, Value y) -> Value {
    if (!x)
      return y;
    if (!y)
      return x;
    return arith::AndIOp::create(b, loc, x, y);
  };
  auto load = [&](Value mem, AffineMap map, Value mi, Value ni, Value ki, Value ok) -> Value {
    SmallVector<Value> at = coordinates(map, plan, mi, ni, ki);
    if (!ok)
      return memref::LoadOp::create(b, loc, mem, at);
    auto branch = scf::IfOp::create(b, loc, TypeRange{f32}, ok, /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(branch.thenBlock());
      scf::YieldOp::create(b, loc, ValueRange{memref::LoadOp::create(b, loc, mem, at)});
      b.setInsertionPointToStart(branch.elseBlock());
      scf::YieldOp::create(b, loc, ValueRange{arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0))});
    }
    return branch.getResult(0);
  };
  // Two f32 elements as one register of the operand type, the first in the low half:
  // rounded (part 0), or what the rounding left (part 1, the split's low parts).
  auto pack = [&](Value first, Value second, int part) -> Value {
    auto bits = [&](Value x) {
      Value narrow = arith::TruncFOp::create(b, loc, mmaType, x);
      if (part == 1) {
        Value rest = arith::SubFOp::create(b, loc, x, arith::ExtFOp::create(b, loc, f32, narrow));
        narrow = arith::TruncFOp::create(b, loc, mmaType, rest);
      }
      Value r = arith::BitcastOp::create(b, loc, i16, narrow);
      return arith::ExtUIOp::create(b, loc, i32, r).getResult();
    };
    Value high = arith::ShLIOp::create(b, loc, bits(second),
                                       arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(16)));
    return arith::OrIOp::create(b, loc, bits(first), high);
  };

  Value g = arith::DivUIOp::create(b, loc, lane, idx(4));
  Value t2 = arith::MulIOp::create(b, loc, arith::RemUIOp::create(b, loc, lane, idx(4)), idx(2));
  auto plus = [&](Value x, int64_t c) { return c ? arith::AddIOp::create(b, loc, x, idx(c)) : x; };
  Value rowLo = g, rowHi = plus(g, 8);
  Value okRowLo = below(rowLo, sizeM, staticM, 16), okRowHi = below(rowHi, sizeM, staticM, 16);
  Value okColN = below(g, sizeN, staticN, 8);
  // The accumulator fragment: element i at (g + 8 (i / 2), 2t + i % 2).
  SmallVector<std::pair<Value, Value>> cAt;
  SmallVector<Value> cOk, acc;
  for (int64_t i = 0; i < 4; ++i) {
    Value row = i / 2 ? rowHi : rowLo, col = plus(t2, i % 2);
    cAt.push_back({row, col});
    cOk.push_back(both(i / 2 ? okRowHi : okRowLo, below(col, sizeN, staticN, 8)));
    acc.push_back(load(C, mapC, row, col, Value(), cOk.back()));
  }
  int64_t steps = ceilDiv(staticK, ks);
  auto loop = scf::ForOp::create(b, loc, idx(0), idx(steps * ks), idx(ks), acc);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value k0 = loop.getInductionVar();
    ValueRange c = loop.getRegionIterArgs();
    // The last k step reads past a reduction that is no multiple of it.
    auto kOk = [&](Value kk) -> Value {
      if (staticK % ks == 0)
        return Value();
      return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, kk, idx(staticK));
    };
    // A: reg r = (row, k pair); B: reg r = (k pair, g).
    SmallVector<std::pair<Value, Value>> aPairs, bPairs;
    for (int64_t r = 0; r < ks / 4; ++r) {
      bool hi = ks == 16 ? r % 2 : r;
      int64_t kOff = ks == 16 ? 8 * (r / 2) : 0;
      Value row = hi ? rowHi : rowLo, okRow = hi ? okRowHi : okRowLo;
      Value k0a = plus(arith::AddIOp::create(b, loc, k0, t2), kOff), k1a = plus(k0a, 1);
      aPairs.push_back({load(A, mapA, row, Value(), k0a, both(okRow, kOk(k0a))),
                        load(A, mapA, row, Value(), k1a, both(okRow, kOk(k1a)))});
    }
    for (int64_t r = 0; r < ks / 8; ++r) {
      Value k0b = plus(arith::AddIOp::create(b, loc, k0, t2), 8 * r), k1b = plus(k0b, 1);
      bPairs.push_back({load(B, mapB, Value(), g, k0b, both(okColN, kOk(k0b))),
                        load(B, mapB, Value(), g, k1b, both(okColN, kOk(k1b)))});
    }
    auto regs = [&](ArrayRef<std::pair<Value, Value>> pairs, int part) {
      SmallVector<Value> r;
      for (auto [x, y] : pairs)
        r.push_back(pack(x, y, part));
      return r;
    };
    Type accType = LLVM::LLVMStructType::getLiteral(b.getContext(), {f32, f32, f32, f32});
    SmallVector<Value> acc(c.begin(), c.end());
    auto mma = [&](ArrayRef<Value> aRegs, ArrayRef<Value> bRegs) {
      auto op = NVVM::MmaOp::create(b, loc, accType, aRegs, bRegs, acc,
                                    ArrayRef<int64_t>{16, 8, ks}, std::nullopt, std::nullopt,
                                    std::array<NVVM::MMATypes, 2>{ptxType, ptxType},
                                    std::array<NVVM::MMALayout, 2>{NVVM::MMALayout::row,
                                                                    NVVM::MMALayout::col});
      for (int64_t i = 0; i < 4; ++i)
        acc[i] = LLVM::ExtractValueOp::create(b, loc, op, ArrayRef<int64_t>{i});
    };
    SmallVector<Value> aHigh = regs(aPairs, 0), bHigh = regs(bPairs, 0);
    if (split) {
      // f32-grade products from 16-bit parts, small terms first: x = hi + lo with hi the
      // rounding of x and lo the rounding of what is left, then lo hi + hi lo + hi hi.
      mma(regs(aPairs, 1), bHigh);
      mma(aHigh, regs(bPairs, 1));
    }
    mma(aHigh, bHigh);
    scf::YieldOp::create(b, loc, acc);
  }
  for (int64_t i = 0; i < 4; ++i) {
    SmallVector<Value> at = coordinates(mapC, plan, cAt[i].first, cAt[i].second, Value());
    if (!cOk[i]) {
      memref::StoreOp::create(b, loc, loop.getResult(i), C, at);
      continue;
    }
    auto branch = scf::IfOp::create(b, loc, cOk[i], /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(branch.thenBlock()->getTerminator());
    memref::StoreOp::create(b, loc, loop.getResult(i), C, at);
  }
  op->erase();
  return success();
}
