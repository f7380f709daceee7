//===- TileBuilder.h - the builders the tile kernels are written with ----===//
//
// What every kernel of the tile layer (TileKernels.cpp: bidirectional, CausalKernels.cpp:
// causal) is written with: TileBuilder emits upstream linalg on static f32 tiles (staging,
// contractions, elementwise bodies, row and column reductions), Scalar the arithmetic inside
// a generic's body, and the helpers that chain a component's derived partials into the
// gradients of q or k, W and the parameters. See TileKernels.h for the kernels and their ABI.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_TILEBUILDER_H
#define SPECTRA_CODEGEN_TILEBUILDER_H

#include "codegen/KernelBuilder.h"
#include "codegen/TileKernels.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>

namespace mlir::spectra::tiles {

/// The static sizes of one feature map's kernels.
struct Dims {
  int64_t T, D, DV, M, K, F, P;
  /// Where W's rows come in blocks of 2 pairs + 1, a zero row, then `pairs` rows P, then -P
  /// (antipodal points: the degree-3 sparse grid's, rotated; `antipodalPairs` in
  /// TileKernels.cpp), and the schedule takes it: the logits X W^T are X P^T, negated for -P,
  /// 0 for the zero row, and the inputs' gradient G W is (G_P - G_-P) P. 0: W dense.
  int64_t pairs = 0;
};

/// Where an operand of a two-dimensional iteration space (i, j) is read.
enum class At { Full, Row, Col };
struct Operand {
  Value buffer;
  At at = At::Full;
};
using Body = function_ref<SmallVector<Value>(OpBuilder &, Location, ValueRange)>;

/// Emits linalg on static f32 tiles; `b` always points where the next op goes.
class TileBuilder : public KernelBuilder {
public:
  TileBuilder(OpBuilder &b, Location loc, ComponentOp component, const Dims &s, Block *entry)
      : KernelBuilder(b, loc, component), s(s), entry(entry) {}

  Type f32Type() { return b.getF32Type(); }
  Value negInf() { return f32(-std::numeric_limits<float>::infinity()); }

  /// A static buffer on the stack, allocated once at function entry.
  Value buffer(ArrayRef<int64_t> shape) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(entry);
    return memref::AllocaOp::create(b, loc, MemRefType::get(shape, f32Type()));
  }
  void fill(Value buf, double value) {
    linalg::FillOp::create(b, loc, ValueRange{f32(value)}, ValueRange{buf});
  }
  /// A static window of a buffer (offsets and sizes per dimension, unit strides).
  Value window(Value buf, ArrayRef<int64_t> offsets, ArrayRef<int64_t> sizes) {
    SmallVector<OpFoldResult> o, z, st;
    for (auto [off, size] : llvm::zip(offsets, sizes)) {
      o.push_back(b.getIndexAttr(off));
      z.push_back(b.getIndexAttr(size));
      st.push_back(b.getIndexAttr(1));
    }
    return memref::SubViewOp::create(b, loc, buf, o, z, st);
  }
  /// Row `row` (dynamic) of a [N, W] buffer as a [1, W] window.
  Value rowOf(Value buf, Value row, int64_t width) {
    SmallVector<OpFoldResult> o = {row, b.getIndexAttr(0)}, z = {b.getIndexAttr(1), b.getIndexAttr(width)},
                              st = {b.getIndexAttr(1), b.getIndexAttr(1)};
    return memref::SubViewOp::create(b, loc, buf, o, z, st);
  }

