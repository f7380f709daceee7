//===- MapTilesToGpu.cpp - the GPU schedule of the tile kernels -----------===//
//
// The GPU target of the one kernel layer (TileKernels.h). The same tile kernels
// the CPU vectorises are scheduled here for a GPU, in three passes:
//
//  spectra-map-tiles-to-gpu     the mapped IR: each kernel takes its arguments
//      batched by role (the kernel ABI) and becomes one scf.forall over blocks
//      (#gpu.block: a block per (row chunk, slice), per slice, or one; per
//      (row block, slice) or row block for the combines, whose rows are
//      independent: rowsPerSliceBlock), whose
//      body is the tile kernel on that block's windows; the tile buffers are
//      workgroup memory (#gpu.address_space<workgroup>), every linalg op a
//      thread nest (scf.forall mapped to #gpu.thread<x>, a block-stride loop
//      over the op's parallel iterations, the reductions sequential in each
//      thread), and scalar stores a one-thread nest. Row chunks write their
//      own partial sums; combine kernels merge them in chunk order, so there
//      are no atomics and the sums are reproducible.
//  spectra-strip-workgroup-memory + scf-forall-to-for: the emulation of the
//      mapped IR on the CPU (gpu-emulated): blocks and threads as sequential
//      loops, a nest finished before the next starts (what the barrier gives).
//  spectra-launch-mapped-kernels: the GPU path from the same mapped IR: the
//      block forall becomes gpu.launch (workgroup buffers as views of one pool,
//      its dynamic shared memory), each thread nest `if (tid < n)` followed by
//      gpu.barrier;
//      upstream's outlining, NVVM lowering and serialisation follow.
//
//===----------------------------------------------------------------------===//

#include "codegen/MapTilesToGpu.h"
#include "codegen/MapContractionsToMma.h"
#include "codegen/WarpChains.h"
#include "codegen/CpuKernel.h"
#include "codegen/GpuLowering.h"
#include "codegen/Passes.h"
#include "codegen/MergeNests.h"
#include "codegen/RowLoopNests.h"
#include "codegen/TileKernels.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/SCF/Transforms/Passes.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Dialect/Utils/StructuredOpsUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#define DEBUG_TYPE "spectra-map-tiles-to-gpu"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAMAPTILESTOGPU
#define GEN_PASS_DEF_SPECTRASTRIPWORKGROUPMEMORY
#define GEN_PASS_DEF_SPECTRALAUNCHMAPPEDKERNELS
#define GEN_PASS_DEF_SPECTRAEMULATEWARPMMA
#define GEN_PASS_DEF_SPECTRAEXPANDBF16
#define GEN_PASS_DEF_SPECTRADESCRIBEGPUKERNELS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;
using namespace mlir::spectra;

namespace {

constexpr StringLiteral kNestAttr = kThreadNestAttr;

Attribute workgroupSpace(MLIRContext *ctx) {
  return gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
}

bool isWorkgroup(Type type) {
  auto memref = dyn_cast<MemRefType>(type);
  auto space = memref ? dyn_cast_or_null<gpu::AddressSpaceAttr>(memref.getMemorySpace()) : nullptr;
  return space && space.getValue() == gpu::AddressSpace::Workgroup;
}

/// The leading dimensions an argument of `role` gains when batched over slices (and chunks).
int64_t leadingDims(StringRef role) {
  if (role == "rows" || role == "mask" || role == "slice")
    return 1;
  if (role == "partial")
    return 2;
  return 0;
}

/// Re-infers the result type of every subview below `root` from its (possibly retyped)
/// source, in program order: windows of strided arguments and of workgroup buffers.
void reinferSubviews(Operation *root) {
  root->walk<WalkOrder::PreOrder>([](memref::SubViewOp view) {
    MemRefType old = view.getType();
    MemRefType inferred = memref::SubViewOp::inferRankReducedResultType(
        old.getShape(), view.getSourceType(), view.getMixedOffsets(), view.getMixedSizes(),
        view.getMixedStrides());
    view.getResult().setType(inferred);
  });
}

/// Whether `op` or anything nested in it may write memory.
bool mayWrite(Operation *op) {
  WalkResult r = op->walk([](Operation *inner) {
    if (auto effects = dyn_cast<MemoryEffectOpInterface>(inner))
      return effects.hasEffect<MemoryEffects::Write>() ? WalkResult::interrupt()
                                                       : WalkResult::advance();
    return WalkResult::advance();
  });
  return r.wasInterrupted();
}

bool isNest(Operation *op) { return op->hasAttr(kNestAttr); }

/// A nest over warps (contractions on tensor cores, MapContractionsToMma.h).
bool isWarpNest(scf::ForallOp nest) {
  std::optional<ArrayAttr> mapping = nest.getMapping();
  return mapping && mapping->size() == 1 && isa<gpu::GPUWarpMappingAttr>((*mapping)[0]);
}


/// The share of a per-slice kernel's leading rows one block takes, where the kernel's blocks
/// split them (rowsPerSliceBlock): block `block` of the slice runs each op on rows
/// [block * rows, (block + 1) * rows) of its leading loop dimension only.
struct RowSplit {
  Value block;
  int64_t rows = 0;
};

/// Distributes a linalg op on static tiles over the block's threads: a block-stride loop
/// over its parallel iterations (delinearised), each running the op on the 1-sized window
/// of those iterations (its reductions whole, in order, in one thread). With `split`, only
/// the block's rows of the leading (parallel) loop dimension.
LogicalResult distribute(linalg::LinalgOp op, int64_t threads, const RowSplit *split = nullptr) {
  Location loc = op.getLoc();
  SmallVector<int64_t> ranges = op.getStaticLoopRanges();
  SmallVector<utils::IteratorType> iterators = op.getIteratorTypesArray();
  if (llvm::any_of(ranges, ShapedType::isDynamic))
    return op->emitOpError("spectra-map-tiles-to-gpu: a tile op must have static loop ranges");
  for (AffineMap map : op.getIndexingMapsArray())
    if (!map.isProjectedPermutation())
      return op->emitOpError("spectra-map-tiles-to-gpu: indexing maps must be projected permutations");
  SmallVector<unsigned> parallel;
  int64_t total = 1;
  for (auto [d, it] : llvm::enumerate(iterators))
    if (it == utils::IteratorType::parallel) {
      parallel.push_back(d);
      total *= ranges[d];
    }
  if (total == 0) {
    op->erase();
    return success();
  }
  // The leading dimension is the outermost of the delinearisation, so a block's rows of it
  // are one contiguous range of the linear iterations.
  int64_t count = total;
  if (split) {
    if (parallel.empty() || parallel.front() != 0 || ranges[0] % split->rows != 0)
      return op->emitOpError("spectra-map-tiles-to-gpu: a kernel whose blocks split the rows "
                             "needs them the leading parallel dimension of every op, in whole "
                             "shares of ")
             << split->rows;
    count = total / ranges[0] * split->rows;
  }
  int64_t n = std::min(count, threads);
  OpBuilder b(op);
  scf::ForallOp nest = createThreadNest(b, loc, n);
  b.setInsertionPointToStart(nest.getBody());
  Value t = nest.getInductionVar(0);
  auto idx = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };
  Value linear = t;
  if (count > n) {
    auto loop = scf::ForOp::create(b, loc, t, idx(count), idx(n));
    b.setInsertionPointToStart(loop.getBody());
    linear = loop.getInductionVar();
  }
  if (split)
    linear = arith::AddIOp::create(
        b, loc, arith::MulIOp::create(b, loc, split->block, idx(count)), linear);
  SmallVector<Value> at(iterators.size());
  int64_t stride = total;
  for (unsigned d : parallel) {
    stride /= ranges[d];
    Value q = arith::DivUIOp::create(b, loc, linear, idx(stride));
    at[d] = arith::RemUIOp::create(b, loc, q, idx(ranges[d]));
  }
  SmallVector<Value> operands;
  for (OpOperand &operand : op->getOpOperands()) {
    auto type = dyn_cast<MemRefType>(operand.get().getType());
    if (!type) {
      operands.push_back(operand.get());
      continue;
    }
    AffineMap map = op.getMatchingIndexingMap(&operand);
    SmallVector<OpFoldResult> offsets, sizes, strides;
    for (AffineExpr e : map.getResults()) {
      unsigned d = cast<AffineDimExpr>(e).getPosition();
      bool par = iterators[d] == utils::IteratorType::parallel;
      offsets.push_back(par ? OpFoldResult(at[d]) : OpFoldResult(b.getIndexAttr(0)));
      sizes.push_back(b.getIndexAttr(par ? 1 : ranges[d]));
      strides.push_back(b.getIndexAttr(1));
    }
    operands.push_back(memref::SubViewOp::create(b, loc, operand.get(), offsets, sizes, strides));
  }
  mlir::clone(b, op, TypeRange{}, operands);
  op->erase();
  return success();
}

