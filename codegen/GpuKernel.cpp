//===- GpuKernel.cpp - building and lowering the fused GPU kernels --------===//

#include "codegen/GpuKernel.h"
#include "codegen/CpuKernel.h"
#include "codegen/KernelBuilder.h"
#include "codegen/spectra_compiler.h"

#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Threading.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <limits>

using namespace mlir;
using namespace mlir::spectra;

namespace {

using T = GpuTiling;

/// The static shape of one feature map's kernels.
struct Shape {
  int64_t M, D, DV, K, P, MC, TK;
  Type elem;
  int64_t chunks() const { return (M + MC - 1) / MC; }
};

FailureOr<Shape> shapeOf(FeatureMapOp map, ComponentOp component, const GpuKernelOptions &options) {
  MLIRContext *ctx = map.getContext();
  Shape s;
  s.M = map.getM();
  s.D = map.getD();
  s.DV = options.valueDim > 0 ? options.valueDim : s.D;
  s.K = component.getNumOutputs();
  s.P = std::max<int64_t>(1, component.getFeatures().front().getNumArguments() - 3);
  if (options.dtype == "f32")
    s.elem = Float32Type::get(ctx);
  else if (options.dtype == "bf16")
    s.elem = BFloat16Type::get(ctx);
  else if (options.dtype == "f16")
    s.elem = Float16Type::get(ctx);
  else
    return map.emitOpError() << "GPU kernels: unsupported dtype '" << options.dtype
                             << "' (supported: f32, bf16, f16)";
  if (s.K > T::chunkFeatures)
    return map.emitOpError() << "GPU kernels: a component with " << s.K
                             << " outputs does not fit the " << T::chunkFeatures
                             << "-feature phi tile";
  if (s.D > 256 || s.DV > 256)
    return map.emitOpError() << "GPU kernels: head dimensions above 256 are not supported (d = "
                             << s.D << ", dv = " << s.DV << ")";
  // The summary kernels' static shared memory must stay within 48 KiB: staged
  // rows [TK, D+1] and values [TK, DV], three per-row scalars, the phi tile
  // [FC, TK+1]. Fewer staged rows for wide heads, then fewer features per chunk.
  const int64_t limit = 48 * 1024 / 4;
  s.TK = T::tileRows;
  while (s.TK > 8 && s.TK * (s.D + 1 + s.DV + 3) > limit * 3 / 4)
    s.TK /= 2;
  int64_t fc = std::min<int64_t>(T::chunkFeatures,
                                 (limit - s.TK * (s.D + 1 + s.DV + 3)) / (s.TK + 1));
  s.MC = std::min<int64_t>(s.M, fc / s.K);
  if (s.MC < 1)
    return map.emitOpError() << "GPU kernels: d = " << s.D << ", dv = " << s.DV
                             << " leave no room for the phi tile in 48 KiB of shared memory";
  return s;
}

/// Emits one kernel's body; `b` always points where the next op goes.
class GpuBuilder : public KernelBuilder {
public:
  GpuBuilder(OpBuilder &b, Location loc, ComponentOp component, const Shape &s)
      : KernelBuilder(b, loc, component), s(s) {}

  Value ext(Value x) {
    return x.getType().isF32() ? x : arith::ExtFOp::create(b, loc, b.getF32Type(), x).getResult();
  }
  Value trunc(Value x, Type to) {
    return to.isF32() ? x : arith::TruncFOp::create(b, loc, to, x).getResult();
  }
  Value i32(int64_t v) { return arith::ConstantIntOp::create(b, loc, b.getI32Type(), v); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) { return arith::CmpIOp::create(b, loc, p, x, y); }
  Value select(Value c, Value x, Value y) { return arith::SelectOp::create(b, loc, c, x, y); }
  Value addi(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value muli(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value divui(Value x, Value y) { return arith::DivUIOp::create(b, loc, x, y); }
  Value remui(Value x, Value y) { return arith::RemUIOp::create(b, loc, x, y); }
  Value minui(Value x, Value y) { return arith::MinUIOp::create(b, loc, x, y); }
  Value fmax(Value x, Value y) { return arith::MaximumFOp::create(b, loc, x, y); }
  Value exp(Value x) { return math::ExpOp::create(b, loc, x); }
  Value negInf() { return f32(-std::numeric_limits<float>::infinity()); }
  Value tid() { return gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x); }
  Value bid(gpu::Dimension d) { return gpu::BlockIdOp::create(b, loc, d); }
  void barrier() { gpu::BarrierOp::create(b, loc); }
  void atomicAdd(Value v, Value mem, ValueRange idx) {
    memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addf, v, mem, idx);
  }

  /// Runs `body` only when `cond` holds.
  void ifThen(Value cond, function_ref<void()> body) {
    auto op = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&op.getThenRegion().front());
    body();
  }

  /// A loop carrying `init`; `body(iv, carried)` returns the next values.
  SmallVector<Value> loop(Value lb, Value ub, ValueRange init,
                          function_ref<SmallVector<Value>(Value, ValueRange)> body) {
    auto op = scf::ForOp::create(b, loc, lb, ub, idx(1), init);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    SmallVector<Value> next = body(op.getInductionVar(), op.getRegionIterArgs());
    scf::YieldOp::create(b, loc, next);
    return SmallVector<Value>(op.getResults());
  }

  /// The `width` elements of row `row` of x[bh] as f32 registers.
  SmallVector<Value> loadRow(Value x, Value bh, Value row, int64_t width) {
    SmallVector<Value> r;
    for (int64_t c = 0; c < width; ++c)
      r.push_back(ext(load(x, {bh, row, idx(c)})));
    return r;
  }
  /// Row `row` of q or k [bh] as f32 registers times the slice's input scale
  /// (normaliser and diagonal transform, [BH, D] f32): the inputs stay in their
  /// own dtype and are never rounded after scaling.
  SmallVector<Value> loadScaledRow(Value x, Value scale, Value bh, Value row) {
    SmallVector<Value> r = loadRow(x, bh, row, s.D);
    for (int64_t c = 0; c < s.D; ++c)
      r[c] = mul(r[c], load(scale, {bh, idx(c)}));
    return r;
  }
  Value dotRegs(ArrayRef<Value> x, ArrayRef<Value> y) {
    Value acc = f32(0);
    for (auto [a, c] : llvm::zip(x, y))
      acc = add(acc, mul(a, c));
    return acc;
  }

  /// Sum (or max) over the 32 lanes of a warp; every lane gets the result.
  Value warpReduce(Value v, bool isMax) {
    for (int64_t offset = 16; offset >= 1; offset /= 2) {
      auto shuffled = gpu::ShuffleOp::create(b, loc, v, static_cast<int32_t>(offset), 32,
                                             gpu::ShuffleMode::XOR);
      v = isMax ? fmax(v, shuffled.getShuffleResult()) : add(v, shuffled.getShuffleResult());
    }
    return v;
  }

  /// Feature index f = o*M + i of output o, row i of W.
  Value featureIndex(unsigned o, Value i) { return addi(idx(o * s.M), i); }

  /// The parameters of slice bh.
  SmallVector<Value> loadParams(Value params, Value bh) {
    SmallVector<Value> p;
    for (unsigned i = 0; i < numParams(); ++i)
      p.push_back(load(params, {bh, idx(i)}));
    return p;
  }

  const Shape &s;
};

