//===- CpuKernel.cpp - building and lowering the fused CPU forward --------===//

#include "codegen/CpuKernel.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/Passes.h"

#include <limits>

using namespace mlir;
using namespace mlir::spectra;

namespace {

/// Emits the loops; `b` always points where the next op goes.
class KernelBuilder {
public:
  KernelBuilder(OpBuilder &b, Location loc, ComponentOp component)
      : b(b), loc(loc), component(component) {}

  Value f32(double v) { return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(static_cast<float>(v))); }
  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value load(Value memref, ValueRange indices) { return memref::LoadOp::create(b, loc, memref, indices); }
  void store(Value value, Value memref, ValueRange indices) {
    memref::StoreOp::create(b, loc, value, memref, indices);
  }
  Value dim(Value memref, int64_t i) { return memref::DimOp::create(b, loc, memref, i); }

  /// sum_c a[ia, c] * bm[ib, c] over c < n.
  Value dot(Value a, Value ia, Value bm, Value ib, Value n) {
    auto loop = scf::ForOp::create(b, loc, idx(0), n, idx(1), ValueRange{f32(0)});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value c = loop.getInductionVar();
    // Reassociation lets LLVM vectorise the reduction; contraction fuses the multiply-add.
    auto fast = arith::FastMathFlagsAttr::get(b.getContext(),
                                              arith::FastMathFlags::reassoc | arith::FastMathFlags::contract);
    Value prod = arith::MulFOp::create(b, loc, load(a, {ia, c}), load(bm, {ib, c}), fast);
    scf::YieldOp::create(b, loc,
                         ValueRange{arith::AddFOp::create(b, loc, loop.getRegionIterArgs()[0], prod, fast)});
    return loop.getResult(0);
  }

  /// Inlines the features region at the insertion point; returns (logits, coeffs).
  std::pair<SmallVector<Value>, SmallVector<Value>> features(Value wx, Value xx, Value ww,
                                                             ArrayRef<Value> params) {
    Block &body = component.getFeatures().front();
    IRMapping map;
    map.map(body.getArgument(0), wx);
    map.map(body.getArgument(1), xx);
    map.map(body.getArgument(2), ww);
    for (auto [i, p] : llvm::enumerate(params))
      map.map(body.getArgument(3 + i), p);
    for (Operation &op : body.without_terminator())
      b.clone(op, map);
    auto yield = llvm::cast<FeatureYieldOp>(body.getTerminator());
    SmallVector<Value> logits, coeffs;
    for (Value l : yield.getLogits())
      logits.push_back(map.lookupOrDefault(l));
    for (Value c : yield.getCoeffs())
      coeffs.push_back(map.lookupOrDefault(c));
    return {logits, coeffs};
  }

  OpBuilder &b;
  Location loc;
  ComponentOp component;
};

} // namespace