  /// linalg.generic over the iteration space of `rank` dims with the given iterators.
  void generic(ArrayRef<Operand> ins, ArrayRef<Operand> outs,
               ArrayRef<utils::IteratorType> iterators, Body body) {
    unsigned rank = iterators.size();
    auto mapOf = [&](At at) {
      if (rank == 1)
        return AffineMap::getMultiDimIdentityMap(1, b.getContext());
      AffineExpr i = b.getAffineDimExpr(0), j = b.getAffineDimExpr(1);
      SmallVector<AffineExpr> results = at == At::Full  ? SmallVector<AffineExpr>{i, j}
                                        : at == At::Row ? SmallVector<AffineExpr>{i}
                                                        : SmallVector<AffineExpr>{j};
      return AffineMap::get(2, 0, results, b.getContext());
    };
    SmallVector<Value> inputs, outputs;
    SmallVector<AffineMap> maps;
    for (const Operand &in : ins) {
      inputs.push_back(in.buffer);
      maps.push_back(mapOf(in.at));
    }
    for (const Operand &out : outs) {
      outputs.push_back(out.buffer);
      maps.push_back(mapOf(out.at));
    }
    linalg::GenericOp::create(b, loc, TypeRange{}, inputs, outputs, maps, iterators, "", "",
                              [&](OpBuilder &nb, Location l, ValueRange args) {
                                linalg::YieldOp::create(nb, l, body(nb, l, args));
                              });
  }
  /// Elementwise over the shape of outs (rank 1 or 2, all Full).
  void elementwise(ArrayRef<Operand> ins, ArrayRef<Value> outs, Body body) {
    auto rank = llvm::cast<MemRefType>(outs[0].getType()).getRank();
    SmallVector<Operand> o;
    for (Value v : outs)
      o.push_back({v, At::Full});
    generic(ins, o, SmallVector<utils::IteratorType>(rank, utils::IteratorType::parallel), body);
  }
  /// Reduces over j into outs indexed by i.
  void reduceRows(ArrayRef<Operand> ins, ArrayRef<Value> outs, Body body) {
    SmallVector<Operand> o;
    for (Value v : outs)
      o.push_back({v, At::Row});
    generic(ins, o, {utils::IteratorType::parallel, utils::IteratorType::reduction}, body);
  }
  /// Reduces over i into outs indexed by j.
  void reduceCols(ArrayRef<Operand> ins, ArrayRef<Value> outs, Body body) {
    SmallVector<Operand> o;
    for (Value v : outs)
      o.push_back({v, At::Col});
    generic(ins, o, {utils::IteratorType::reduction, utils::IteratorType::parallel}, body);
  }
  /// C[m, n] += sum_k A[m, k] B[k, n] (A read as A[k, m] when `transposeA`).
  void matmul(Value A, Value B, Value C, bool transposeA = false) {
    AffineExpr m = b.getAffineDimExpr(0), n = b.getAffineDimExpr(1), k = b.getAffineDimExpr(2);
    contraction(A, B, C, transposeA ? SmallVector<AffineExpr>{k, m} : SmallVector<AffineExpr>{m, k},
                {k, n});
  }
  /// C[m, n] += sum_k A[m, k] B[n, k] (both operands contiguous along k: the CPU schedule
  /// makes it dot products, the GPU schedule a thread nest like any contraction).
  void matmulTransposedB(Value A, Value B, Value C) {
    AffineExpr m = b.getAffineDimExpr(0), n = b.getAffineDimExpr(1), k = b.getAffineDimExpr(2);
    contraction(A, B, C, {m, k}, {n, k});
  }
  /// C[m, n] += A[a] B[b] summed over k, A and B indexed by `a` and `b` of (m, n, k).
  void contraction(Value A, Value B, Value C, ArrayRef<AffineExpr> a, ArrayRef<AffineExpr> bIdx) {
    MLIRContext *ctx = b.getContext();
    AffineExpr m = b.getAffineDimExpr(0), n = b.getAffineDimExpr(1);
    SmallVector<AffineMap> maps = {AffineMap::get(3, 0, a, ctx), AffineMap::get(3, 0, bIdx, ctx),
                                   AffineMap::get(3, 0, {m, n}, ctx)};
    linalg::GenericOp::create(
        b, loc, TypeRange{}, ValueRange{A, B}, ValueRange{C}, maps,
        {utils::IteratorType::parallel, utils::IteratorType::parallel, utils::IteratorType::reduction},
        "", "", [](OpBuilder &nb, Location l, ValueRange args) {
          Value prod = arith::MulFOp::create(nb, l, args[0], args[1]);
          linalg::YieldOp::create(nb, l, ValueRange{arith::AddFOp::create(nb, l, args[2], prod)});
        });
  }