/// The typed arguments of the kernels.
struct Types {
  MemRefType rows, values, keep, W, rowscale, params, shift, S, z, qstat, dW, gradRows, gradValues,
      guarded, xscale;
  Types(MLIRContext *ctx, const Shape &s) {
    int64_t dyn = ShapedType::kDynamic;
    Type f32 = Float32Type::get(ctx);
    rows = MemRefType::get({dyn, dyn, s.D}, s.elem);
    values = MemRefType::get({dyn, dyn, s.DV}, s.elem);
    keep = MemRefType::get({dyn, dyn}, f32);
    W = MemRefType::get({s.M, s.D}, f32);
    rowscale = MemRefType::get({s.M}, f32);
    params = MemRefType::get({dyn, s.P}, f32);
    shift = MemRefType::get({dyn, s.K * s.M}, f32);
    guarded = MemRefType::get({dyn}, f32);
    xscale = MemRefType::get({dyn, s.D}, f32);
    S = MemRefType::get({dyn, s.K * s.M, s.DV}, f32);
    z = MemRefType::get({dyn, s.K * s.M}, f32);
    qstat = MemRefType::get({dyn, dyn, 3}, f32);
    dW = MemRefType::get({dyn, s.M, s.D}, f32);
    gradRows = MemRefType::get({dyn, dyn, s.D}, f32);
    gradValues = MemRefType::get({dyn, dyn, s.DV}, f32);
  }
};

/// A kernel function with `args` plus the trailing heads count H.
gpu::GPUFuncOp makeKernel(OpBuilder &b, Location loc, StringRef name, SmallVector<Type> args,
                          int64_t threads, TypeRange workgroup = {}) {
  args.push_back(b.getIndexType());
  auto fn = gpu::GPUFuncOp::create(b, loc, name, b.getFunctionType(args, {}), workgroup);
  fn->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  fn.setKnownBlockSizeAttr(b.getDenseI32ArrayAttr({static_cast<int32_t>(threads), 1, 1}));
  return fn;
}

/// Per-row-thread kernels: the row this thread owns, clamped for loads.
struct RowThread {
  Value bh, row, valid, clamped;
};
RowThread rowThread(GpuBuilder &g, Value rowsMemref) {
  RowThread r;
  r.bh = g.bid(gpu::Dimension::y);
  Value n = g.dim(rowsMemref, 1);
  r.row = g.addi(g.muli(g.bid(gpu::Dimension::x), g.idx(T::rowThreads)), g.tid());
  r.valid = g.cmp(arith::CmpIPredicate::ult, r.row, n);
  r.clamped = g.select(r.valid, r.row, g.idx(0));
  return r;
}

/// Whether the thread's key row exists and is kept by the mask keep[b = bh / H].
Value keptRow(GpuBuilder &g, Value keep, const RowThread &r, Value H) {
  Value mask = g.load(keep, {g.divui(r.bh, H), r.clamped});
  return arith::AndIOp::create(
      g.b, g.loc, r.valid,
      arith::CmpFOp::create(g.b, g.loc, arith::CmpFPredicate::OGT, mask, g.f32(0)));
}

/// One feature of a row held in registers: W's row i, w.x, ||w||^2, and the
/// inlined features region.
struct FeatureAt {
  SmallVector<Value> w;
  Value wx, ww;
  SmallVector<Value> logits, coeffs;
};
FeatureAt featureAt(GpuBuilder &g, Value W, Value i, ArrayRef<Value> x, Value xx,
                    ArrayRef<Value> params) {
  FeatureAt f;
  for (int64_t c = 0; c < g.s.D; ++c)
    f.w.push_back(g.load(W, {i, g.idx(c)}));
  f.wx = g.dotRegs(f.w, x);
  f.ww = g.dotRegs(f.w, f.w);
  std::tie(f.logits, f.coeffs) = g.features(f.wx, xx, f.ww, params);
  return f;
}

/// Feature f's key constant as the kernels use it: 0 when no key is kept.
Value keyShift(GpuBuilder &g, Value shiftBuf, Value bh, Value f) {
  Value sh = g.load(shiftBuf, {bh, f});
  Value finite = arith::CmpFOp::create(g.b, g.loc, arith::CmpFPredicate::OGT, sh, g.negInf());
  return g.select(finite, sh, g.f32(0));
}

/// A query's constant: the largest l_f + c_f over all features and outputs.
Value queryConstant(GpuBuilder &g, Value W, Value shiftBuf, Value bh, ArrayRef<Value> x, Value xx,
                    ArrayRef<Value> params) {
  return g.loop(g.idx(0), g.idx(g.s.M), {g.negInf()}, [&](Value i, ValueRange acc) {
    FeatureAt f = featureAt(g, W, i, x, xx, params);
    Value m = acc[0];
    for (unsigned o = 0; o < f.logits.size(); ++o)
      m = g.fmax(m, g.add(f.logits[o], keyShift(g, shiftBuf, bh, g.featureIndex(o, i))));
    return SmallVector<Value>{m};
  })[0];
}

/// A query's guarded denominator: den = sum_f phi_f z_f and T = sum_f |phi_f| zabs_f with
/// phi_f = coeff exp(l_f + c_f - M); where |den| <= guard * T the result is den + 2 guard T.
/// Returns (guarded den, fired as i1).
std::pair<Value, Value> guardedDenominator(GpuBuilder &g, Value W, Value shiftBuf, Value z,
                                           Value zabs, Value bh, ArrayRef<Value> x, Value xx,
                                           ArrayRef<Value> params, Value M) {
  SmallVector<Value> sums =
      g.loop(g.idx(0), g.idx(g.s.M), {g.f32(0), g.f32(0)}, [&](Value i, ValueRange acc) {
        FeatureAt f = featureAt(g, W, i, x, xx, params);
        Value den = acc[0], total = acc[1];
        for (unsigned o = 0; o < g.s.K; ++o) {
          Value fi = g.featureIndex(o, i);
          Value phi = g.mul(f.coeffs[o],
                            g.exp(g.sub(g.add(f.logits[o], keyShift(g, shiftBuf, bh, fi)), M)));
          den = g.add(den, g.mul(phi, g.load(z, {bh, fi})));
          total = g.add(total, g.mul(math::AbsFOp::create(g.b, g.loc, phi), g.load(zabs, {bh, fi})));
        }
        return SmallVector<Value>{den, total};
      });
  Value eps = g.mul(g.f32(SPECTRA_DENOMINATOR_GUARD), sums[1]);
  Value fired = arith::CmpFOp::create(g.b, g.loc, arith::CmpFPredicate::ULE,
                                      math::AbsFOp::create(g.b, g.loc, sums[0]), eps);
  return {g.select(fired, g.add(sums[0], g.mul(g.f32(2), eps)), sums[0]), fired};
}

