//===- ParamsKernels.cpp - the component's params program as kernels ------===//
//
// OPRF's, SADERF's and HCEXP's parameters are a small program over the data statistics (the
// component's `params` region: statistics, dots, splats, options and arith/math on f32 and
// rank-1 tensors of the head's d entries). Two per-slice kernels run it where LibTorch ran it
// op by op (about 400 small tensor ops with autograd per forward+backward at d = 32):
//   <map>_moments_params(qsum [D], qsq [D], ksum [D], ksq [D], counts [2], inscale [1],
//                        params [P], qscale [D], kscale [D])
//       the statistics from the moments (sum and sum of squares per column of the unscaled
//       rows, counts = the kept queries and keys, inscale the input scale s), the program,
//       and what the row kernels read: the scalars, and s times the input scales (s alone
//       where the component has none).
//   <map>_moments_params_backward(qsum, qsq, ksum, ksq, counts, inscale, dparams [P],
//                        dqscale [D], dkscale [D], dqsum [D], dqsq [D], dksum [D], dksq [D])
//       the same program again, then its adjoint (reverse mode): the moments' gradients,
//       which moments_backward adds to dq and dk.
// Built where TileKernelOptions::paramsKernels asks (both pipelines ask): the CPU lowers the
// vectors as they are, the GPU schedule spreads them over a block's threads
// (spectra-map-tiles-to-gpu, vectorsToTiles; docs/kernels-at-the-limit.md, "The params
// program compiled").
// Every rank-1 value is one vector<D x f32> (d is a compile-time constant, and the program is
// straight-line), so the kernels have no loops and no buffers, and their code does not grow
// with d (one unrolled scalar per entry took 1.4 s more of a cold compile at d = 128); each op's
// local derivatives are DerivePartials' forward-mode rules seeded with 1
// (spectra::localPartial), so the two differentiations of a component cannot disagree.
//
//===----------------------------------------------------------------------===//

#include "codegen/TileBuilder.h"
#include "codegen/TileKernels.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/ADT/DenseMap.h"

using namespace mlir;
using namespace mlir::spectra;
using namespace mlir::spectra::tiles;

namespace {

/// The params program on one slice: each f32 value as a scalar, each rank-1 tensor of d
/// entries as one vector<d x f32> (the program is straight-line and d a compile-time
/// constant, so its code does not grow with d).
class ParamsProgram {
public:
  ParamsProgram(OpBuilder &b, Location loc, FeatureMapOp map, ComponentOp component,
                const Dims &s, ValueRange args)
      : b(b), loc(loc), map(map), component(component), D(s.D),
        vt(VectorType::get({s.D}, b.getF32Type())) {
    sum[0] = vload(args[0]);
    sq[0] = vload(args[1]);
    sum[1] = vload(args[2]);
    sq[1] = vload(args[3]);
    count[0] = load(args[4], 0);
    count[1] = load(args[4], 1);
    scale = load(args[5], 0);
    scale2 = mul(scale, scale);
  }

  /// The forward values of every op of the region; failure (with a diagnostic) for an op
  /// the kernels do not lower.
  LogicalResult evaluate() {
    Block &body = component.getParams().front();
    values[body.getArgument(0)] = constant(static_cast<double>(map.getM()));
    values[body.getArgument(1)] = constant(static_cast<double>(map.getD()));
    for (Operation &op : body.without_terminator())
      if (failed(forward(&op)))
        return failure();
    return success();
  }

  ParamsYieldOp yield() {
    ParamsYieldOp y = component.getParamsYield();
    assert(y && "a verified component ends its params region in spectra.params_yield (C2)");
    return y;
  }
  Value value(Value v) { return values.at(v); }
  /// s times an input scale of the program, or s alone where it has none, as a vector.
  Value scaled(Value inputScale) {
    return inputScale ? mul(splat(scale), value(inputScale)) : splat(scale);
  }