  /// X[i, j] = 0 where j > i: the causal mask of a [T, T] tile (row i a query, column j a
  /// key), stored (never multiplied) so that nothing above the diagonal (inf, NaN) leaks.
  void lowerTriangle(Value X) {
    int64_t n = llvm::cast<MemRefType>(X.getType()).getDimSize(0);
    forRange(idx(0), idx(n), [&](Value i) {
      forRange(arith::AddIOp::create(b, loc, i, idx(1)), idx(n),
               [&](Value j) { store(f32(0), X, {i, j}); });
    });
  }
  /// for (t = tiles - 1; t >= 0; --t) body(r0 = t T, rows = min(T, n - r0)): the tiles
  /// last to first (the causal backward's suffix pass).
  void forTilesReversed(Value n, function_ref<void(Value, Value)> body) {
    Value tiles = arith::CeilDivUIOp::create(b, loc, n, idx(s.T));
    auto loop = scf::ForOp::create(b, loc, idx(0), tiles, idx(1));
    loop->setAttr(kTileLoopAttr, b.getUnitAttr());
    loop->setAttr(kTileLoopReversedAttr, b.getUnitAttr());
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value t = arith::SubIOp::create(b, loc, arith::SubIOp::create(b, loc, tiles, idx(1)),
                                    loop.getInductionVar());
    Value r0 = arith::MulIOp::create(b, loc, t, idx(s.T));
    Value rows = arith::MinSIOp::create(b, loc, idx(s.T), arith::SubIOp::create(b, loc, n, r0));
    body(r0, rows);
  }

  /// for (r0 = 0; r0 < n; r0 += T) body(r0, rows = min(T, n - r0)).
  void forTiles(Value n, function_ref<void(Value, Value)> body) {
    auto loop = scf::ForOp::create(b, loc, idx(0), n, idx(s.T));
    loop->setAttr(kTileLoopAttr, b.getUnitAttr());
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value r0 = loop.getInductionVar();
    Value rows = arith::MinSIOp::create(b, loc, idx(s.T), arith::SubIOp::create(b, loc, n, r0));
    body(r0, rows);
  }
  void forRange(Value lb, Value ub, function_ref<void(Value)> body) {
    auto loop = scf::ForOp::create(b, loc, lb, ub, idx(1));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    body(loop.getInductionVar());
  }