/// Chains dL/dphi = a of each output into (d wx, 2 d xx, 2 d ww, d params),
/// summed over outputs: phi' = phi dlogit + e dcoeff, e = exp(logit - shift) * scale.
struct Chained {
  Value dwx, dxx2, dww2;
  SmallVector<Value> dparams;
};
Chained chain(GpuBuilder &g, FeaturePartialsOp partials, const FeatureAt &f, Value xx,
              ArrayRef<Value> params, ArrayRef<Value> e, ArrayRef<Value> a) {
  SmallVector<Value> pv = g.partials(partials, f.wx, xx, f.ww, params);
  unsigned args = 3 + g.numParams();
  Chained c{g.f32(0), g.f32(0), g.f32(0), {}};
  for (unsigned p = 0; p < g.numParams(); ++p)
    c.dparams.push_back(g.f32(0));
  for (unsigned o = 0; o < g.numOutputs(); ++o) {
    Value phi = g.mul(f.coeffs[o], e[o]);
    auto dphi = [&](unsigned v) {
      return g.add(g.mul(phi, pv[2 * (o * args + v)]), g.mul(e[o], pv[2 * (o * args + v) + 1]));
    };
    c.dwx = g.add(c.dwx, g.mul(a[o], dphi(0)));
    c.dxx2 = g.add(c.dxx2, g.mul(g.mul(a[o], dphi(1)), g.f32(2)));
    c.dww2 = g.add(c.dww2, g.mul(g.mul(a[o], dphi(2)), g.f32(2)));
    for (unsigned p = 0; p < g.numParams(); ++p)
      c.dparams[p] = g.add(c.dparams[p], g.mul(a[o], dphi(3 + p)));
  }
  return c;
}

/// The warp's share of dW[bh, i, :] and dparams[bh, :]: warp sums, then one
/// atomic add per value from lane 0.
void accumulateWeightGrads(GpuBuilder &g, const Chained &c, const FeatureAt &f,
                           ArrayRef<Value> x, Value dW, Value dparams, Value bh, Value i) {
  SmallVector<Value> sums;
  for (int64_t col = 0; col < g.s.D; ++col)
    sums.push_back(g.warpReduce(g.add(g.mul(c.dwx, x[col]), g.mul(c.dww2, f.w[col])), false));
  SmallVector<Value> psums;
  for (Value p : c.dparams)
    psums.push_back(g.warpReduce(p, false));
  Value lane0 = g.cmp(arith::CmpIPredicate::eq, g.remui(g.tid(), g.idx(32)), g.idx(0));
  g.ifThen(lane0, [&] {
    for (int64_t col = 0; col < g.s.D; ++col)
      g.atomicAdd(sums[col], dW, {bh, i, g.idx(col)});
    for (auto [p, v] : llvm::enumerate(psums))
      g.atomicAdd(v, dparams, {bh, g.idx(p)});
  });
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

/// Thread per row i of W (block: 128 rows, grid.z over them), block per 256-key chunk:
/// the largest logit of each feature over the chunk's kept keys, one atomic max per
/// feature and block into shift[bh, f] (init -inf). Max is order-independent, so the
/// result is deterministic.
void buildKeyMax(OpBuilder &b, Location loc, ComponentOp component, const Shape &s,
                 const Types &t, StringRef name) {
  auto fn = makeKernel(b, loc, name, {t.rows, t.keep, t.W, t.params, t.shift, t.xscale},
                       T::rowThreads);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&fn.getBody().front());
  GpuBuilder g(b, loc, component, s);
  auto arg = [&](unsigned i) { return fn.getArgument(i); };
  Value k = arg(0), keep = arg(1), W = arg(2), params = arg(3), shift = arg(4), kscale = arg(5),
        H = arg(6);
  Value bh = g.bid(gpu::Dimension::y);
  Value i = g.addi(g.muli(g.bid(gpu::Dimension::z), g.idx(T::rowThreads)), g.tid());
  Value inM = g.cmp(arith::CmpIPredicate::ult, i, g.idx(s.M));
  Value ic = g.minui(i, g.idx(s.M - 1));
  Value n = g.dim(k, 1);
  Value start = g.muli(g.bid(gpu::Dimension::x), g.idx(T::chunkRows));
  Value end = g.minui(g.addi(start, g.idx(T::chunkRows)), n);
  SmallVector<Value> p = g.loadParams(params, bh);
  SmallVector<Value> w;
  for (int64_t c = 0; c < s.D; ++c)
    w.push_back(g.load(W, {ic, g.idx(c)}));
  Value ww = g.dotRegs(w, w);
  Value batch = g.divui(bh, H);
  SmallVector<Value> init(s.K, g.negInf());
  SmallVector<Value> maxes = g.loop(start, end, init, [&](Value j, ValueRange acc) {
    // Every thread reads the same key row: one broadcast load per element.
    SmallVector<Value> x = g.loadScaledRow(k, kscale, bh, j);
    Value kept = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT,
                                       g.load(keep, {batch, j}), g.f32(0));
    auto [logits, coeffs] = g.features(g.dotRegs(w, x), g.dotRegs(x, x), ww, p);
    SmallVector<Value> next;
    for (unsigned o = 0; o < s.K; ++o)
      next.push_back(g.select(kept, g.fmax(acc[o], logits[o]), acc[o]));
    return next;
  });
  g.ifThen(inM, [&] {
    for (unsigned o = 0; o < s.K; ++o)
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::maximumf, maxes[o], shift,
                                  ValueRange{bh, g.featureIndex(o, ic)});
  });
  gpu::ReturnOp::create(b, loc);
}

/// What distinguishes the two summary kernels (S, z, zabs over keys; dS, dz over queries).
/// A staged row's exponent for feature f is logit_f + offset_f - rowShift.
struct SummaryRole {
  /// Per staged row j (clamped, valid): the phi scale, the row shift and the z weight.
  std::function<std::tuple<Value, Value, Value>(GpuBuilder &, gpu::GPUFuncOp, Value bh, Value j)>
      row;
  /// Per feature (row i of W, feature index f): the phi scale (quadrature row weights
  /// for keys) and the exponent offset (-c_f for keys, +c_f for queries).
  std::function<std::pair<Value, Value>(GpuBuilder &, gpu::GPUFuncOp, Value bh, Value i, Value f)>
      feature;
  /// The argument accumulating sum |phi| (zabs), or -1 for none.
  int absArg = -1;
};