/// How a per-slice kernel's blocks split the rows of its leading dimension: each block's
/// rows and the blocks per slice; none where they cannot. They can where the rows are
/// independent: every op that touches memory is a linalg op whose leading loop dimension is
/// parallel, of one extent R across the kernel, and indexes the leading dimension of each of
/// its buffers (row r of an op reads and writes row r of every buffer, nothing else), and
/// every window is a chunk (one index of a leading dimension, the rest whole), so row r of a
/// window is row r of its buffer. The combines are such kernels: per feature, their partial
/// sums' merge reads that feature's shares only. The share is the most rows, dividing R,
/// whose elements fit the block's threads once (R / share blocks per slice).
struct SliceSplit {
  int64_t rows = 0, blocks = 1;
};

std::optional<SliceSplit> rowsPerSliceBlock(func::FuncOp tile, int64_t threads) {
  int64_t extent = -1, inner = 1;
  auto chunkWindow = [](memref::SubViewOp view) {
    MemRefType source = view.getSourceType();
    if (source.getRank() != view.getType().getRank() + 1 || view.getStaticSizes()[0] != 1)
      return false;
    for (int64_t d = 1; d < source.getRank(); ++d)
      if (view.getStaticOffsets()[d] != 0 || view.getStaticSizes()[d] != source.getDimSize(d) ||
          ShapedType::isDynamic(source.getDimSize(d)))
        return false;
    return true;
  };
  WalkResult r = tile.getBody().walk<WalkOrder::PreOrder>([&](Operation *op) {
    if (auto linalgOp = dyn_cast<linalg::LinalgOp>(op)) {
      SmallVector<int64_t> ranges = linalgOp.getStaticLoopRanges();
      if (ranges.empty() || ShapedType::isDynamic(ranges[0]) ||
          linalgOp.getIteratorTypesArray()[0] != utils::IteratorType::parallel ||
          (extent >= 0 && ranges[0] != extent))
        return WalkResult::interrupt();
      extent = ranges[0];
      int64_t total = 1;
      for (int64_t x : ranges)
        total *= x;
      for (auto [x, it] : llvm::zip(ranges, linalgOp.getIteratorTypesArray()))
        if (it != utils::IteratorType::parallel)
          total /= x;
      inner = std::max(inner, total / std::max<int64_t>(extent, 1));
      for (OpOperand &operand : op->getOpOperands()) {
        if (!isa<MemRefType>(operand.get().getType()))
          continue;
        AffineMap map = linalgOp.getMatchingIndexingMap(&operand);
        if (map.getNumResults() == 0 || map.getResult(0) != getAffineDimExpr(0, op->getContext()))
          return WalkResult::interrupt();
      }
      return WalkResult::skip();  // its body is scalar
    }
    if (auto view = dyn_cast<memref::SubViewOp>(op))
      return chunkWindow(view) ? WalkResult::advance() : WalkResult::interrupt();
    if (isa<memref::DimOp, memref::AllocaOp, scf::ForOp, scf::YieldOp, func::ReturnOp>(op) ||
        isa<arith::ArithDialect>(op->getDialect()))
      return WalkResult::advance();
    return WalkResult::interrupt();
  });
  if (r.wasInterrupted() || extent <= 1)
    return std::nullopt;
  int64_t rows = 1;
  for (int64_t d = 1; d <= extent; ++d)
    if (extent % d == 0 && d * inner <= threads)
      rows = d;
  if (rows == extent)
    return std::nullopt;
  return SliceSplit{rows, extent / rows};
}

/// The GPU schedule of a kernel's straight-line vector code (the params kernels,
/// ParamsKernels.cpp, hold each rank-1 value of the component's program as one
/// vector<d x f32>). Left at block level, every thread would hold each vector whole in its
/// registers (saderf-orf's moments_params_backward spilled 3.4 KB on sm_80), so here the
/// vectors become tiles: each run of elementwise vector ops (and the stores they feed) one
/// linalg.generic over [d], which distribute() spreads an entry per thread; each value a
/// later run or a reduction reads a [d] buffer (workgroup memory once mapped); each
/// vector.reduction a one-thread linalg reduction into a [1] buffer that every thread then
/// reads. Scalar code stays at block level, computed alike by every thread. A kernel with
/// no vector values is left as it is.
LogicalResult vectorsToTiles(func::FuncOp fn) {
  Block &body = fn.getBody().front();
  auto isVector = [](Value v) { return isa<VectorType>(v.getType()); };
  bool any = false;
  for (Operation &op : body)
    any |= llvm::any_of(op.getResults(), isVector);
  if (!any)
    return success();
  MLIRContext *ctx = fn.getContext();
  Location loc = fn.getLoc();
  OpBuilder b(ctx);
  auto newTile = [&](MemRefType type) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&body);
    return memref::AllocaOp::create(b, loc, type).getResult();
  };
  // A vector's [d] window of a rank-1 memref at `index` (a load's source, a store's target).
  auto window = [&](Value memref, ValueRange indices, VectorType type) -> FailureOr<Value> {
    auto mt = cast<MemRefType>(memref.getType());
    if (mt.getRank() != 1 || type.getRank() != 1 || indices.size() != 1)
      return failure();
    SmallVector<OpFoldResult> o = {indices[0]}, z = {b.getIndexAttr(type.getDimSize(0))},
                              st = {b.getIndexAttr(1)};
    return memref::SubViewOp::create(b, loc, memref, o, z, st).getResult();
  };
  llvm::DenseMap<Value, Value> tileOf;  // each vector value read outside its run: its tile
  SmallVector<Operation *> run, dead;
  auto identity = AffineMap::getMultiDimIdentityMap(1, ctx);
  // A splat (a vector constant, a broadcast scalar) is formed again where it is read.
  auto isSplat = [](Operation *op) {
    if (!op)
      return false;
    if (auto splat = dyn_cast<vector::BroadcastOp>(op))
      return !isa<VectorType>(splat.getSource().getType());
    auto c = dyn_cast<arith::ConstantOp>(op);
    return c && isa<SplatElementsAttr>(c.getValue());
  };
  // The scalar of a splat `v`: the broadcast's operand, or its constant made by `nb`.
  auto splatScalar = [](Value v, OpBuilder &nb) -> Value {
    if (auto splat = v.getDefiningOp<vector::BroadcastOp>())
      return splat.getSource();
    auto c = v.getDefiningOp<arith::ConstantOp>();
    return arith::ConstantOp::create(
        nb, c.getLoc(), cast<TypedAttr>(cast<SplatElementsAttr>(c.getValue()).getSplatValue<Attribute>()));
  };

  // One linalg.generic for the run, after its last op.
  auto flush = [&]() -> LogicalResult {
    if (run.empty())
      return success();
    SmallVector<Operation *> ops = std::move(run);
    run.clear();
    llvm::SmallPtrSet<Operation *, 16> inRun(ops.begin(), ops.end());
    SmallVector<Value> inputs, outputs;       // tiles read / buffers and windows written
    SmallVector<Value> yieldOf;               // per output: the run's vector value it holds
    llvm::SetVector<Value> read;
    b.setInsertionPointAfter(ops.back());
    for (Operation *op : ops) {
      for (Value operand : op->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (isVector(operand) && !inRun.contains(def) && !isSplat(def))
          read.insert(operand);
      }
      if (auto store = dyn_cast<vector::StoreOp>(op)) {
        FailureOr<Value> target =
            window(store.getBase(), store.getIndices(), store.getVectorType());
        if (failed(target))
          return op->emitOpError("spectra-map-tiles-to-gpu: a vector store to a rank-1 buffer "
                                 "is the only kind the GPU schedule spreads over threads");
        outputs.push_back(*target);
        yieldOf.push_back(store.getValueToStore());
        continue;
      }
      for (Value r : op->getResults())
        if (llvm::any_of(r.getUsers(), [&](Operation *u) { return !inRun.contains(u); })) {
          auto vt = cast<VectorType>(r.getType());
          Value tile = newTile(MemRefType::get(vt.getShape(), vt.getElementType()));
          tileOf[r] = tile;
          outputs.push_back(tile);
          yieldOf.push_back(r);
        }
    }
    for (Value v : read) {
      Value tile = tileOf.lookup(v);
      if (!tile)
        return v.getDefiningOp()->emitOpError(
            "spectra-map-tiles-to-gpu: a vector value the GPU schedule cannot hold as a tile");
      inputs.push_back(tile);
    }
    if (outputs.empty())
      return success();
    SmallVector<AffineMap> maps(inputs.size() + outputs.size(), identity);
    linalg::GenericOp::create(
        b, loc, TypeRange{}, inputs, outputs, maps, {utils::IteratorType::parallel}, "", "",
        [&](OpBuilder &nb, Location l, ValueRange args) {
          IRMapping m;
          for (auto [v, arg] : llvm::zip(read, args.take_front(read.size())))
            m.map(v, arg);
          auto scalarOf = [&](Value v) {
            if (Value s = m.lookupOrNull(v))
              return s;
            return isVector(v) && isSplat(v.getDefiningOp()) ? splatScalar(v, nb) : v;
          };
          for (Operation *op : ops) {
            if (isa<vector::StoreOp>(op))
              continue;
            OperationState state(l, op->getName());
            for (Value operand : op->getOperands())
              state.addOperands(scalarOf(operand));
            for (Type t : op->getResultTypes())
              state.addTypes(getElementTypeOrSelf(t));
            state.addAttributes(op->getAttrs());
            Operation *scalar = nb.create(state);
            m.map(op->getResults(), scalar->getResults());
          }
          SmallVector<Value> yields;
          for (Value v : yieldOf)
            yields.push_back(scalarOf(v));
          linalg::YieldOp::create(nb, l, yields);
        });
    return success();
  };

  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    if (auto load = dyn_cast<vector::LoadOp>(op)) {
      b.setInsertionPoint(&op);
      FailureOr<Value> source = window(load.getBase(), load.getIndices(), load.getVectorType());
      if (failed(source))
        return op.emitOpError("spectra-map-tiles-to-gpu: a vector load from a rank-1 buffer is "
                              "the only kind the GPU schedule spreads over threads");
      tileOf[load.getResult()] = *source;
      dead.push_back(&op);
      continue;
    }
    if (auto reduction = dyn_cast<vector::ReductionOp>(op)) {
      if (reduction.getKind() != vector::CombiningKind::ADD || reduction.getAcc())
        return op.emitOpError("spectra-map-tiles-to-gpu: only sums (vector.reduction <add>, "
                              "no accumulator) are spread over threads");
      Value v = reduction.getVector();
      if (failed(flush()))
        return failure();
      b.setInsertionPoint(&op);
      Value tile = tileOf.lookup(v);
      if (!tile && isSplat(v.getDefiningOp())) {
        auto vt = cast<VectorType>(v.getType());
        tile = newTile(MemRefType::get(vt.getShape(), vt.getElementType()));
        linalg::FillOp::create(b, loc, ValueRange{splatScalar(v, b)}, ValueRange{tile});
      }
      if (!tile)
        return op.emitOpError("spectra-map-tiles-to-gpu: a sum of a vector the GPU schedule "
                              "holds no tile of");
      Type et = reduction.getType();
      Value total = newTile(MemRefType::get({1}, et));
      linalg::FillOp::create(
          b, loc, ValueRange{arith::ConstantOp::create(b, loc, b.getZeroAttr(et))},
          ValueRange{total});
      AffineExpr i = b.getAffineDimExpr(0), j = b.getAffineDimExpr(1);
      linalg::GenericOp::create(
          b, loc, TypeRange{}, ValueRange{tile}, ValueRange{total},
          {AffineMap::get(2, 0, {j}, ctx), AffineMap::get(2, 0, {i}, ctx)},
          {utils::IteratorType::parallel, utils::IteratorType::reduction}, "", "",
          [&](OpBuilder &nb, Location l, ValueRange args) {
            linalg::YieldOp::create(nb, l,
                                    ValueRange{arith::AddFOp::create(nb, l, args[1], args[0])});
          });
      Value sum = memref::LoadOp::create(
          b, loc, total, ValueRange{arith::ConstantIndexOp::create(b, loc, 0)});
      reduction.getResult().replaceAllUsesWith(sum);
      dead.push_back(&op);
      continue;
    }
    if (isSplat(&op)) {
      dead.push_back(&op);
      continue;
    }
    if (llvm::any_of(op.getResults(), isVector)) {
      // Cloned entry by entry into its run's generic (flush).
      if (op.getNumRegions() != 0 || !isa<arith::ArithDialect, math::MathDialect>(op.getDialect()))
        return op.emitOpError("spectra-map-tiles-to-gpu: not an elementwise arith or math op, "
                              "which the GPU schedule spreads over threads");
      run.push_back(&op);
      dead.push_back(&op);
      continue;
    }
    if (isa<vector::StoreOp>(op)) {
      run.push_back(&op);
      dead.push_back(&op);
      continue;
    }
    if (llvm::any_of(op.getOperands(), isVector))
      return op.emitOpError("spectra-map-tiles-to-gpu: a scalar op that reads a vector, which "
                            "the GPU schedule cannot spread over threads");
  }
  if (failed(flush()))
    return failure();
  for (Operation *op : llvm::reverse(dead))
    op->erase();
  return success();
}

