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
// Every rank-1 value is held as D scalars (d is a compile-time constant, and the program is
// straight-line), so the kernels are scalar code with no loops and no buffers; each op's
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
#include "llvm/ADT/DenseMap.h"

using namespace mlir;
using namespace mlir::spectra;
using namespace mlir::spectra::tiles;

namespace {

/// The params program on scalars: each value as its lanes (1 for f32, D for a rank-1 tensor).
class ParamsProgram {
public:
  ParamsProgram(OpBuilder &b, Location loc, FeatureMapOp map, ComponentOp component,
                const Dims &s, ValueRange args)
      : b(b), loc(loc), map(map), component(component), D(s.D) {
    Value sumq = args[0], sqq = args[1], sumk = args[2], sqk = args[3], counts = args[4];
    for (int64_t j = 0; j < D; ++j) {
      sum[0].push_back(load(sumq, j));
      sq[0].push_back(load(sqq, j));
      sum[1].push_back(load(sumk, j));
      sq[1].push_back(load(sqk, j));
    }
    count[0] = load(counts, 0);
    count[1] = load(counts, 1);
    scale = load(args[5], 0);
    scale2 = mul(scale, scale);
  }

  /// The forward values of every op of the region; failure (with a diagnostic) for an op
  /// or value the kernels do not lower.
  LogicalResult evaluate() {
    Block &body = component.getParams().front();
    values[body.getArgument(0)] = {constant(static_cast<double>(map.getM()))};
    values[body.getArgument(1)] = {constant(static_cast<double>(map.getD()))};
    for (Operation &op : body.without_terminator())
      if (failed(forward(&op)))
        return failure();
    return success();
  }

  /// The yield's values: the scalars, then s times the input scales (s where there are none).
  ParamsYieldOp yield() {
    return llvm::cast<ParamsYieldOp>(component.getParams().front().getTerminator());
  }
  Value lane(Value v, int64_t j) {
    const SmallVector<Value> &l = values.at(v);
    return l.size() == 1 ? l[0] : l[j];
  }
  Value scaled(Value inputScale, int64_t j) {
    return inputScale ? mul(scale, lane(inputScale, j)) : scale;
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
  void accumulate(Value v, int64_t j, Value g) {
    if (!g)
      return;
    SmallVector<Value> &a = adjoints[v];
    if (a.empty())
      a.resize(values.at(v).size());
    Value &slot = a[a.size() == 1 ? 0 : j];
    slot = slot ? add(slot, g) : g;
  }
  /// dL/dsum and dL/dsumsq of a side (0 queries, 1 keys), column j (0 where nothing reads it).
  Value sumGradient(int side, int64_t j) { return orZero(dsum[side], j); }
  Value squareGradient(int side, int64_t j) { return orZero(dsq[side], j); }
  Value inputScale() { return scale; }

  Value load(Value memref, int64_t i) {
    return memref::LoadOp::create(b, loc, memref, ValueRange{idx(i)});
  }
  void store(Value v, Value memref, int64_t i) {
    memref::StoreOp::create(b, loc, v, memref, ValueRange{idx(i)});
  }
  Value constant(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(static_cast<float>(v)));
  }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }

private:
  Value orZero(ArrayRef<Value> slots, int64_t j) {
    return j < static_cast<int64_t>(slots.size()) && slots[j] ? slots[j] : constant(0);
  }
  Value idx(int64_t i) { return arith::ConstantIndexOp::create(b, loc, i); }
  int sideOf(StatisticOp op) { return op.getSide() == Side::keys ? 1 : 0; }
  int64_t lanesOf(Type t) { return llvm::isa<RankedTensorType>(t) ? D : 1; }