/// sum over a 256-row chunk of phi(x_j) * value_j^T into Sacc[bh] (and
/// phi(x_j) * zweight_j into zacc[bh]): tiles of 32 rows in shared memory,
/// phi tile in shared memory, per-thread accumulators, one atomic per entry.
void buildSummary(OpBuilder &b, Location loc, ComponentOp component, const Shape &s,
                  const Types &t, StringRef name, SmallVector<Type> args, unsigned xArg,
                  unsigned vArg, unsigned WArg, unsigned paramsArg, unsigned SArg, unsigned zArg,
                  unsigned scaleArg, const SummaryRole &role) {
  MLIRContext *ctx = b.getContext();
  auto shared = gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
  Type f32 = b.getF32Type();
  const int64_t TK = s.TK, NT = T::sumThreads, FC = s.K * s.MC;
  auto xsT = MemRefType::get({TK, s.D + 1}, f32, MemRefLayoutAttrInterface(), shared);
  auto vsT = MemRefType::get({TK, s.DV}, f32, MemRefLayoutAttrInterface(), shared);
  auto rowT = MemRefType::get({TK}, f32, MemRefLayoutAttrInterface(), shared);
  auto phiT = MemRefType::get({FC, TK + 1}, f32, MemRefLayoutAttrInterface(), shared);
  auto fn = makeKernel(b, loc, name, args, NT, {xsT, vsT, rowT, rowT, rowT, phiT});
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&fn.getBody().front());
  GpuBuilder g(b, loc, component, s);
  Value x = fn.getArgument(xArg), v = fn.getArgument(vArg), W = fn.getArgument(WArg),
        params = fn.getArgument(paramsArg), Sacc = fn.getArgument(SArg),
        zacc = fn.getArgument(zArg), xscale = fn.getArgument(scaleArg);
  ArrayRef<BlockArgument> wg = fn.getWorkgroupAttributions();
  Value xs = wg[0], vs = wg[1], rscale = wg[2], rshift = wg[3], zw = wg[4], phis = wg[5];
  Value bh = g.bid(gpu::Dimension::y), chunk = g.bid(gpu::Dimension::z), tid = g.tid();
  Value n = g.dim(x, 1), last = arith::SubIOp::create(b, loc, n, g.idx(1));
  Value start = g.muli(g.bid(gpu::Dimension::x), g.idx(T::chunkRows));
  SmallVector<Value> p = g.loadParams(params, bh);
  const int64_t R = (FC * s.DV + NT - 1) / NT;

  /// `body(e)` for e = tid + r*NT over [0, limit), guarded where it overhangs.
  auto strided = [&](int64_t limit, function_ref<void(Value)> body) {
    for (int64_t r = 0; r * NT < limit; ++r) {
      Value e = g.addi(tid, g.idx(r * NT));
      if ((r + 1) * NT <= limit)
        body(e);
      else
        g.ifThen(g.cmp(arith::CmpIPredicate::ult, e, g.idx(limit)), [&] { body(e); });
    }
  };

  const bool withAbs = role.absArg >= 0;
  SmallVector<Value> init(R + 1 + (withAbs ? 1 : 0), g.f32(0));
  SmallVector<Value> acc = g.loop(
      g.idx(0), g.idx(T::chunkRows / TK), init, [&](Value tile, ValueRange carried) {
        Value r0 = g.addi(start, g.muli(tile, g.idx(TK)));
        // Stage the tile's rows and values (zeros past the end).
        auto stage = [&](Value src, Value dst, int64_t width, Value scale) {
          strided(TK * width, [&](Value e) {
            Value jj = g.divui(e, g.idx(width)), c = g.remui(e, g.idx(width));
            Value j = g.addi(r0, jj);
            Value in = g.cmp(arith::CmpIPredicate::ult, j, n);
            Value val = g.ext(g.load(src, {bh, g.minui(j, last), c}));
            if (scale)
              val = g.mul(val, g.load(scale, {bh, c}));
            g.store(g.select(in, val, g.f32(0)), dst, {jj, c});
          });
        };
        stage(x, xs, s.D, xscale);
        stage(v, vs, s.DV, Value());
        g.ifThen(g.cmp(arith::CmpIPredicate::ult, tid, g.idx(TK)), [&] {
          Value j = g.addi(r0, tid);
          Value in = g.cmp(arith::CmpIPredicate::ult, j, n);
          auto [scale, sh, zweight] = role.row(g, fn, bh, g.minui(j, last));
          g.store(g.select(in, scale, g.f32(0)), rscale, {tid});
          g.store(sh, rshift, {tid});
          g.store(zweight, zw, {tid});
        });
        g.barrier();
        // The phi tile: (row of W, staged row) pairs, every output.
        strided(s.MC * TK, [&](Value e) {
          Value il = g.divui(e, g.idx(TK)), jj = g.remui(e, g.idx(TK));
          Value i = g.addi(g.muli(chunk, g.idx(s.MC)), il);
          Value inM = g.cmp(arith::CmpIPredicate::ult, i, g.idx(s.M));
          Value ic = g.minui(i, g.idx(s.M - 1));
          SmallVector<Value> xr;
          for (int64_t c = 0; c < s.D; ++c)
            xr.push_back(g.load(xs, {jj, g.idx(c)}));
          FeatureAt f = featureAt(g, W, ic, xr, g.dotRegs(xr, xr), p);
          Value rowScale = g.load(rscale, {jj});
          // Masked and out-of-range rows are selected away, never multiplied by 0:
          // their exp may overflow (the shift covers kept rows only) and inf * 0 is NaN.
          Value live = arith::AndIOp::create(
              b, loc, inM,
              arith::CmpFOp::create(b, loc, arith::CmpFPredicate::ONE, rowScale, g.f32(0)));
          for (unsigned o = 0; o < s.K; ++o) {
            auto [featureScale, offset] = role.feature(g, fn, bh, ic, g.featureIndex(o, ic));
            Value exponent = g.sub(g.add(f.logits[o], offset), g.load(rshift, {jj}));
            Value phi = g.mul(g.mul(f.coeffs[o], g.exp(exponent)), g.mul(rowScale, featureScale));
            g.store(g.select(live, phi, g.f32(0)), phis, {g.addi(g.idx(o * s.MC), il), jj});
          }
        });
        g.barrier();
        // Accumulate: thread entry (fl, c) += sum_jj phi[fl, jj] value[jj, c].
        SmallVector<Value> next(carried.begin(), carried.end());
        for (int64_t r = 0; r < R; ++r) {
          Value e = g.minui(g.addi(tid, g.idx(r * NT)), g.idx(FC * s.DV - 1));
          Value fl = g.divui(e, g.idx(s.DV)), c = g.remui(e, g.idx(s.DV));
          for (int64_t jj = 0; jj < TK; ++jj)
            next[r] = g.add(next[r], g.mul(g.load(phis, {fl, g.idx(jj)}), g.load(vs, {g.idx(jj), c})));
        }
        Value fz = g.minui(tid, g.idx(FC - 1));
        for (int64_t jj = 0; jj < TK; ++jj) {
          Value phi = g.load(phis, {fz, g.idx(jj)});
          next[R] = g.add(next[R], g.mul(phi, g.load(zw, {g.idx(jj)})));
          if (withAbs)
            next[R + 1] = g.add(next[R + 1], math::AbsFOp::create(b, loc, phi));
        }
        g.barrier();
        return next;
      });

  // Combine the chunks: one atomic add per owned entry.
  auto globalFeature = [&](Value fl) {
    Value o = g.divui(fl, g.idx(s.MC)), il = g.remui(fl, g.idx(s.MC));
    Value i = g.addi(g.muli(chunk, g.idx(s.MC)), il);
    return std::make_pair(g.addi(g.muli(o, g.idx(s.M)), i),
                          g.cmp(arith::CmpIPredicate::ult, i, g.idx(s.M)));
  };
  for (int64_t r = 0; r < R; ++r) {
    Value e = g.addi(tid, g.idx(r * NT));
    Value fl = g.divui(e, g.idx(s.DV)), c = g.remui(e, g.idx(s.DV));
    auto [f, inM] = globalFeature(fl);
    Value ok = arith::AndIOp::create(b, loc, inM, g.cmp(arith::CmpIPredicate::ult, e, g.idx(FC * s.DV)));
    g.ifThen(ok, [&, f = f] { g.atomicAdd(acc[r], Sacc, {bh, f, c}); });
  }
  auto [fz, inMz] = globalFeature(tid);
  Value okz = arith::AndIOp::create(b, loc, inMz, g.cmp(arith::CmpIPredicate::ult, tid, g.idx(FC)));
  g.ifThen(okz, [&, fz = fz] {
    g.atomicAdd(acc[R], zacc, {bh, fz});
    if (withAbs)
      g.atomicAdd(acc[R + 1], fn.getArgument(role.absArg), {bh, fz});
  });
  gpu::ReturnOp::create(b, loc);
}