/// Moves every op at block level (not in a nest) that may write memory into a
/// one-thread nest (adjacent ones share it); recurses into loops that hold nests.
LogicalResult serialiseScalarWrites(Block &block) {
  scf::ForallOp open;
  for (Operation &op : llvm::make_early_inc_range(block)) {
    if (op.hasTrait<OpTrait::IsTerminator>())
      continue;
    bool holdsNest = false;
    op.walk([&](scf::ForallOp f) { holdsNest |= isNest(f); });
    if (isNest(&op)) {
      open = {};
      continue;
    }
    if (holdsNest) {
      open = {};
      // A branch holding nests must be taken by every thread of the block: its condition is
      // read from values every thread sees alike (the causal kernels' split decision, a
      // flag in workgroup memory written by one thread before the barrier).
      if (auto branch = dyn_cast<scf::IfOp>(op)) {
        for (Region *region : {&branch.getThenRegion(), &branch.getElseRegion()})
          if (!region->empty() && failed(serialiseScalarWrites(region->front())))
            return failure();
        continue;
      }
      auto loop = dyn_cast<scf::ForOp>(op);
      if (!loop)
        return op.emitOpError("spectra-map-tiles-to-gpu: only scf.for and scf.if may hold "
                              "thread nests");
      if (failed(serialiseScalarWrites(*loop.getBody())))
        return failure();
      continue;
    }
    if (!mayWrite(&op) || isa<memref::AllocaOp>(op)) {
      // A later write may use what this op defines: it must not move into a nest before it.
      if (op.getNumResults() != 0 && !isa<memref::AllocaOp>(op))
        open = {};
      continue;
    }
    if (op.getNumResults() != 0)
      return op.emitOpError("spectra-map-tiles-to-gpu: a block-level op that writes memory "
                            "must not have results");
    if (!open) {
      OpBuilder b(&op);
      open = createThreadNest(b, op.getLoc(), 1);
    }
    op.moveBefore(open.getBody()->getTerminator());
  }
  return success();
}