  /// Reverse mode from the yield's adjoints (`seed` adds them) to the moments' gradients.
  LogicalResult adjoint(function_ref<void()> seed) {
    seed();
    Block &body = component.getParams().front();
    for (Operation &op : llvm::reverse(body.without_terminator()))
      if (failed(backward(&op)))
        return failure();
    return success();
  }
  void accumulate(Value v, Value g) {
    if (!g)
      return;
    Value &slot = adjoints[v];
    slot = slot ? add(slot, g) : g;
  }
  /// dL/dsum and dL/dsumsq of a side (0 queries, 1 keys) as vectors (0 where nothing reads them).
  Value sumGradient(int side) { return dsum[side] ? dsum[side] : zeros(); }
  Value squareGradient(int side) { return dsq[side] ? dsq[side] : zeros(); }
  Value inputScale() { return scale; }

  Value load(Value memref, int64_t i) {
    return memref::LoadOp::create(b, loc, memref, ValueRange{idx(i)});
  }
  void store(Value v, Value memref, int64_t i) {
    memref::StoreOp::create(b, loc, v, memref, ValueRange{idx(i)});
  }
  Value vload(Value memref) {
    return vector::LoadOp::create(b, loc, vt, memref, ValueRange{idx(0)});
  }
  void vstore(Value v, Value memref) {
    vector::StoreOp::create(b, loc, v, memref, ValueRange{idx(0)});
  }
  Value constant(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(static_cast<float>(v)));
  }
  Value splat(Value scalar) { return vector::BroadcastOp::create(b, loc, vt, scalar); }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }

private:
  Value idx(int64_t i) { return arith::ConstantIndexOp::create(b, loc, i); }
  Value zeros() {
    return arith::ConstantOp::create(b, loc, DenseElementsAttr::get(vt, b.getF32FloatAttr(0)));
  }
  Value zeroLike(Value v) {
    return llvm::isa<VectorType>(v.getType()) ? zeros() : constant(0);
  }
  Value total(Value v) {
    return vector::ReductionOp::create(b, loc, vector::CombiningKind::ADD, v);
  }
  int sideOf(StatisticOp op) { return op.getSide() == Side::keys ? 1 : 0; }
  /// The kernels' type of a program type: a rank-1 tensor as vector<d x element>.
  Type lowered(Type t) {
    if (auto tensor = llvm::dyn_cast<RankedTensorType>(t))
      return VectorType::get({D}, tensor.getElementType());
    return t;
  }

  LogicalResult forward(Operation *op) {
    if (auto st = llvm::dyn_cast<StatisticOp>(op)) {
      int side = sideOf(st);
      Value out;
      switch (st.getKind()) {
      case StatisticKind::mean:
        out = div(mul(sum[side], splat(scale)), splat(count[side]));
        break;
      case StatisticKind::mean_square:
        out = div(mul(sq[side], splat(scale2)), splat(count[side]));
        break;
      case StatisticKind::sum_square:
        out = mul(sq[side], splat(scale2));
        break;
      case StatisticKind::mean_sq_norm:
        out = div(mul(total(sq[side]), scale2), count[side]);
        break;
      case StatisticKind::count:
        out = count[side];
        break;
      }
      values[st.getResult()] = out;
      return success();
    }
    if (auto dot = llvm::dyn_cast<DotOp>(op)) {
      values[dot.getResult()] = total(mul(value(dot.getLhs()), value(dot.getRhs())));
      return success();
    }
    if (auto sp = llvm::dyn_cast<SplatOp>(op)) {
      values[sp.getResult()] = splat(value(sp.getValue()));
      return success();
    }
    if (auto option = llvm::dyn_cast<OptionOp>(op)) {
      double v = option.getDefaultValue().convertToDouble();
      if (std::optional<DictionaryAttr> given = map.getOptions())
        if (auto f = llvm::dyn_cast_or_null<FloatAttr>(given->get(option.getName())))
          v = f.getValueAsDouble();
      values[option.getResult()] = constant(v);
      return success();
    }
    if (auto c = llvm::dyn_cast<arith::ConstantOp>(op)) {
      if (auto f = llvm::dyn_cast<FloatAttr>(c.getValue())) {
        values[c.getResult()] = constant(f.getValueAsDouble());
        return success();
      }
      auto dense = llvm::dyn_cast<DenseFPElementsAttr>(c.getValue());
      if (!dense || !dense.isSplat())
        return op->emitOpError("params kernels: only scalar and splat constants are lowered");
      values[c.getResult()] = arith::ConstantOp::create(
          b, loc,
          DenseElementsAttr::get(vt, b.getF32FloatAttr(
                                         dense.getSplatValue<APFloat>().convertToDouble())));
      return success();
    }
    if (op->getNumResults() != 1 || op->getNumRegions() != 0 ||
        !(op->getDialect()->getNamespace() == "arith" ||
          op->getDialect()->getNamespace() == "math"))
      return op->emitOpError("params kernels: not an elementwise arith or math op");
    // An elementwise op on the operands' lowered values (a scalar condition of a select
    // stays scalar).
    OperationState state(loc, op->getName());
    for (Value operand : op->getOperands())
      state.addOperands(value(operand));
    state.addTypes(lowered(op->getResult(0).getType()));
    state.addAttributes(op->getAttrs());
    Operation *clone = b.create(state);
    values[op->getResult(0)] = clone->getResult(0);
    clones[op] = clone;
    return success();
  }

  LogicalResult backward(Operation *op) {
    if (op->getNumResults() != 1)
      return success();
    Value r = op->getResult(0), g = adjoints.lookup(r);
    if (!g)
      return success();
    if (auto st = llvm::dyn_cast<StatisticOp>(op)) {
      int side = sideOf(st);
      auto into = [&](Value &slot, Value v) { slot = slot ? add(slot, v) : v; };
      switch (st.getKind()) {
      case StatisticKind::mean:
        into(dsum[side], div(mul(g, splat(scale)), splat(count[side])));
        break;
      case StatisticKind::mean_square:
        into(dsq[side], div(mul(g, splat(scale2)), splat(count[side])));
        break;
      case StatisticKind::sum_square:
        into(dsq[side], mul(g, splat(scale2)));
        break;
      case StatisticKind::mean_sq_norm:
        into(dsq[side], splat(div(mul(g, scale2), count[side])));
        break;
      case StatisticKind::count:  // the masks' count: no gradient
        break;
      }
      return success();
    }
    if (auto dot = llvm::dyn_cast<DotOp>(op)) {
      accumulate(dot.getLhs(), mul(splat(g), value(dot.getRhs())));
      accumulate(dot.getRhs(), mul(splat(g), value(dot.getLhs())));
      return success();
    }
    if (auto sp = llvm::dyn_cast<SplatOp>(op)) {
      accumulate(sp.getValue(), total(g));
      return success();
    }
    if (llvm::isa<OptionOp, arith::ConstantOp, arith::CmpFOp>(op))
      return success();
    auto it = clones.find(op);
    if (it == clones.end())
      return op->emitOpError("params kernels: no forward value to differentiate");
    Operation *clone = it->second;
    if (auto select = llvm::dyn_cast<arith::SelectOp>(clone)) {
      Value zero = zeroLike(g);
      Value c = select.getCondition();
      accumulate(op->getOperand(1), arith::SelectOp::create(b, loc, c, g, zero));
      accumulate(op->getOperand(2), arith::SelectOp::create(b, loc, c, zero, g));
      return success();
    }
    for (unsigned i = 0; i < clone->getNumOperands(); ++i) {
      if (!llvm::isa<FloatType>(getElementTypeOrSelf(clone->getOperand(i).getType())))
        continue;
      FailureOr<Value> partial = localPartial(b, loc, clone, i);
      if (failed(partial))
        return op->emitOpError("params kernels: no derivative rule for this op");
      if (*partial)
        accumulate(op->getOperand(i), mul(g, *partial));
    }
    return success();
  }

  OpBuilder &b;
  Location loc;
  FeatureMapOp map;
  ComponentOp component;
  int64_t D;
  VectorType vt;
  Value sum[2], sq[2], dsum[2], dsq[2];
  Value count[2], scale, scale2;
  llvm::DenseMap<Value, Value> values, adjoints;
  llvm::DenseMap<Operation *, Operation *> clones;
};