  LogicalResult forward(Operation *op) {
    if (auto st = llvm::dyn_cast<StatisticOp>(op)) {
      int side = sideOf(st);
      SmallVector<Value> out;
      switch (st.getKind()) {
      case StatisticKind::mean:
        for (int64_t j = 0; j < D; ++j)
          out.push_back(div(mul(sum[side][j], scale), count[side]));
        break;
      case StatisticKind::mean_square:
        for (int64_t j = 0; j < D; ++j)
          out.push_back(div(mul(sq[side][j], scale2), count[side]));
        break;
      case StatisticKind::sum_square:
        for (int64_t j = 0; j < D; ++j)
          out.push_back(mul(sq[side][j], scale2));
        break;
      case StatisticKind::mean_sq_norm: {
        Value total = sq[side][0];
        for (int64_t j = 1; j < D; ++j)
          total = add(total, sq[side][j]);
        out.push_back(div(mul(total, scale2), count[side]));
        break;
      }
      case StatisticKind::count:
        out.push_back(count[side]);
        break;
      }
      values[st.getResult()] = out;
      return success();
    }
    if (auto dot = llvm::dyn_cast<DotOp>(op)) {
      Value total = mul(lane(dot.getLhs(), 0), lane(dot.getRhs(), 0));
      for (int64_t j = 1; j < D; ++j)
        total = add(total, mul(lane(dot.getLhs(), j), lane(dot.getRhs(), j)));
      values[dot.getResult()] = {total};
      return success();
    }
    if (auto splat = llvm::dyn_cast<SplatOp>(op)) {
      values[splat.getResult()] = SmallVector<Value>(D, lane(splat.getValue(), 0));
      return success();
    }
    if (auto option = llvm::dyn_cast<OptionOp>(op)) {
      double v = option.getDefaultValue().convertToDouble();
      if (std::optional<DictionaryAttr> given = map.getOptions())
        if (auto f = llvm::dyn_cast_or_null<FloatAttr>(given->get(option.getName())))
          v = f.getValueAsDouble();
      values[option.getResult()] = {constant(v)};
      return success();
    }
    if (auto c = llvm::dyn_cast<arith::ConstantOp>(op)) {
      if (auto f = llvm::dyn_cast<FloatAttr>(c.getValue())) {
        values[c.getResult()] = {constant(f.getValueAsDouble())};
        return success();
      }
      auto dense = llvm::dyn_cast<DenseFPElementsAttr>(c.getValue());
      if (!dense || !dense.isSplat())
        return op->emitOpError("params kernels: only scalar and splat constants are lowered");
      values[c.getResult()] =
          SmallVector<Value>(D, constant(dense.getSplatValue<APFloat>().convertToDouble()));
      return success();
    }
    if (op->getNumResults() != 1 || op->getNumRegions() != 0 ||
        !(op->getDialect()->getNamespace() == "arith" ||
          op->getDialect()->getNamespace() == "math"))
      return op->emitOpError("params kernels: not an elementwise arith or math op");
    // An elementwise op: one clone per lane, on the operands' lanes.
    Type resultType = op->getResult(0).getType();
    int64_t n = lanesOf(resultType);
    SmallVector<Value> out;
    SmallVector<Operation *> perLane;
    for (int64_t j = 0; j < n; ++j) {
      OperationState state(loc, op->getName());
      for (Value operand : op->getOperands())
        state.addOperands(lane(operand, j));
      state.addTypes(getElementTypeOrSelf(resultType));
      state.addAttributes(op->getAttrs());
      Operation *clone = b.create(state);
      out.push_back(clone->getResult(0));
      perLane.push_back(clone);
    }
    values[op->getResult(0)] = out;
    clones[op] = perLane;
    return success();
  }

  Value adjointOf(Value v, int64_t j) {
    auto it = adjoints.find(v);
    if (it == adjoints.end())
      return Value();
    return it->second.size() == 1 ? it->second[0] : it->second[j];
  }

  LogicalResult backward(Operation *op) {
    if (op->getNumResults() != 1 || !adjoints.count(op->getResult(0)))
      return success();
    Value r = op->getResult(0);
    if (auto st = llvm::dyn_cast<StatisticOp>(op)) {
      int side = sideOf(st);
      auto into = [&](SmallVector<Value> &slots, int64_t j, Value g) {
        if (g)
          slots[j] = slots[j] ? add(slots[j], g) : g;
      };
      for (SmallVector<Value> *slots : {&dsum[side], &dsq[side]})
        if (slots->empty())
          slots->resize(D);
      switch (st.getKind()) {
      case StatisticKind::mean:
        for (int64_t j = 0; j < D; ++j)
          if (Value g = adjointOf(r, j))
            into(dsum[side], j, div(mul(g, scale), count[side]));
        break;
      case StatisticKind::mean_square:
        for (int64_t j = 0; j < D; ++j)
          if (Value g = adjointOf(r, j))
            into(dsq[side], j, div(mul(g, scale2), count[side]));
        break;
      case StatisticKind::sum_square:
        for (int64_t j = 0; j < D; ++j)
          if (Value g = adjointOf(r, j))
            into(dsq[side], j, mul(g, scale2));
        break;
      case StatisticKind::mean_sq_norm:
        if (Value g = adjointOf(r, 0)) {
          Value each = div(mul(g, scale2), count[side]);
          for (int64_t j = 0; j < D; ++j)
            into(dsq[side], j, each);
        }
        break;
      case StatisticKind::count:  // the masks' count: no gradient
        break;
      }
      return success();
    }
    if (auto dot = llvm::dyn_cast<DotOp>(op)) {
      Value g = adjointOf(r, 0);
      for (int64_t j = 0; j < D; ++j) {
        accumulate(dot.getLhs(), j, mul(g, lane(dot.getRhs(), j)));
        accumulate(dot.getRhs(), j, mul(g, lane(dot.getLhs(), j)));
      }
      return success();
    }
    if (auto splat = llvm::dyn_cast<SplatOp>(op)) {
      Value total;
      for (int64_t j = 0; j < D; ++j)
        if (Value g = adjointOf(r, j))
          total = total ? add(total, g) : g;
      accumulate(splat.getValue(), 0, total);
      return success();
    }
    if (llvm::isa<OptionOp, arith::ConstantOp, arith::CmpFOp>(op))
      return success();
    auto it = clones.find(op);
    if (it == clones.end())
      return op->emitOpError("params kernels: no forward lanes to differentiate");
    for (auto [j, clone] : llvm::enumerate(it->second)) {
      Value g = adjointOf(r, j);
      if (!g)
        continue;
      if (auto select = llvm::dyn_cast<arith::SelectOp>(clone)) {
        Value zero = constant(0);
        accumulate(op->getOperand(1), j,
                   arith::SelectOp::create(b, loc, select.getCondition(), g, zero));
        accumulate(op->getOperand(2), j,
                   arith::SelectOp::create(b, loc, select.getCondition(), zero, g));
        continue;
      }
      for (unsigned i = 0; i < clone->getNumOperands(); ++i) {
        if (!llvm::isa<FloatType>(clone->getOperand(i).getType()))
          continue;
        FailureOr<Value> partial = localPartial(b, loc, clone, i);
        if (failed(partial))
          return op->emitOpError("params kernels: no derivative rule for this op");
        if (*partial)
          accumulate(op->getOperand(i), j, mul(g, *partial));
      }
    }
    return success();
  }