/// Maps one tile kernel (a function with the kernel ABI attributes) to the GPU.
LogicalResult mapKernel(func::FuncOp tile, const MapTilesOptions &o) {
  if (failed(vectorsToTiles(tile)))
    return failure();
  MLIRContext *ctx = tile.getContext();
  Location loc = tile.getLoc();
  auto roles = tile->getAttrOfType<ArrayAttr>(kKernelArgRolesAttr);
  auto grid = tile->getAttrOfType<StringAttr>(kKernelGridAttr);
  if (!roles || !grid || roles.size() != tile.getNumArguments())
    return tile.emitOpError("spectra-map-tiles-to-gpu: a kernel needs its ABI attributes");
  SmallVector<StringRef> role;
  for (Attribute r : roles)
    role.push_back(cast<StringAttr>(r).getValue());
  bool rowGrid = grid.getValue() == "keys" || grid.getValue() == "queries";

  // The batched signature.
  SmallVector<Type> types;
  for (auto [arg, r] : llvm::zip(tile.getArguments(), role)) {
    auto type = cast<MemRefType>(arg.getType());
    SmallVector<int64_t> shape(leadingDims(r), ShapedType::kDynamic);
    if (r == "mask")
      shape.assign(2, ShapedType::kDynamic);
    else
      llvm::append_range(shape, type.getShape());
    types.push_back(MemRefType::get(shape, type.getElementType()));
  }
  OpBuilder b(tile);
  auto fn = func::FuncOp::create(b, loc, tile.getSymName(), b.getFunctionType(types, {}));
  for (NamedAttribute attr : tile->getAttrs())
    if (attr.getName() != tile.getFunctionTypeAttrName() &&
        attr.getName() != tile.getSymNameAttrName() && attr.getName() != kKernelTileSharedBytesAttr)
      fn->setAttr(attr.getName(), attr.getValue());
  for (unsigned i = 0; i < tile.getNumArguments(); ++i)
    if (DictionaryAttr attrs = tile.getArgAttrDict(i))
      fn.setArgAttrs(i, attrs);
  auto counted = tile->getAttrOfType<IntegerAttr>(kKernelTileSharedBytesAttr);
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto idx = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };

  int rowsArg = -1, sliceArg = -1, partialArg = -1;
  for (auto [i, r] : llvm::enumerate(role)) {
    if (r == "rows" && rowsArg < 0)
      rowsArg = i;
    if ((r == "rows" || r == "slice") && sliceArg < 0)
      sliceArg = i;
    if (r == "partial" && partialArg < 0)
      partialArg = i;
  }
  // The chunk count from the partial sums (their [BH, C, ...] second dimension), and
  // ceil(N / C) rows per chunk rounded up to the tile rows (partial-chunks).
  auto tileRowsAttr = tile->getAttrOfType<IntegerAttr>(kKernelTileRowsAttr);
  bool chunksFromPartials = o.partialChunks && rowGrid && partialArg >= 0 && tileRowsAttr;
  if (rowGrid && rowsArg < 0)
    return tile.emitOpError("spectra-map-tiles-to-gpu: a row kernel needs a rows argument");
  // A per-slice (or one-block) kernel whose rows are independent (the combines) spreads
  // them over blocks: one block per slice left most of a GPU idle while it merged every
  // chunk's partial sums.
  int64_t blockRows = 0, sliceBlocks = 1;
  bool perSlice = grid.getValue() == "slices" || grid.getValue() == "one";
  if (std::optional<SliceSplit> split;
      perSlice && rowsArg < 0 && (split = rowsPerSliceBlock(tile, o.threads))) {
    blockRows = split->rows;
    sliceBlocks = split->blocks;
  }
  // The grid: (chunk, slice), (row block, slice), (slice), (row block) or (1). Its bounds
  // are the only values computed outside the blocks; the blocks recompute what they need
  // from the arguments.
  auto gridOf = [&](OpBuilder &gb) -> SmallVector<OpFoldResult> {
    if (rowGrid) {
      Value n = memref::DimOp::create(gb, loc, fn.getArgument(rowsArg), 1);
      Value chunks =
          chunksFromPartials
              ? memref::DimOp::create(gb, loc, fn.getArgument(partialArg), 1).getResult()
              : arith::CeilDivSIOp::create(gb, loc, n,
                                           arith::ConstantIndexOp::create(gb, loc, o.chunkRows))
                    .getResult();
      return {chunks, OpFoldResult(memref::DimOp::create(gb, loc, fn.getArgument(rowsArg), 0))};
    }
    SmallVector<OpFoldResult> bounds;
    if (sliceBlocks > 1 || grid.getValue() == "one")
      bounds.push_back(gb.getIndexAttr(sliceBlocks));
    if (grid.getValue() == "slices")
      bounds.push_back(memref::DimOp::create(gb, loc, fn.getArgument(sliceArg), 0).getResult());
    return bounds;
  };
  SmallVector<OpFoldResult> bounds = gridOf(b);
  SmallVector<Attribute> mapping = {gpu::GPUBlockMappingAttr::get(ctx, gpu::MappingId::DimX)};
  if (bounds.size() == 2)
    mapping.push_back(gpu::GPUBlockMappingAttr::get(ctx, gpu::MappingId::DimY));
  auto blocks = scf::ForallOp::create(b, loc, bounds, ValueRange{}, b.getArrayAttr(mapping));
  func::ReturnOp::create(b, loc);

  // The block's windows of each argument.
  b.setInsertionPointToStart(blocks.getBody());
  Value chunk, slice;
  // The row block of a kernel whose blocks split its rows (the combines): the grid's first
  // dimension, the slice (if any) its last.
  RowSplit rowSplit{sliceBlocks > 1 ? blocks.getInductionVar(0) : Value(), blockRows};
  if (rowGrid) {
    chunk = blocks.getInductionVar(0);
    slice = blocks.getInductionVar(1);
  } else if (grid.getValue() == "slices") {
    slice = blocks.getInductionVars().back();
  }
  Value first, rows;
  if (rowGrid) {
    Value n = memref::DimOp::create(b, loc, fn.getArgument(rowsArg), 1);
    Value perChunk = idx(o.chunkRows);
    if (chunksFromPartials) {
      // ceil(n / C) rounded up to a multiple of the tile rows T: ceil(ceil(n / C) / T) T.
      Value C = memref::DimOp::create(b, loc, fn.getArgument(partialArg), 1);
      Value T = idx(tileRowsAttr.getInt());
      Value even = arith::CeilDivSIOp::create(b, loc, n, C);
      perChunk = arith::MulIOp::create(b, loc, arith::CeilDivSIOp::create(b, loc, even, T), T);
    }
    first = arith::MulIOp::create(b, loc, chunk, perChunk);
    // 0 rows past the end (a chunk count the host did not pick as KernelLaunch.h's rowChunks
    // does): the block still writes its partial sums, from no rows.
    rows = arith::MaxSIOp::create(
        b, loc, idx(0), arith::MinSIOp::create(b, loc, perChunk, arith::SubIOp::create(b, loc, n, first)));
  }
  // A per-slice kernel with rows (the causal keys' backward) takes all of them, and its
  // partial shares are the slice's one chunk.
  bool sliceRows = grid.getValue() == "slices" && rowsArg >= 0;
  if (sliceRows) {
    chunk = idx(0);
    first = idx(0);
    rows = memref::DimOp::create(b, loc, fn.getArgument(rowsArg), 1);
  }
  IRMapping map;
  for (auto [i, r] : llvm::enumerate(role)) {
    Value arg = fn.getArgument(i);
    auto inner = cast<MemRefType>(tile.getArgument(i).getType());
    if (r == "shared") {
      map.map(tile.getArgument(i), arg);
      continue;
    }
    if ((r == "rows" || r == "mask" || r == "partial") && !rowGrid && !sliceRows)
      return tile.emitOpError("spectra-map-tiles-to-gpu: argument ")
             << i << " has role '" << r << "' in a kernel whose grid is not over rows";
    if (!slice)
      return tile.emitOpError("spectra-map-tiles-to-gpu: argument ")
             << i << " has role '" << r << "' in a kernel with one block";
    SmallVector<OpFoldResult> offsets = {slice}, sizes = {b.getIndexAttr(1)};
    int64_t lead = r == "partial" ? 2 : 1;
    if (r == "partial") {
      offsets.push_back(chunk);
      sizes.push_back(b.getIndexAttr(1));
    }
    for (int64_t d = 0; d < inner.getRank(); ++d) {
      bool rowDim = (r == "rows" || r == "mask") && d == 0;
      offsets.push_back(rowDim ? OpFoldResult(first) : OpFoldResult(b.getIndexAttr(0)));
      if (rowDim)
        sizes.push_back(rows);
      else if (inner.isDynamicDim(d))
        sizes.push_back(OpFoldResult(memref::DimOp::create(b, loc, arg, lead + d)));
      else
        sizes.push_back(b.getIndexAttr(inner.getDimSize(d)));
    }
    SmallVector<OpFoldResult> strides(offsets.size(), b.getIndexAttr(1));
    MemRefType viewType = memref::SubViewOp::inferRankReducedResultType(
        inner.getShape(), cast<MemRefType>(arg.getType()), offsets, sizes, strides);
    map.map(tile.getArgument(i),
            memref::SubViewOp::create(b, loc, viewType, arg, offsets, sizes, strides));
  }
  // The tile kernel's body, per block; its buffers in workgroup memory.
  for (Operation &op : tile.getBody().front().without_terminator())
    b.clone(op, map);
  int64_t sharedBytes = 0;
  Attribute space = workgroupSpace(ctx);
  for (auto alloca : llvm::to_vector(blocks.getBody()->getOps<memref::AllocaOp>())) {
    MemRefType type = alloca.getType();
    if (!type.hasStaticShape())
      return alloca.emitOpError("spectra-map-tiles-to-gpu: a tile buffer must have a static shape");
    sharedBytes += sharedPoolBytes(type);
    alloca.getResult().setType(MemRefType::get(type.getShape(), type.getElementType(),
                                               type.getLayout(), space));
  }
  reinferSubviews(blocks);
  if (sharedBytes > o.sharedLimit) {
    auto diag = tile.emitOpError("spectra-map-tiles-to-gpu: the tiles of kernel '")
                << tile.getSymName() << "' need " << sharedBytes
                << " bytes of workgroup (shared) memory, more than the " << o.sharedLimit
                << "-byte limit of a block's shared memory";
    // A kernel already at one row per tile cannot shrink further: the head is too large.
    if (tileRowsAttr && tileRowsAttr.getInt() <= 1)
      return diag << " at 1 row per tile (the buffers sized by the features and the head "
                     "dims alone); use fewer features (m) or a smaller head";
    return diag << "; use fewer tile rows";
  }
  fn->setAttr(kKernelSharedBytesAttr, b.getI64IntegerAttr(sharedBytes));
  fn->setAttr(kKernelThreadsAttr, b.getI64IntegerAttr(o.threads));
  fn->setAttr(kKernelChunkRowsAttr, b.getI64IntegerAttr(o.chunkRows));
  if (chunksFromPartials)
    fn->setAttr(kKernelChunksAttr, b.getStringAttr("partials"));
  if (sliceBlocks > 1)
    fn->setAttr(kKernelSliceBlocksAttr, b.getI64IntegerAttr(sliceBlocks));

  // Thread nests.
  // Thread nests; the contractions the tensor cores take, warp nests.
  Type mmaType;
  bool split = o.mmaType == "bf16x3";
  if (o.mmaType == "bf16" || split)
    mmaType = b.getBF16Type();
  else if (o.mmaType == "f16")
    mmaType = b.getF16Type();
  SmallVector<linalg::LinalgOp> ops;
  blocks.getBody()->walk([&](linalg::LinalgOp op) { ops.push_back(op); });
  // A contraction on tensor cores runs its epilogue (Epilogue.h: the features after the
  // logits) on each warp tile's accumulators: no thread nest, no barrier, no pass over the
  // tile in shared memory for it.
  // One whose output a fill just set to 0 starts each warp tile's accumulators at 0: the
  // fill's thread nest and barrier go too.
  struct OnTensorCores {
    MmaPlan plan;
    std::optional<Epilogue> epilogue;
    bool zeroInit = false;
  };
  llvm::DenseMap<Operation *, OnTensorCores> tensorCores;
  llvm::DenseSet<Operation *> fused;
  // Warp chains (WarpChains.h): a contraction, its epilogue and the ops reading the tiles it
  // forms, with those tiles in registers, where the tiles and the warps' partials fit 48 KiB
  // (kStaticSharedBytes; all of them are views of the dynamic pool once launched).
  llvm::DenseSet<Operation *> chained, deferred;
  if (mmaType && o.threads % 32 == 0 && o.warpChains)
    for (linalg::LinalgOp op : ops) {
      if (chained.contains(op) || deferred.contains(op))
        continue;
      auto generic = dyn_cast<linalg::GenericOp>(op.getOperation());
      if (!generic || !planMma(generic))
        continue;
      std::optional<WarpChainMapping> chain =
          mapWarpChain(generic, o.threads, mmaType, split, kNestAttr, sharedBytes,
                       kStaticSharedBytes);
      if (!chain)
        continue;
      chained.insert(chain->ops.begin(), chain->ops.end());
      deferred.insert(chain->deferred.begin(), chain->deferred.end());
      for (Value tile : chain->registerTiles) {
        auto type = cast<MemRefType>(tile.getType());
        sharedBytes -= sharedPoolBytes(type);
        tile.setType(MemRefType::get(type.getShape(), type.getElementType(), type.getLayout()));
      }
      sharedBytes += chain->partialBytes;
      reinferSubviews(blocks);
      fn->setAttr(kKernelSharedBytesAttr, b.getI64IntegerAttr(sharedBytes));
    }
  // The tile layer sized the kernel's rows by its count of these bytes
  // (warpChainSharedBytes); the two counts must agree, or the rows were chosen on a wrong
  // figure.
  if (counted && counted.getInt() != sharedBytes && mmaType && o.warpChains)
    fn.emitWarning("spectra-map-tiles-to-gpu: kernel '")
        << fn.getSymName() << "' takes " << sharedBytes
        << " bytes of shared memory, but its tile rows were chosen for " << counted.getInt();
  if (mmaType && o.threads % 32 == 0)
    for (linalg::LinalgOp op : ops) {
      if (chained.contains(op))
        continue;
      auto generic = dyn_cast<linalg::GenericOp>(op.getOperation());
      std::optional<MmaPlan> plan = generic ? planMma(generic) : std::nullopt;
      if (!plan)
        continue;
      OnTensorCores t{*plan, epilogueOf(generic), false};
      if (t.epilogue)
        fused.insert(t.epilogue->op);
      if (linalg::FillOp fill = zeroFillBefore(generic)) {
        t.zeroInit = true;
        fused.insert(fill);
      }
      tensorCores[op] = t;
    }
  for (linalg::LinalgOp op : ops) {
    if (chained.contains(op))
      continue;
    if (fused.contains(op)) {
      if (isa<linalg::FillOp>(op.getOperation()))
        op->erase();
      continue;
    }
    if (auto it = tensorCores.find(op); it != tensorCores.end()) {
      const OnTensorCores &t = it->second;
      mapContractionToWarps(cast<linalg::GenericOp>(op.getOperation()), t.plan, o.threads / 32,
                            mmaType, split, kNestAttr, t.epilogue ? &*t.epilogue : nullptr,
                            t.zeroInit);
      continue;
    }
    if (failed(distribute(op, o.threads, rowSplit.block ? &rowSplit : nullptr)))
      return failure();
  }
  if (failed(serialiseScalarWrites(*blocks.getBody())))
    return failure();
  // A partial tile's row loops (loads, stores): one nest each, not one per row.
  if (o.rowNests)
    mergeRowLoopsIntoNests(*blocks.getBody(), o.threads, kNestAttr);
  // A recurrence down a tile's rows, column by column (the causal running maximum): the rows
  // in order inside each thread, one nest.
  if (o.mergeNests)
    runRowsInThreads(*blocks.getBody(), o.threads, kNestAttr);
  // A block's nests in phases of independent nests: one barrier per phase.
  if (o.mergeNests)
    mergeIndependentNests(*blocks.getBody(), o.threads, kNestAttr);
  tile.erase();
  return success();
}