  /// Rows [r0, r0 + rows) of src [N, W] into tile [T, W], zeros below them; times
  /// `scale` [W] per column when given (q and k arrive unscaled). Only the rows past the
  /// end are filled: a loop no full tile runs.
  void stage(Value src, Value r0, Value rows, Value tile, int64_t width, Value scale = Value()) {
    int64_t T = llvm::cast<MemRefType>(tile.getType()).getDimSize(0);
    forRange(rows, idx(T), [&](Value i) { fill(rowOf(tile, i, width), 0); });
    copyRows(src, r0, rows, tile, width, scale);
  }
  /// stage(), the whole tile filled first: one loop fewer, for GPU kernels whose registers
  /// are tight (sm_80 bf16: posrf-sgq's causal key backward spills 272 B with stage(), 56 B
  /// with this; the moments kernels take 39 registers for 32, 6 blocks per SM for 8).
  void stageFilled(Value src, Value r0, Value rows, Value tile, int64_t width,
                   Value scale = Value()) {
    fill(tile, 0);
    copyRows(src, r0, rows, tile, width, scale);
  }
  void copyRows(Value src, Value r0, Value rows, Value tile, int64_t width, Value scale) {
    forRange(idx(0), rows, [&](Value i) {
      Value from = rowOf(src, arith::AddIOp::create(b, loc, r0, i), width), to = rowOf(tile, i, width);
      copyRow(from, to, scale);
    });
  }
  /// The first `rows` rows of tile [T, W] into dst [N, W] from row r0, times `scale`.
  void unstage(Value tile, Value r0, Value rows, Value dst, int64_t width, Value scale = Value()) {
    forRange(idx(0), rows, [&](Value i) {
      Value from = rowOf(tile, i, width), to = rowOf(dst, arith::AddIOp::create(b, loc, r0, i), width);
      copyRow(from, to, scale);
    });
  }
  /// Copies a row, converting between the rows' element type (f32, bf16, f16) and the
  /// tiles' f32: q, k, v and dL/dout are widened as they are loaded, outputs and
  /// gradients rounded once as they are stored; the scale multiplies in f32.
  void copyRow(Value from, Value to, Value scale) {
    Type toType = llvm::cast<MemRefType>(to.getType()).getElementType();
    auto convert = [toType](OpBuilder &nb, Location l, Value v) -> Value {
      if (v.getType() == toType)
        return v;
      if (toType.getIntOrFloatBitWidth() > v.getType().getIntOrFloatBitWidth())
        return arith::ExtFOp::create(nb, l, toType, v);
      return arith::TruncFOp::create(nb, l, toType, v);
    };
    if (!scale) {
      elementwise({{from}}, {to}, [&](OpBuilder &nb, Location l, ValueRange a) {
        return SmallVector<Value>{convert(nb, l, a[0])};
      });
      return;
    }
    elementwise({{from}, {scale, At::Col}}, {to}, [&](OpBuilder &nb, Location l, ValueRange a) {
      Value x = a[0].getType() == a[1].getType()
                    ? a[0]
                    : Value(arith::ExtFOp::create(nb, l, a[1].getType(), a[0]));
      return SmallVector<Value>{convert(nb, l, arith::MulFOp::create(nb, l, x, a[1]))};
    });
  }
  /// kept[i] = keep[r0 + i] for i < rows (keep: 1 kept, 0 masked; nullptr: all kept), else 0.
  void stageMask(Value keep, Value r0, Value rows, Value kept) {
    fill(kept, 0);
    forRange(idx(0), rows, [&](Value i) {
      store(keep ? load(keep, {arith::AddIOp::create(b, loc, r0, i)}) : f32(1), kept, {i});
    });
  }

  /// xx = ||x||^2 and L = X W^T of a staged tile, all of L formed (the backward kernels, whose
  /// features come after other products; logitsAndFeatures where they follow at once). With
  /// antipodal weights (Dims::pairs) each block's product takes its P columns only: the -P
  /// columns are their negation (exact: X (-P)^T rounds as -(X P^T)) and the zero row's
  /// logit is 0.
  void logits(Value X, Value Wt, Value L, Value xx) {
    rowNorms(X, xx);
    if (s.pairs == 0) {
      fill(L, 0);
      matmul(X, Wt, L);
      return;
    }
    const int64_t h = s.pairs;
    for (int64_t first = 0; first < s.M; first += 2 * h + 1) {
      fill(window(L, {0, first}, {s.T, 1}), 0);
      Value plus = window(L, {0, first + 1}, {s.T, h});
      fill(plus, 0);
      matmul(X, window(Wt, {0, first + 1}, {s.D, h}), plus);
      elementwise({{plus}}, {window(L, {0, first + 1 + h}, {s.T, h})},
                  [](OpBuilder &nb, Location l, ValueRange a) {
                    return SmallVector<Value>{arith::NegFOp::create(nb, l, a[0])};
                  });
    }
  }

  /// logits(X, Wt, L, xx), then the features that read them: elementwise(ins, outs, body),
  /// where ins[0] is {L}, the other inputs are indexed by the row, by L's column or by both
  /// ([T, M]), and each output is [T, M]. With antipodal weights (Dims::pairs) the features
  /// run per part of each block, so that they stay the product's epilogue (Epilogue.h): the
  /// zero row's column; then one generic over the P product's logits that writes the P
  /// columns' outputs from them and the -P columns' from them negated (the body runs twice,
  /// its operands' windows for each part). L itself is written only where `keepLogits` asks
  /// for it (something past the features reads L); otherwise the logits live in buffers of
  /// their own, one per block, which only the product and its epilogue touch.
  void logitsAndFeatures(Value X, Value Wt, Value L, Value xx, ArrayRef<Operand> ins,
                         ArrayRef<Value> outs, Body body, bool keepLogits = false);

