//===- TileKernels.cpp - the fused kernels as linalg on static tiles ------===//

#include "codegen/TileKernels.h"
#include "codegen/TileBuilder.h"
#include "codegen/spectra_compiler.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <functional>
#include <limits>

using namespace mlir;
using namespace mlir::spectra;

namespace {

using namespace mlir::spectra::tiles;


void buildKv(OpBuilder &b, Location loc, ComponentOp component, const Dims &s, const Types &t,
             StringRef name, unsigned numParams) {
  Kernel k = makeKernel(b, loc, name, "kv", "keys",
                        {{t.rows, "k", "rows"}, {t.values, "v", "rows"}, {t.mask, "keep", "mask"},
                         {t.Wt, "Wt", "shared"}, {t.ww, "ww", "shared"},
                         {t.ww, "rowscale", "shared"}, {t.params, "params", "slice"},
                         {t.S, "S", "partial"}, {t.f, "z", "partial"}, {t.f, "zabs", "partial"},
                         {t.f, "c", "partial"}, {t.scale, "kscale", "slice"}},
                        6, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value K = k.arg(0), V = k.arg(1), keep = k.arg(2), Wt = k.arg(3), ww = k.arg(4),
        rowscale = k.arg(5), S = k.arg(7), z = k.arg(8), zabs = k.arg(9), c = k.arg(10),
        kscale = k.arg(11);
  // Coefficients that do not vary by element are formed where phi is, not kept in tiles.
  bool varying = KernelBuilder(b, loc, component).coefficientsVary();
  tb.fill(S, 0);
  tb.fill(z, 0);
  if (varying)
    tb.fill(zabs, 0);
  tb.fill(c, -std::numeric_limits<double>::infinity());
  Value Kt = tb.buffer({s.T, s.D}), Vt = tb.buffer({s.T, s.DV}), kept = tb.buffer({s.T});
  Value L = tb.buffer({s.T, s.M}), xx = tb.buffer({s.T}), tmax = tb.buffer({s.M}),
        r = tb.buffer({s.M}), cf = tb.buffer({s.M}), phi = tb.buffer({s.T, s.M}),
        kmark = tb.buffer({1});
  tb.fill(kmark, 0);
  SmallVector<Value> logit, coeff, scaleBy;
  for (int64_t o = 0; o < s.K; ++o) {
    logit.push_back(tb.buffer({s.T, s.M}));
    if (varying)
      coeff.push_back(tb.buffer({s.T, s.M}));
  }
  // Each feature's factor after the exp: coeff rowscale where the coefficient is invariant
  // (one multiply per element, which the CPU exp folds into its last step), else rowscale.
  // Formed once per launch; it must be finite (a masked key's phi is exp(-inf) = 0 times it).
  for (int64_t o = 0; o < s.K; ++o) {
    if (varying) {
      scaleBy.push_back(rowscale);
      continue;
    }
    scaleBy.push_back(tb.buffer({s.M}));
    tb.elementwise({{rowscale}}, {scaleBy.back()}, [&](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      return SmallVector<Value>{x.mul(invariantCoefficient(nb, l, component, a[0], k.params, o),
                                      a[0])};
    });
  }
  tb.forTiles(tb.dim(K, 0), [&](Value r0, Value rows) {
    tb.stage(K, r0, rows, Kt, s.D, kscale);
    tb.stage(V, r0, rows, Vt, s.DV);
    tb.stageMask(keep, r0, rows, kept);
    // The features of the tile; masked (and padded) keys' logits become -inf.
    SmallVector<Value> outs;
    for (int64_t o = 0; o < s.K; ++o) {
      outs.push_back(logit[o]);
      if (varying)
        outs.push_back(coeff[o]);
    }
    tb.logitsAndFeatures(Kt, Wt, L, xx, {{L}, {xx, At::Row}, {ww, At::Col}, {kept, At::Row}},
                         outs, [&](OpBuilder &nb, Location l, ValueRange a) {
                           KernelBuilder kb(nb, l, component);
                           Scalar x{nb, l};
                           auto [logits, coeffs] = kb.features(a[0], a[1], a[2], k.params);
                           SmallVector<Value> y;
                           for (int64_t o = 0; o < s.K; ++o) {
                             y.push_back(x.select(x.positive(a[3]), logits[o], x.c(-INFINITY)));
                             if (varying)
                               y.push_back(coeffs[o]);
                           }
                           return y;
                         });
    for (int64_t o = 0; o < s.K; ++o) {
      Value So = tb.outputRows(S, o), zo = tb.outputRows(z, o), zabso = tb.outputRows(zabs, o),
            co = tb.outputRows(c, o);
      // Raise each feature's constant to the tile's largest logit; what was accumulated
      // relative to the old constant is rescaled by r = exp(old - new) (1 where unchanged).
      tb.fill(tmax, -std::numeric_limits<double>::infinity());
      tb.reduceCols({{logit[o]}}, {tmax}, [](OpBuilder &nb, Location l, ValueRange a) {
        return SmallVector<Value>{arith::MaximumFOp::create(nb, l, a[0], a[1])};
      });
      // cf: the constant the exps subtract, c_f with -inf made 0 (no kept key has reached
      // the feature yet: its logits are all -inf, and exp(-inf - 0) = 0 needs no select).
      tb.elementwise({{tmax}}, {co, r, cf}, [](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        Value raised = x.max(a[1], a[0]);
        Value same = x.cmp(arith::CmpFPredicate::OEQ, a[1], raised);
        Value reached = x.cmp(arith::CmpFPredicate::UNE, raised, x.c(-INFINITY));
        return SmallVector<Value>{raised, x.select(same, x.c(1), x.expAtMostZero(x.sub(a[1], raised))),
                                  x.select(reached, raised, x.c(0))};
      });
      tb.elementwise({{r, At::Row}}, {So}, [](OpBuilder &nb, Location l, ValueRange a) {
        return SmallVector<Value>{arith::MulFOp::create(nb, l, a[1], a[0])};
      });
      // zabs is z's own sum of |phi| only where the coefficient varies (see below).
      SmallVector<Value> sums = {zo};
      if (varying)
        sums.push_back(zabso);
      tb.elementwise({{r}}, sums, [](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        SmallVector<Value> y;
        for (Value v : a.drop_front())
          y.push_back(x.mul(v, a[0]));
        return y;
      });
      // phi = coeff exp(l - c_f) rowscale: masked and padded keys' l = -inf gives exp 0
      // against the finite cf (c_f >= every finite l of the feature), so no select where the
      // coefficient is invariant. A varying coefficient comes from the key's own data, which
      // a masked key may hold as inf or NaN: that product is selected (never multiplied) to 0.
      SmallVector<Operand> phiIns = {{logit[o]}, {cf, At::Col}, {scaleBy[o], At::Col}};
      if (varying)
        phiIns.push_back({coeff[o]});
      tb.elementwise(phiIns, {phi}, [&](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        Value p = x.mul(x.expAtMostZero(x.sub(a[0], a[1])), a[2]);
        if (!varying)
          return SmallVector<Value>{p};
        Value live = x.cmp(arith::CmpFPredicate::UNE, a[0], x.c(-INFINITY));
        return SmallVector<Value>{x.select(live, x.mul(a[3], p), x.c(0))};
      });
      tb.matmul(phi, Vt, So, /*transposeA=*/true);
      tb.reduceCols({{phi}}, sums, [](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        SmallVector<Value> y = {x.add(a[1], a[0])};
        if (a.size() > 2)
          y.push_back(x.add(a[2], x.abs(a[0])));
        return y;
      });
    }
    // The input check (q, k and v finite) rides on the kernels: kmark += 0 x ||k||^2 over
    // the tile's rows, NaN from any inf or NaN in k, kept or masked (after the features and
    // the sums, where it leaves a GPU warp chain whole).
    tb.reduceCols({{xx, At::Row}}, {kmark}, [](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      return SmallVector<Value>{x.add(a[1], x.mark(a[0]))};
    });
  });
  // With an invariant coefficient every phi of feature f has the sign of its factor
  // scaleBy_f (exp is positive, each rescale r > 0), so sum |phi| = |sum phi| exactly
  // (rounding is symmetric in the sign): zabs = |z|, one pass over F values per launch in
  // place of an abs and an add per element. The chunks' combine keeps this (its weights are
  // positive and every chunk's z_f has the same sign).
  for (int64_t o = 0; o < s.K; ++o) {
    if (!varying)
      tb.elementwise({{tb.outputRows(z, o)}}, {tb.outputRows(zabs, o)},
                     [](OpBuilder &nb, Location l, ValueRange a) {
                       return SmallVector<Value>{Scalar{nb, l}.abs(a[0])};
                     });
    // The input check, per launch: zabs_f += 0 x S_f (NaN from any inf or NaN in v, kept or
    // masked: 0 x inf is NaN whatever phi is) + kmark. The readout passes it on to the
    // queries' guard counts.
    tb.reduceRows({{tb.outputRows(S, o)}}, {tb.outputRows(zabs, o)},
                  [](OpBuilder &nb, Location l, ValueRange a) {
                    Scalar x{nb, l};
                    return SmallVector<Value>{x.add(a[1], x.mark(a[0]))};
                  });
    tb.reduceRows({{kmark, At::Col}}, {tb.outputRows(zabs, o)},
                  [](OpBuilder &nb, Location l, ValueRange a) {
                    return SmallVector<Value>{Scalar{nb, l}.add(a[1], a[0])};
                  });
  }
  func::ReturnOp::create(b, loc);
}

void buildReadout(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                  const Types &t, StringRef name, unsigned numParams) {
  Kernel k = makeKernel(b, loc, name, "readout", "queries",
                        {{t.rows, "q", "rows"}, {t.Wt, "Wt", "shared"}, {t.ww, "ww", "shared"},
                         {t.params, "params", "slice"}, {t.S, "S", "slice"}, {t.f, "z", "slice"},
                         {t.f, "zabs", "slice"}, {t.f, "c", "slice"}, {t.values, "out", "rows"},
                         {t.qstat, "qstat", "rows"}, {t.scale, "qscale", "slice"}},
                        3, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value Q = k.arg(0), Wt = k.arg(1), ww = k.arg(2), S = k.arg(4), z = k.arg(5), zabs = k.arg(6),
        c = k.arg(7), out = k.arg(8), qstat = k.arg(9), qscale = k.arg(10);
  Value Qt = tb.buffer({s.T, s.D}), L = tb.buffer({s.T, s.M}), xx = tb.buffer({s.T}),
        Mq = tb.buffer({s.T}), acc = tb.buffer({s.T, s.DV}), den = tb.buffer({s.T}),
        total = tb.buffer({s.T}), guarded = tb.buffer({s.T}), fired = tb.buffer({s.T}),
        inverse = tb.buffer({s.T});
  bool varying = KernelBuilder(b, loc, component).coefficientsVary();
  SmallVector<Value> logit, coeff, phi, zsigned;
  for (int64_t o = 0; o < s.K; ++o) {
    logit.push_back(tb.buffer({s.T, s.M}));
    if (varying)
      coeff.push_back(tb.buffer({s.T, s.M}));
    phi.push_back(tb.buffer({s.T, s.M}));
  }
  // The guard's total sums |phi_f| zabs_f. With an invariant coefficient co every phi of
  // output o has co's sign, so |phi_f| zabs_f = phi_f (sign(co) zabs_f) exactly: zabs
  // signed once per launch, and no abs per element.
  if (!varying)
    for (int64_t o = 0; o < s.K; ++o) {
      zsigned.push_back(tb.buffer({s.M}));
      tb.elementwise({{tb.outputRows(zabs, o)}}, {zsigned.back()},
                     [&](OpBuilder &nb, Location l, ValueRange a) {
                       Scalar x{nb, l};
                       Value co = invariantCoefficient(nb, l, component, a[0], k.params, o);
                       Value negative = x.cmp(arith::CmpFPredicate::OLT, co, x.c(0));
                       return SmallVector<Value>{x.select(negative, x.neg(a[0]), a[0])};
                     });
    }
  tb.forTiles(tb.dim(Q, 0), [&](Value r0, Value rows) {
    tb.stage(Q, r0, rows, Qt, s.D, qscale);
    // Feature f's query logit carries its key constant: l + c_f.
    SmallVector<Operand> ins = {{L}, {xx, At::Row}, {ww, At::Col}};
    SmallVector<Value> outs;
    for (int64_t o = 0; o < s.K; ++o) {
      ins.push_back({tb.outputRows(c, o), At::Col});
      outs.push_back(logit[o]);
      if (varying)
        outs.push_back(coeff[o]);
    }
    tb.logitsAndFeatures(Qt, Wt, L, xx, ins, outs, [&](OpBuilder &nb, Location l, ValueRange a) {
      KernelBuilder kb(nb, l, component);
      Scalar x{nb, l};
      auto [logits, coeffs] = kb.features(a[0], a[1], a[2], k.params);
      SmallVector<Value> y;
      for (int64_t o = 0; o < s.K; ++o) {
        y.push_back(x.add(logits[o], a[3 + o]));
        if (varying)
          y.push_back(coeffs[o]);
      }
      return y;
    });
    // The query constant M = max over features and outputs, then phi = coeff exp(l - M).
    tb.fill(Mq, -std::numeric_limits<double>::infinity());
    for (int64_t o = 0; o < s.K; ++o)
      tb.reduceRows({{logit[o]}}, {Mq}, [](OpBuilder &nb, Location l, ValueRange a) {
        return SmallVector<Value>{arith::MaximumFOp::create(nb, l, a[0], a[1])};
      });
    tb.fill(acc, 0);
    tb.fill(den, 0);
    tb.fill(total, 0);
    for (int64_t o = 0; o < s.K; ++o) {
      SmallVector<Operand> phiIns = {{logit[o]}, {Mq, At::Row}};
      if (varying)
        phiIns.push_back({coeff[o]});
      tb.elementwise(phiIns, {phi[o]}, [&](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        Value co = varying ? a[2] : invariantCoefficient(nb, l, component, a[0], k.params, o);
        return SmallVector<Value>{x.mul(co, x.expAtMostZero(x.sub(a[0], a[1])))};
      });
      tb.matmul(phi[o], tb.outputRows(S, o), acc);
      Value guardBy = varying ? tb.outputRows(zabs, o) : zsigned[o];
      tb.reduceRows({{phi[o]}, {tb.outputRows(z, o), At::Col}, {guardBy, At::Col}}, {den, total},
                    [&](OpBuilder &nb, Location l, ValueRange a) {
                      Scalar x{nb, l};
                      Value magnitude = varying ? x.abs(a[0]) : a[0];
                      return SmallVector<Value>{x.add(a[3], x.mul(a[0], a[1])),
                                                x.add(a[4], x.mul(magnitude, a[2]))};
                    });
    }
    // The denominator guard (SPECTRA_DENOMINATOR_GUARD): fires unless |den| > guard * T
    // (an unordered compare fires it for NaN too).
    // The output is the numerator times the guarded denominator's reciprocal, one division
    // per row where dividing each element took one per DV values (a vector division is 10-16
    // cycles on the CPU cores measured: 4% of the readout).
    tb.elementwise({{den}, {total}}, {guarded, fired, inverse},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     Value eps = x.mul(x.c(SPECTRA_DENOMINATOR_GUARD), a[1]);
                     Value fire = x.cmp(arith::CmpFPredicate::ULE, x.abs(a[0]), eps);
                     Value g = x.select(fire, x.add(a[0], x.mul(x.c(2), eps)), a[0]);
                     return SmallVector<Value>{g, x.select(fire, x.c(1), x.c(0)), x.div(x.c(1), g)};
                   });
    tb.elementwise({{inverse, At::Row}}, {acc}, [](OpBuilder &nb, Location l, ValueRange a) {
      return SmallVector<Value>{arith::MulFOp::create(nb, l, a[1], a[0])};
    });
    tb.unstage(acc, r0, rows, out, s.DV);
    // The guard's count carries the input check: 0 x (||q||^2 + the guarded denominator) is
    // NaN where the query's row is not finite, or where k or v were not (zabs NaN makes the
    // guard fire with a NaN denominator); the runtime sums the counts anyway.
    tb.forRange(tb.idx(0), rows, [&](Value i) {
      Scalar x{b, loc};
      Value n = arith::AddIOp::create(b, loc, r0, i);
      Value g = tb.load(guarded, {i});
      tb.store(tb.load(Mq, {i}), qstat, {n, tb.idx(0)});
      tb.store(g, qstat, {n, tb.idx(1)});
      Value mark = x.mark(x.add(tb.load(xx, {i}), g));
      tb.store(x.add(tb.load(fired, {i}), mark), qstat, {n, tb.idx(2)});
    });
  });
  func::ReturnOp::create(b, loc);
}

/// The gradient tiles of the bidirectional backward kernels: no ||x||^2 tile where
/// dxxPerDwx applies, and no tile for the arguments factoredArguments factors.
GradientTiles backwardGradientTiles(TileBuilder &tb, const Dims &s, FeaturePartialsOp partials,
                                    ArrayRef<Value> params, Value ww) {
  unsigned args = 3 + params.size();
  std::optional<double> ratio = dxxPerDwx(partials, s.K, args);
  return gradientTiles(tb, s, usedArguments(tb.component, partials, s.K, args), ratio,
                       factoredArguments(partials, s.K, args, ratio.has_value()), partials, params, ww);
}

void buildQueryBackward(OpBuilder &b, Location loc, ComponentOp component, FeaturePartialsOp partials,
                        const Dims &s, const Types &t, StringRef name, unsigned numParams) {
  Kernel k = makeKernel(b, loc, name, "query_backward", "queries",
                        {{t.rows, "q", "rows"}, {t.Wt, "Wt", "shared"}, {t.W, "W", "shared"},
                         {t.ww, "ww", "shared"}, {t.params, "params", "slice"},
                         {t.S, "S", "slice"}, {t.St, "St", "slice"}, {t.f, "z", "slice"},
                         {t.f, "c", "slice"}, {t.values, "out", "rows"},
                         {t.values, "gout", "rows"}, {t.qstat, "qstat", "rows"},
                         {t.rows, "dq", "rows"}, {t.S, "dS", "partial"}, {t.f, "dz", "partial"},
                         {t.W, "dW", "partial"}, {t.params, "dparams", "partial"},
                         {t.scale, "qscale", "slice"}, {t.scale, "dqscale", "partial"},
                         {t.flag, "wgrad", "shared"}},
                        4, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value Q = k.arg(0), Wt = k.arg(1), W = k.arg(2), ww = k.arg(3), St = k.arg(6), z = k.arg(7),
        c = k.arg(8), out = k.arg(9), gout = k.arg(10), qstat = k.arg(11), dq = k.arg(12),
        dS = k.arg(13), dz = k.arg(14), dW = k.arg(15), dparams = k.arg(16), qscale = k.arg(17),
        dqscale = k.arg(18);
  tb.fill(dS, 0);
  tb.fill(dqscale, 0);
  tb.fill(dz, 0);
  Value wantW = weightGradFlag(tb, k.arg(19));
  ifWeightGrad(tb, wantW, [&] { tb.fill(dW, 0); });
  Value Qt = tb.buffer({s.T, s.D}), Gt = tb.buffer({s.T, s.DV}), Ot = tb.buffer({s.T, s.DV}),
        L = tb.buffer({s.T, s.M}), xx = tb.buffer({s.T}), Mq = tb.buffer({s.T}),
        rden = tb.buffer({s.T}), gdot = tb.buffer({s.T});
  SmallVector<Value> gS, P;
  for (int64_t o = 0; o < s.K; ++o) {
    gS.push_back(tb.buffer({s.T, s.M}));
    P.push_back(tb.buffer({s.T, s.M}));
  }
  GradientTiles g = backwardGradientTiles(tb, s, partials, k.params, ww);
  g.weightGrad = wantW;
  tb.forTiles(tb.dim(Q, 0), [&](Value r0, Value rows) {
    tb.stage(Q, r0, rows, Qt, s.D, qscale);
    tb.stage(gout, r0, rows, Gt, s.DV);
    tb.stage(out, r0, rows, Ot, s.DV);
    // The forward's constant M and guarded denominator per query. Past the rows M = +inf
    // and 1/den = 0: there e = exp(l + c - M) = 0 and a = 0 (g and g.out are 0 too), so the
    // products of those rows are 0 wherever the component is finite at a zero query.
    tb.fill(Mq, std::numeric_limits<double>::infinity());
    tb.fill(rden, 0);
    tb.forRange(tb.idx(0), rows, [&](Value i) {
      Value n = arith::AddIOp::create(b, loc, r0, i);
      tb.store(tb.load(qstat, {n, tb.idx(0)}), Mq, {i});
      tb.store(arith::DivFOp::create(b, loc, tb.f32(1), tb.load(qstat, {n, tb.idx(1)})), rden, {i});
    });
    tb.logits(Qt, Wt, L, xx);
    tb.fill(gdot, 0);
    tb.reduceRows({{Gt}, {Ot}}, {gdot}, [](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      return SmallVector<Value>{x.add(a[2], x.mul(a[0], a[1]))};
    });
    for (int64_t o = 0; o < s.K; ++o) {
      tb.fill(gS[o], 0);
      tb.matmul(Gt, tb.outputCols(St, o), gS[o]);
    }
    // dL/dphi_f = (g.S_f - (g.out) z_f) / den, chained through the derived partials.
    SmallVector<Operand> ins = {{L}, {xx, At::Row}, {ww, At::Col}, {Mq, At::Row},
                                {rden, At::Row}, {gdot, At::Row}};
    for (int64_t o = 0; o < s.K; ++o)
      ins.append({{tb.outputRows(c, o), At::Col}, {gS[o]}, {tb.outputRows(z, o), At::Col}});
    SmallVector<Value> outs = g.outputs();
    outs.append(P.begin(), P.end());
    tb.elementwise(ins, outs, [&](OpBuilder &nb, Location l, ValueRange a) {
      KernelBuilder kb(nb, l, component);
      Scalar x{nb, l};
      Value wx = a[0], xxv = a[1], wwv = a[2], M = a[3], rd = a[4], gd = a[5];
      auto [logits, coeffs] = kb.features(wx, xxv, wwv, k.params);
      SmallVector<Value> e, da, y;
      for (int64_t o = 0; o < s.K; ++o) {
        Value co = a[6 + 3 * o], gSo = a[7 + 3 * o], zo = a[8 + 3 * o];
        e.push_back(x.expAtMostZero(x.sub(x.add(logits[o], co), M)));
        da.push_back(x.mul(x.sub(gSo, x.mul(gd, zo)), rd));
      }
      Chained ch = chain(kb, x, partials, g.used, wx, xxv, wwv, k.params, coeffs, e, da);
      y = g.values(ch, [](Value v) { return v; });
      for (int64_t o = 0; o < s.K; ++o)
        y.push_back(x.mul(x.mul(coeffs[o], e[o]), rd));
      return y;
    });
    // A declared component need not be finite at a zero query (a rsqrt of ||x||^2, say):
    // the rows past the end are zeroed after the generic, by a loop that runs only in the
    // last, partial tile, not by a select on every element.
    tb.forRange(rows, tb.idx(s.T), [&](Value i) {
      for (Value t : outs)
        tb.forRange(tb.idx(0), tb.idx(s.M), [&](Value j) { tb.store(tb.f32(0), t, {i, j}); });
    });
    accumulateGradients(tb, s, g, Qt, W, dW);
    // dq with respect to the unscaled queries, and the input scale's gradient.
    tb.unstage(g.dx, r0, rows, dq, s.D, qscale);
    scaleGradient(tb, g.dx, Qt, dqscale);
    // dS += P^T g and dz -= P^T (g.out): P = coeff e / den (0 past the rows, where g.out is
    // 0 too), so dz's product is one multiply-add per element of P, with no tile of its own.
    for (int64_t o = 0; o < s.K; ++o) {
      tb.matmul(P[o], Gt, tb.outputRows(dS, o), /*transposeA=*/true);
      tb.reduceCols({{P[o]}, {gdot, At::Row}}, {tb.outputRows(dz, o)},
                    [](OpBuilder &nb, Location l, ValueRange a) {
                      Scalar x{nb, l};
                      return SmallVector<Value>{x.sub(a[2], x.mul(a[0], a[1]))};
                    });
    }
  });
  finishGradients(tb, s, g, W, dW, dparams);
  func::ReturnOp::create(b, loc);
}

void buildKeyBackward(OpBuilder &b, Location loc, ComponentOp component, FeaturePartialsOp partials,
                      const Dims &s, const Types &t, StringRef name, unsigned numParams) {
  Kernel k = makeKernel(b, loc, name, "key_backward", "keys",
                        {{t.rows, "k", "rows"}, {t.values, "v", "rows"}, {t.mask, "keep", "mask"},
                         {t.Wt, "Wt", "shared"}, {t.W, "W", "shared"}, {t.ww, "ww", "shared"},
                         {t.ww, "rowscale", "shared"}, {t.params, "params", "slice"},
                         {t.f, "c", "slice"}, {t.S, "dS", "slice"}, {t.St, "dSt", "slice"},
                         {t.f, "dz", "slice"}, {t.rows, "dk", "rows"}, {t.values, "dv", "rows"},
                         {t.W, "dW", "partial"}, {t.params, "dparams", "partial"},
                         {t.scale, "kscale", "slice"}, {t.scale, "dkscale", "partial"},
                         {t.flag, "wgrad", "shared"}},
                        7, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value K = k.arg(0), V = k.arg(1), keep = k.arg(2), Wt = k.arg(3), W = k.arg(4), ww = k.arg(5),
        rowscale = k.arg(6), c = k.arg(8), dS = k.arg(9), dSt = k.arg(10), dz = k.arg(11),
        dk = k.arg(12), dv = k.arg(13), dW = k.arg(14), dparams = k.arg(15), kscale = k.arg(16),
        dkscale = k.arg(17);
  Value wantW = weightGradFlag(tb, k.arg(18));
  ifWeightGrad(tb, wantW, [&] { tb.fill(dW, 0); });
  tb.fill(dkscale, 0);
  Value Kt = tb.buffer({s.T, s.D}), Vt = tb.buffer({s.T, s.DV}), kept = tb.buffer({s.T}),
        L = tb.buffer({s.T, s.M}), xx = tb.buffer({s.T}), dVt = tb.buffer({s.T, s.DV});
  SmallVector<Value> B, phi;
  for (int64_t o = 0; o < s.K; ++o) {
    B.push_back(tb.buffer({s.T, s.M}));
    phi.push_back(tb.buffer({s.T, s.M}));
  }
  GradientTiles g = backwardGradientTiles(tb, s, partials, k.params, ww);
  g.weightGrad = wantW;
  tb.forTiles(tb.dim(K, 0), [&](Value r0, Value rows) {
    tb.stage(K, r0, rows, Kt, s.D, kscale);
    tb.stage(V, r0, rows, Vt, s.DV);
    tb.stageMask(keep, r0, rows, kept);
    tb.logits(Kt, Wt, L, xx);
    for (int64_t o = 0; o < s.K; ++o) {
      tb.fill(B[o], 0);
      tb.matmul(Vt, tb.outputCols(dSt, o), B[o]);
    }
    // dL/dphi(k_j)_f = v_j . dS_f + dz_f for kept keys; masked keys are selected away
    // (their exp may overflow: the constants cover kept keys only).
    SmallVector<Operand> ins = {{L}, {xx, At::Row}, {ww, At::Col}, {kept, At::Row},
                                {rowscale, At::Col}};
    for (int64_t o = 0; o < s.K; ++o)
      ins.append({{tb.outputRows(c, o), At::Col}, {B[o]}, {tb.outputRows(dz, o), At::Col}});
    SmallVector<Value> outs = g.outputs();
    outs.append(phi.begin(), phi.end());
    tb.elementwise(ins, outs, [&](OpBuilder &nb, Location l, ValueRange a) {
      KernelBuilder kb(nb, l, component);
      Scalar x{nb, l};
      Value wx = a[0], xxv = a[1], wwv = a[2], live = x.positive(a[3]), rs = a[4];
      auto [logits, coeffs] = kb.features(wx, xxv, wwv, k.params);
      SmallVector<Value> e, da, y;
      for (int64_t o = 0; o < s.K; ++o) {
        Value co = a[5 + 3 * o], Bo = a[6 + 3 * o], dzo = a[7 + 3 * o];
        e.push_back(x.select(live, x.mul(x.expAtMostZero(x.sub(logits[o], co)), rs), x.c(0)));
        // Every term of the chain is a product with e (0 for masked keys), and every output
        // is selected below: a masked key's v (in B) may be anything, and is not selected here.
        da.push_back(x.add(Bo, dzo));
      }
      Chained ch = chain(kb, x, partials, g.used, wx, xxv, wwv, k.params, coeffs, e, da);
      auto keepv = [&](Value v) { return x.select(live, v, x.c(0)); };
      y = g.values(ch, keepv);
      for (int64_t o = 0; o < s.K; ++o)
        y.push_back(keepv(x.mul(coeffs[o], e[o])));
      return y;
    });
    accumulateGradients(tb, s, g, Kt, W, dW);
    tb.unstage(g.dx, r0, rows, dk, s.D, kscale);
    scaleGradient(tb, g.dx, Kt, dkscale);
    tb.fill(dVt, 0);
    for (int64_t o = 0; o < s.K; ++o)
      tb.matmul(phi[o], tb.outputRows(dS, o), dVt);
    tb.unstage(dVt, r0, rows, dv, s.DV);
  });
  finishGradients(tb, s, g, W, dW, dparams);
  func::ReturnOp::create(b, loc);
}

/// The key summaries' merge, the second stage of the split reduction: per feature the
/// constant c = max over chunks, and S, z, zabs summed over chunks 0, 1, ... in that
/// order, each rescaled by exp(c_chunk - c) (0 for a chunk no kept key reached). A
/// feature no kept key reached keeps the constant 0 (refused by the runtime's checks).
void buildKvCombine(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                    const Types &t, StringRef name) {
  Kernel k = makeKernel(b, loc, name, "kv_combine", "slices",
                        {{t.Sp, "Sp", "slice"}, {t.fp, "zp", "slice"}, {t.fp, "zabsp", "slice"},
                         {t.fp, "cp", "slice"}, {t.S, "S", "slice"}, {t.f, "z", "slice"},
                         {t.f, "zabs", "slice"}, {t.f, "c", "slice"}},
                        0, 0);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value Sp = k.arg(0), zp = k.arg(1), zabsp = k.arg(2), cp = k.arg(3), S = k.arg(4), z = k.arg(5),
        zabs = k.arg(6), c = k.arg(7);
  Value w = tb.buffer({s.F});
  Value chunks = tb.dim(Sp, 0);
  tb.fill(c, -std::numeric_limits<double>::infinity());
  tb.forRange(tb.idx(0), chunks, [&](Value ch) {
    tb.elementwise({{chunkOf(tb, cp, ch)}}, {c}, [](OpBuilder &nb, Location l, ValueRange a) {
      return SmallVector<Value>{arith::MaximumFOp::create(nb, l, a[1], a[0])};
    });
  });
  tb.fill(S, 0);
  tb.fill(z, 0);
  tb.fill(zabs, 0);
  tb.forRange(tb.idx(0), chunks, [&](Value ch) {
    tb.elementwise({{chunkOf(tb, cp, ch)}, {c}}, {w}, [](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      Value live = x.cmp(arith::CmpFPredicate::UNE, a[0], x.c(-INFINITY));
      return SmallVector<Value>{x.select(live, x.expAtMostZero(x.sub(a[0], a[1])), x.c(0))};
    });
    tb.elementwise({{chunkOf(tb, Sp, ch)}, {w, At::Row}}, {S},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     return SmallVector<Value>{x.add(a[2], x.mul(a[1], a[0]))};
                   });
    tb.elementwise({{chunkOf(tb, zp, ch)}, {chunkOf(tb, zabsp, ch)}, {w}}, {z, zabs},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     return SmallVector<Value>{x.add(a[3], x.mul(a[2], a[0])),
                                               x.add(a[4], x.mul(a[2], a[1]))};
                   });
  });
  tb.elementwise({}, {c}, [](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    Value live = x.cmp(arith::CmpFPredicate::UNE, a[0], x.c(-INFINITY));
    return SmallVector<Value>{x.select(live, a[0], x.c(0))};
  });
  func::ReturnOp::create(b, loc);
}

/// Sums `parts` [R, ...] over R in order 0, 1, ... into `total` [...].

/// A combine kernel of plain sums: each (parts [R, ...], total [...]) pair of `args`
/// (in that order) summed over R in order 0, 1, ...
void buildSumCombine(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                     StringRef name, StringRef kind, StringRef grid, ArrayRef<Arg> args) {
  Kernel k = makeKernel(b, loc, name, kind, grid, args, 0, 0);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  for (size_t i = 0; i < args.size() / 2; ++i)
    sumChunks(tb, k.arg(i), k.arg(args.size() / 2 + i));
  func::ReturnOp::create(b, loc);
}

/// The data statistics' column moments, the compiled prologue of components whose
/// parameters depend on q and k (OPRF, SADERF, HCEXP): per row chunk of one slice,
/// sum = sum_n keep_n x_n and cross = sum_n keep_n x_n y_n per column (y = x gives the
/// sums of squares; y = the rows and x their gradient gives an input scale's gradient).
void buildMoments(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                  const Types &t, StringRef name) {
  Kernel k = makeKernel(b, loc, name, "moments", "keys",
                        {{t.rows, "x", "rows"}, {t.rows, "y", "rows"}, {t.mask, "keep", "mask"},
                         {t.scale, "sum", "partial"}, {t.scale, "cross", "partial"}},
                        0, 0);
  // Its tiles' rows: a GPU schedule sizes its chunks from them (MapTilesToGpu.h).
  k.fn->setAttr(kKernelTileRowsAttr, b.getI64IntegerAttr(s.T));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value X = k.arg(0), Y = k.arg(1), keep = k.arg(2), sum = k.arg(3), cross = k.arg(4);
  tb.fill(sum, 0);
  tb.fill(cross, 0);
  Value Xt = tb.buffer({s.T, s.D}), Yt = tb.buffer({s.T, s.D}), kept = tb.buffer({s.T});
  tb.forTiles(tb.dim(X, 0), [&](Value r0, Value rows) {
    tb.stageFilled(X, r0, rows, Xt, s.D);
    tb.stageFilled(Y, r0, rows, Yt, s.D);
    tb.stageMask(keep, r0, rows, kept);
    tb.reduceCols({{Xt}, {Yt}, {kept, At::Row}}, {sum, cross},
                  [](OpBuilder &nb, Location l, ValueRange a) {
                    Scalar x{nb, l};
                    Value kx = x.mul(a[2], a[0]);
                    return SmallVector<Value>{x.add(a[3], kx), x.add(a[4], x.mul(kx, a[1]))};
                  });
  });
  func::ReturnOp::create(b, loc);
}

/// The moments' backward added to a gradient: dx = dxin + keep (a + b x) per row, for
/// dL/dsum = a and dL/dcross = b (with y = x, b is twice the sums of squares' gradient); dx
/// may be dxin (each row is read before it is written).
void buildMomentsBackward(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                          const Types &t, StringRef name) {
  Kernel k = makeKernel(b, loc, name, "moments_backward", "keys",
                        {{t.rows, "x", "rows"}, {t.mask, "keep", "mask"},
                         {t.scale, "a", "slice"}, {t.scale, "b", "slice"},
                         {t.rows, "dxin", "rows", /*mayAlias=*/true},
                         {t.rows, "dx", "rows", /*mayAlias=*/true}},
                        0, 0);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value X = k.arg(0), keep = k.arg(1), A = k.arg(2), Bv = k.arg(3), DXin = k.arg(4),
        DX = k.arg(5);
  // dxin staged apart from dx, which the elementwise op only writes: on the CPU a full tile
  // then reads x and dxin and writes dx in place (spectra-full-tiles-in-place).
  Value Xt = tb.buffer({s.T, s.D}), DXint = tb.buffer({s.T, s.D}), DXt = tb.buffer({s.T, s.D}),
        kept = tb.buffer({s.T});
  tb.forTiles(tb.dim(X, 0), [&](Value r0, Value rows) {
    tb.stageFilled(X, r0, rows, Xt, s.D);
    tb.stageFilled(DXin, r0, rows, DXint, s.D);
    tb.stageMask(keep, r0, rows, kept);
    tb.elementwise({{Xt}, {kept, At::Row}, {A, At::Col}, {Bv, At::Col}, {DXint}}, {DXt},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     return SmallVector<Value>{
                         x.add(a[4], x.mul(a[1], x.add(a[2], x.mul(a[3], a[0]))))};
                   });
    tb.unstage(DXt, r0, rows, DX, s.D);
  });
  func::ReturnOp::create(b, loc);
}

} // namespace