struct MapTilesToGpuPass : mlir::spectra::impl::SpectraMapTilesToGpuBase<MapTilesToGpuPass> {
  using SpectraMapTilesToGpuBase::SpectraMapTilesToGpuBase;
  void runOnOperation() override {
    MapTilesOptions o{threads, chunkRows,  partialChunks, sharedLimit,
                      mmaType, warpChains, rowNests,      mergeNests};
    if (!o.mmaType.empty() && o.mmaType != "bf16" && o.mmaType != "bf16x3" && o.mmaType != "f16") {
      getOperation().emitError() << "spectra-map-tiles-to-gpu: mma-type must be bf16, bf16x3, "
                                    "f16 or empty (no tensor cores), got '"
                                 << o.mmaType << "'";
      return signalPassFailure();
    }
    if (threads < 1 || threads > 1024 || chunkRows < 1) {
      getOperation().emitError() << "spectra-map-tiles-to-gpu: threads must be in [1, 1024] (the "
                                    "most a block may hold) and chunk-rows positive, got threads="
                                 << o.threads << " and chunk-rows=" << o.chunkRows;
      return signalPassFailure();
    }
    for (auto fn : llvm::to_vector(getOperation().getOps<func::FuncOp>()))
      if (fn->hasAttr(kKernelKindAttr) && failed(mapKernel(fn, o)))
        return signalPassFailure();
  }
};

/// Erases the workgroup memory space from every type (the CPU has one memory).
struct StripWorkgroupMemoryPass : mlir::spectra::impl::SpectraStripWorkgroupMemoryBase<StripWorkgroupMemoryPass> {
  void runOnOperation() override {
    auto strip = [](Value v) {
      if (!isWorkgroup(v.getType()))
        return;
      auto type = cast<MemRefType>(v.getType());
      v.setType(MemRefType::get(type.getShape(), type.getElementType(), type.getLayout()));
    };
    getOperation().walk([&](Operation *op) {
      for (Value r : op->getResults())
        strip(r);
      for (Region &region : op->getRegions())
        for (Block &block : region)
          for (BlockArgument a : block.getArguments())
            strip(a);
    });
  }
};

/// bf16 conversions as integer arithmetic: the CPU need not have them (AVX2 has none).
struct ExpandBf16Pass : mlir::spectra::impl::SpectraExpandBf16Base<ExpandBf16Pass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    arith::populateExpandBFloat16Patterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

/// The tensor-core tiles lane by lane on the CPU (MapContractionsToMma.h).
struct EmulateWarpMmaPass : mlir::spectra::impl::SpectraEmulateWarpMmaBase<EmulateWarpMmaPass> {
  void runOnOperation() override {
    SmallVector<scf::ForallOp> chains;
    getOperation().walk([&](scf::ForallOp nest) {
      if (isWarpChain(nest))
        chains.push_back(nest);
    });
    for (scf::ForallOp nest : chains)
      if (failed(emulateWarpChain(nest)))
        return signalPassFailure();
    SmallVector<linalg::GenericOp> tiles;
    getOperation().walk([&](linalg::GenericOp g) {
      if (g->hasAttr(kMmaAttr))
        tiles.push_back(g);
    });
    for (linalg::GenericOp g : tiles)
      if (failed(emulateWarpMma(g)))
        return signalPassFailure();
  }
};