  /// xx = ||x||^2 of each row of a staged tile.
  void rowNorms(Value X, Value xx) {
    fill(xx, 0);
    reduceRows({{X}}, {xx}, [](OpBuilder &nb, Location l, ValueRange a) {
      Value sq = arith::MulFOp::create(nb, l, a[0], a[0]);
      return SmallVector<Value>{arith::AddFOp::create(nb, l, a[1], sq)};
    });
  }

  /// Feature f's window of a [F] or [F, W] buffer for output o.
  Value outputRows(Value buf, unsigned o) {
    auto type = llvm::cast<MemRefType>(buf.getType());
    if (type.getRank() == 1)
      return window(buf, {o * s.M}, {s.M});
    return window(buf, {o * s.M, 0}, {s.M, type.getDimSize(1)});
  }
  /// Output o's columns of a [W, F] buffer.
  Value outputCols(Value buf, unsigned o) {
    int64_t rows = llvm::cast<MemRefType>(buf.getType()).getDimSize(0);
    return window(buf, {0, o * s.M}, {rows, s.M});
  }

  const Dims &s;
  Block *entry;
};

/// Scalar arithmetic inside a generic's body.
struct Scalar {
  OpBuilder &b;
  Location l;
  Value add(Value x, Value y) { return arith::AddFOp::create(b, l, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, l, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, l, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, l, x, y); }
  Value exp(Value x) { return math::ExpOp::create(b, l, x); }
  /// exp(x) for x at most 0 or NaN (a stabilised exponent: a logit less a constant at least
  /// as large), marked so that the CPU's expansion drops its overflow clamp.
  Value expAtMostZero(Value x) {
    auto e = math::ExpOp::create(b, l, x);
    e->setAttr(kExpAtMostZeroAttr, b.getUnitAttr());
    return e;
  }
  Value abs(Value x) { return math::AbsFOp::create(b, l, x); }
  Value neg(Value x) { return arith::NegFOp::create(b, l, x); }
  Value max(Value x, Value y) { return arith::MaximumFOp::create(b, l, x, y); }
  Value c(double v) { return arith::ConstantOp::create(b, l, b.getF32FloatAttr(static_cast<float>(v))); }
  Value select(Value cond, Value x, Value y) { return arith::SelectOp::create(b, l, cond, x, y); }
  Value cmp(arith::CmpFPredicate p, Value x, Value y) { return arith::CmpFOp::create(b, l, p, x, y); }
  Value positive(Value x) { return cmp(arith::CmpFPredicate::OGT, x, c(0)); }
  /// 0 x v: 0 where v is finite, NaN where it is not (the kernels' input check adds it to a
  /// value the runtime reads anyway).
  Value mark(Value v) { return mul(v, c(0)); }
};

/// Output o's coefficient when it depends on no element (KernelBuilder::coefficientsVary):
/// the features inlined with `any` for wx, xx and ww; the logits they also build are dead
/// and canonicalisation removes them.
Value invariantCoefficient(OpBuilder &b, Location loc, ComponentOp component, Value any,
                           ArrayRef<Value> params, int64_t o);

/// Per scalar parameter of the component's params region, whether it depends on a statistic
/// of the inputs (`spectra.statistic`). The others are functions of m, d and options only,
/// constants of the compile: nothing upstream of them takes a gradient, so the backward
/// kernels leave their share of dparams 0 (OPRF's and SADERF's coefficient m^(-1/2), every
/// parameter of PosRF, GERF, TrigRF).
SmallVector<bool> parametersWithGradient(ComponentOp component);
/// Whether the input scales (query_scale, key_scale) depend on a statistic: only then do
/// the backward kernels accumulate dqscale and dkscale (SADERF's Psi, HCEXP's A; otherwise
/// the scale is d^(-1/4), a constant, and they stay 0).
bool scalesWithGradient(ComponentOp component);