FailureOr<func::FuncOp> mlir::spectra::buildCpuForwardKernel(ModuleOp module, ComponentOp component,
                                                            StringRef name) {
  MLIRContext *ctx = module.getContext();
  ctx->loadDialect<func::FuncDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                   math::MathDialect>();
  OpBuilder b(ctx);
  b.setInsertionPointToEnd(module.getBody());
  Location loc = component.getLoc();
  Type f32 = b.getF32Type();
  int64_t dyn = ShapedType::kDynamic;
  // Rows are contiguous (unit inner stride): the dot products vectorise.
  auto mat = MemRefType::get({dyn, dyn}, f32, StridedLayoutAttr::get(ctx, 0, {dyn, 1}));
  auto vec = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, 0, {1}));
  auto one = MemRefType::get({1}, f32);
  // q, k, v, keep, W, rowscale, params, S, z, out, shift
  SmallVector<Type> args = {mat, mat, mat, vec, mat, vec, vec, mat, vec, mat, one};
  auto fn = func::FuncOp::create(b, loc, name, b.getFunctionType(args, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  KernelBuilder kb(b, loc, component);
  Value q = entry->getArgument(0), k = entry->getArgument(1), v = entry->getArgument(2),
        keep = entry->getArgument(3), W = entry->getArgument(4), rowscale = entry->getArgument(5),
        paramsBuf = entry->getArgument(6), S = entry->getArgument(7), z = entry->getArgument(8),
        out = entry->getArgument(9), shiftBuf = entry->getArgument(10);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value nq = kb.dim(q, 0), nk = kb.dim(k, 0), d = kb.dim(k, 1), dv = kb.dim(v, 1), m = kb.dim(W, 0);
  unsigned numParams = component.getFeatures().front().getNumArguments() - 3;
  unsigned outputs = component.getNumOutputs();
  SmallVector<Value> params;
  for (unsigned i = 0; i < numParams; ++i)
    params.push_back(kb.load(paramsBuf, {kb.idx(i)}));
  Value negInf = kb.f32(-std::numeric_limits<float>::infinity());

  auto squaredNorm = [&](Value x, Value row) { return kb.dot(x, row, x, row, d); };
  // ||w_i||^2 once per feature (a stack buffer of m floats; phi itself is never stored).
  Value wwBuf = memref::AllocaOp::create(b, loc, MemRefType::get({dyn}, f32), ValueRange{m});
  {
    auto rows = scf::ForOp::create(b, loc, c0, m, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(rows.getBody());
    kb.store(squaredNorm(W, rows.getInductionVar()), wwBuf, {rows.getInductionVar()});
  }
  auto rowNorm = [&](Value i) { return kb.load(wwBuf, {i}); };
  auto maxOver = [&](Value acc, ArrayRef<Value> values) {
    for (Value v : values)
      acc = arith::MaximumFOp::create(b, loc, acc, v);
    return acc;
  };
  /// max(init, the largest logit of row `row` of x over all features and outputs).
  auto maxLogit = [&](Value x, Value row, Value init) {
    Value xx = squaredNorm(x, row);
    auto feats = scf::ForOp::create(b, loc, c0, m, c1, ValueRange{init});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(feats.getBody());
    Value i = feats.getInductionVar();
    auto [logits, coeffs] = kb.features(kb.dot(W, i, x, row, d), xx, rowNorm(i), params);
    scf::YieldOp::create(b, loc, ValueRange{maxOver(feats.getRegionIterArgs()[0], logits)});
    return feats.getResult(0);
  };

  // 1. The key stabiliser: the max logit over kept keys, features and outputs.
  Value keyShift;
  {
    auto keys = scf::ForOp::create(b, loc, c0, nk, c1, ValueRange{negInf});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(keys.getBody());
    Value j = keys.getInductionVar();
    Value rowMax = maxLogit(k, j, keys.getRegionIterArgs()[0]);
    Value kept = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, kb.load(keep, {j}), kb.f32(0));
    Value next = arith::SelectOp::create(b, loc, kept, rowMax, keys.getRegionIterArgs()[0]);
    scf::YieldOp::create(b, loc, ValueRange{next});
    b.setInsertionPointAfter(keys);
    Value finite = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, keys.getResult(0), negInf);
    keyShift = arith::SelectOp::create(b, loc, finite, keys.getResult(0), kb.f32(0));
  }
  kb.store(keyShift, shiftBuf, {c0});

  // 2. Zero S and z, then accumulate over kept keys: phi(k_j) lives in registers only.
  Value numFeatures = arith::MulIOp::create(b, loc, m, kb.idx(outputs));
  {
    auto rows = scf::ForOp::create(b, loc, c0, numFeatures, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(rows.getBody());
    Value f = rows.getInductionVar();
    kb.store(kb.f32(0), z, {f});
    auto cols = scf::ForOp::create(b, loc, c0, dv, c1);
    b.setInsertionPointToStart(cols.getBody());
    kb.store(kb.f32(0), S, {f, cols.getInductionVar()});
  }
  {
    auto keys = scf::ForOp::create(b, loc, c0, nk, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(keys.getBody());
    Value j = keys.getInductionVar();
    Value kept = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, kb.load(keep, {j}), kb.f32(0));
    auto ifKept = scf::IfOp::create(b, loc, kept, /*withElseRegion=*/false);
    b.setInsertionPointToStart(&ifKept.getThenRegion().front());
    Value xx = squaredNorm(k, j);
    auto feats = scf::ForOp::create(b, loc, c0, m, c1);
    b.setInsertionPointToStart(feats.getBody());
    Value i = feats.getInductionVar();
    Value wx = kb.dot(W, i, k, j, d), ww = rowNorm(i);
    auto [logits, coeffs] = kb.features(wx, xx, ww, params);
    Value scale = kb.load(rowscale, {i});
    for (unsigned o = 0; o < outputs; ++o) {
      Value e = math::ExpOp::create(b, loc, arith::SubFOp::create(b, loc, logits[o], keyShift));
      Value phi = arith::MulFOp::create(b, loc, arith::MulFOp::create(b, loc, coeffs[o], e), scale);
      Value f = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i);
      kb.store(arith::AddFOp::create(b, loc, kb.load(z, {f}), phi), z, {f});
      auto cols = scf::ForOp::create(b, loc, c0, dv, c1);
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToStart(cols.getBody());
      Value c = cols.getInductionVar();
      Value contribution = arith::MulFOp::create(b, loc, phi, kb.load(v, {j, c}));
      kb.store(arith::AddFOp::create(b, loc, kb.load(S, {f, c}), contribution), S, {f, c});
    }
  }

  // 3. Readout: per query, its own constant (two passes over the features).
  {
    auto queries = scf::ForOp::create(b, loc, c0, nq, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(queries.getBody());
    Value n = queries.getInductionVar();
    Value xx = squaredNorm(q, n);
    Value queryShift = maxLogit(q, n, negInf);
    {
      auto cols = scf::ForOp::create(b, loc, c0, dv, c1);
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToStart(cols.getBody());
      kb.store(kb.f32(0), out, {n, cols.getInductionVar()});
    }
    auto pass2 = scf::ForOp::create(b, loc, c0, m, c1, ValueRange{kb.f32(0)});
    {
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPointToStart(pass2.getBody());
      Value i = pass2.getInductionVar();
      Value wx = kb.dot(W, i, q, n, d), ww = rowNorm(i);
      auto [logits, coeffs] = kb.features(wx, xx, ww, params);
      Value den = pass2.getRegionIterArgs()[0];
      for (unsigned o = 0; o < outputs; ++o) {
        Value e = math::ExpOp::create(b, loc, arith::SubFOp::create(b, loc, logits[o], queryShift));
        Value phi = arith::MulFOp::create(b, loc, coeffs[o], e);
        Value f = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i);
        den = arith::AddFOp::create(b, loc, den, arith::MulFOp::create(b, loc, phi, kb.load(z, {f})));
        auto cols = scf::ForOp::create(b, loc, c0, dv, c1);
        OpBuilder::InsertionGuard innermost(b);
        b.setInsertionPointToStart(cols.getBody());
        Value c = cols.getInductionVar();
        Value add = arith::MulFOp::create(b, loc, phi, kb.load(S, {f, c}));
        kb.store(arith::AddFOp::create(b, loc, kb.load(out, {n, c}), add), out, {n, c});
      }
      scf::YieldOp::create(b, loc, ValueRange{den});
    }
    Value den = pass2.getResult(0);
    auto cols = scf::ForOp::create(b, loc, c0, dv, c1);
    b.setInsertionPointToStart(cols.getBody());
    Value c = cols.getInductionVar();
    kb.store(arith::DivFOp::create(b, loc, kb.load(out, {n, c}), den), out, {n, c});
  }
  func::ReturnOp::create(b, loc);
  return fn;
}

void mlir::spectra::registerCpuLoweringDialects(DialectRegistry &registry) {
  registry.insert<func::FuncDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                  math::MathDialect, cf::ControlFlowDialect, LLVM::LLVMDialect,
                  index::IndexDialect, ub::UBDialect>();
  arith::registerConvertArithToLLVMInterface(registry);
  cf::registerConvertControlFlowToLLVMInterface(registry);
  registerConvertFuncToLLVMInterface(registry);
  index::registerConvertIndexToLLVMInterface(registry);
  registerConvertMathToLLVMInterface(registry);
  registerConvertMemRefToLLVMInterface(registry);
  ub::registerConvertUBToLLVMInterface(registry);
}

void mlir::spectra::buildCpuLoweringPipeline(OpPassManager &pm) {
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createSCFToControlFlowPass());
  // Ops without an LLVM intrinsic (tanh, log1p, ...) become libm calls.
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createConvertToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}
