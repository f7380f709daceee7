//===- CpuKernel.cpp - building and lowering the fused CPU forward --------===//

#include "codegen/CpuKernel.h"
#include "codegen/KernelBuilder.h"
#include "codegen/spectra_compiler.h"
#include "codegen/Passes.h"
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
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

#include <limits>

using namespace mlir;
using namespace mlir::spectra;


/// Adds a kernel function (C interface) whose arguments are f32 memrefs given
/// by letters: M a matrix [?, ?] with contiguous rows (unit inner stride, so
/// dot products vectorise), V a vector [?], O a single value [1].
static func::FuncOp createKernelFunction(OpBuilder &b, Location loc, StringRef name,
                                         StringRef signature) {
  MLIRContext *ctx = b.getContext();
  Type f32 = b.getF32Type();
  int64_t dyn = ShapedType::kDynamic;
  auto mat = MemRefType::get({dyn, dyn}, f32, StridedLayoutAttr::get(ctx, 0, {dyn, 1}));
  auto vec = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, 0, {1}));
  auto one = MemRefType::get({1}, f32);
  SmallVector<Type> args;
  for (char c : signature)
    args.push_back(c == 'M' ? Type(mat) : c == 'V' ? Type(vec) : Type(one));
  auto fn = func::FuncOp::create(b, loc, name, b.getFunctionType(args, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  return fn;
}

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
  // q, k, v, keep, W, rowscale, params, S, z, zabs, out, shift, qstat
  func::FuncOp fn = createKernelFunction(b, loc, name, "MMMVMVVMVVMVM");
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  KernelBuilder kb(b, loc, component);
  Value q = entry->getArgument(0), k = entry->getArgument(1), v = entry->getArgument(2),
        keep = entry->getArgument(3), W = entry->getArgument(4), rowscale = entry->getArgument(5),
        paramsBuf = entry->getArgument(6), S = entry->getArgument(7), z = entry->getArgument(8),
        zabs = entry->getArgument(9), out = entry->getArgument(10), shift = entry->getArgument(11),
        qstat = entry->getArgument(12);
  Value c0 = kb.idx(0), c1 = kb.idx(1), c2 = kb.idx(2);
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
  auto forRange = [&](Value n, function_ref<void(Value)> body) {
    auto loop = scf::ForOp::create(b, loc, c0, n, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    body(loop.getInductionVar());
  };
  auto featureIndex = [&](unsigned o, Value i) {
    return arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i).getResult();
  };
  auto absf = [&](Value x) { return math::AbsFOp::create(b, loc, x).getResult(); };

  // 1. Zero S, z, zabs and the key constants (-inf), then one pass over kept keys:
  //    phi(k_j) lives in registers only. Feature f's S row, z_f and zabs_f are relative
  //    to its own running constant c_f (the largest logit of feature f so far), rescaled
  //    when it rises, so at the end c_f = max over kept keys: S_f and z_f hold a term
  //    exp(0) each and nothing underflows to 0/0 (the stabiliser contract, Reference.h).
  Value numFeatures = arith::MulIOp::create(b, loc, m, kb.idx(outputs));
  forRange(numFeatures, [&](Value f) {
    kb.store(kb.f32(0), z, {f});
    kb.store(kb.f32(0), zabs, {f});
    kb.store(negInf, shift, {f});
    forRange(dv, [&](Value c) { kb.store(kb.f32(0), S, {f, c}); });
  });
  forRange(nk, [&](Value j) {
    Value kept = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, kb.load(keep, {j}), kb.f32(0));
    auto ifKept = scf::IfOp::create(b, loc, kept, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard inner(b);
    b.setInsertionPointToStart(&ifKept.getThenRegion().front());
    Value xx = squaredNorm(k, j);
    forRange(m, [&](Value i) {
      auto [logits, coeffs] = kb.features(kb.dot(W, i, k, j, d), xx, rowNorm(i), params);
      Value scale = kb.load(rowscale, {i});
      for (unsigned o = 0; o < outputs; ++o) {
        Value f = featureIndex(o, i), l = logits[o], M = kb.load(shift, {f});
        Value above = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, l, M);
        auto raise = scf::IfOp::create(b, loc, above, /*withElseRegion=*/false);
        {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(&raise.getThenRegion().front());
          Value r = math::ExpOp::create(b, loc, kb.sub(M, l));
          kb.store(kb.mul(kb.load(z, {f}), r), z, {f});
          kb.store(kb.mul(kb.load(zabs, {f}), r), zabs, {f});
          forRange(dv, [&](Value c) { kb.store(kb.mul(kb.load(S, {f, c}), r), S, {f, c}); });
          kb.store(l, shift, {f});
        }
        Value e = math::ExpOp::create(b, loc, kb.sub(l, kb.load(shift, {f})));
        Value phi = kb.mul(kb.mul(coeffs[o], e), scale);
        kb.store(kb.add(kb.load(z, {f}), phi), z, {f});
        kb.store(kb.add(kb.load(zabs, {f}), absf(phi)), zabs, {f});
        forRange(dv, [&](Value c) {
          kb.store(kb.add(kb.load(S, {f, c}), kb.mul(phi, kb.load(v, {j, c}))), S, {f, c});
        });
      }
    });
  });
  // A feature no kept key reached (every key masked: refused by the runtime) keeps 0.
  forRange(numFeatures, [&](Value f) {
    Value c = kb.load(shift, {f});
    Value finite = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, c, negInf);
    kb.store(arith::SelectOp::create(b, loc, finite, c, kb.f32(0)), shift, {f});
  });

  // 2. Readout, one pass per query: feature f weighs exp(l_f + c_f - M) with M the
  //    query's running max of l_f + c_f (out and the sums rescaled when it rises). The
  //    denominator guard (kDenominatorGuard in the C API header) uses T = sum |phi| zabs;
  //    qstat saves (M, the guarded denominator, whether the guard fired) for the backward.
  forRange(nq, [&](Value n) {
    Value xx = squaredNorm(q, n);
    forRange(dv, [&](Value c) { kb.store(kb.f32(0), out, {n, c}); });
    auto feats = scf::ForOp::create(b, loc, c0, m, c1, ValueRange{negInf, kb.f32(0), kb.f32(0)});
    {
      OpBuilder::InsertionGuard loop(b);
      b.setInsertionPointToStart(feats.getBody());
      Value i = feats.getInductionVar();
      Value M = feats.getRegionIterArgs()[0], den = feats.getRegionIterArgs()[1],
            total = feats.getRegionIterArgs()[2];
      auto [logits, coeffs] = kb.features(kb.dot(W, i, q, n, d), xx, rowNorm(i), params);
      for (unsigned o = 0; o < outputs; ++o) {
        Value f = featureIndex(o, i);
        Value l = kb.add(logits[o], kb.load(shift, {f}));
        Value above = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, l, M);
        auto raise = scf::IfOp::create(b, loc, TypeRange{f32, f32}, above, /*withElseRegion=*/true);
        {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(&raise.getThenRegion().front());
          Value r = math::ExpOp::create(b, loc, kb.sub(M, l));
          forRange(dv, [&](Value c) { kb.store(kb.mul(kb.load(out, {n, c}), r), out, {n, c}); });
          scf::YieldOp::create(b, loc, ValueRange{kb.mul(den, r), kb.mul(total, r)});
          b.setInsertionPointToStart(&raise.getElseRegion().front());
          scf::YieldOp::create(b, loc, ValueRange{den, total});
        }
        M = arith::MaximumFOp::create(b, loc, M, l);
        Value phi = kb.mul(coeffs[o], math::ExpOp::create(b, loc, kb.sub(l, M)));
        den = kb.add(raise.getResult(0), kb.mul(phi, kb.load(z, {f})));
        total = kb.add(raise.getResult(1), kb.mul(absf(phi), kb.load(zabs, {f})));
        forRange(dv, [&](Value c) {
          kb.store(kb.add(kb.load(out, {n, c}), kb.mul(phi, kb.load(S, {f, c}))), out, {n, c});
        });
      }
      scf::YieldOp::create(b, loc, ValueRange{M, den, total});
    }
    Value den = feats.getResult(1), total = feats.getResult(2);
    Value eps = kb.mul(kb.f32(SPECTRA_DENOMINATOR_GUARD), total);
    // Fires unless |den| > eps (NaN-safe: an unordered compare fires it too).
    Value fired = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::ULE, absf(den), eps);
    Value guarded = arith::SelectOp::create(b, loc, fired, kb.add(den, kb.mul(kb.f32(2), eps)), den);
    forRange(dv, [&](Value c) {
      kb.store(arith::DivFOp::create(b, loc, kb.load(out, {n, c}), guarded), out, {n, c});
    });
    kb.store(feats.getResult(0), qstat, {n, c0});
    kb.store(guarded, qstat, {n, c1});
    kb.store(arith::UIToFPOp::create(b, loc, f32, fired), qstat, {n, c2});
  });
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

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAPOLYNOMIALEXP
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