/// Which arguments (wx, xx, ww, params...) take a gradient: those the features depend on
/// (a derived partial that is not the constant 0 for some output), parameters only where
/// parametersWithGradient says so. The others get no gradient tile (PosRF's logit does not
/// depend on ||w||^2: no dW ||w||^2 term; OPRF's coefficient is a constant: no column sums
/// for it). wx and xx always count: their tiles feed dq/dk, also when their sum is zero
/// (a component whose features ignore ||x||^2).
SmallVector<bool> usedArguments(ComponentOp component, FeaturePartialsOp partials,
                                unsigned outputs, unsigned args);
/// k where the ||x||^2 term of every output's chain is k times its w.x term: each output's
/// d logit / d xx and d logit / d wx constants in the same ratio k, and its coefficient
/// independent of both (PosRF: one output, k = -1/2; not PosRF-Hyp, whose two outputs
/// have ratios -1/2 and 1/2). The xx gradient is then k times the row sums of the wx
/// gradient's tile and needs no tile of its own.
std::optional<double> dxxPerDwx(FeaturePartialsOp partials, unsigned outputs, unsigned args);

/// An argument's gradient that needs no tile of its own. Its chained term is base x f, with
/// base = a phi or a e (the one derived partial of the two that is not 0 says which) and f
/// that partial, read from ww and the parameters at most (not from wx or xx), and its tile
/// would only be reduced: along the rows for ||w||^2 and the parameters (sum_n base_nf f_f =
/// f_f sum_n base_nf) and, for an f that reads no element, along the features for ||x||^2
/// (sum_f base_nf f = f sum_f base_nf) and for wx (dx = f (base W), dW = f base^T x). The
/// backward kernels then keep one tile per base and apply f to its sums or products:
/// SADERF's query_backward writes 4 tiles per element where it wrote 8.
struct FactoredGradient {
  unsigned base;     // 0: a phi, 1: a e
  unsigned partial;  // the partial's index in the feature_partials yield
  bool column;       // f reads ww (varies along the features)
};
/// Per argument (wx, xx, ww, params...), its FactoredGradient where it has one. Only for a
/// single output (the bases are per output). wx's tile is reduced along the features (dx =
/// dwx W) and the rows (dW += dwx^T x), so its factor must read no element: dx and dW are
/// then formed from the base tile and scaled after. `ratio`: dxxPerDwx applies (PosRF), and
/// wx and ||x||^2 keep that form.
SmallVector<std::optional<FactoredGradient>> factoredArguments(FeaturePartialsOp partials,
                                                               unsigned outputs, unsigned args,
                                                               bool ratio);


/// Chains dL/dphi_o = a_o of each output into (d wx, d xx, d ww, d params) of one feature:
/// phi' = phi dlogit + e dcoeff with e = phi / coeff (the shifted, scaled exponential).
/// Arguments not `used` are left null.
struct Chained {
  Value dwx, dxx, dww;
  SmallVector<Value> dparams;
  /// Output 0's a phi and a e where the chain formed them (the factored gradients' bases).
  Value aphi, ae;
};
Chained chain(KernelBuilder &kb, Scalar &x, FeaturePartialsOp partials, ArrayRef<bool> used,
              Value wx, Value xx, Value ww, ArrayRef<Value> params, ArrayRef<Value> coeffs,
              ArrayRef<Value> e, ArrayRef<Value> a);

/// A kernel function: arguments, entry block, and the loaded parameters.
struct Kernel {
  func::FuncOp fn;
  Block *entry;
  SmallVector<Value> params;
  Value arg(unsigned i) { return entry->getArgument(i); }
};

/// One kernel argument: its type, name and role (TileKernels.h, "The kernel ABI"), and
/// whether the runtime may pass it as the same buffer as another argument so marked
/// (kMayAliasArgAttr, SpectraDialect.h).
struct Arg {
  Type type;
  StringRef name;
  StringRef role;
  bool mayAlias = false;
};

/// A kernel function with its ABI attributes (TileKernels.h, "The kernel ABI"); the first
/// `numParams` entries of the `paramsArg` argument are loaded at entry.
Kernel makeKernel(OpBuilder &b, Location loc, StringRef name, StringRef kind, StringRef grid,
                  ArrayRef<Arg> args, unsigned paramsArg, unsigned numParams);