/// The kernels' arguments up to the program's inputs (both kernels start with them).
SmallVector<Arg> momentArgs(const Types &t, MemRefType counts, MemRefType one) {
  return {{t.scale, "qsum", "slice"}, {t.scale, "qsq", "slice"}, {t.scale, "ksum", "slice"},
          {t.scale, "ksq", "slice"},  {counts, "counts", "slice"}, {one, "inscale", "shared"}};
}

} // namespace

LogicalResult mlir::spectra::tiles::buildParamsKernels(OpBuilder &b, Location loc,
                                                       FeatureMapOp map, ComponentOp component,
                                                       const Dims &s, const Types &t) {
  Type f32 = b.getF32Type();
  auto counts = MemRefType::get({2}, f32), one = MemRefType::get({1}, f32);
  SmallVector<func::FuncOp, 2> built;
  auto fail = [&]() {
    for (func::FuncOp fn : built)
      fn.erase();
    return failure();
  };
  // A kernel of the moments' inputs and `outputs`, with the program evaluated at its entry;
  // `finish` writes its results.
  auto build = [&](StringRef kind, ArrayRef<Arg> outputs,
                   function_ref<LogicalResult(Kernel &, ParamsProgram &, ParamsYieldOp)> finish) {
    SmallVector<Arg> args = momentArgs(t, counts, one);
    args.append(outputs.begin(), outputs.end());
    Kernel k =
        makeKernel(b, loc, (map.getSymName() + "_" + kind).str(), kind, "slices", args, 0, 0);
    built.push_back(k.fn);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(k.entry);
    ParamsProgram p(b, loc, map, component, s, k.entry->getArguments());
    if (failed(p.evaluate()) || failed(finish(k, p, p.yield())))
      return failure();
    func::ReturnOp::create(b, loc);
    return success();
  };
  // The forward kernel.
  LogicalResult forward = build(
      "moments_params",
      {{t.params, "params", "slice"}, {t.scale, "qscale", "slice"}, {t.scale, "kscale", "slice"}},
      [&](Kernel &k, ParamsProgram &p, ParamsYieldOp y) {
        for (auto [i, v] : llvm::enumerate(y.getScalars()))
          p.store(p.value(v), k.arg(6), i);
        if (y.getScalars().empty())
          p.store(p.constant(0), k.arg(6), 0);
        p.vstore(p.scaled(y.getQueryScale()), k.arg(7));
        p.vstore(p.scaled(y.getKeyScale()), k.arg(8));
        return success();
      });
  if (failed(forward))
    return fail();
  // The backward kernel: the program, then its adjoint.
  LogicalResult backward = build(
      "moments_params_backward",
      {{t.params, "dparams", "slice"}, {t.scale, "dqscale", "slice"},
       {t.scale, "dkscale", "slice"}, {t.scale, "dqsum", "slice"}, {t.scale, "dqsq", "slice"},
       {t.scale, "dksum", "slice"}, {t.scale, "dksq", "slice"}},
      [&](Kernel &k, ParamsProgram &p, ParamsYieldOp y) {
        LogicalResult done = p.adjoint([&] {
          for (auto [i, v] : llvm::enumerate(y.getScalars()))
            p.accumulate(v, p.load(k.arg(6), i));
          // qscale = s Psi: dL/dPsi = s dL/dqscale.
          if (Value q = y.getQueryScale())
            p.accumulate(q, p.mul(p.vload(k.arg(7)), p.splat(p.inputScale())));
          if (Value kk = y.getKeyScale())
            p.accumulate(kk, p.mul(p.vload(k.arg(8)), p.splat(p.inputScale())));
        });
        if (failed(done))
          return failure();
        for (int side = 0; side < 2; ++side) {
          p.vstore(p.sumGradient(side), k.arg(9 + 2 * side));
          p.vstore(p.squareGradient(side), k.arg(10 + 2 * side));
        }
        return success();
      });
  if (failed(backward))
    return fail();
  return success();
}
