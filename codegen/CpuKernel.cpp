//===- CpuKernel.cpp - building and lowering the fused CPU forward --------===//

#include "codegen/CpuKernel.h"
#include "codegen/KernelBuilder.h"
#include "passes/Passes.h"

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
#include "mlir/IR/SymbolTable.h"
#include "mlir/Transforms/Passes.h"

#include <limits>

using namespace mlir;
using namespace mlir::spectra;


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

//===----------------------------------------------------------------------===//
// The backward kernel
//===----------------------------------------------------------------------===//

FailureOr<func::FuncOp> mlir::spectra::buildCpuBackwardKernel(ModuleOp module, ComponentOp component,
                                                             StringRef name) {
  MLIRContext *ctx = module.getContext();
  ctx->loadDialect<func::FuncDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                   math::MathDialect>();
  // The derivatives come from the compiler, never from a hand-written rule.
  FailureOr<FeaturePartialsOp> derived = lookupOrDerivePartials(component);
  if (failed(derived))
    return failure();
  FeaturePartialsOp partials = *derived;

  OpBuilder b(ctx);
  b.setInsertionPointToEnd(module.getBody());
  Location loc = component.getLoc();
  Type f32 = b.getF32Type();
  int64_t dyn = ShapedType::kDynamic;
  auto mat = MemRefType::get({dyn, dyn}, f32, StridedLayoutAttr::get(ctx, 0, {dyn, 1}));
  auto vec = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, 0, {1}));
  auto one = MemRefType::get({1}, f32);
  // q, k, v, keep, W, rowscale, params, S, z, out, shift, gout | dq, dk, dv, dW, dparams, dS, dz
  SmallVector<Type> args = {mat, mat, mat, vec, mat, vec, vec, mat, vec, mat, one, mat,
                            mat, mat, mat, mat, vec, mat, vec};
  auto fn = func::FuncOp::create(b, loc, name, b.getFunctionType(args, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  KernelBuilder kb(b, loc, component);
  auto arg = [&](unsigned i) { return entry->getArgument(i); };
  Value q = arg(0), k = arg(1), v = arg(2), keep = arg(3), W = arg(4), rowscale = arg(5),
        paramsBuf = arg(6), S = arg(7), z = arg(8), out = arg(9), shiftBuf = arg(10), gout = arg(11),
        dq = arg(12), dk = arg(13), dvOut = arg(14), dW = arg(15), dparams = arg(16), dS = arg(17),
        dz = arg(18);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value nq = kb.dim(q, 0), nk = kb.dim(k, 0), d = kb.dim(k, 1), dv = kb.dim(v, 1), m = kb.dim(W, 0);
  unsigned numParams = component.getFeatures().front().getNumArguments() - 3;
  unsigned numArgs = 3 + numParams, outputs = component.getNumOutputs();
  SmallVector<Value> params;
  for (unsigned i = 0; i < numParams; ++i)
    params.push_back(kb.load(paramsBuf, {kb.idx(i)}));
  Value numFeatures = arith::MulIOp::create(b, loc, m, kb.idx(outputs));
  Value negInf = kb.f32(-std::numeric_limits<float>::infinity());
  Value two = kb.f32(2);

  auto forRange = [&](Value n, function_ref<void(Value)> body) {
    auto loop = scf::ForOp::create(b, loc, c0, n, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    body(loop.getInductionVar());
  };
  auto add = [&](Value x, Value y) { return kb.add(x, y); };
  auto mul = [&](Value x, Value y) { return kb.mul(x, y); };
  auto sub = [&](Value x, Value y) { return kb.sub(x, y); };
  auto accumulate = [&](Value mem, ValueRange idx, Value delta) {
    kb.store(add(kb.load(mem, idx), delta), mem, idx);
  };
  auto squaredNorm = [&](Value x, Value row) { return kb.dot(x, row, x, row, d); };

  // Zero the outputs and the scratch.
  auto zero2 = [&](Value mem, Value rows, Value cols) {
    forRange(rows, [&](Value r) { forRange(cols, [&](Value c) { kb.store(kb.f32(0), mem, {r, c}); }); });
  };
  zero2(dq, nq, d);
  zero2(dk, nk, d);
  zero2(dvOut, nk, dv);
  zero2(dW, m, d);
  zero2(dS, numFeatures, dv);
  forRange(numFeatures, [&](Value f) { kb.store(kb.f32(0), dz, {f}); });
  for (unsigned p = 0; p < numParams; ++p)
    kb.store(kb.f32(0), dparams, {kb.idx(p)});

  Value wwBuf = memref::AllocaOp::create(b, loc, MemRefType::get({dyn}, f32), ValueRange{m});
  forRange(m, [&](Value i) { kb.store(squaredNorm(W, i), wwBuf, {i}); });

  /// For feature i of row `row` of x: per output o, the (shifted, scaled) phi,
  /// e = exp(logit - shift) * scale, and d phi / d arg v = phi dl/dv + e dc/dv.
  struct FeatureGrad {
    Value phi;
    SmallVector<Value> dphi;  // per argument v
  };
  auto featureGrads = [&](Value x, Value row, Value xx, Value i, Value shift, Value scale) {
    Value wx = kb.dot(W, i, x, row, d), ww = kb.load(wwBuf, {i});
    auto [logits, coeffs] = kb.features(wx, xx, ww, params);
    SmallVector<Value> pv = kb.partials(partials, wx, xx, ww, params);
    SmallVector<FeatureGrad> grads;
    for (unsigned o = 0; o < outputs; ++o) {
      Value e = math::ExpOp::create(b, loc, sub(logits[o], shift));
      if (scale)
        e = mul(e, scale);
      FeatureGrad g{mul(coeffs[o], e), {}};
      for (unsigned a = 0; a < numArgs; ++a)
        g.dphi.push_back(add(mul(g.phi, pv[2 * (o * numArgs + a)]), mul(e, pv[2 * (o * numArgs + a) + 1])));
      grads.push_back(g);
    }
    return grads;
  };

  /// Chains dL/dphi (`a`) into dx (row `row` of dx), dW and dparams.
  auto chain = [&](const FeatureGrad &g, Value a, Value x, Value row, Value dx, Value i) {
    Value dwx = mul(a, g.dphi[0]), dxx2 = mul(mul(a, g.dphi[1]), two), dww2 = mul(mul(a, g.dphi[2]), two);
    forRange(d, [&](Value c) {
      Value xc = kb.load(x, {row, c}), wc = kb.load(W, {i, c});
      accumulate(dx, {row, c}, add(mul(dwx, wc), mul(dxx2, xc)));
      accumulate(dW, {i, c}, add(mul(dwx, xc), mul(dww2, wc)));
    });
    for (unsigned p = 0; p < numParams; ++p)
      accumulate(dparams, {kb.idx(p)}, mul(a, g.dphi[3 + p]));
  };

  // Pass A, queries: dL/dphi(q), dS, dz, and the query-side dq, dW, dparams.
  forRange(nq, [&](Value n) {
    Value xx = squaredNorm(q, n);
    // The per-query constant, as in the forward (it cancels; any constant would do).
    auto pass1 = scf::ForOp::create(b, loc, c0, m, c1, ValueRange{negInf});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(pass1.getBody());
      Value i = pass1.getInductionVar();
      auto [logits, coeffs] = kb.features(kb.dot(W, i, q, n, d), xx, kb.load(wwBuf, {i}), params);
      Value acc = pass1.getRegionIterArgs()[0];
      for (Value l : logits)
        acc = arith::MaximumFOp::create(b, loc, acc, l);
      scf::YieldOp::create(b, loc, ValueRange{acc});
    }
    Value shift = pass1.getResult(0);
    auto denLoop = scf::ForOp::create(b, loc, c0, m, c1, ValueRange{kb.f32(0)});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(denLoop.getBody());
      Value i = denLoop.getInductionVar();
      auto [logits, coeffs] = kb.features(kb.dot(W, i, q, n, d), xx, kb.load(wwBuf, {i}), params);
      Value acc = denLoop.getRegionIterArgs()[0];
      for (unsigned o = 0; o < outputs; ++o) {
        Value phi = mul(coeffs[o], math::ExpOp::create(b, loc, sub(logits[o], shift)));
        Value f = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i);
        acc = add(acc, mul(phi, kb.load(z, {f})));
      }
      scf::YieldOp::create(b, loc, ValueRange{acc});
    }
    Value rden = arith::DivFOp::create(b, loc, kb.f32(1), denLoop.getResult(0));
    Value gdot = kb.dot(gout, n, out, n, dv);
    forRange(m, [&](Value i) {
      SmallVector<FeatureGrad> grads = featureGrads(q, n, xx, i, shift, Value());
      for (unsigned o = 0; o < outputs; ++o) {
        Value f = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i);
        Value gS = kb.dot(gout, n, S, f, dv);
        Value a = mul(sub(gS, mul(gdot, kb.load(z, {f}))), rden);
        Value scaled = mul(grads[o].phi, rden);
        forRange(dv, [&](Value c) { accumulate(dS, {f, c}, mul(scaled, kb.load(gout, {n, c}))); });
        accumulate(dz, {f}, arith::NegFOp::create(b, loc, mul(scaled, gdot)));
        chain(grads[o], a, q, n, dq, i);
      }
    });
  });

  // Pass B, kept keys: dv and the key-side dk, dW, dparams.
  Value keyShift = kb.load(shiftBuf, {c0});
  forRange(nk, [&](Value j) {
    Value kept = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, kb.load(keep, {j}), kb.f32(0));
    auto ifKept = scf::IfOp::create(b, loc, kept, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&ifKept.getThenRegion().front());
    Value xx = squaredNorm(k, j);
    forRange(m, [&](Value i) {
      SmallVector<FeatureGrad> grads = featureGrads(k, j, xx, i, keyShift, kb.load(rowscale, {i}));
      for (unsigned o = 0; o < outputs; ++o) {
        Value f = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i);
        Value bval = add(kb.dot(dS, f, v, j, dv), kb.load(dz, {f}));
        Value phi = grads[o].phi;
        forRange(dv, [&](Value c) { accumulate(dvOut, {j, c}, mul(phi, kb.load(dS, {f, c}))); });
        chain(grads[o], bval, k, j, dk, i);
      }
    });
  });
  func::ReturnOp::create(b, loc);
  return fn;
}

FailureOr<FeaturePartialsOp> mlir::spectra::lookupOrDerivePartials(ComponentOp component) {
  if (auto existing = SymbolTable::lookupNearestSymbolFrom<FeaturePartialsOp>(
          component, StringAttr::get(component.getContext(), component.getSymName() + "_partials")))
    return existing;
  return derivePartials(component);
}