/// Memref types of the kernel arguments.
struct Types {
  MemRefType rows, values, mask, Wt, W, ww, params, S, St, f, qstat, scale;
  MemRefType flag;  // memref<1xf32>: a switch the runtime sets (1: on, 0: off)
  MemRefType Sp, fp, Wp, paramsp, Dp;  // per-chunk partials, [C, ...] (combine kernels)
  Types(MLIRContext *ctx, const Dims &s, Type input) {
    Type f32 = Float32Type::get(ctx);
    int64_t dyn = ShapedType::kDynamic;
    rows = MemRefType::get({dyn, s.D}, input);
    values = MemRefType::get({dyn, s.DV}, input);
    Sp = MemRefType::get({dyn, s.F, s.DV}, f32);
    fp = MemRefType::get({dyn, s.F}, f32);
    Wp = MemRefType::get({dyn, s.M, s.D}, f32);
    Dp = MemRefType::get({dyn, s.D}, f32);
    paramsp = MemRefType::get({dyn, s.P}, f32);
    mask = MemRefType::get({dyn}, f32);
    Wt = MemRefType::get({s.D, s.M}, f32);
    W = MemRefType::get({s.M, s.D}, f32);
    ww = MemRefType::get({s.M}, f32);
    params = MemRefType::get({s.P}, f32);
    S = MemRefType::get({s.F, s.DV}, f32);
    St = MemRefType::get({s.DV, s.F}, f32);
    f = MemRefType::get({s.F}, f32);
    qstat = MemRefType::get({dyn, 3}, f32);
    scale = MemRefType::get({s.D}, f32);
    flag = MemRefType::get({1}, f32);
  }
};

/// Buffers both backward kernels share: the partial-derivative tiles and the
/// accumulators of dW's ||w||^2 term and of dparams.
/// (The ||w||^2 and parameter tiles only for arguments the features depend on;
/// null otherwise.)
struct GradientTiles {
  SmallVector<bool> used;  // per argument (wx, xx, ww, params...)
  /// dxxPerDwx: when set, dxx is null and the xx gradient's row sums are k times dwx's.
  std::optional<double> dxxScale;
  Value dwx, dxx, dww, dxxRow, dwwAcc, dx;
  SmallVector<Value> dp, dpAcc;  // per parameter: the tile's terms [T, M] and their column sums [M]
  /// Per argument: its factored gradient (no tile in dxx, dww or dp), else nullopt.
  SmallVector<std::optional<FactoredGradient>> factored;
  /// The factored gradients' bases [T, M] (a phi, a e; null where none uses one), their
  /// column sums over the tiles [M] (null where no column-reduced argument uses the base),
  /// and whether only ||w||^2 uses those sums (then formed only where dW is wanted).
  Value base[2], baseCols[2];
  bool baseColsForWOnly[2] = {true, true};
  /// What the factors are evaluated from: the partials, the loaded parameters and the
  /// kernel's ww argument [M]; and ||x||^2's factor, a scalar formed at kernel entry.
  FeaturePartialsOp partials;
  SmallVector<Value> params;
  Value ww, xxFactor;
  /// wx's factor where it is factored (dwx is then the base tile, not wx's term), else null.
  Value dwxFactor;
  /// An i1: whether dW is wanted (the `wgrad` argument; null: always). Without it the dW
  /// product and its ||w||^2 term are skipped, a branch every thread of a GPU block takes
  /// alike, and the dW partials are not written.
  Value weightGrad;
  /// The chain generic's gradient outputs, in order (dwx unless factored, dxx, ww's and the
  /// parameters' unless factored, then the bases).
  SmallVector<Value> outputs() const {
    SmallVector<Value> out;
    if (!dwxFactor)
      out.push_back(dwx);
    if (dxx)
      out.push_back(dxx);
    if (dww)
      out.push_back(dww);
    for (Value p : dp)
      if (p)
        out.push_back(p);
    for (Value b : base)
      if (b)
        out.push_back(b);
    return out;
  }
  /// The chained values for those outputs.
  SmallVector<Value> values(const Chained &c, function_ref<Value(Value)> keep) const {
    SmallVector<Value> out;
    if (!dwxFactor)
      out.push_back(keep(c.dwx));
    if (dxx)
      out.push_back(keep(c.dxx));
    if (dww)
      out.push_back(keep(c.dww));
    for (auto [p, v] : llvm::zip(dp, c.dparams))
      if (p)
        out.push_back(keep(v));
    if (base[0])
      out.push_back(keep(c.aphi));
    if (base[1])
      out.push_back(keep(c.ae));
    return out;
  }
};
/// With `factored` (factoredArguments), those arguments get no tile but a base; `partials`,
/// `params` and `ww` are what their factors are formed from.
GradientTiles gradientTiles(TileBuilder &tb, const Dims &s, ArrayRef<bool> used,
                            std::optional<double> dxxScale = std::nullopt,
                            ArrayRef<std::optional<FactoredGradient>> factored = {},
                            FeaturePartialsOp partials = {}, ArrayRef<Value> params = {},
                            Value ww = {});