bool mlir::spectra::usesStatistics(ComponentOp component) {
  bool found = false;
  component->walk([&](StatisticOp) { found = true; });
  return found;
}

SmallVector<std::string, 4> mlir::spectra::tileKernelNames(StringRef map) {
  return {(map + "_kv").str(), (map + "_readout").str(), (map + "_query_backward").str(),
          (map + "_key_backward").str()};
}

ArrayRef<StringLiteral> mlir::spectra::tileKernelKinds() {
  static const StringLiteral kinds[] = {
      "moments",          "moments_combine", "moments_params",  "kv",
      "kv_combine",       "readout",          "query_backward",
      "dsummary_combine", "key_backward",     "dweights_chunk_combine", "dweights_combine",
      "dparams_combine", "moments_params_backward",  "moments_backward", "causal_prefix",
      "causal_readout",   "causal_query_backward", "causal_suffix", "causal_suffix_scan",
      "causal_key_backward", "causal_decode"};
  return kinds;
}

int64_t mlir::spectra::antipodalPairs(FeatureMapOp map) {
  auto recipe = SymbolTable::lookupNearestSymbolFrom<WeightRecipeOp>(map, map.getWeightsAttr());
  if (!recipe || recipe.getBody().empty())
    return 0;
  const int64_t d = map.getD();
  // The pairs per block of the rows `w` holds: the rules give [0, P, -P] in that order
  // (runtime/WeightFactory.cpp), a rotation maps -p to exactly -(p Q^T) and 0 to 0, and
  // whole stacked blocks keep each block's layout.
  std::function<int64_t(Value)> pairs = [&](Value w) -> int64_t {
    Operation *def = w.getDefiningOp();
    if (auto grid = dyn_cast_or_null<SparseGridOp>(def))
      return w == grid.getPoints() && grid.getDegree() == 3 ? d : 0;
    if (auto rule = dyn_cast_or_null<SphericalRadialOp>(def))
      return w == rule.getPoints() ? d + 1 : 0;
    if (auto rotate = dyn_cast_or_null<RotateOp>(def))
      return pairs(rotate.getPoints());
    // Only the recipe's own stack of %m rows, whose whole blocks the check below asks for: a
    // stack inside it, or one of other rows, may truncate its last block.
    if (auto stack = dyn_cast_or_null<StackBlocksOp>(def)) {
      if (stack.getBody().empty() || w != stack->getResult(0) ||
          stack->getParentOp() != recipe.getOperation() ||
          stack.getRows() != recipe.getBody().front().getArgument(0))
        return 0;
      auto inner = dyn_cast<YieldOp>(stack.getBody().front().getTerminator());
      return inner && !inner.getValues().empty() ? pairs(inner.getValues()[0]) : 0;
    }
    return 0;
  };
  auto yield = dyn_cast<YieldOp>(recipe.getBody().front().getTerminator());
  if (!yield || yield.getValues().empty())
    return 0;
  const int64_t h = pairs(yield.getValues()[0]);
  return h > 0 && map.getM() % (2 * h + 1) == 0 ? h : 0;
}