void buildReadout(OpBuilder &b, Location loc, ComponentOp component, const Shape &s,
                  const Types &t, StringRef name) {
  auto fn = makeKernel(b, loc, name,
                       {t.rows, t.W, t.params, t.shift, t.S, t.z, t.z, t.values, t.guarded,
                        t.xscale},
                       T::rowThreads);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&fn.getBody().front());
  GpuBuilder g(b, loc, component, s);
  auto arg = [&](unsigned i) { return fn.getArgument(i); };
  Value q = arg(0), W = arg(1), params = arg(2), shift = arg(3), S = arg(4), z = arg(5),
        zabs = arg(6), out = arg(7), guarded = arg(8), qscale = arg(9);
  RowThread r = rowThread(g, q);
  SmallVector<Value> x = g.loadScaledRow(q, qscale, r.bh, r.clamped);
  SmallVector<Value> p = g.loadParams(params, r.bh);
  Value xx = g.dotRegs(x, x);
  Value M = queryConstant(g, W, shift, r.bh, x, xx, p);
  SmallVector<Value> init(s.DV + 2, g.f32(0));
  SmallVector<Value> acc = g.loop(g.idx(0), g.idx(s.M), init, [&](Value i, ValueRange carried) {
    FeatureAt f = featureAt(g, W, i, x, xx, p);
    SmallVector<Value> next(carried.begin(), carried.end());
    for (unsigned o = 0; o < s.K; ++o) {
      Value fi = g.featureIndex(o, i);
      Value phi = g.mul(f.coeffs[o],
                        g.exp(g.sub(g.add(f.logits[o], keyShift(g, shift, r.bh, fi)), M)));
      next[s.DV] = g.add(next[s.DV], g.mul(phi, g.load(z, {r.bh, fi})));
      next[s.DV + 1] = g.add(next[s.DV + 1],
                             g.mul(math::AbsFOp::create(b, loc, phi), g.load(zabs, {r.bh, fi})));
      for (int64_t c = 0; c < s.DV; ++c)
        next[c] = g.add(next[c], g.mul(phi, g.load(S, {r.bh, fi, g.idx(c)})));
    }
    return next;
  });
  // The denominator guard (SPECTRA_DENOMINATOR_GUARD), counted per slice.
  Value eps = g.mul(g.f32(SPECTRA_DENOMINATOR_GUARD), acc[s.DV + 1]);
  Value fired = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::ULE,
                                      math::AbsFOp::create(b, loc, acc[s.DV]), eps);
  Value den = g.select(fired, g.add(acc[s.DV], g.mul(g.f32(2), eps)), acc[s.DV]);
  g.ifThen(r.valid, [&] {
    for (int64_t c = 0; c < s.DV; ++c)
      g.store(g.trunc(arith::DivFOp::create(b, loc, acc[c], den), s.elem), out,
              {r.bh, r.row, g.idx(c)});
  });
  g.ifThen(arith::AndIOp::create(b, loc, r.valid, fired),
           [&] { g.atomicAdd(g.f32(1), guarded, {r.bh}); });
  gpu::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

void buildQueryBackward(OpBuilder &b, Location loc, ComponentOp component, const Shape &s,
                        const Types &t, FeaturePartialsOp partials, StringRef name) {
  auto fn = makeKernel(b, loc, name,
                       {t.rows, t.W, t.params, t.shift, t.S, t.z, t.z, t.values, t.values,
                        t.gradRows, t.dW, t.params, t.qstat, t.xscale},
                       T::rowThreads);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&fn.getBody().front());
  GpuBuilder g(b, loc, component, s);
  auto arg = [&](unsigned i) { return fn.getArgument(i); };
  Value q = arg(0), W = arg(1), params = arg(2), shiftBuf = arg(3), S = arg(4), z = arg(5),
        zabs = arg(6), out = arg(7), gout = arg(8), dq = arg(9), dW = arg(10), dparams = arg(11),
        qstat = arg(12), qscale = arg(13);
  RowThread r = rowThread(g, q);
  SmallVector<Value> x = g.loadScaledRow(q, qscale, r.bh, r.clamped);
  SmallVector<Value> gr = g.loadRow(gout, r.bh, r.clamped, s.DV);
  SmallVector<Value> p = g.loadParams(params, r.bh);
  Value xx = g.dotRegs(x, x);
  Value gdot = g.dotRegs(gr, g.loadRow(out, r.bh, r.clamped, s.DV));
  Value M = queryConstant(g, W, shiftBuf, r.bh, x, xx, p);
  Value den = guardedDenominator(g, W, shiftBuf, z, zabs, r.bh, x, xx, p, M).first;
  Value rden = arith::DivFOp::create(b, loc, g.f32(1), den);
  g.ifThen(r.valid, [&] {
    g.store(M, qstat, {r.bh, r.row, g.idx(0)});
    g.store(rden, qstat, {r.bh, r.row, g.idx(1)});
    g.store(gdot, qstat, {r.bh, r.row, g.idx(2)});
  });
  SmallVector<Value> init(s.D, g.f32(0));
  SmallVector<Value> dx = g.loop(g.idx(0), g.idx(s.M), init, [&](Value i, ValueRange carried) {
    FeatureAt f = featureAt(g, W, i, x, xx, p);
    SmallVector<Value> e, a;
    for (unsigned o = 0; o < s.K; ++o) {
      Value fi = g.featureIndex(o, i);
      SmallVector<Value> Srow;
      for (int64_t c = 0; c < s.DV; ++c)
        Srow.push_back(g.load(S, {r.bh, fi, g.idx(c)}));
      Value da = g.mul(g.sub(g.dotRegs(gr, Srow), g.mul(gdot, g.load(z, {r.bh, fi}))), rden);
      e.push_back(g.exp(g.sub(g.add(f.logits[o], keyShift(g, shiftBuf, r.bh, fi)), M)));
      a.push_back(g.select(r.valid, da, g.f32(0)));
    }
    Chained c = chain(g, partials, f, xx, p, e, a);
    accumulateWeightGrads(g, c, f, x, dW, dparams, r.bh, i);
    SmallVector<Value> next;
    for (int64_t col = 0; col < s.D; ++col)
      next.push_back(g.add(carried[col], g.add(g.mul(c.dwx, f.w[col]), g.mul(c.dxx2, x[col]))));
    return next;
  });
  g.ifThen(r.valid, [&] {
    for (int64_t col = 0; col < s.D; ++col)
      g.store(dx[col], dq, {r.bh, r.row, g.idx(col)});
  });
  gpu::ReturnOp::create(b, loc);
}