/// The block forall of a mapped kernel as gpu.launch: blocks (x, y) = its bounds,
/// `threads` threads, workgroup buffers as views of one dynamic shared-memory pool; each
/// thread nest `if (tid.x < n)`, then gpu.barrier.
LogicalResult launch(scf::ForallOp blocks, int64_t threads) {
  Location loc = blocks.getLoc();
  OpBuilder b(blocks);
  SmallVector<Value> ubs = getValueOrCreateConstantIndexOp(b, loc, blocks.getMixedUpperBound());
  Value one = arith::ConstantIndexOp::create(b, loc, 1);
  SmallVector<memref::AllocaOp> buffers;
  for (auto alloca : blocks.getBody()->getOps<memref::AllocaOp>())
    if (isWorkgroup(alloca.getType()))
      buffers.push_back(alloca);
  auto launchOp = gpu::LaunchOp::create(
      b, loc, ubs[0], ubs.size() > 1 ? ubs[1] : one, one,
      arith::ConstantIndexOp::create(b, loc, threads), one, one, /*dynamicSharedMemorySize=*/Value());
  Block &body = launchOp.getBody().front();
  b.setInsertionPointToEnd(&body);
  auto terminator = gpu::TerminatorOp::create(b, loc);
  // Move the block body in, block ids for the forall's induction variables.
  gpu::KernelDim3 ids = launchOp.getBlockIds();
  Value blockIds[] = {ids.x, ids.y};
  Block *forallBody = blocks.getBody();
  for (auto [i, iv] : llvm::enumerate(blocks.getInductionVars()))
    iv.replaceAllUsesWith(blockIds[i]);
  forallBody->getTerminator()->erase();
  body.getOperations().splice(terminator->getIterator(), forallBody->getOperations());
  blocks.erase();
  // Thread nests: predicated on the thread id, a barrier after each.
  Value tid = launchOp.getThreadIds().x;
  SmallVector<scf::ForallOp> nests;
  launchOp.getBody().walk([&](scf::ForallOp f) {
    if (isNest(f))
      nests.push_back(f);
  });
  for (scf::ForallOp nest : nests) {
    if (isWarpChain(nest)) {
      if (failed(lowerWarpChain(nest, launchOp, tid, threads)))
        return failure();
      continue;
    }
    OpBuilder nb(nest);
    std::optional<int64_t> n = getConstantIntValue(nest.getMixedUpperBound()[0]);
    // A warp nest: its induction variable is the warp (tid / 32), its contractions
    // fragments and mma.sync on each warp's lanes.
    bool warps = isWarpNest(nest);
    int64_t width = warps ? 32 : 1;
    // A warp nest beside others of its phase starts past their warps (MergeNests.h).
    int64_t first = 0;
    if (auto attr = nest->getAttrOfType<IntegerAttr>(kFirstWarpAttr); attr && warps)
      first = attr.getInt();
    if (!n || first < 0 || (first + *n) * width > threads)
      return nest.emitOpError("spectra-launch-mapped-kernels: a thread nest needs at most ")
             << threads << " threads";
    Block *inner = nest.getBody();
    inner->getTerminator()->erase();
    Value unit = tid;
    if (warps) {
      Value w = arith::ConstantIndexOp::create(nb, nest.getLoc(), 32);
      unit = arith::DivUIOp::create(nb, nest.getLoc(), tid, w);
      // Below `first` the difference wraps past every count: those warps take no tile.
      if (first)
        unit = arith::SubIOp::create(nb, nest.getLoc(), unit,
                                     arith::ConstantIndexOp::create(nb, nest.getLoc(), first));
      Value lane = arith::RemUIOp::create(nb, nest.getLoc(), tid, w);
      SmallVector<linalg::GenericOp> tiles;
      inner->walk([&](linalg::GenericOp g) {
        if (g->hasAttr(kMmaAttr))
          tiles.push_back(g);
      });
      for (linalg::GenericOp g : tiles)
        if (failed(lowerWarpMma(g, lane)))
          return failure();
    }
    nest.getInductionVar(0).replaceAllUsesWith(unit);
    if (first == 0 && *n * width == threads) {
      nb.getInsertionBlock()->getOperations().splice(nest->getIterator(), inner->getOperations());
    } else {
      Value live = arith::CmpIOp::create(nb, nest.getLoc(), arith::CmpIPredicate::ult, unit,
                                         arith::ConstantIndexOp::create(nb, nest.getLoc(), *n));
      auto guard = scf::IfOp::create(nb, nest.getLoc(), live, /*withElseRegion=*/false);
      Block *then = guard.thenBlock();
      then->getOperations().splice(then->getTerminator()->getIterator(), inner->getOperations());
    }
    // The next nest of its phase is independent of it (MergeNests.h): no barrier between.
    if (!nest->hasAttr(kNoBarrierAttr))
      gpu::BarrierOp::create(nb, nest.getLoc());
    nest.erase();
  }
  // The buffers are views at 16-byte aligned offsets of one pool, the block's dynamic shared
  // memory, whose size the launch carries (the runtime opts the kernel in at load:
  // cuFuncSetAttribute): first the tiles' buffers, then the warp chains' partials, which the
  // chains' lowering above adds as workgroup allocas (WarpChains.cpp, `shared`). Not a
  // workgroup attribution per buffer: each attribution is a shared symbol of its own, whose
  // 64-bit address LLVM forms once and keeps live through the loops, two registers each (49
  // in posrf-mm's causal key backward, which then spilled at the 128 registers two blocks per
  // SM leave). Nor one static pool: its buffers are a register plus offsets, where the dynamic
  // pool's are the extern symbol plus offsets, and ptxas spilled more with it (the causal
  // set's readout on sm_90a in f32: 32 bytes, 0).
  for (auto alloca : body.getOps<memref::AllocaOp>())
    if (isWorkgroup(alloca.getType()) && !llvm::is_contained(buffers, alloca))
      buffers.push_back(alloca);
  if (!buffers.empty()) {
    int64_t total = 0;
    SmallVector<int64_t> offsets;
    for (memref::AllocaOp a : buffers) {
      offsets.push_back(total);
      total += sharedPoolBytes(a.getType());
    }
    OpBuilder sb(launchOp);
    launchOp.getDynamicSharedMemorySizeMutable().assign(
        arith::ConstantIntOp::create(sb, loc, sb.getI32Type(), total).getResult());
    OpBuilder vb = OpBuilder::atBlockBegin(&body);
    auto bytes = MemRefType::get({ShapedType::kDynamic}, vb.getI8Type(),
                                 MemRefLayoutAttrInterface(), workgroupSpace(b.getContext()));
    Value pool = gpu::DynamicSharedMemoryOp::create(vb, loc, bytes);
    for (auto [a, offset] : llvm::zip(buffers, offsets)) {
      Value at = arith::ConstantIndexOp::create(vb, loc, offset);
      a.getResult().replaceAllUsesWith(
          memref::ViewOp::create(vb, loc, a.getType(), pool, at, ValueRange{}).getResult());
    }
    // Erased after: vb inserts before the body's first op, which may be one of them.
    for (memref::AllocaOp a : buffers)
      a.erase();
  }
  return success();
}

struct LaunchMappedKernelsPass : mlir::spectra::impl::SpectraLaunchMappedKernelsBase<LaunchMappedKernelsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), UnitAttr::get(&getContext()));
    for (auto fn : llvm::to_vector(module.getOps<func::FuncOp>())) {
      auto threads = fn->getAttrOfType<IntegerAttr>(kKernelThreadsAttr);
      if (!threads)
        continue;
      SmallVector<scf::ForallOp> blocks;
      for (auto f : fn.getBody().front().getOps<scf::ForallOp>())
        blocks.push_back(f);
      if (blocks.size() != 1) {
        fn.emitOpError("spectra-launch-mapped-kernels: a mapped kernel has one block forall");
        return signalPassFailure();
      }
      if (failed(launch(blocks.front(), threads.getInt())))
        return signalPassFailure();
    }
  }
};

/// The barriers a block passes per full tile of rows on the path a tile takes: the
/// gpu.barrier ops in the kernel's tile loop (marked kTileLoopAttr by the tile layer), each
/// counted as often as the loops around it in there run at most (a row loop up to its
/// constant bound; the rows past the end, from min(x, C) to C, not at all; a loop with no
/// constant bound once). Of a branch, the branch with more; of the causal row-by-row
/// fallback (kRowByRowAttr), the tile's branch only: a tile runs row by row only where its
/// factors' range is too wide for one reference. In a kernel without a tile loop (the
/// combines, the params kernels), the whole kernel.
int64_t barriersIn(Region &region);

int64_t barriersIn(Operation *op) {
  if (isa<gpu::BarrierOp>(op))
    return 1;
  if (auto branch = dyn_cast<scf::IfOp>(op)) {
    int64_t otherwise = barriersIn(branch.getElseRegion());
    if (branch->hasAttr(kRowByRowAttr))
      return otherwise;
    return std::max(barriersIn(branch.getThenRegion()), otherwise);
  }
  int64_t inside = 0;
  for (Region &region : op->getRegions())
    inside += barriersIn(region);
  auto loop = dyn_cast<scf::ForOp>(op);
  if (!loop || inside == 0)
    return inside;
  if (isRowsPastTheEnd(loop))
    return 0;
  std::optional<int64_t> last = constantUpperBound(loop.getUpperBound()),
                         step = getConstantIntValue(loop.getStep());
  if (loop->hasAttr(kTileLoopAttr) || !last || !step || *step <= 0)
    return inside;
  int64_t first = getConstantIntValue(loop.getLowerBound()).value_or(0);
  return inside * std::max<int64_t>(0, llvm::divideCeil(*last - first, *step));
}