LogicalResult mlir::spectra::buildTileKernels(ModuleOp module, FeatureMapOp map,
                                              const TileKernelOptions &options,
                                              std::string *backwardError) {
  MLIRContext *ctx = module.getContext();
  ctx->loadDialect<func::FuncDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                   math::MathDialect, linalg::LinalgDialect>();
  auto component = SymbolTable::lookupNearestSymbolFrom<ComponentOp>(map, map.getComponentAttr());
  if (!component)
    return map.emitOpError() << "component '" << map.getComponent() << "' is not defined";
  if (options.inputType != "f32" && options.inputType != "bf16" && options.inputType != "f16")
    return map.emitOpError() << "tile kernels: unsupported q/k/v dtype '" << options.inputType
                             << "' (supported: f32, bf16, f16)";
  OpBuilder b0(ctx);
  // Causal with tile-rows 0: the CPU's rows by the head (spectra_cpu_causal_tile_rows).
  if (options.tileRows < (options.causal ? 0 : 1) || options.valueDim < 0)
    return map.emitOpError() << "tile kernels: tile-rows must be positive and value-dim "
                                "non-negative, got "
                             << options.tileRows << " and " << options.valueDim;
  unsigned numParams = component.getFeatures().front().getNumArguments() - 3;
  Dims s;
  s.D = map.getD();
  s.DV = options.valueDim > 0 ? options.valueDim : s.D;
  s.M = map.getM();
  s.K = component.getNumOutputs();
  s.F = s.K * s.M;
  s.T = options.tileRows > 0 ? options.tileRows : spectra_cpu_causal_tile_rows(s.F, s.DV);
  s.P = std::max<unsigned>(1, numParams);
  s.pairs = options.antipodalWeights ? antipodalPairs(map) : 0;
  Type input = options.inputType == "bf16"  ? Type(b0.getBF16Type())
               : options.inputType == "f16" ? Type(b0.getF16Type())
                                            : Type(b0.getF32Type());
  Types t(ctx, s, input);
  OpBuilder b(ctx);
  b.setInsertionPointAfter(map);
  Location loc = map.getLoc();
  SmallVector<std::string, 4> names = tileKernelNames(map.getSymName());
  StringRef mapName = map.getSymName();
  if (options.causal && usesStatistics(component)) {
    StatisticOp first;
    component->walk([&](StatisticOp op) {
      if (!first)
        first = op;
    });
    return map.emitOpError()
           << "causal attention: the parameters of component '" << component.getSymName()
           << "' read data statistics over the whole sequence (" << first->getName() << " '"
           << first->getAttrDictionary() << "'), so a token would see later tokens; use a "
           << "component with fixed parameters (posrf; gerf with the option a=VALUE for OPRF's "
           << "family with A fixed)";
  }
  // The data statistics' prologue, for components whose parameters depend on q and k.
  if (usesStatistics(component)) {
    buildMoments(b, loc, component, s, t, (mapName + "_moments").str());
    buildSumCombine(b, loc, component, s, (mapName + "_moments_combine").str(), "moments_combine",
                    "slices",
                    {{t.Dp, "sump", "slice"},
                     {t.Dp, "crossp", "slice"},
                     {t.scale, "sum", "slice"}, {t.scale, "cross", "slice"}});
    buildMomentsBackward(b, loc, component, s, t, (mapName + "_moments_backward").str());
    if (options.paramsKernels) {
      // A program these kernels cannot lower stays LibTorch's (the runtime's fallback): its
      // diagnostic is dropped, as the kernels are an optimisation.
      ScopedDiagnosticHandler quiet(ctx, [](Diagnostic &) { return success(); });
      (void)buildParamsKernels(b, loc, map, component, s, t);
    }
  }
  // The row kernels take the most rows per tile, from maxTileRows down by halves, whose tile
  // buffers fit sharedLimit bytes (a GPU block's static shared memory) or, where it is set,
  // dynamicSharedLimit bytes (dynamic shared memory past the static 48 KiB, still two blocks
  // per SM): larger tiles fill the tensor cores' 8- and 16-row shapes, and the two blocks an
  // SM holds are bound by their registers either way. Failing that they keep halving down to
  // minTileRows (what does not fit there, spectra-map-tiles-to-gpu refuses). `build` adds one
  // kernel, or a group (the causal kernels) that shares the choice.
  const int64_t fewest =
      options.minTileRows > 0 ? std::min(options.minTileRows, s.T) : s.T;
  auto grow = [&](function_ref<void(const Dims &, const Types &)> build,
                  int64_t most = std::numeric_limits<int64_t>::max()) {
    auto attempt = [&](int64_t rows) {
      llvm::SmallPtrSet<Operation *, 16> before;
      for (func::FuncOp fn : module.getOps<func::FuncOp>())
        before.insert(fn);
      Dims sr = s;
      sr.T = rows;
      Types tr(ctx, sr, input);
      build(sr, tr);
      SmallVector<func::FuncOp> added;
      int64_t most = 0;
      for (func::FuncOp fn : module.getOps<func::FuncOp>()) {
        if (before.contains(fn))
          continue;
        added.push_back(fn);
        // Buffers a builder made for a path this kernel does not take (the causal kernels'
        // shared helpers): gone before they are counted, as the canonicalizer would drop
        // them before the GPU mapping counts its own bytes.
        SmallVector<memref::AllocaOp> unused;
        fn.walk([&](memref::AllocaOp a) {
          if (a->use_empty())
            unused.push_back(a);
        });
        for (memref::AllocaOp a : unused)
          a.erase();
        int64_t bytes = tileBufferBytes(fn);
        if (options.sharedBytes) {
          bytes = options.sharedBytes(fn);
          fn->setAttr(kKernelTileSharedBytesAttr, b.getI64IntegerAttr(bytes));
        }
        most = std::max(most, bytes);
      }
      return std::make_pair(added, most);
    };
    auto keep = [&](ArrayRef<func::FuncOp> added, int64_t rows) {
      for (func::FuncOp fn : added) {
        fn->setAttr(kKernelTileRowsAttr, b.getI64IntegerAttr(rows));
        if (s.pairs > 0)
          fn->setAttr(kKernelAntipodalPairsAttr, b.getI64IntegerAttr(s.pairs));
      }
    };
    // Rows asked for (minTileRows = maxTileRows) are taken as is, past `most` too.
    if (options.minTileRows > 0 && options.minTileRows >= options.maxTileRows)
      most = std::numeric_limits<int64_t>::max();
    int64_t rows = std::max(std::min(options.maxTileRows, most), s.T);
    const int64_t limit = std::max(options.sharedLimit, options.dynamicSharedLimit);
    while (true) {
      auto [added, most] = attempt(rows);
      if (options.sharedLimit <= 0 || most <= limit || rows <= fewest)
        return keep(added, rows);
      for (func::FuncOp fn : added)
        fn.erase();
      rows = std::max(fewest, rows / 2);
    }
  };
  grow([&](const Dims &sr, const Types &tr) {
    buildKv(b, loc, component, sr, tr, names[0], numParams);
  });
  // kv_combine: the bidirectional summary, and under causal attention the state a prompt
  // ends in (prefill).
  buildKvCombine(b, loc, component, s, t, (mapName + "_kv_combine").str());
  if (options.causal) {
    grow([&](const Dims &sr, const Types &tr) {
      buildCausalForward(b, loc, component, sr, tr, mapName, numParams);
    });
    buildCausalDecode(b, loc, component, s, t, mapName, numParams);
    auto decode = module.lookupSymbol<func::FuncOp>((mapName + "_causal_decode").str());
    decode->setAttr(kKernelTileRowsAttr, b.getI64IntegerAttr(1));
    if (s.pairs > 0)
      decode->setAttr(kKernelAntipodalPairsAttr, b.getI64IntegerAttr(s.pairs));
  } else {
    grow([&](const Dims &sr, const Types &tr) {
      buildReadout(b, loc, component, sr, tr, names[1], numParams);
    });
  }
  // The backward needs derivatives the compiler can derive; without them the
  // forward still works and the error says why the backward is missing.
  std::string why;
  FailureOr<FeaturePartialsOp> partials = failure();
  {
    ScopedDiagnosticHandler capture(ctx, [&](Diagnostic &diag) {
      llvm::raw_string_ostream os(why);
      os << diag;
      return success();
    });
    partials = lookupOrDerivePartials(component);
  }
  if (failed(partials)) {
    if (backwardError)
      *backwardError = why.empty() ? "the component could not be differentiated" : why;
    return success();
  }
  // The backward's combine kernels: the query chunks' dS and dz of one slice, and every
  // (slice, chunk) share of dW and dparams, summed in order into the weights' gradient (dW
  // is shared by the slices) and dparams (per slice: the runtime views one slice's shares,
  // or all of them for a parameter shared by the slices).
  if (options.causal) {
    // Features with two outputs (PosRF-Hyp, TrigRF) take their rows as the others do. (They
    // were held at 2 while 4 spilled more; with the rows from dynamic shared memory, bf16 at
    // d = 32, m = 128, PosRF-Hyp's take 8 and spill 64 B where 2 spilled 80 on sm_80, 552 where
    // 1180 on sm_90a; TrigRF's 4 on sm_80, 8 on sm_90a: 80 B where 0, 616 where 1184.)
    // At most 8 rows, whatever the shared memory allows: past that the backward's warp
    // chains hold more fragments than the 128 registers of two blocks per SM (PosRF-SGQ, whose
    // 65 features leave room for 16 rows, spilled 436 B on sm_80 in bf16 at 16, 67 spill
    // instructions in its loops; 24 B at 8). PosRF's other five take 8 for their shared memory.
    grow(
        [&](const Dims &sr, const Types &tr) {
          buildCausalBackward(b, loc, component, *partials, sr, tr, mapName, numParams);
        },
        /*most=*/8);
  } else {
    grow([&](const Dims &sr, const Types &tr) {
      buildQueryBackward(b, loc, component, *partials, sr, tr, names[2], numParams);
    });
    buildSumCombine(b, loc, component, s, (mapName + "_dsummary_combine").str(),
                    "dsummary_combine", "slices",
                    {{t.Sp, "dSp", "slice"}, {t.fp, "dzp", "slice"}, {t.S, "dS", "slice"},
                     {t.f, "dz", "slice"}});
    grow([&](const Dims &sr, const Types &tr) {
      buildKeyBackward(b, loc, component, *partials, sr, tr, names[3], numParams);
    });
  }
  // dW in two stages: each slice's chunks (a block per slice), then the slices (one block),
  // so no single block reads every (slice, chunk) share.
  buildSumCombine(b, loc, component, s, (mapName + "_dweights_chunk_combine").str(),
                  "dweights_chunk_combine", "slices",
                  {{t.Wp, "dWp", "slice"}, {t.W, "dWs", "slice"}});
  buildSumCombine(b, loc, component, s, (mapName + "_dweights_combine").str(), "dweights_combine",
                  "one", {{t.Wp, "dWp", "shared"}, {t.W, "dW", "shared"}});
  buildSumCombine(b, loc, component, s, (mapName + "_dparams_combine").str(), "dparams_combine",
                  "slices", {{t.paramsp, "dparamsp", "slice"}, {t.params, "dparams", "slice"}});
  return success();
}