void buildKeyBackward(OpBuilder &b, Location loc, ComponentOp component, const Shape &s,
                      const Types &t, FeaturePartialsOp partials, StringRef name) {
  auto fn = makeKernel(b, loc, name,
                       {t.rows, t.values, t.keep, t.W, t.rowscale, t.params, t.shift, t.S, t.z,
                        t.gradRows, t.gradValues, t.dW, t.params, t.xscale},
                       T::rowThreads);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&fn.getBody().front());
  GpuBuilder g(b, loc, component, s);
  auto arg = [&](unsigned i) { return fn.getArgument(i); };
  Value k = arg(0), v = arg(1), keep = arg(2), W = arg(3), rowscale = arg(4), params = arg(5),
        shiftBuf = arg(6), dS = arg(7), dz = arg(8), dk = arg(9), dv = arg(10), dW = arg(11),
        dparams = arg(12), kscale = arg(13), H = arg(14);
  RowThread r = rowThread(g, k);
  Value kept = keptRow(g, keep, r, H);
  SmallVector<Value> x = g.loadScaledRow(k, kscale, r.bh, r.clamped);
  SmallVector<Value> vr = g.loadRow(v, r.bh, r.clamped, s.DV);
  SmallVector<Value> p = g.loadParams(params, r.bh);
  Value xx = g.dotRegs(x, x);
  SmallVector<Value> init(s.D + s.DV, g.f32(0));
  SmallVector<Value> acc = g.loop(g.idx(0), g.idx(s.M), init, [&](Value i, ValueRange carried) {
    FeatureAt f = featureAt(g, W, i, x, xx, p);
    Value scale = g.load(rowscale, {i});
    SmallVector<Value> next(carried.begin(), carried.end());
    SmallVector<Value> e, a;
    for (unsigned o = 0; o < s.K; ++o) {
      Value fi = g.featureIndex(o, i);
      // Masked keys: select, never multiply (their exp may overflow).
      Value eo = g.select(
          kept, g.mul(g.exp(g.sub(f.logits[o], keyShift(g, shiftBuf, r.bh, fi))), scale), g.f32(0));
      Value phi = g.mul(f.coeffs[o], eo);
      SmallVector<Value> dSrow;
      for (int64_t c = 0; c < s.DV; ++c) {
        dSrow.push_back(g.load(dS, {r.bh, fi, g.idx(c)}));
        next[s.D + c] = g.add(next[s.D + c], g.mul(phi, dSrow.back()));
      }
      Value bval = g.add(g.dotRegs(dSrow, vr), g.load(dz, {r.bh, fi}));
      e.push_back(eo);
      a.push_back(g.select(kept, bval, g.f32(0)));
    }
    Chained c = chain(g, partials, f, xx, p, e, a);
    accumulateWeightGrads(g, c, f, x, dW, dparams, r.bh, i);
    for (int64_t col = 0; col < s.D; ++col)
      next[col] = g.add(next[col], g.add(g.mul(c.dwx, f.w[col]), g.mul(c.dxx2, x[col])));
    return next;
  });
  g.ifThen(r.valid, [&] {
    for (int64_t col = 0; col < s.D; ++col)
      g.store(g.select(kept, acc[col], g.f32(0)), dk, {r.bh, r.row, g.idx(col)});
    for (int64_t c = 0; c < s.DV; ++c)
      g.store(g.select(kept, acc[s.D + c], g.f32(0)), dv, {r.bh, r.row, g.idx(c)});
  });
  gpu::ReturnOp::create(b, loc);
}

} // namespace

LogicalResult mlir::spectra::buildGpuKernels(ModuleOp module, FeatureMapOp map,
                                             const GpuKernelOptions &options) {
  MLIRContext *ctx = module.getContext();
  ctx->loadDialect<gpu::GPUDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                   math::MathDialect>();
  auto component = SymbolTable::lookupNearestSymbolFrom<ComponentOp>(map, map.getComponentAttr());
  if (!component)
    return map.emitOpError() << "component '" << map.getComponent() << "' is not defined";
  FailureOr<Shape> shape = shapeOf(map, component, options);
  if (failed(shape))
    return failure();
  FailureOr<FeaturePartialsOp> partials = lookupOrDerivePartials(component);
  if (failed(partials))
    return failure();
  const Shape &s = *shape;
  Types t(ctx, s);
  module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), UnitAttr::get(ctx));
  OpBuilder b(ctx);
  b.setInsertionPointToEnd(module.getBody());
  Location loc = map.getLoc();
  std::string base = map.getSymName().str();
  auto gm = gpu::GPUModuleOp::create(b, loc, base + "_kernels");
  b.setInsertionPointToStart(gm.getBody());

  buildKeyMax(b, loc, component, s, t, base + "_key_max");
  // kv_summary(k, v, keep, W, rowscale, params, shift, S, z, zabs, kscale, H)
  SummaryRole keys;
  keys.row = [](GpuBuilder &g, gpu::GPUFuncOp fn, Value bh, Value j) {
    Value keep = fn.getArgument(2), H = fn.getArgument(fn.getFunctionType().getNumInputs() - 1);
    Value kept = arith::CmpFOp::create(g.b, g.loc, arith::CmpFPredicate::OGT,
                                       g.load(keep, {g.divui(bh, H), j}), g.f32(0));
    return std::make_tuple(g.select(kept, g.f32(1), g.f32(0)), g.f32(0), g.f32(1));
  };
  keys.feature = [](GpuBuilder &g, gpu::GPUFuncOp fn, Value bh, Value i, Value f) {
    Value c = keyShift(g, fn.getArgument(6), bh, f);
    return std::make_pair(g.load(fn.getArgument(4), {i}),
                          arith::NegFOp::create(g.b, g.loc, c).getResult());
  };
  keys.absArg = 9;
  buildSummary(b, loc, component, s, t, base + "_kv_summary",
               {t.rows, t.values, t.keep, t.W, t.rowscale, t.params, t.shift, t.S, t.z, t.z,
                t.xscale},
               /*x=*/0, /*v=*/1, /*W=*/3, /*params=*/5, /*S=*/7, /*z=*/8, /*scale=*/10, keys);
  buildReadout(b, loc, component, s, t, base + "_readout");

  buildQueryBackward(b, loc, component, s, t, *partials, base + "_query_backward");
  // dsummary(q, gout, W, params, shift, qstat, dS, dz, qscale, H)
  SummaryRole queries;
  queries.row = [](GpuBuilder &g, gpu::GPUFuncOp fn, Value bh, Value j) {
    Value qstat = fn.getArgument(5);
    Value M = g.load(qstat, {bh, j, g.idx(0)}), rden = g.load(qstat, {bh, j, g.idx(1)});
    Value gdot = g.load(qstat, {bh, j, g.idx(2)});
    return std::make_tuple(rden, M, arith::NegFOp::create(g.b, g.loc, gdot).getResult());
  };
  queries.feature = [](GpuBuilder &g, gpu::GPUFuncOp fn, Value bh, Value, Value f) {
    return std::make_pair(g.f32(1), keyShift(g, fn.getArgument(4), bh, f));
  };
  buildSummary(b, loc, component, s, t, base + "_dsummary",
               {t.rows, t.values, t.W, t.params, t.shift, t.qstat, t.S, t.z, t.xscale},
               /*x=*/0, /*v=*/1, /*W=*/2, /*params=*/3, /*S=*/6, /*z=*/7, /*scale=*/8, queries);
  buildKeyBackward(b, loc, component, s, t, *partials, base + "_key_backward");
  return success();
}