int64_t barriersIn(Region &region) {
  int64_t count = 0;
  for (Block &block : region)
    for (Operation &op : block)
      count += barriersIn(&op);
  return count;
}

int64_t barriersPerTile(gpu::GPUFuncOp fn) {
  scf::ForOp tiles;
  fn.walk<WalkOrder::PreOrder>([&](scf::ForOp loop) {
    if (!loop->hasAttr(kTileLoopAttr))
      return WalkResult::advance();
    tiles = loop;
    return WalkResult::interrupt();
  });
  return tiles ? barriersIn(tiles) : barriersIn(fn.getBody());
}

/// After outlining: every kernel of the module in one gpu.module `@<name>` (one PTX
/// text), and the launch description read off each host function's gpu.launch_func
/// (the kernel's arguments are the host function's, named by the ABI attributes).
struct DescribeGpuKernelsPass : mlir::spectra::impl::SpectraDescribeGpuKernelsBase<DescribeGpuKernelsPass> {
  using SpectraDescribeGpuKernelsBase::SpectraDescribeGpuKernelsBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<gpu::GPUModuleOp> modules = llvm::to_vector(module.getOps<gpu::GPUModuleOp>());
    if (modules.empty())
      return;
    OpBuilder b(modules.front());
    auto joined = gpu::GPUModuleOp::create(b, module.getLoc(), moduleName);
    SymbolTable symbols(joined);
    llvm::json::Array kernels;
    for (auto fn : module.getOps<func::FuncOp>()) {
      auto kind = fn->getAttrOfType<StringAttr>(kKernelKindAttr);
      if (!kind)
        continue;
      gpu::LaunchFuncOp launchOp;
      fn.walk([&](gpu::LaunchFuncOp l) { launchOp = l; });
      if (!launchOp) {
        fn.emitOpError("spectra-describe-gpu-kernels: no gpu.launch_func");
        return signalPassFailure();
      }
      auto names = fn->getAttrOfType<ArrayAttr>(kKernelArgNamesAttr);
      auto roles = fn->getAttrOfType<ArrayAttr>(kKernelArgRolesAttr);
      auto gridRule = fn->getAttrOfType<StringAttr>(kKernelGridAttr);
      auto threadCount = fn->getAttrOfType<IntegerAttr>(kKernelThreadsAttr);
      auto chunkRowCount = fn->getAttrOfType<IntegerAttr>(kKernelChunkRowsAttr);
      if (!names || !roles || !gridRule || !threadCount || !chunkRowCount ||
          names.size() != fn.getNumArguments() || roles.size() != fn.getNumArguments()) {
        fn.emitOpError("spectra-describe-gpu-kernels: a mapped kernel needs its ABI attributes "
                       "(spectra.arg_names, spectra.arg_roles, spectra.grid, spectra.threads, "
                       "spectra.chunk_rows; run spectra-map-tiles-to-gpu first)");
        return signalPassFailure();
      }
      llvm::json::Array args;
      for (Value operand : launchOp.getKernelOperands()) {
        auto arg = dyn_cast<BlockArgument>(operand);
        if (!arg || arg.getOwner() != &fn.getBody().front()) {
          launchOp.emitOpError("spectra-describe-gpu-kernels: a kernel operand is not an "
                               "argument of the host function (computed on the host)");
          return signalPassFailure();
        }
        auto type = cast<MemRefType>(arg.getType());
        std::string element;
        llvm::raw_string_ostream(element) << type.getElementType();
        args.push_back(llvm::json::Object{
            {"name", cast<StringAttr>(names[arg.getArgNumber()]).getValue()},
            {"role", cast<StringAttr>(roles[arg.getArgNumber()]).getValue()},
            {"rank", type.getRank()},
            {"element", element}});
      }
      auto kernelFn = SymbolTable::lookupNearestSymbolFrom<gpu::GPUFuncOp>(
          module, launchOp.getKernelAttr());
      // Move the kernel into the joined module under the host function's name.
      auto moved = cast<gpu::GPUFuncOp>(kernelFn->clone());
      moved.setName(fn.getSymName());
      symbols.insert(moved);
      launchOp.setKernelAttr(SymbolRefAttr::get(
          joined.getSymNameAttr(),
          ArrayRef<FlatSymbolRefAttr>{FlatSymbolRefAttr::get(moved.getNameAttr())}));
      int64_t shared = 0, dynamicShared = 0;
      for (BlockArgument a : moved.getWorkgroupAttributions())
        shared += sharedPoolBytes(cast<MemRefType>(a.getType()));  // aligned to 16 as well
      if (Value size = launchOp.getDynamicSharedMemorySize()) {
        std::optional<int64_t> n = getConstantIntValue(size);
        if (!n) {
          launchOp.emitOpError("spectra-describe-gpu-kernels: the dynamic shared memory size "
                               "is not a constant");
          return signalPassFailure();
        }
        dynamicShared = *n;
      }
      llvm::json::Object description{{"kind", kind.getValue()},
                                     {"name", fn.getSymName()},
                                     {"grid", gridRule.getValue()},
                                     {"block", threadCount.getInt()},
                                     {"chunk_rows", chunkRowCount.getInt()},
                                     {"shared_bytes", shared + dynamicShared},
                                     {"args", std::move(args)}};
      if (dynamicShared > 0)
        description.insert({"dynamic_shared_bytes", dynamicShared});
      auto rows = fn->getAttrOfType<IntegerAttr>(kKernelTileRowsAttr);
      if (rows)
        description.insert({"tile_rows", rows.getInt()});
      description.insert({"barriers_per_tile", barriersPerTile(moved)});
      if (auto chunks = fn->getAttrOfType<StringAttr>(kKernelChunksAttr))
        description.insert({"chunks", chunks.getValue()});
      if (auto split = fn->getAttrOfType<IntegerAttr>(kKernelSliceBlocksAttr))
        description.insert({"slice_blocks", split.getInt()});
      kernels.push_back(std::move(description));
    }
    for (gpu::GPUModuleOp m : modules)
      m.erase();
    std::string text;
    // Compact: one line in the printed module.
    llvm::raw_string_ostream(text) << llvm::formatv("{0}", llvm::json::Value(std::move(kernels)));
    module->setAttr(kGpuKernelsAttr, StringAttr::get(&getContext(), text));
  }
};

} // namespace

scf::ForallOp mlir::spectra::createThreadNest(OpBuilder &b, Location loc, int64_t n,
                                              StringRef mark) {
  auto forall = scf::ForallOp::create(
      b, loc, ArrayRef<OpFoldResult>{b.getIndexAttr(n)}, ValueRange{},
      b.getArrayAttr({gpu::GPUThreadMappingAttr::get(b.getContext(), gpu::MappingId::DimX)}));
  forall->setAttr(mark, b.getUnitAttr());
  return forall;
}

int64_t mlir::spectra::staticSharedLimit(StringRef chip) {
  // Both targets cap a block's static shared memory at 48 KiB.
  (void)chip;
  return kStaticSharedBytes;
}

int64_t mlir::spectra::blockSharedLimit(StringRef chip) {
  // The opt-in maximum per block (CUDA programming guide, compute capabilities): 163 KiB on
  // sm_80, 227 KiB on sm_90.
  return chip.starts_with("sm_90") ? 227 * 1024 : 163 * 1024;
}

int64_t mlir::spectra::twoBlockSharedLimit(StringRef chip) {
  // Half an SM's shared memory (164 KiB on sm_80, 228 KiB on sm_90) less the 1 KiB the
  // system reserves per block: what two resident blocks each may use.
  int64_t perSm = chip.starts_with("sm_90") ? 228 * 1024 : 164 * 1024;
  return perSm / 2 - 1024;
}