  OpBuilder &b;
  Location loc;
  FeatureMapOp map;
  ComponentOp component;
  int64_t D;
  SmallVector<Value> sum[2], sq[2], dsum[2], dsq[2];
  Value count[2], scale, scale2;
  llvm::DenseMap<Value, SmallVector<Value>> values, adjoints;
  llvm::DenseMap<Operation *, SmallVector<Operation *>> clones;
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
  // The forward kernel.
  {
    SmallVector<Arg> args = momentArgs(t, counts, one);
    args.append({{t.params, "params", "slice"}, {t.scale, "qscale", "slice"},
                 {t.scale, "kscale", "slice"}});
    Kernel k = makeKernel(b, loc, (map.getSymName() + "_moments_params").str(), "moments_params",
                          "slices", args, 0, 0);
    built.push_back(k.fn);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(k.entry);
    ParamsProgram p(b, loc, map, component, s, k.entry->getArguments());
    if (failed(p.evaluate()))
      return fail();
    ParamsYieldOp y = p.yield();
    for (auto [i, v] : llvm::enumerate(y.getScalars()))
      p.store(p.lane(v, 0), k.arg(6), i);
    if (y.getScalars().empty())
      p.store(p.constant(0), k.arg(6), 0);
    for (int64_t j = 0; j < s.D; ++j) {
      p.store(p.scaled(y.getQueryScale(), j), k.arg(7), j);
      p.store(p.scaled(y.getKeyScale(), j), k.arg(8), j);
    }
    func::ReturnOp::create(b, loc);
  }
  // The backward kernel: the program, then its adjoint.
  {
    SmallVector<Arg> args = momentArgs(t, counts, one);
    args.append({{t.params, "dparams", "slice"}, {t.scale, "dqscale", "slice"},
                 {t.scale, "dkscale", "slice"}, {t.scale, "dqsum", "slice"},
                 {t.scale, "dqsq", "slice"}, {t.scale, "dksum", "slice"},
                 {t.scale, "dksq", "slice"}});
    Kernel k = makeKernel(b, loc, (map.getSymName() + "_moments_params_backward").str(),
                          "moments_params_backward", "slices", args, 0, 0);
    built.push_back(k.fn);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(k.entry);
    ParamsProgram p(b, loc, map, component, s, k.entry->getArguments());
    if (failed(p.evaluate()))
      return fail();
    ParamsYieldOp y = p.yield();
    LogicalResult done = p.adjoint([&] {
      for (auto [i, v] : llvm::enumerate(y.getScalars()))
        p.accumulate(v, 0, p.load(k.arg(6), i));
      // qscale = s Psi: dL/dPsi_j = s dL/dqscale_j.
      for (int64_t j = 0; j < s.D; ++j) {
        if (Value q = y.getQueryScale())
          p.accumulate(q, j, p.mul(p.load(k.arg(7), j), p.inputScale()));
        if (Value kk = y.getKeyScale())
          p.accumulate(kk, j, p.mul(p.load(k.arg(8), j), p.inputScale()));
      }
    });
    if (failed(done))
      return fail();
    for (int64_t j = 0; j < s.D; ++j) {
      p.store(p.sumGradient(0, j), k.arg(9), j);
      p.store(p.squareGradient(0, j), k.arg(10), j);
      p.store(p.sumGradient(1, j), k.arg(11), j);
      p.store(p.squareGradient(1, j), k.arg(12), j);
    }
    func::ReturnOp::create(b, loc);
  }
  return success();
}