std::string mlir::spectra::describeGpuKernels(FeatureMapOp map, const GpuKernelOptions &options) {
  auto component = SymbolTable::lookupNearestSymbolFrom<ComponentOp>(map, map.getComponentAttr());
  FailureOr<Shape> shape = shapeOf(map, component, options);
  if (failed(shape))
    return "";
  const Shape &s = *shape;
  std::string base = map.getSymName().str();
  const int64_t TK = s.TK, FC = s.K * s.MC;
  int64_t summaryShared = 4 * (TK * (s.D + 1) + TK * s.DV + 3 * TK + FC * (TK + 1));
  using llvm::json::Array;
  using llvm::json::Object;
  auto rowKernel = [&](StringRef kind, StringRef rows, Array args) {
    return Object{{"name", base + "_" + kind.str()},
                  {"block", Array{T::rowThreads, 1, 1}},
                  {"grid", Object{{"x", Object{{"rows", rows}, {"per_block", T::rowThreads}}},
                                  {"y", "batch_heads"},
                                  {"z", 1}}},
                  {"shared_bytes", 0},
                  {"args", std::move(args)}};
  };
  auto summaryKernel = [&](StringRef kind, StringRef rows, Array args) {
    return Object{{"name", base + "_" + kind.str()},
                  {"block", Array{T::sumThreads, 1, 1}},
                  {"grid", Object{{"x", Object{{"rows", rows}, {"per_block", T::chunkRows}}},
                                  {"y", "batch_heads"},
                                  {"z", s.chunks()}}},
                  {"shared_bytes", summaryShared},
                  {"args", std::move(args)}};
  };
  // key_max: block per 256-key chunk and batch-head, a thread per row of W (grid.z over them).
  auto keyMaxKernel = [&](Array args) {
    return Object{{"name", base + "_key_max"},
                  {"block", Array{T::rowThreads, 1, 1}},
                  {"grid", Object{{"x", Object{{"rows", "keys"}, {"per_block", T::chunkRows}}},
                                  {"y", "batch_heads"},
                                  {"z", (s.M + T::rowThreads - 1) / T::rowThreads}}},
                  {"shared_bytes", 0},
                  {"args", std::move(args)}};
  };
  std::string elem = options.dtype;
  auto buffer = [](StringRef name, StringRef type, Array shape, StringRef init) {
    return Object{{"name", name}, {"type", type}, {"shape", std::move(shape)}, {"init", init}};
  };
  Object artifact{
      {"version", 2},
      {"feature_map", base},
      {"dtype", elem},
      {"m", s.M},
      {"d", s.D},
      {"dv", s.DV},
      {"outputs", s.K},
      {"tile_rows", s.TK},
      {"features_per_chunk", s.K * s.MC},
      {"params", s.P},
      {"memref_abi", "each memref argument is (allocated ptr, aligned ptr, i64 offset, i64 "
                     "sizes[rank], i64 strides[rank]); the trailing H is i64"},
      {"buffers",
       Array{buffer("q", elem, Array{"BH", "Nq", s.D}, "input"),
             buffer("k", elem, Array{"BH", "Nk", s.D}, "input"),
             buffer("v", elem, Array{"BH", "Nk", s.DV}, "input"),
             buffer("keep", "f32", Array{"B", "Nk"}, "input"),
             buffer("W", "f32", Array{s.M, s.D}, "input"),
             buffer("rowscale", "f32", Array{s.M}, "input"),
             buffer("params", "f32", Array{"BH", s.P}, "input"),
             buffer("shift", "f32", Array{"BH", s.K * s.M}, "-inf"),
             buffer("S", "f32", Array{"BH", s.K * s.M, s.DV}, "zero"),
             buffer("z", "f32", Array{"BH", s.K * s.M}, "zero"),
             buffer("zabs", "f32", Array{"BH", s.K * s.M}, "zero"),
             buffer("out", elem, Array{"BH", "Nq", s.DV}, "output"),
             buffer("guarded", "f32", Array{"BH"}, "zero"),
             buffer("qscale", "f32", Array{"BH", s.D}, "input"),
             buffer("kscale", "f32", Array{"BH", s.D}, "input"),
             buffer("gout", elem, Array{"BH", "Nq", s.DV}, "input"),
             buffer("qstat", "f32", Array{"BH", "Nq", 3}, "scratch"),
             buffer("dS", "f32", Array{"BH", s.K * s.M, s.DV}, "zero"),
             buffer("dz", "f32", Array{"BH", s.K * s.M}, "zero"),
             buffer("dq", "f32", Array{"BH", "Nq", s.D}, "output"),
             buffer("dk", "f32", Array{"BH", "Nk", s.D}, "output"),
             buffer("dv", "f32", Array{"BH", "Nk", s.DV}, "output"),
             buffer("dW", "f32", Array{"BH", s.M, s.D}, "zero"),
             buffer("dparams", "f32", Array{"BH", s.P}, "zero")}},
      {"forward",
       Array{keyMaxKernel(Array{"k", "keep", "W", "params", "shift", "kscale", "H"}),
             summaryKernel("kv_summary", "keys",
                           Array{"k", "v", "keep", "W", "rowscale", "params", "shift", "S", "z",
                                 "zabs", "kscale", "H"}),
             rowKernel("readout", "queries",
                       Array{"q", "W", "params", "shift", "S", "z", "zabs", "out", "guarded",
                             "qscale", "H"})}},
      {"backward",
       Array{rowKernel("query_backward", "queries",
                       Array{"q", "W", "params", "shift", "S", "z", "zabs", "out", "gout", "dq",
                             "dW", "dparams", "qstat", "qscale", "H"}),
             summaryKernel("dsummary", "queries",
                           Array{"q", "gout", "W", "params", "shift", "qstat", "dS", "dz",
                                 "qscale", "H"}),
             rowKernel("key_backward", "keys",
                       Array{"k", "v", "keep", "W", "rowscale", "params", "shift", "dS", "dz",
                             "dk", "dv", "dW", "dparams", "kscale", "H"})}},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(artifact)));
  return text;
}

void mlir::spectra::registerGpuLoweringDialects(DialectRegistry &registry) {
  registerCpuLoweringDialects(registry);
  registry.insert<gpu::GPUDialect, NVVM::NVVMDialect>();
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerConvertNVVMToLLVMInterface(registry);
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
}

/// The CUDA toolkit whose libdevice resolves math calls (__nv_expf, ...).
static std::string cudaToolkit() {
  for (const char *var : {"SPECTRA_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"})
    if (const char *v = std::getenv(var); v && *v)
      return v;
  return "/usr/local/cuda";
}

void mlir::spectra::buildGpuLoweringPipeline(OpPassManager &pm, StringRef chip, bool toBinary) {
  GpuNVVMAttachTargetOptions target;
  target.chip = chip.str();
  // sm_90a needs PTX ISA 8.0; sm_80 accepts it too (ptxas 12+).
  target.features = "+ptx80";
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));
  // The cleanups run per kernel (gpu.func, then llvm.func), so the pass manager spreads the
  // kernels over the context's threads; the conversion itself is per gpu.module.
  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  OpPassManager &gpuFuncs = kernels.nest<gpu::GPUFuncOp>();
  gpuFuncs.addPass(createCanonicalizerPass());
  gpuFuncs.addPass(createCSEPass());
  // The mapped kernels' one-element linalg ops and windows (the hand-built ones have none).
  gpuFuncs.addPass(createConvertLinalgToLoopsPass());
  gpuFuncs.addPass(memref::createExpandStridedMetadataPass());
  gpuFuncs.addPass(createLowerAffinePass());
  gpuFuncs.addPass(createSCFToControlFlowPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.indexBitwidth = 64;
  kernels.addPass(createConvertGpuOpsToNVVMOps(nvvm));
  OpPassManager &llvmFuncs = kernels.nest<LLVM::LLVMFuncOp>();
  llvmFuncs.addPass(createCanonicalizerPass());
  llvmFuncs.addPass(createCSEPass());
  kernels.addPass(createReconcileUnrealizedCastsPass());
  if (toBinary)
    pm.addPass(createSerializeKernelsToPtxPass());
}