void mlir::spectra::buildGpuMappedPipeline(OpPassManager &pm, const GpuScheduleOptions &o) {
  buildSpectraInputPipeline(pm);
  SpectraBuildTileKernelsOptions tiles;
  tiles.valueDim = o.valueDim;
  // The causal kernels hold twice the tiles (a tile and its one-row split path) besides their
  // [T, T] products: at most 2 rows, so that features with two outputs (TrigRF, PosRF-Hyp)
  // stay within the 48 KiB a block has without opting in.
  tiles.tileRows = o.causal ? std::min<int64_t>(o.tileRows, 2) : o.tileRows;
  tiles.inputType = o.dtype;
  tiles.causal = o.causal;
  tiles.paramsKernels = true;
  // 16-bit inputs: the contractions on tensor cores (bf16 operands by default, also for f16
  // inputs, because the tiles they read include sums over the sequence, the summaries S, z
  // and their gradients, that may exceed f16's range, 65504). f32 inputs: FMA.
  std::string dtype = o.dtype, mma = o.mma;
  bool tensorCores = mma != "none" && (dtype == "bf16" || dtype == "f16");
  // On tensor cores a 4-row tile pads the mma's 16-row m (or 8-row n) to four times its work:
  // each row kernel takes 16 rows per tile, or 8, where its tiles leave two blocks per SM
  // (posrf at d = 32, m = 128: 16 in every kernel; its backward at d = 64, m = 256: 8).
  if (tensorCores && o.maxTileRows > tiles.tileRows)
    tiles.maxTileRows = o.maxTileRows;
  // Larger heads (d = 64, m = 256: OPRF's and SADERF's query backward, TrigRF's causal
  // kernels), where tile-rows rows would not fit 48 KiB: dynamic shared memory or fewer rows
  // (below); spectra-map-tiles-to-gpu refuses what does not fit the block at min-tile-rows.
  tiles.sharedLimit = staticSharedLimit(o.chip);
  tiles.minTileRows = o.minTileRows;
  // On tensor cores, before fewer rows (padding the mma's 16- and 8-row shapes), more shared
  // memory: past 48 KiB (opted in), up to what keeps two blocks per SM (the registers bound
  // the blocks an SM holds to two either way). f32 (FMA) takes fewer rows within 48 KiB
  // (measured at d = 64, m = 256 on sm_80: OPRF's query backward spills 24 B at 4 rows, none
  // at 2); tiles that fit nowhere at min-tile-rows go dynamic on both.
  tiles.dynamicSharedLimit = o.dynamicShared && tensorCores ? twoBlockSharedLimit(o.chip) : 0;
  // With warp chains, a kernel's tiles that a chain keeps in registers take no shared memory:
  // kv at d = 64, m = 256 takes 16 rows, not 8.
  // (An unknown mma type is spectra-map-tiles-to-gpu's error, below.)
  if (tensorCores && o.warpChains && (mma == "bf16" || mma == "bf16x3" || mma == "f16")) {
    tiles.warpChainThreads = o.threads;
    tiles.warpChainMma = mma;
  }
  pm.addPass(createSpectraBuildTileKernels(tiles));
  pm.addPass(createSpectraKeepKernels());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  SpectraMapTilesToGpuOptions map;
  map.threads = o.threads;
  map.chunkRows = o.chunkRows;
  // The bidirectional sets size the chunks of kv, the backward kernels and the moments at
  // launch; the causal set keeps chunk-rows rows (its readout's chunks are the keys').
  map.partialChunks = !o.causal;
  map.sharedLimit = o.dynamicShared ? blockSharedLimit(o.chip) : staticSharedLimit(o.chip);
  if (tensorCores)
    map.mmaType = mma;
  map.warpChains = o.warpChains;
  // The causal set's row loops too, since its nests merge (MergeNests.h) and its running
  // maximum runs down the rows in each thread: at the register cap they spill less so than
  // with a nest per row (bf16, d = 32, m = 128: posrf-orf's causal key backward on sm_90a
  // 88 B against 464, TrigRF's on sm_80 48 B against 152), though at d = 64, m = 512 the
  // set's kv spills 16 B and its key backward 32 B where they spilled none.
  map.rowNests = o.rowNests;
  map.mergeNests = o.mergeNests;
  pm.addPass(createSpectraMapTilesToGpu(map));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void mlir::spectra::buildGpuEmulationLowering(OpPassManager &pm) {
  pm.addPass(createSpectraEmulateWarpMma());
  pm.addPass(createSpectraStripWorkgroupMemory());
  pm.addPass(createSpectraExpandBf16());
  pm.addPass(createForallToForLoopPass());
  pm.addPass(createConvertLinalgToLoopsPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  CpuPipelineOptions cpu;
  cpu.selectMaxima = false;  // the GPU's maxima (max.NaN.f32) propagate NaN
  buildCpuStage(pm, cpu, CpuStage::LLVM);
}

void mlir::spectra::buildMappedGpuLowering(OpPassManager &pm, StringRef chip, bool toBinary) {
  pm.addPass(createSpectraLaunchMappedKernels());
  pm.addPass(createGpuLaunchSinkIndexComputationsPass());
  pm.addPass(createGpuKernelOutliningPass());
  pm.addPass(createSpectraDescribeGpuKernels());
  buildGpuLoweringPipeline(pm, chip, toBinary);
}

void mlir::spectra::buildGpuPipeline(OpPassManager &pm, const GpuScheduleOptions &o, GpuStage until) {
  buildGpuMappedPipeline(pm, o);
  if (until != GpuStage::Mapped)
    buildMappedGpuLowering(pm, o.chip, /*toBinary=*/until == GpuStage::PTX);
}

llvm::Expected<std::string> mlir::spectra::gpuArtifact(ModuleOp module, StringRef featureMap,
                                                      const GpuScheduleOptions &options,
                                                      StringRef compilerVersion) {
  auto description = module->getAttrOfType<StringAttr>(kGpuKernelsAttr);
  std::string ptx = extractPtx(module);
  if (ptx.empty() || !description)
    return llvm::createStringError("the GPU lowering produced no PTX or no launch description");
  llvm::Expected<llvm::json::Value> kernels = llvm::json::parse(description.getValue());
  if (!kernels)
    return llvm::createStringError("internal error: the launch description is not JSON: " +
                                   llvm::toString(kernels.takeError()));
  std::string backwardError;
  if (auto errors = module->getAttrOfType<DictionaryAttr>(kBackwardErrorsAttr))
    if (auto why = errors.getAs<StringAttr>(featureMap))
      backwardError = why.str();
  llvm::json::Object artifact{{"version", 3},
                              {"feature_map", featureMap},
                              {"target", options.chip.getValue()},
                              {"dtype", options.dtype.getValue()},
                              {"dv", options.valueDim.getValue()},
                              {"mma", options.mma.getValue()},
                              {"compiler", compilerVersion},
                              {"kernels", std::move(*kernels)},
                              {"ptx", ptx}};
  if (!backwardError.empty())
    artifact.insert({"backward_error", backwardError});
  return llvm::formatv("{0:2}", llvm::json::Value(std::move(artifact))).str();
}

namespace {
/// Options of spectra-gpu-lowering.
struct GpuLoweringOptions : public PassPipelineOptions<GpuLoweringOptions> {
  Option<std::string> chip{*this, "chip", llvm::cl::desc("sm_80 or sm_90a"),
                           llvm::cl::init("sm_90a")};
  Option<bool> binary{*this, "binary",
                      llvm::cl::desc("serialise to PTX (false: stop at the NVVM dialect)"),
                      llvm::cl::init(true)};
};
} // namespace

void mlir::spectra::registerGpuPipelines() {
  PassRegistration<Pass>([] { return createSerializeKernelsToPtxPass(); });
  // Upstream's one-module serialiser, to compare against (test/Codegen/serialize-kernels.test).
  registerGpuModuleToBinaryPass();
  PassPipelineRegistration<GpuScheduleOptions>(
      "spectra-gpu-mapped",
      "spectra IR to the mapped GPU kernels (blocks, thread nests, workgroup tiles): the stage "
      "the emulation and the GPU lowering share",
      [](OpPassManager &pm, const GpuScheduleOptions &o) { buildGpuMappedPipeline(pm, o); });
  PassPipelineRegistration<GpuScheduleOptions>(
      "spectra-gpu-emulated", "spectra IR to the LLVM dialect for the CPU through the mapped GPU kernels",
      [](OpPassManager &pm, const GpuScheduleOptions &o) {
        buildGpuMappedPipeline(pm, o);
        buildGpuEmulationLowering(pm);
      });
  PassPipelineRegistration<>("spectra-gpu-emulation-lowering",
                             "the mapped GPU kernels to the LLVM dialect for the CPU (gpu-emulated)",
                             [](OpPassManager &pm) { buildGpuEmulationLowering(pm); });
  PassPipelineRegistration<GpuScheduleOptions>(
      "spectra-gpu-pipeline",
      "spectra IR to PTX through the mapped GPU kernels (what spectra-compile and the C API run)",
      [](OpPassManager &pm, const GpuScheduleOptions &o) { buildGpuPipeline(pm, o); });
  PassPipelineRegistration<GpuLoweringOptions>(
      "spectra-gpu-lowering",
      "the mapped GPU kernels to PTX: gpu.launch, outlining, the launch description, NVVM and "
      "(binary=true) PTX",
      [](OpPassManager &pm, const GpuLoweringOptions &o) {
        buildMappedGpuLowering(pm, o.chip, o.binary);
      });
}