/// After the chain generic of a tile: dx = dwx W + 2 dxx x (into the tile `g.dx`; wx's
/// factor scales the product where it is factored), dW += dwx^T x, and the column sums of the
/// ||w||^2 and parameter terms, or of the bases where those are factored.
void accumulateGradients(TileBuilder &tb, const Dims &s, GradientTiles &g, Value X, Value W,
                         Value dW);

/// The backward kernels' `wgrad` argument (memref<1xf32>, set by the runtime from whether W
/// requires a gradient) as an i1: wgrad[0] != 0.
Value weightGradFlag(TileBuilder &tb, Value wgrad);
/// Runs `body` under scf.if on `flag` (an i1 from weightGradFlag); directly when null.
void ifWeightGrad(TileBuilder &tb, Value flag, function_ref<void()> body);

/// dW += 2 ww-term W and dparams = the accumulated sums (once per call).
void finishGradients(TileBuilder &tb, const Dims &s, GradientTiles &g, Value W, Value dW,
                     Value dparams);

/// The input scale's gradient of a tile, sum_n dx_n x_n per column for dx with respect to
/// the scaled rows x (staged: their scale already applied; padded rows are 0). The runtime
/// divides by the scale: dL/dscale_c = sum_n dL/dx_nc raw_nc = sum_n dx_nc x_nc / scale_c.
/// Nothing where the scale is a constant (scalesWithGradient): `acc` keeps its 0.
void scaleGradient(TileBuilder &tb, Value dx, Value X, Value acc);

/// Chunk `c` (dynamic) of a [C, ...] partial buffer as a static window of the rest.
Value chunkOf(TileBuilder &tb, Value buf, Value c);

/// Sums `parts` [R, ...] over R in order 0, 1, ... into `total` [...].
void sumChunks(TileBuilder &tb, Value parts, Value total);

/// The causal kernels (CausalKernels.cpp) of the feature map `map` with its component:
/// causal_prefix and causal_readout (after the keys' `kv`), and the backward's
/// causal_query_backward and causal_key_backward.
void buildCausalForward(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                        const Types &t, StringRef map, unsigned numParams);
/// causal_decode: causal_readout on one-row tiles (no split), for decoding one token at a
/// time from a carried state (the runtime's prefill/decode).
void buildCausalDecode(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                       const Types &t, StringRef map, unsigned numParams);
void buildCausalBackward(OpBuilder &b, Location loc, ComponentOp component,
                         FeaturePartialsOp partials, const Dims &s, const Types &t, StringRef map,
                         unsigned numParams);

/// <map>_moments_params and <map>_moments_params_backward (ParamsKernels.cpp): the params
/// program from the moments, and its adjoint. Failure (after a diagnostic, nothing added)
/// where the program has an op the kernels do not lower or differentiate.
LogicalResult buildParamsKernels(OpBuilder &b, Location loc, FeatureMapOp map,
                                 ComponentOp component, const Dims &s, const Types &t);

} // namespace mlir::spectra::tiles

#endif // SPECTRA_CODEGEN_TILEBUILDER_H