namespace {
struct PolynomialExpPass : spectra::impl::SpectraPolynomialExpBase<PolynomialExpPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateMathPolynomialApproximationPatterns(
        patterns, [](StringRef name) { return name == "exp" || name == "math.exp"; });
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

void mlir::spectra::buildCpuLoweringPipeline(OpPassManager &pm) {
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createSpectraPolynomialExp());
  pm.addPass(createSCFToControlFlowPass());
  // Ops with an LLVM intrinsic (fma, floor, sqrt, ...) become intrinsics: instructions the
  // vectoriser can widen (as libm calls, fmaf and floorf kept the polynomial exp scalar and
  // took a fifth of a training step). The rest (tanh, log1p, ...) become libm calls.
  pm.addPass(createConvertMathToLLVMPass());
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
  // q, k, v, keep, W, rowscale, params, S, z, out, shift, qstat, gout | dq, dk, dv, dW, dparams, dS, dz
  func::FuncOp fn = createKernelFunction(b, loc, name, "MMMVMVVMVMVMM" "MMMMVMV");
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  KernelBuilder kb(b, loc, component);
  auto arg = [&](unsigned i) { return entry->getArgument(i); };
  Value q = arg(0), k = arg(1), v = arg(2), keep = arg(3), W = arg(4), rowscale = arg(5),
        paramsBuf = arg(6), S = arg(7), z = arg(8), out = arg(9), shiftBuf = arg(10),
        qstat = arg(11), gout = arg(12), dq = arg(13), dk = arg(14), dvOut = arg(15), dW = arg(16),
        dparams = arg(17), dS = arg(18), dz = arg(19);
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value nq = kb.dim(q, 0), nk = kb.dim(k, 0), d = kb.dim(k, 1), dv = kb.dim(v, 1), m = kb.dim(W, 0);
  unsigned numParams = component.getFeatures().front().getNumArguments() - 3;
  unsigned numArgs = 3 + numParams, outputs = component.getNumOutputs();
  SmallVector<Value> params;
  for (unsigned i = 0; i < numParams; ++i)
    params.push_back(kb.load(paramsBuf, {kb.idx(i)}));
  Value numFeatures = arith::MulIOp::create(b, loc, m, kb.idx(outputs));
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
  /// e = exp(logit - shiftOf(o)) * scale, and d phi / d arg v = phi dl/dv + e dc/dv.
  struct FeatureGrad {
    Value phi;
    SmallVector<Value> dphi;  // per argument v
  };
  auto featureIndex = [&](unsigned o, Value i) {
    return arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, kb.idx(o), m), i).getResult();
  };
  auto featureGrads = [&](Value x, Value row, Value xx, Value i,
                          function_ref<Value(unsigned)> shiftOf, Value scale) {
    Value wx = kb.dot(W, i, x, row, d), ww = kb.load(wwBuf, {i});
    auto [logits, coeffs] = kb.features(wx, xx, ww, params);
    SmallVector<Value> pv = kb.partials(partials, wx, xx, ww, params);
    SmallVector<FeatureGrad> grads;
    for (unsigned o = 0; o < outputs; ++o) {
      Value e = math::ExpOp::create(b, loc, sub(logits[o], shiftOf(o)));
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
    // The forward's per-query constant and guarded denominator (qstat); feature f's
    // exponent is l_f + c_f - M as in the readout.
    Value M = kb.load(qstat, {n, c0});
    Value rden = arith::DivFOp::create(b, loc, kb.f32(1), kb.load(qstat, {n, c1}));
    Value gdot = kb.dot(gout, n, out, n, dv);
    forRange(m, [&](Value i) {
      SmallVector<FeatureGrad> grads = featureGrads(
          q, n, xx, i, [&](unsigned o) { return sub(M, kb.load(shiftBuf, {featureIndex(o, i)})); },
          Value());
      for (unsigned o = 0; o < outputs; ++o) {
        Value f = featureIndex(o, i);
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
  forRange(nk, [&](Value j) {
    Value kept = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, kb.load(keep, {j}), kb.f32(0));
    auto ifKept = scf::IfOp::create(b, loc, kept, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&ifKept.getThenRegion().front());
    Value xx = squaredNorm(k, j);
    forRange(m, [&](Value i) {
      SmallVector<FeatureGrad> grads = featureGrads(
          k, j, xx, i, [&](unsigned o) { return kb.load(shiftBuf, {featureIndex(o, i)}); },
          kb.load(rowscale, {i}));
      for (unsigned o = 0; o < outputs; ++o) {
        Value f = featureIndex(o, i);
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