namespace {

/// Joins the PTX of kernels compiled as separate modules into one module's text: the first
/// header (.version, .target, .address_size; every part must have the same), the module-level
/// declarations once each (libdevice's tables come with every kernel that uses them), then
/// every kernel. Returns nothing when the parts cannot be joined safely: module-level functions
/// (.func), a name declared two ways, or a part without a header.
std::optional<std::string> joinPtx(const std::vector<std::string> &parts) {
  std::string header, declarations, kernels;
  std::map<std::string, std::string> declared;  // name -> its declaration
  for (const std::string &part : parts) {
    StringRef text(part);
    size_t version = text.find(".version"), address = text.find(".address_size");
    if (version == StringRef::npos || address == StringRef::npos || address < version)
      return std::nullopt;
    size_t headerEnd = text.find('\n', address);
    if (headerEnd == StringRef::npos)
      return std::nullopt;
    StringRef partHeader = text.slice(version, headerEnd + 1);
    if (header.empty())
      header = text.take_front(headerEnd + 1).str();
    else if (!StringRef(header).ends_with(partHeader))
      return std::nullopt;
    StringRef body = text.drop_front(headerEnd + 1);
    size_t firstKernel = body.find(".visible .entry");
    if (firstKernel == StringRef::npos)
      return std::nullopt;
    StringRef prefix = body.take_front(firstKernel), rest = body.drop_front(firstKernel);
    for (StringRef line : llvm::split(rest, '\n'))
      if (line.starts_with(".func") || line.starts_with(".visible .func") ||
          line.starts_with(".weak") || line.starts_with(".global") || line.starts_with(".const"))
        return std::nullopt;
    // Module-level declarations: one statement per line, ending with ';'.
    for (StringRef line : llvm::split(prefix, '\n')) {
      StringRef statement = line.trim();
      if (statement.empty() || statement.starts_with("//"))
        continue;
      if (!statement.ends_with(";"))
        return std::nullopt;
      StringRef named = statement.take_until([](char c) { return c == '[' || c == '=' || c == ';'; }).rtrim();
      std::string name = named.substr(named.rfind(' ') + 1).str();
      auto [it, inserted] = declared.emplace(name, statement.str());
      if (!inserted) {
        if (it->second != statement.str())
          return std::nullopt;
        continue;
      }
      declarations += line.str() + "\n";
    }
    kernels += rest.str();
    if (!StringRef(kernels).ends_with("\n"))
      kernels += "\n";
  }
  return header + "\n" + declarations + "\n" + kernels;
}

/// gpu-module-to-binary (format isa) with the kernels serialised side by side: each gpu.module
/// is split into one detached copy per kernel (the kernel and the symbols it uses), the copies
/// go through the NVVM target's serialiser (LLVM's optimiser and the NVPTX back end, most of a
/// cold GPU compile) on the context's threads, and their PTX is joined into one text (one
/// header; the kernels share no module-level symbol). Each kernel's PTX is what the one-module
/// compile gives, since no kernel calls another.
struct SerializeKernelsToPtxPass
    : public PassWrapper<SerializeKernelsToPtxPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(SerializeKernelsToPtxPass)
  StringRef getArgument() const final { return "spectra-serialize-kernels-to-ptx"; }
  StringRef getDescription() const final {
    return "serialise each gpu.module to one PTX gpu.binary, its kernels compiled in parallel";
  }

  void runOnOperation() override {
    for (gpu::GPUModuleOp module : llvm::to_vector(getOperation().getOps<gpu::GPUModuleOp>()))
      if (failed(serialize(module)))
        return signalPassFailure();
  }

  LogicalResult serialize(gpu::GPUModuleOp module) {
    ArrayAttr targets = module.getTargetsAttr();
    if (!targets || targets.size() != 1)
      return module.emitError("expected exactly one GPU target (spectra attaches #nvvm.target)");
    auto target = dyn_cast<gpu::TargetAttrInterface>(targets[0]);
    if (!target)
      return module.emitError("the GPU target does not implement serialisation");
    SmallVector<OwningOpRef<gpu::GPUModuleOp>> parts;
    auto isKernel = [](LLVM::LLVMFuncOp fn) {
      return fn->hasAttr(NVVM::NVVMDialect::getKernelFuncAttrName()) ||
             fn->hasAttr("gpu.kernel");
    };
    SmallVector<std::string> kernels;
    for (LLVM::LLVMFuncOp fn : module.getOps<LLVM::LLVMFuncOp>())
      if (isKernel(fn))
        kernels.push_back(fn.getSymName().str());
    if (kernels.size() <= 1) {
      parts.push_back(module.clone());
    } else {
      for (const std::string &name : kernels) {
        OwningOpRef<gpu::GPUModuleOp> part = module.clone();
        for (LLVM::LLVMFuncOp fn : llvm::to_vector(part->getOps<LLVM::LLVMFuncOp>()))
          if (isKernel(fn) && fn.getSymName() != name)
            fn.erase();
        // Drop what only the other kernels used (their shared-memory globals, declarations).
        for (bool erased = true; erased;) {
          erased = false;
          for (Operation &op : llvm::make_early_inc_range(part->getBody()->getOperations())) {
            auto symbol = dyn_cast<SymbolOpInterface>(&op);
            auto fn = dyn_cast<LLVM::LLVMFuncOp>(&op);
            if (symbol && !(fn && isKernel(fn)) && SymbolTable::symbolKnownUseEmpty(&op, *part)) {
              op.erase();
              erased = true;
            }
          }
        }
        parts.push_back(std::move(part));
      }
    }
    gpu::TargetOptions options(cudaToolkit(), {}, {}, {}, gpu::CompilationTarget::Assembly);
    std::vector<std::optional<SmallVector<char, 0>>> objects(parts.size());
    ParallelDiagnosticHandler diagnostics(&getContext());
    LogicalResult compiled = failableParallelForEachN(
        &getContext(), 0, parts.size(), [&](size_t i) -> LogicalResult {
          diagnostics.setOrderIDForThread(i);
          objects[i] = target.serializeToObject(parts[i].get(), options);
          diagnostics.eraseOrderIDForThread();
          return success(objects[i].has_value());
        });
    if (failed(compiled))
      return module.emitError("serialising the kernels of '") << module.getName() << "' to PTX failed";
    std::vector<std::string> texts;
    for (auto &object : objects)
      texts.push_back(StringRef(object->data(), object->size()).rtrim(StringRef("\0", 1)).str());
    std::optional<std::string> joined = joinPtx(texts);
    if (!joined) {
      // Parts that cannot be joined safely (module-level functions, or one name declared two
      // ways): the whole module at once, as gpu-module-to-binary would.
      std::optional<SmallVector<char, 0>> whole = target.serializeToObject(module, options);
      if (!whole)
        return module.emitError("serialising '") << module.getName() << "' to PTX failed";
      joined = StringRef(whole->data(), whole->size()).rtrim(StringRef("\0", 1)).str();
    }
    std::string merged = *joined;
    SmallVector<char, 0> bytes(merged.begin(), merged.end());
    Attribute object = target.createObject(module, bytes, options);
    if (!object)
      return module.emitError("could not create the GPU object");
    OpBuilder builder(module);
    gpu::BinaryOp::create(builder, module.getLoc(), module.getName(), nullptr,
                          builder.getArrayAttr({object}));
    module.erase();
    return success();
  }
};

} // namespace

std::unique_ptr<Pass> mlir::spectra::createSerializeKernelsToPtxPass() {
  return std::make_unique<SerializeKernelsToPtxPass>();
}

std::string mlir::spectra::extractPtx(ModuleOp module) {
  std::string ptx;
  module->walk([&](gpu::BinaryOp binary) {
    for (Attribute a : binary.getObjects()) {
      StringRef text = llvm::cast<gpu::ObjectAttr>(a).getObject().getValue();
      while (!text.empty() && text.back() == '\0')
        text = text.drop_back();
      ptx += text.str();
    }
  });
  return ptx;
}
