//===- CausalKernels.cpp - causal attention as contractions on tiles -----===//
//
// The causal kernels of the tile layer (CAUSAL-NOTES.md has the math and its checks):
//   keys' chunk summaries      the bidirectional `kv` kernel, unchanged;
//   causal_prefix              per slice, the state carried into each chunk: the summaries
//                              of the chunks before it merged in order (exclusive scan);
//   causal_readout             per (row chunk, slice), the chunk's tiles in order from the
//                              carried state (S, z, zabs, c): within a tile the masked product
//                              of features, across tiles the state, rescaled when a feature's
//                              running maximum c_f grows;
//   causal_query_backward      per (row chunk, slice), dq, dW and dparams shares: the forward
//                              order again from the same carried states;
//   causal_suffix              per (row chunk, slice), the chunk's summary of the suffix
//                              state (R, r, e) the keys' backward carries;
//   causal_suffix_scan         per slice, the suffix state carried into each chunk from
//                              the right (a reverse exclusive scan);
//   causal_key_backward        per (row chunk, slice), the chunk's tiles last to first from
//                              that state: dk, dv, dW and dparams shares.
// Exactness at any input scale: keys of a tile are referenced to the tile's end c_end (every
// key factor <= 1), each query row to M_r = max_f (l_q,f + cm_f(r)) with cm the running maximum
// at its own row (never the tile's: CAUSAL-NOTES section 2, "the pitfall"), so the query
// factors exp(l_q + c_end - M_r) are <= exp(Delta_r). A tile whose largest Delta_r exceeds
// kSplitGap is run row by row (one row has Delta = 0): the token recurrence, exact; the
// suffix pass splits on the mirror bound Gamma_j. Masks and padding act by select.
//
//===----------------------------------------------------------------------===//

#include "codegen/TileBuilder.h"
#include "codegen/TileKernels.h"
#include "codegen/spectra_compiler.h"

using namespace mlir;
using namespace mlir::spectra;
using namespace mlir::spectra::tiles;

namespace {

/// The largest exponent a tile's factors may reach before it is run row by row: F exp(60)
/// stays finite in float32 and every term within 2^-24 of a row's largest stays a normal
/// float (CAUSAL-NOTES section 2).
constexpr double kSplitGap = 60;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// The tiles of one causal step over `s.T` rows (a tile, or one row when a tile is split).
struct CausalTiles {
  Value Qt, Kt, Vt, Gt, Ot, kept, valid, Lq, xxq, Lk, xxk, M, rden, gdot, delta, flag, P, Pabs, G,
      GN, gdr, acc, den, total, guarded, fired, rr, dVt;
  // Per output. The factors are computed in place of the logits (qa in lq, kf in lk) and their
  // magnitudes in place of the coefficients (|qa| in cq, |kf| in ck): the GPU schedule keeps
  // every tile in a block's 48 KiB of shared memory.
  SmallVector<Value> lq, cq, lk, ck, cm, ref, qa, kf, qaAbs, kfAbs, A;
  GradientTiles grad;
  // Whether a coefficient depends on the element (KernelBuilder::coefficientsVary): only
  // then are cq and ck kept in tiles; otherwise each pass forms the constant where it uses it.
  bool varying;

  CausalTiles(TileBuilder &tb, const Dims &s, bool backward, ArrayRef<bool> used = {})
      : varying(KernelBuilder(tb.b, tb.loc, tb.component).coefficientsVary()) {
    auto tile = [&](int64_t w) { return tb.buffer({s.T, w}); };
    Qt = tile(s.D), Kt = tile(s.D), Vt = tile(s.DV), Lq = tile(s.M), Lk = tile(s.M);
    kept = tb.buffer({s.T}), valid = tb.buffer({s.T}), xxq = tb.buffer({s.T}),
    xxk = tb.buffer({s.T}), M = tb.buffer({s.T}), delta = tb.buffer({s.T}), flag = tb.buffer({1});
    P = tile(s.T), rr = tb.buffer({s.M});
    for (int64_t o = 0; o < s.K; ++o) {
      lq.push_back(tile(s.M)), cq.push_back(tile(s.M)), lk.push_back(tile(s.M));
      ck.push_back(tile(s.M)), cm.push_back(tile(s.M)), ref.push_back(tb.buffer({s.M}));
    }
    qa = lq, kf = lk, qaAbs = cq, kfAbs = ck;
    if (!backward) {
      Pabs = tile(s.T), acc = tile(s.DV), den = tb.buffer({s.T}), total = tb.buffer({s.T}),
      guarded = tb.buffer({s.T}), fired = tb.buffer({s.T}), rden = tb.buffer({s.T});
      return;
    }
    Gt = tile(s.DV), Ot = tile(s.DV), rden = tb.buffer({s.T}), gdot = tb.buffer({s.T}), G = tile(s.T),
    GN = tile(s.DV), gdr = tb.buffer({s.T}), dVt = tile(s.DV);
    for (int64_t o = 0; o < s.K; ++o)
      A.push_back(tile(s.M));
    if (!used.empty())  // the suffix summary takes no gradient
      grad = gradientTiles(tb, s, used);
  }
};

/// The kernel's inputs a causal step reads.
struct CausalArgs {
  Value Q, K, V, keep, Wt, ww, rowscale, qscale, kscale, gout, out, qstat;
  ArrayRef<Value> params;
  /// With invariant coefficients, whether some factor may be negative (an i1 formed once
  /// per kernel from the coefficients' and the row weights' signs); null: test the tiles.
  Value negative = Value();
};

/// The carried state of a slice: (S, z, zabs, c) forward, (R, r, e) in the suffix pass; S
/// [F, DV] and/or its transpose St [DV, F], as the contractions that read it want it (no
/// transposed copy of a state per tile). Kernel arguments (global memory on a GPU), advanced
/// in place.
struct State {
  Value S, z, zabs, c, St;
};

/// Elementwise body helper.
SmallVector<Value> one(Value v) { return SmallVector<Value>{v}; }

/// Stages rows [r0, r0 + rows) of q, k, v (and dL/dout, out when given) and the masks.
void stageRows(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in, Value r0,
               Value rows) {
  tb.stageFilled(in.Q, r0, rows, t.Qt, s.D, in.qscale);
  tb.stageFilled(in.K, r0, rows, t.Kt, s.D, in.kscale);
  tb.stageFilled(in.V, r0, rows, t.Vt, s.DV);
  tb.stageMask(in.keep, r0, rows, t.kept);
  tb.stageMask(Value(), r0, rows, t.valid);
  if (in.gout) {
    tb.stageFilled(in.gout, r0, rows, t.Gt, s.DV);
    tb.stageFilled(in.out, r0, rows, t.Ot, s.DV);
  }
}

/// The features of the staged rows: per output the query logits lq and coefficients cq, the
/// key logits lk (-inf for masked and padded keys) and coefficients ck (times the row weights).
/// keepLogits (keepQueryLogits, keepKeyLogits): the logits themselves stay in Lq or Lk (the
/// backward's chains read them: the queries' backward Lq, the keys' Lk).
void queryFeatures(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in,
                   bool keepLogits = false) {
  ComponentOp component = tb.component;
  SmallVector<Value> qOuts;
  bool varying = t.varying;
  for (int64_t o = 0; o < s.K; ++o) {
    qOuts.push_back(t.lq[o]);
    if (varying)
      qOuts.push_back(t.cq[o]);
  }
  tb.logitsAndFeatures(t.Qt, in.Wt, t.Lq, t.xxq, {{t.Lq}, {t.xxq, At::Row}, {in.ww, At::Col}},
                       qOuts,
                       [&](OpBuilder &nb, Location l, ValueRange a) {
                         KernelBuilder kb(nb, l, component);
                         auto [logits, coeffs] = kb.features(a[0], a[1], a[2], in.params);
                         SmallVector<Value> y;
                         for (int64_t o = 0; o < s.K; ++o) {
                           y.push_back(logits[o]);
                           if (varying)
                             y.push_back(coeffs[o]);
                         }
                         return y;
                       },
                       keepLogits);
}

void features(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in,
              bool keepQueryLogits = false, bool keepKeyLogits = false) {
  queryFeatures(tb, s, t, in, keepQueryLogits);
  ComponentOp component = tb.component;
  SmallVector<Value> kOuts;
  bool varying = t.varying;
  for (int64_t o = 0; o < s.K; ++o) {
    kOuts.push_back(t.lk[o]);
    if (varying)
      kOuts.push_back(t.ck[o]);
  }
  SmallVector<Operand> kIns = {{t.Lk}, {t.xxk, At::Row}, {in.ww, At::Col}, {t.kept, At::Row}};
  if (varying)
    kIns.push_back({in.rowscale, At::Col});
  tb.logitsAndFeatures(
      t.Kt, in.Wt, t.Lk, t.xxk, kIns, kOuts,
      [&](OpBuilder &nb, Location l, ValueRange a) {
        KernelBuilder kb(nb, l, component);
        Scalar x{nb, l};
        auto [logits, coeffs] = kb.features(a[0], a[1], a[2], in.params);
        SmallVector<Value> y;
        for (int64_t o = 0; o < s.K; ++o) {
          y.push_back(x.select(x.positive(a[3]), logits[o], x.c(kNegInf)));
          if (varying)
            y.push_back(x.mul(coeffs[o], a[4]));
        }
        return y;
      },
      keepKeyLogits);
}

/// cm[o][r] = max(c_o, lk[o][0..r]) down the rows (a scan, no exponentials), and ref[o] its
/// last row: the tile-end reference of the keys.
void runningMax(TileBuilder &tb, const Dims &s, CausalTiles &t, Value c) {
  auto max = [](OpBuilder &nb, Location l, ValueRange a) {
    return one(arith::MaximumFOp::create(nb, l, a[0], a[1]));
  };
  for (int64_t o = 0; o < s.K; ++o) {
    tb.elementwise({{tb.rowOf(t.lk[o], tb.idx(0), s.M)}, {tb.outputRows(c, o), At::Col}},
                   {tb.rowOf(t.cm[o], tb.idx(0), s.M)}, max);
    tb.forRange(tb.idx(1), tb.idx(s.T), [&](Value i) {
      Value prev = arith::SubIOp::create(tb.b, tb.loc, i, tb.idx(1));
      tb.elementwise({{tb.rowOf(t.lk[o], i, s.M)}, {chunkOf(tb, t.cm[o], prev), At::Col}},
                     {tb.rowOf(t.cm[o], i, s.M)}, max);
    });
    tb.elementwise({{chunkOf(tb, t.cm[o], tb.idx(s.T - 1))}}, {t.ref[o]},
                   [](OpBuilder &, Location, ValueRange a) { return one(a[0]); });
  }
}

/// M[r] = max over outputs and features of lq + cm (0 for a row no kept key reaches yet:
/// its terms are all 0, and the readout defines its output as 0). With `gap`, the same
/// pass over lq also leaves max over outputs and features of lq + c_end in delta (what
/// splitGap turns into Delta_r).
void rowReference(TileBuilder &tb, const Dims &s, CausalTiles &t, bool gap) {
  tb.fill(t.M, kNegInf);
  if (gap)
    tb.fill(t.delta, kNegInf);
  for (int64_t o = 0; o < s.K; ++o) {
    if (!gap) {
      tb.reduceRows({{t.lq[o]}, {t.cm[o]}}, {t.M}, [](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        return one(x.max(a[2], x.add(a[0], a[1])));
      });
      continue;
    }
    tb.reduceRows({{t.lq[o]}, {t.cm[o]}, {t.ref[o], At::Col}}, {t.M, t.delta},
                  [](OpBuilder &nb, Location l, ValueRange a) {
                    Scalar x{nb, l};
                    return SmallVector<Value>{x.max(a[3], x.add(a[0], a[1])),
                                              x.max(a[4], x.add(a[0], a[2]))};
                  });
  }
  tb.elementwise({}, {t.M}, [](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    return one(x.select(x.cmp(arith::CmpFPredicate::OEQ, a[0], x.c(kNegInf)), x.c(0), a[0]));
  });
}

/// Whether the largest of `values` [T] over the valid rows exceeds kSplitGap (an i1).
/// The largest of `values` [T] over the rows `mask` keeps (every row without one), as a
/// scalar every thread of a GPU block reads alike; whether it exceeds `bound` (an i1).
Value largestExceeds(TileBuilder &tb, const Dims &s, CausalTiles &t, Value values, Value mask,
                     double bound) {
  tb.fill(t.flag, kNegInf);
  tb.forRange(tb.idx(0), tb.idx(s.T), [&](Value i) {
    Value v = tb.load(values, {i});
    if (mask) {
      Value live = arith::CmpFOp::create(tb.b, tb.loc, arith::CmpFPredicate::OGT,
                                         tb.load(mask, {i}), tb.f32(0));
      v = arith::SelectOp::create(tb.b, tb.loc, live, v, tb.f32(kNegInf));
    }
    tb.store(arith::MaximumFOp::create(tb.b, tb.loc, tb.load(t.flag, {tb.idx(0)}), v), t.flag,
             {tb.idx(0)});
  });
  return arith::CmpFOp::create(tb.b, tb.loc, arith::CmpFPredicate::OGT,
                               tb.load(t.flag, {tb.idx(0)}), tb.f32(bound));
}

/// bound[r] = max over outputs and features of logits[o] + ref[o] (a row's largest exponent
/// against the tile's references).
void largestExponent(TileBuilder &tb, const Dims &s, CausalTiles &t, ArrayRef<Value> logits,
                     Value bound) {
  tb.fill(bound, kNegInf);
  for (int64_t o = 0; o < s.K; ++o)
    tb.reduceRows({{logits[o]}, {t.ref[o], At::Col}}, {bound},
                  [](OpBuilder &nb, Location l, ValueRange a) {
                    Scalar x{nb, l};
                    return one(x.max(a[2], x.add(a[0], a[1])));
                  });
}

/// Whether a tile must run row by row: Delta_r = max_f (lq + c_end) - M_r > kSplitGap.
/// `reduced`: delta already holds max_f (lq + c_end) (rowReference's gap).
Value forwardSplit(TileBuilder &tb, const Dims &s, CausalTiles &t, bool reduced = false) {
  if (!reduced)
    largestExponent(tb, s, t, t.lq, t.delta);
  tb.elementwise({{t.M}}, {t.delta}, [](OpBuilder &nb, Location l, ValueRange a) {
    return one(arith::SubFOp::create(nb, l, a[1], a[0]));
  });
  return largestExceeds(tb, s, t, t.delta, t.valid, kSplitGap);
}

/// Moves the state's reference to ref (per feature, >= c): S, z (and zabs) times
/// exp(c - ref), 1 where they are equal (-inf included), then c = ref.
void rescale(TileBuilder &tb, const Dims &s, CausalTiles &t, const State &st) {
  for (int64_t o = 0; o < s.K; ++o) {
    tb.elementwise({{t.ref[o]}}, {tb.outputRows(st.c, o), t.rr},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     Value same = x.cmp(arith::CmpFPredicate::OEQ, a[1], a[0]);
                     return SmallVector<Value>{a[0], x.select(same, x.c(1), x.expAtMostZero(x.sub(a[1], a[0])))};
                   });
    auto times = [](OpBuilder &nb, Location l, ValueRange a) {
      return one(arith::MulFOp::create(nb, l, a[1], a[0]));
    };
    if (st.S)
      tb.elementwise({{t.rr, At::Row}}, {tb.outputRows(st.S, o)}, times);
    if (st.St)
      tb.elementwise({{t.rr, At::Col}}, {tb.outputCols(st.St, o)}, times);
    SmallVector<Value> vecs = {tb.outputRows(st.z, o)};
    if (st.zabs)
      vecs.push_back(tb.outputRows(st.zabs, o));
    tb.elementwise({{t.rr}}, vecs, [n = vecs.size()](OpBuilder &nb, Location l, ValueRange a) {
      SmallVector<Value> y;
      for (size_t i = 0; i < n; ++i)
        y.push_back(arith::MulFOp::create(nb, l, a[1 + i], a[0]));
      return y;
    });
  }
}

/// Appends to `ins` what a factor pass reads for output o's coefficient: its tile when
/// coefficients vary (`tile`: cq, or ck already times the row weights), otherwise the row
/// weights [F] on the key side (`rowscale`) and nothing on the query side. Returns where
/// coefficient() finds them.
unsigned coefficientOperands(const CausalTiles &t, Value tile, Value rowscale,
                             SmallVector<Operand> &ins) {
  unsigned at = ins.size();
  if (t.varying)
    ins.push_back({tile});
  else if (rowscale)
    ins.push_back({rowscale, At::Col});
  return at;
}

/// In a factor pass's body: output o's coefficient from those operands (the constant
/// formed in place, times the row weights when `scaled`).
Value coefficient(Scalar &x, const CausalTiles &t, ComponentOp component, const CausalArgs &in,
                  ValueRange a, unsigned at, bool scaled, int64_t o) {
  if (t.varying)
    return a[at];
  Value co = invariantCoefficient(x.b, x.l, component, x.c(0), in.params, o);
  return scaled ? x.mul(co, a[at]) : co;
}

/// Output o's factors in place of the logits `l` they are formed from: coeff exp(l - ref)
/// (0 where l = -inf), the coefficient from `coeffTile` or formed in place (times the row
/// weights when `rowscale` is given: the key side).
void referencedFactors(TileBuilder &tb, CausalTiles &t, const CausalArgs &in, int64_t o, Value l,
                       Value coeffTile, Value rowscale) {
  SmallVector<Operand> ins = {{t.ref[o], At::Col}};
  unsigned at = coefficientOperands(t, coeffTile, rowscale, ins);
  tb.elementwise(ins, {l}, [&, n = ins.size()](OpBuilder &nb, Location loc, ValueRange a) {
    Scalar x{nb, loc};
    Value live = x.cmp(arith::CmpFPredicate::UNE, a[n], x.c(kNegInf));
    Value co = coefficient(x, t, tb.component, in, a, at, /*scaled=*/bool(rowscale), o);
    return one(x.select(live, x.mul(co, x.expAtMostZero(x.sub(a[n], a[0]))), x.c(0)));
  });
}

/// The key factors kf = ck exp(lk - ref) <= |ck| (0 for masked keys) and, when `queries`,
/// the query factors qa = cq exp(lq + ref - M) <= |cq| exp(Delta) (0 past the rows).
void factors(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in, bool queries) {
  ComponentOp component = tb.component;
  for (int64_t o = 0; o < s.K; ++o) {
    referencedFactors(tb, t, in, o, t.kf[o], t.ck[o], in.rowscale);  // kf in place of lk
    if (!queries)
      continue;
    SmallVector<Operand> qIns = {{t.ref[o], At::Col}, {t.M, At::Row}, {t.valid, At::Row}};
    unsigned qc = coefficientOperands(t, t.cq[o], Value(), qIns);
    tb.elementwise(qIns, {t.qa[o]},  // qa in place of lq
                   [&, n = qIns.size()](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     Value co = coefficient(x, t, component, in, a, qc, /*scaled=*/false, o);
                     Value e = x.mul(co, x.exp(x.sub(x.add(a[n], a[0]), a[1])));
                     return one(x.select(x.positive(a[2]), e, x.c(0)));
                   });
  }
}

/// The state takes the tile's keys: S += kf^T V, z += sum kf, zabs += sum |kf|.
void absorbKeys(TileBuilder &tb, const Dims &s, CausalTiles &t, const State &st) {
  for (int64_t o = 0; o < s.K; ++o) {
    if (st.S)
      tb.matmul(t.kf[o], t.Vt, tb.outputRows(st.S, o), /*transposeA=*/true);
    if (st.St)
      tb.matmul(t.Vt, t.kf[o], tb.outputCols(st.St, o), /*transposeA=*/true);
    SmallVector<Value> vecs = {tb.outputRows(st.z, o)};
    if (st.zabs)
      vecs.push_back(tb.outputRows(st.zabs, o));
    tb.reduceCols({{t.kf[o]}}, vecs, [n = vecs.size()](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      SmallVector<Value> y = {x.add(a[1], a[0])};
      if (n > 1)
        y.push_back(x.add(a[2], x.abs(a[0])));
      return y;
    });
  }
}

/// With invariant coefficients, whether some factor can be negative (an i1 formed once per
/// kernel): a factor is its output's constant coefficient times an exponential, times the
/// row weight of its feature on the key side, so one of those below 0 (or NaN) says so. No
/// tile of factors is then searched for a sign per tile.
Value negativeFactors(TileBuilder &tb, const Dims &s, const CausalArgs &in, Value flag) {
  tb.fill(flag, kNegInf);
  Value zero = tb.idx(0);
  tb.forRange(zero, tb.dim(in.rowscale, 0), [&](Value f) {
    Value v = arith::NegFOp::create(tb.b, tb.loc, tb.load(in.rowscale, {f}));
    tb.store(arith::MaximumFOp::create(tb.b, tb.loc, tb.load(flag, {zero}), v), flag, {zero});
  });
  Value worst = tb.load(flag, {zero});
  for (int64_t o = 0; o < s.K; ++o) {
    Value co = invariantCoefficient(tb.b, tb.loc, tb.component, tb.f32(0), in.params, o);
    worst = arith::MaximumFOp::create(tb.b, tb.loc, worst, arith::NegFOp::create(tb.b, tb.loc, co));
  }
  return arith::CmpFOp::create(tb.b, tb.loc, arith::CmpFPredicate::UGT, worst, tb.f32(0));
}

/// Runs `tile` on a tile, or row by row when `split` (an i1) holds: `row(r)` per row.
void unlessSplit(TileBuilder &tb, Value split, Value r0, Value rows, bool reversed,
                 function_ref<void(Value)> row, function_ref<void()> tile) {
  auto branch = scf::IfOp::create(tb.b, tb.loc, split, /*withElseRegion=*/true);
  branch->setAttr(kRowByRowAttr, tb.b.getUnitAttr());
  OpBuilder::InsertionGuard guard(tb.b);
  tb.b.setInsertionPoint(branch.thenBlock()->getTerminator());
  tb.forRange(tb.idx(0), rows, [&](Value i) {
    if (reversed)
      i = arith::SubIOp::create(tb.b, tb.loc, arith::SubIOp::create(tb.b, tb.loc, rows, tb.idx(1)), i);
    row(arith::AddIOp::create(tb.b, tb.loc, r0, i));
  });
  tb.b.setInsertionPoint(branch.elseBlock()->getTerminator());
  tile();
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

/// One forward step over rows [r0, r0 + rows) from the state `st` (advanced past them).
void forwardStep(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in,
                 const State &st, Value r0, Value rows, function_ref<void(Value)> row) {
  stageRows(tb, s, t, in, r0, rows);
  features(tb, s, t, in);
  runningMax(tb, s, t, st.c);
  rowReference(tb, s, t, /*gap=*/bool(row));
  auto tile = [&] {
    rescale(tb, s, t, st);
    factors(tb, s, t, in, /*queries=*/true);
    // Within the tile: P = qa kf^T, masked to j <= r; the guard's |qa| |kf|^T is P itself
    // unless a factor of the tile is negative (signed estimators: SGQ's weights, TrigRF), so
    // that product runs only then (a branch every thread of a GPU block takes alike).
    tb.fill(t.P, 0);
    for (int64_t o = 0; o < s.K; ++o)
      tb.matmulTransposedB(t.qa[o], t.kf[o], t.P);
    tb.lowerTriangle(t.P);
    Value negative = in.negative;
    if (!negative) {
      tb.fill(t.delta, 0);
      for (int64_t o = 0; o < s.K; ++o)
        tb.reduceRows({{t.qa[o]}, {t.kf[o]}}, {t.delta}, [](OpBuilder &nb, Location l, ValueRange a) {
          Scalar x{nb, l};
          Value neg = x.max(arith::NegFOp::create(nb, l, a[0]), arith::NegFOp::create(nb, l, a[1]));
          return one(x.max(a[2], neg));
        });
      negative = largestExceeds(tb, s, t, t.delta, Value(), 0);
    }
    auto branch = scf::IfOp::create(tb.b, tb.loc, negative, /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(tb.b);
      tb.b.setInsertionPoint(branch.thenBlock()->getTerminator());
      auto magnitude = [](OpBuilder &nb, Location l, ValueRange a) {
        return one(math::AbsFOp::create(nb, l, a[0]));
      };
      tb.fill(t.Pabs, 0);
      for (int64_t o = 0; o < s.K; ++o) {
        tb.elementwise({{t.qa[o]}}, {t.qaAbs[o]}, magnitude);
        tb.elementwise({{t.kf[o]}}, {t.kfAbs[o]}, magnitude);
        tb.matmulTransposedB(t.qaAbs[o], t.kfAbs[o], t.Pabs);
      }
      tb.lowerTriangle(t.Pabs);
      tb.b.setInsertionPoint(branch.elseBlock()->getTerminator());
      tb.elementwise({{t.P}}, {t.Pabs}, [](OpBuilder &, Location, ValueRange a) { return one(a[0]); });
    }
    // num = qa S + P V, den = qa z + rowsum P, T = |qa| zabs + rowsum |P| (one M_r for all).
    tb.fill(t.acc, 0);
    tb.matmul(t.P, t.Vt, t.acc);
    tb.fill(t.den, 0);
    tb.fill(t.total, 0);
    tb.reduceRows({{t.P}, {t.Pabs}}, {t.den, t.total}, [](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      return SmallVector<Value>{x.add(a[2], a[0]), x.add(a[3], a[1])};
    });
    for (int64_t o = 0; o < s.K; ++o) {
      tb.matmul(t.qa[o], tb.outputRows(st.S, o), t.acc);
      tb.reduceRows({{t.qa[o]}, {tb.outputRows(st.z, o), At::Col},
                     {tb.outputRows(st.zabs, o), At::Col}},
                    {t.den, t.total}, [](OpBuilder &nb, Location l, ValueRange a) {
                      Scalar x{nb, l};
                      return SmallVector<Value>{x.add(a[3], x.mul(a[0], a[1])),
                                                x.add(a[4], x.mul(x.abs(a[0]), a[2]))};
                    });
    }
    // The guard of the bidirectional readout; a row no kept key reaches (T = 0) is 0. The
    // output is the numerator times the guarded denominator's reciprocal (one division a row).
    tb.elementwise({{t.den}, {t.total}}, {t.guarded, t.fired, t.rden},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     Value eps = x.mul(x.c(SPECTRA_DENOMINATOR_GUARD), a[1]);
                     Value fire = x.cmp(arith::CmpFPredicate::ULE, x.abs(a[0]), eps);
                     Value reached = x.positive(a[1]);
                     Value g = x.select(fire, x.add(a[0], x.mul(x.c(2), eps)), a[0]);
                     g = x.select(reached, g, x.c(1));
                     Value count = x.select(reached, x.select(fire, x.c(1), x.c(0)), x.c(0));
                     return SmallVector<Value>{g, count, x.div(x.c(1), g)};
                   });
    tb.elementwise({{t.rden, At::Row}}, {t.acc}, [](OpBuilder &nb, Location l, ValueRange a) {
      return one(arith::MulFOp::create(nb, l, a[1], a[0]));
    });
    tb.unstage(t.acc, r0, rows, in.out, s.DV);
    tb.forRange(tb.idx(0), rows, [&](Value i) {
      Value n = arith::AddIOp::create(tb.b, tb.loc, r0, i);
      tb.store(tb.load(t.M, {i}), in.qstat, {n, tb.idx(0)});
      tb.store(tb.load(t.guarded, {i}), in.qstat, {n, tb.idx(1)});
      tb.store(tb.load(t.fired, {i}), in.qstat, {n, tb.idx(2)});
    });
    absorbKeys(tb, s, t, st);
  };
  if (!row)
    return tile();
  unlessSplit(tb, forwardSplit(tb, s, t, /*reduced=*/true), r0, rows, /*reversed=*/false, row,
              tile);
}

/// A carried state as the scans see it: its matrix (S [F, DV], features along rows, or Rt
/// [DV, F], along columns), its per-feature sums (z, zabs or r) and its reference c.
struct Summary {
  Value matrix;
  SmallVector<Value> sums;
  Value c;
};

/// to = the merge of `from` and `part` (c = max, the rest rescaled by exp(c_part - c), 0 for a
/// part no kept key reached); the reference and weights go through cNew, wOld, wNew [F].
void mergeSummaries(TileBuilder &tb, const Summary &from, const Summary &part, const Summary &to,
                    At features, Value cNew, Value wOld, Value wNew) {
  tb.elementwise({{from.c}, {part.c}}, {cNew, wOld, wNew}, [](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    Value m = x.max(a[0], a[1]);
    auto weight = [&](Value v) {
      Value live = x.cmp(arith::CmpFPredicate::UNE, v, x.c(kNegInf));
      return x.select(live, x.expAtMostZero(x.sub(v, m)), x.c(0));
    };
    return SmallVector<Value>{m, weight(a[0]), weight(a[1])};
  });
  auto weighted = [](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    return one(x.add(x.mul(a[0], a[2]), x.mul(a[1], a[3])));
  };
  tb.elementwise({{from.matrix}, {part.matrix}, {wOld, features}, {wNew, features}}, {to.matrix},
                 weighted);
  for (auto [f, p, t] : llvm::zip(from.sums, part.sums, to.sums))
    tb.elementwise({{f}, {p}, {wOld}, {wNew}}, {t}, weighted);
  tb.elementwise({{cNew}}, {to.c}, [](OpBuilder &, Location, ValueRange a) { return one(a[0]); });
}

void buildCausalPrefix(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                       const Types &t, StringRef name) {
  Kernel k = makeKernel(b, loc, name, "causal_prefix", "slices",
                        {{t.Sp, "Sp", "slice"}, {t.fp, "zp", "slice"}, {t.fp, "zabsp", "slice"},
                         {t.fp, "cp", "slice"}, {t.Sp, "S0", "slice"}, {t.fp, "z0", "slice"},
                         {t.fp, "zabs0", "slice"}, {t.fp, "c0", "slice"}},
                        0, 0);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value Sp = k.arg(0), zp = k.arg(1), zabsp = k.arg(2), cp = k.arg(3), S0 = k.arg(4), z0 = k.arg(5),
        zabs0 = k.arg(6), c0 = k.arg(7);
  Value cNew = tb.buffer({s.F}), wOld = tb.buffer({s.F}), wNew = tb.buffer({s.F});
  // The state carried into chunk 0 is empty; into chunk ch, the one carried into ch - 1
  // merged with chunk ch - 1's summary (c = max, the rest rescaled by exp(c_part - c), 0 for
  // a part no kept key reached). The outputs hold the running state: no copy of it here.
  Value zero = tb.idx(0);
  tb.fill(chunkOf(tb, S0, zero), 0);
  tb.fill(chunkOf(tb, z0, zero), 0);
  tb.fill(chunkOf(tb, zabs0, zero), 0);
  tb.fill(chunkOf(tb, c0, zero), kNegInf);
  tb.forRange(tb.idx(1), tb.dim(Sp, 0), [&](Value ch) {
    Value prev = arith::SubIOp::create(b, loc, ch, tb.idx(1));
    auto at = [&](Value chunk, Value S, Value z, Value zabs, Value c) {
      return Summary{chunkOf(tb, S, chunk), {chunkOf(tb, z, chunk), chunkOf(tb, zabs, chunk)},
                     chunkOf(tb, c, chunk)};
    };
    mergeSummaries(tb, at(prev, S0, z0, zabs0, c0), at(prev, Sp, zp, zabsp, cp),
                   at(ch, S0, z0, zabs0, c0), At::Row, cNew, wOld, wNew);
  });
  func::ReturnOp::create(b, loc);
}

/// causal_readout, or with `s.T` = 1 causal_decode: the same step on one-row tiles (a row's
/// Delta is 0, so it never splits), what a decoding step runs on a one-token sequence from
/// the state it carries.
void buildCausalReadout(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                        const Types &t, StringRef name, unsigned numParams, StringRef kind) {
  Kernel k = makeKernel(
      b, loc, name, kind, "queries",
      {{t.rows, "q", "rows"}, {t.rows, "k", "rows"}, {t.values, "v", "rows"},
       {t.mask, "keep", "mask"}, {t.Wt, "Wt", "shared"}, {t.ww, "ww", "shared"},
       {t.ww, "rowscale", "shared"}, {t.params, "params", "slice"}, {t.S, "S0", "partial"},
       {t.f, "z0", "partial"}, {t.f, "zabs0", "partial"}, {t.f, "c0", "partial"},
       {t.values, "out", "rows"}, {t.qstat, "qstat", "rows"}, {t.scale, "qscale", "slice"},
       {t.scale, "kscale", "slice"}},
      7, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  Dims one = s;
  one.T = 1;
  TileBuilder tb(b, loc, component, s, k.entry), rb(b, loc, component, one, k.entry);
  CausalArgs in{k.arg(0), k.arg(1), k.arg(2), k.arg(3), k.arg(4), k.arg(5), k.arg(6),
                k.arg(14), k.arg(15), Value(), k.arg(12), k.arg(13), k.params};
  State st{k.arg(8), k.arg(9), k.arg(10), k.arg(11), Value()};
  CausalTiles tiles(tb, s, false);
  if (!tiles.varying)  // the flag's buffer is free again once its value is loaded
    in.negative = negativeFactors(tb, s, in, tiles.flag);
  if (s.T == 1) {
    tb.forTiles(tb.dim(in.Q, 0), [&](Value r0, Value rows) {
      forwardStep(tb, s, tiles, in, st, r0, rows, nullptr);
    });
    func::ReturnOp::create(b, loc);
    return;
  }
  CausalTiles rowTiles(rb, one, false);
  tb.forTiles(tb.dim(in.Q, 0), [&](Value r0, Value rows) {
    forwardStep(tb, s, tiles, in, st, r0, rows, [&](Value r) {
      forwardStep(rb, one, rowTiles, in, st, r, rb.idx(1), nullptr);
    });
  });
  func::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

/// M and 1/den per staged row from the forward's qstat (0 past the rows),
/// gdot = (dL/dout . out) / den and gn = dL/dout / den.
void rowStats(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in, Value r0,
              Value rows) {
  tb.fill(t.M, 0);
  tb.fill(t.rden, 0);
  tb.forRange(tb.idx(0), rows, [&](Value i) {
    Value n = arith::AddIOp::create(tb.b, tb.loc, r0, i);
    tb.store(tb.load(in.qstat, {n, tb.idx(0)}), t.M, {i});
    tb.store(arith::DivFOp::create(tb.b, tb.loc, tb.f32(1), tb.load(in.qstat, {n, tb.idx(1)})),
             t.rden, {i});
  });
  tb.fill(t.gdot, 0);
  tb.reduceRows({{t.Gt}, {t.Ot}}, {t.gdot}, [](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    return one(x.add(a[2], x.mul(a[0], a[1])));
  });
  tb.elementwise({{t.rden}}, {t.gdot}, [](OpBuilder &nb, Location l, ValueRange a) {
    return one(arith::MulFOp::create(nb, l, a[1], a[0]));
  });
  tb.elementwise({{t.Gt}, {t.rden, At::Row}}, {t.GN}, [](OpBuilder &nb, Location l, ValueRange a) {
    return one(arith::MulFOp::create(nb, l, a[0], a[1]));
  });
}

/// rowStats, and G[r, j] = gn_r . v_j - gdot_r for j <= r (0 above the diagonal).
void loadRowStats(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in, Value r0,
                  Value rows) {
  rowStats(tb, s, t, in, r0, rows);
  tb.fill(t.G, 0);
  tb.matmulTransposedB(t.GN, t.Vt, t.G);
  tb.elementwise({{t.gdot, At::Row}}, {t.G}, [](OpBuilder &nb, Location l, ValueRange a) {
    return one(arith::SubFOp::create(nb, l, a[1], a[0]));
  });
  tb.lowerTriangle(t.G);
}

/// The gradients of one side's staged rows X from a[o] = dL/dphi in units of the factor
/// exp(logit + ref) (times `rowscale` on the key side), chained through the derived
/// partials, into dx (unstaged, times `scale`), dW, the parameters' sums and dscale. With
/// `factorsOut`, the same pass also writes the factors coeff exp(logit + ref) rowscale
/// there (0 where not live): the exponential is formed once for both.
void chainRows(TileBuilder &tb, const Dims &s, CausalTiles &t, FeaturePartialsOp partials,
               const CausalArgs &in, Value X, Value L, Value xx, Value live, Value rowscale,
               Value rowShift, Value W, Value dW, Value dx, Value scale, Value dscale, Value r0,
               Value rows, ArrayRef<Value> factorsOut = {}) {
  ComponentOp component = tb.component;
  GradientTiles &g = t.grad;
  SmallVector<Operand> ins = {{L}, {xx, At::Row}, {in.ww, At::Col}, {live, At::Row}};
  int rs = -1, shiftAt = -1;
  if (rowscale) {
    rs = ins.size();
    ins.push_back({rowscale, At::Col});
  }
  if (rowShift) {
    shiftAt = ins.size();
    ins.push_back({rowShift, At::Row});
  }
  unsigned first = ins.size();
  for (int64_t o = 0; o < s.K; ++o)
    ins.append({{t.ref[o], At::Col}, {t.A[o]}});
  SmallVector<Value> outs = g.outputs();
  outs.append(factorsOut.begin(), factorsOut.end());
  tb.elementwise(ins, outs, [&](OpBuilder &nb, Location l, ValueRange a) {
    KernelBuilder kb(nb, l, component);
    Scalar x{nb, l};
    Value wx = a[0], xxv = a[1], wwv = a[2], ok = x.positive(a[3]);
    auto [logits, coeffs] = kb.features(wx, xxv, wwv, in.params);
    SmallVector<Value> e, da;
    for (int64_t o = 0; o < s.K; ++o) {
      Value ref = a[first + 2 * o];
      Value logit = x.add(logits[o], ref);
      if (shiftAt >= 0)
        logit = x.sub(logit, a[shiftAt]);
      Value f = x.exp(logit);
      if (rs >= 0)
        f = x.mul(f, a[rs]);
      e.push_back(x.select(ok, f, x.c(0)));
      da.push_back(x.select(ok, a[first + 2 * o + 1], x.c(0)));
    }
    Chained ch = chain(kb, x, partials, g.used, wx, xxv, wwv, in.params, coeffs, e, da);
    SmallVector<Value> y = g.values(ch, [&](Value v) { return x.select(ok, v, x.c(0)); });
    if (!factorsOut.empty())
      for (int64_t o = 0; o < s.K; ++o)
        y.push_back(x.select(ok, x.mul(coeffs[o], e[o]), x.c(0)));  // 0, never inf * 0
    return y;
  });
  accumulateGradients(tb, s, g, X, W, dW);
  tb.unstage(g.dx, r0, rows, dx, s.D, scale);
  scaleGradient(tb, g.dx, X, dscale);
}

struct BackwardArgs {
  Value W, dW, dq, dk, dv, dscale;
  FeaturePartialsOp partials;
};

/// One step of the queries' backward (forward order, the state as the forward carried it).
void queryBackwardStep(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in,
                       const BackwardArgs &out, const State &st, Value r0, Value rows,
                       function_ref<void(Value)> row) {
  stageRows(tb, s, t, in, r0, rows);
  features(tb, s, t, in, /*keepQueryLogits=*/true);
  runningMax(tb, s, t, st.c);
  loadRowStats(tb, s, t, in, r0, rows);
  auto tile = [&] {
    rescale(tb, s, t, st);
    factors(tb, s, t, in, /*queries=*/false);
    // a = gn S^T - gdot z (the state, at the tile-end reference) + G kf (the tile's keys).
    for (int64_t o = 0; o < s.K; ++o) {
      tb.elementwise({{t.gdot, At::Row}, {tb.outputRows(st.z, o), At::Col}}, {t.A[o]},
                     [](OpBuilder &nb, Location l, ValueRange a) {
                       Scalar x{nb, l};
                       return one(arith::NegFOp::create(nb, l, x.mul(a[0], a[1])));
                     });
      tb.matmul(t.GN, tb.outputCols(st.St, o), t.A[o]);
      tb.matmul(t.G, t.kf[o], t.A[o]);
    }
    // The query factor exp(l + c_end - M) of the forward, with the saved M.
    chainRows(tb, s, t, out.partials, in, t.Qt, t.Lq, t.xxq, t.valid, Value(), t.M, out.W,
              out.dW, out.dq, in.qscale, out.dscale, r0, rows);
    absorbKeys(tb, s, t, st);
  };
  if (!row)
    return tile();
  unlessSplit(tb, forwardSplit(tb, s, t), r0, rows, /*reversed=*/false, row, tile);
}

/// One step of the keys' backward (tiles last to first): the suffix state (R, r, e) holds
/// R_f = sum_i qb_if gn_i, r_f = sum_i qb_if gdot_i over the later rows, qb = cq exp(lq - M - e).
void keyBackwardStep(TileBuilder &tb, const Dims &s, CausalTiles &t, const CausalArgs &in,
                     const BackwardArgs &out, const State &st, Value r0, Value rows,
                     function_ref<void(Value)> row) {
  stageRows(tb, s, t, in, r0, rows);
  features(tb, s, t, in, /*keepQueryLogits=*/false, /*keepKeyLogits=*/true);
  loadRowStats(tb, s, t, in, r0, rows);
  // lq - M (-inf past the rows), and its reverse running maximum from e; ref = row 0's.
  for (int64_t o = 0; o < s.K; ++o) {
    tb.elementwise({{t.M, At::Row}, {t.valid, At::Row}}, {t.lq[o]},
                   [](OpBuilder &nb, Location l, ValueRange a) {
                     Scalar x{nb, l};
                     return one(x.select(x.positive(a[1]), x.sub(a[2], a[0]), x.c(kNegInf)));
                   });
    auto max = [](OpBuilder &nb, Location l, ValueRange a) {
      return one(arith::MaximumFOp::create(nb, l, a[0], a[1]));
    };
    Value last = tb.idx(s.T - 1);
    tb.elementwise({{tb.rowOf(t.lq[o], last, s.M)}, {tb.outputRows(st.c, o), At::Col}},
                   {tb.rowOf(t.cm[o], last, s.M)}, max);
    tb.forRange(tb.idx(1), tb.idx(s.T), [&](Value j) {
      Value i = arith::SubIOp::create(tb.b, tb.loc, last, j);
      Value next = arith::AddIOp::create(tb.b, tb.loc, i, tb.idx(1));
      tb.elementwise({{tb.rowOf(t.lq[o], i, s.M)}, {chunkOf(tb, t.cm[o], next), At::Col}},
                     {tb.rowOf(t.cm[o], i, s.M)}, max);
    });
    tb.elementwise({{chunkOf(tb, t.cm[o], tb.idx(0))}}, {t.ref[o]},
                   [](OpBuilder &, Location, ValueRange a) { return one(a[0]); });
  }
  // Gamma_j = max_f (lk + E): the key factors exp(lk + E) stay below exp(Gamma).
  largestExponent(tb, s, t, t.lk, t.delta);
  auto tile = [&] {
    rescale(tb, s, t, st);  // R, r to the reference E (e in st.c)
    for (int64_t o = 0; o < s.K; ++o) {
      // qb = cq exp(lq - M - E) <= |cq| (in qa); kb = ck exp(lk + E) comes with the chain.
      referencedFactors(tb, t, in, o, t.qa[o], t.cq[o], Value());  // in place of lq - M
      // a = v R^T - r (the later rows) + G^T qb (the tile's rows at or after each key).
      tb.elementwise({{tb.outputRows(st.z, o), At::Col}}, {t.A[o]},
                     [](OpBuilder &nb, Location l, ValueRange a) {
                       return one(arith::NegFOp::create(nb, l, a[0]));
                     });
      tb.matmul(t.Vt, tb.outputCols(st.St, o), t.A[o]);
      tb.matmul(t.G, t.qa[o], t.A[o], /*transposeA=*/true);
    }
    // The key factor exp(lk + E) rs of the chain, and kb = ck exp(lk + E) (in kf, in place
    // of lk, which the chain does not read) from the same exponential.
    chainRows(tb, s, t, out.partials, in, t.Kt, t.Lk, t.xxk, t.kept, in.rowscale, Value(), out.W,
              out.dW, out.dk, in.kscale, out.dscale, r0, rows, t.kf);
    // dv = kb R (R read transposed: dot products along the features) + (qb kb^T masked)^T gn.
    tb.fill(t.dVt, 0);
    tb.fill(t.P, 0);
    for (int64_t o = 0; o < s.K; ++o) {
      tb.matmulTransposedB(t.kf[o], tb.outputCols(st.St, o), t.dVt);
      tb.matmulTransposedB(t.qa[o], t.kf[o], t.P);
    }
    tb.lowerTriangle(t.P);
    tb.matmul(t.P, t.GN, t.dVt, /*transposeA=*/true);
    tb.unstage(t.dVt, r0, rows, out.dv, s.DV);
    // The suffix state takes the tile's rows: R += qb^T gn, r += qb^T gdot.
    for (int64_t o = 0; o < s.K; ++o) {
      tb.matmul(t.GN, t.qa[o], tb.outputCols(st.St, o), /*transposeA=*/true);
      tb.reduceCols({{t.qa[o]}, {t.gdot, At::Row}}, {tb.outputRows(st.z, o)},
                    [](OpBuilder &nb, Location l, ValueRange a) {
                      Scalar x{nb, l};
                      return one(x.add(a[2], x.mul(a[0], a[1])));
                    });
    }
  };
  if (!row)
    return tile();
  // Split on the keys' bound, over the kept keys.
  Value split = largestExceeds(tb, s, t, t.delta, t.kept, kSplitGap);
  unlessSplit(tb, split, r0, rows, /*reversed=*/true, row, tile);
}

SmallVector<Arg> backwardArgs(const Types &t, StringRef dx, StringRef dscale) {
  SmallVector<Arg> args = {
      {t.rows, "q", "rows"},        {t.rows, "k", "rows"},         {t.values, "v", "rows"},
      {t.mask, "keep", "mask"},     {t.Wt, "Wt", "shared"},        {t.W, "W", "shared"},
      {t.ww, "ww", "shared"},       {t.ww, "rowscale", "shared"},  {t.params, "params", "slice"},
      {t.values, "out", "rows"},    {t.values, "gout", "rows"},    {t.qstat, "qstat", "rows"},
      {t.scale, "qscale", "slice"}, {t.scale, "kscale", "slice"},  {t.W, "dW", "partial"},
      {t.params, "dparams", "partial"}, {t.scale, dscale, "partial"}};
  if (dx == "dq")
    args.push_back({t.rows, "dq", "rows"});
  else
    args.append({{t.rows, "dk", "rows"}, {t.values, "dv", "rows"}});
  return args;
}

void buildCausalQueryBackward(OpBuilder &b, Location loc, ComponentOp component,
                              FeaturePartialsOp partials, const Dims &s, const Types &t,
                              StringRef name, unsigned numParams) {
  SmallVector<Arg> args = backwardArgs(t, "dq", "dqscale");
  args.append({{t.St, "St0", "partial"}, {t.f, "z0", "partial"}, {t.f, "c0", "partial"},
               {t.flag, "wgrad", "shared"}});
  Kernel k = makeKernel(b, loc, name, "causal_query_backward", "queries", args, 8, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  Dims one = s;
  one.T = 1;
  TileBuilder tb(b, loc, component, s, k.entry), rb(b, loc, component, one, k.entry);
  CausalArgs in{k.arg(0), k.arg(1), k.arg(2), k.arg(3), k.arg(4), k.arg(6), k.arg(7), k.arg(12),
                k.arg(13), k.arg(10), k.arg(9), k.arg(11), k.params};
  BackwardArgs out{k.arg(5), k.arg(14), k.arg(17), Value(), Value(), k.arg(16), partials};
  Value wantW = weightGradFlag(tb, k.arg(args.size() - 1));
  ifWeightGrad(tb, wantW, [&] { tb.fill(out.dW, 0); });
  tb.fill(out.dscale, 0);
  State st{Value(), k.arg(19), Value(), k.arg(20), k.arg(18)};
  SmallVector<bool> used = usedArguments(component, partials, s.K, 3 + numParams);
  CausalTiles tiles(tb, s, true, used), rowTiles(rb, one, true, used);
  rowTiles.grad.dwwAcc = tiles.grad.dwwAcc;  // one set of sums for the tiles and the rows
  rowTiles.grad.dpAcc = tiles.grad.dpAcc;
  tiles.grad.weightGrad = rowTiles.grad.weightGrad = wantW;
  tb.forTiles(tb.dim(in.Q, 0), [&](Value r0, Value rows) {
    queryBackwardStep(tb, s, tiles, in, out, st, r0, rows, [&](Value r) {
      queryBackwardStep(rb, one, rowTiles, in, out, st, r, rb.idx(1), nullptr);
    });
  });
  finishGradients(tb, s, tiles.grad, out.W, out.dW, k.arg(15));
  func::ReturnOp::create(b, loc);
}

void buildCausalKeyBackward(OpBuilder &b, Location loc, ComponentOp component,
                            FeaturePartialsOp partials, const Dims &s, const Types &t,
                            StringRef name, unsigned numParams) {
  SmallVector<Arg> args = backwardArgs(t, "dk", "dkscale");
  args.append({{t.St, "Rt0", "partial"}, {t.f, "r0", "partial"}, {t.f, "e0", "partial"},
               {t.flag, "wgrad", "shared"}});
  Kernel k = makeKernel(b, loc, name, "causal_key_backward", "keys", args, 8, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  Dims one = s;
  one.T = 1;
  TileBuilder tb(b, loc, component, s, k.entry), rb(b, loc, component, one, k.entry);
  CausalArgs in{k.arg(0), k.arg(1), k.arg(2), k.arg(3), k.arg(4), k.arg(6), k.arg(7), k.arg(12),
                k.arg(13), k.arg(10), k.arg(9), k.arg(11), k.params};
  BackwardArgs out{k.arg(5), k.arg(14), Value(), k.arg(17), k.arg(18), k.arg(16), partials};
  Value wantW = weightGradFlag(tb, k.arg(args.size() - 1));
  ifWeightGrad(tb, wantW, [&] { tb.fill(out.dW, 0); });
  tb.fill(out.dscale, 0);
  // The suffix state carried into the chunk from the right (causal_suffix_scan): R transposed
  // [DV, F], r [F], e [F] (in the State's St, z, c), advanced in place.
  State st{Value(), k.arg(20), Value(), k.arg(21), k.arg(19)};
  SmallVector<bool> used = usedArguments(component, partials, s.K, 3 + numParams);
  CausalTiles tiles(tb, s, true, used), rowTiles(rb, one, true, used);
  rowTiles.grad.dwwAcc = tiles.grad.dwwAcc;
  rowTiles.grad.dpAcc = tiles.grad.dpAcc;
  tiles.grad.weightGrad = rowTiles.grad.weightGrad = wantW;
  tb.forTilesReversed(tb.dim(in.K, 0), [&](Value r0, Value rows) {
    keyBackwardStep(tb, s, tiles, in, out, st, r0, rows, [&](Value r) {
      keyBackwardStep(rb, one, rowTiles, in, out, st, r, rb.idx(1), nullptr);
    });
  });
  finishGradients(tb, s, tiles.grad, out.W, out.dW, k.arg(15));
  func::ReturnOp::create(b, loc);
}

/// A row chunk's summary of the suffix state (causal_suffix): Rt = sum_i qb_i gn_i^T,
/// r = sum_i qb_i gdot_i with qb = cq exp(lq - M - e), e the chunk's per-feature maximum of
/// lq - M (no split needed: every factor is <= |cq|).
void buildCausalSuffix(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                       const Types &t, StringRef name, unsigned numParams) {
  Kernel k = makeKernel(
      b, loc, name, "causal_suffix", "queries",
      {{t.rows, "q", "rows"}, {t.Wt, "Wt", "shared"}, {t.ww, "ww", "shared"},
       {t.params, "params", "slice"}, {t.values, "out", "rows"}, {t.values, "gout", "rows"},
       {t.qstat, "qstat", "rows"}, {t.scale, "qscale", "slice"}, {t.St, "Rt", "partial"},
       {t.f, "r", "partial"}, {t.f, "e", "partial"}},
      3, numParams);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value Q = k.arg(0), gout = k.arg(5), out = k.arg(4), qstat = k.arg(6);
  CausalArgs in{Q, Value(), Value(), Value(), k.arg(1), k.arg(2), Value(), k.arg(7), Value(),
                gout, out, qstat, k.params};
  State st{Value(), k.arg(9), Value(), k.arg(10), k.arg(8)};
  tb.fill(st.St, 0);
  tb.fill(st.z, 0);
  tb.fill(st.c, kNegInf);
  CausalTiles tt(tb, s, /*backward=*/true);
  tb.forTiles(tb.dim(Q, 0), [&](Value r0, Value rows) {
    tb.stageFilled(Q, r0, rows, tt.Qt, s.D, in.qscale);
    tb.stageFilled(gout, r0, rows, tt.Gt, s.DV);
    tb.stageFilled(out, r0, rows, tt.Ot, s.DV);
    tb.stageMask(Value(), r0, rows, tt.valid);
    queryFeatures(tb, s, tt, in);
    rowStats(tb, s, tt, in, r0, rows);
    for (int64_t o = 0; o < s.K; ++o) {
      // lq - M (-inf past the rows), the new reference max(e, its column maxima).
      tb.elementwise({{tt.M, At::Row}, {tt.valid, At::Row}}, {tt.lq[o]},
                     [](OpBuilder &nb, Location l, ValueRange a) {
                       Scalar x{nb, l};
                       return one(x.select(x.positive(a[1]), x.sub(a[2], a[0]), x.c(kNegInf)));
                     });
      tb.elementwise({{tb.outputRows(st.c, o)}}, {tt.ref[o]},
                     [](OpBuilder &, Location, ValueRange a) { return one(a[0]); });
      tb.reduceCols({{tt.lq[o]}}, {tt.ref[o]}, [](OpBuilder &nb, Location l, ValueRange a) {
        return one(arith::MaximumFOp::create(nb, l, a[1], a[0]));
      });
    }
    rescale(tb, s, tt, st);
    for (int64_t o = 0; o < s.K; ++o) {
      referencedFactors(tb, tt, in, o, tt.qa[o], tt.cq[o], Value());  // in place of lq - M
      tb.matmul(tt.GN, tt.qa[o], tb.outputCols(st.St, o), /*transposeA=*/true);
      tb.reduceCols({{tt.qa[o]}, {tt.gdot, At::Row}}, {tb.outputRows(st.z, o)},
                    [](OpBuilder &nb, Location l, ValueRange a) {
                      Scalar x{nb, l};
                      return one(x.add(a[2], x.mul(a[0], a[1])));
                    });
    }
  });
  func::ReturnOp::create(b, loc);
}

/// The suffix states carried into each row chunk from the right (causal_suffix_scan): chunk
/// C - 1 starts empty; chunk ch starts with chunk ch + 1's state merged with chunk ch + 1's
/// summary (e = max, the rest rescaled by exp(e_part - e)).
void buildCausalSuffixScan(OpBuilder &b, Location loc, ComponentOp component, const Dims &s,
                           const Types &t, StringRef name) {
  MemRefType Stp = MemRefType::get({ShapedType::kDynamic, s.DV, s.F}, b.getF32Type());
  Kernel k = makeKernel(b, loc, name, "causal_suffix_scan", "slices",
                        {{Stp, "Rtp", "slice"}, {t.fp, "rp", "slice"}, {t.fp, "ep", "slice"},
                         {Stp, "Rt0", "slice"}, {t.fp, "r0", "slice"}, {t.fp, "e0", "slice"}},
                        0, 0);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  TileBuilder tb(b, loc, component, s, k.entry);
  Value Rtp = k.arg(0), rp = k.arg(1), ep = k.arg(2), Rt0 = k.arg(3), r0 = k.arg(4), e0 = k.arg(5);
  Value eNew = tb.buffer({s.F}), wOld = tb.buffer({s.F}), wNew = tb.buffer({s.F});
  Value chunks = tb.dim(Rtp, 0);
  Value last = arith::SubIOp::create(b, loc, chunks, tb.idx(1));
  tb.fill(chunkOf(tb, Rt0, last), 0);
  tb.fill(chunkOf(tb, r0, last), 0);
  tb.fill(chunkOf(tb, e0, last), kNegInf);
  tb.forRange(tb.idx(1), chunks, [&](Value i) {
    Value ch = arith::SubIOp::create(b, loc, last, i);
    Value next = arith::AddIOp::create(b, loc, ch, tb.idx(1));
    auto at = [&](Value chunk, Value Rt, Value r, Value e) {
      return Summary{chunkOf(tb, Rt, chunk), {chunkOf(tb, r, chunk)}, chunkOf(tb, e, chunk)};
    };
    mergeSummaries(tb, at(next, Rt0, r0, e0), at(next, Rtp, rp, ep), at(ch, Rt0, r0, e0), At::Col,
                   eNew, wOld, wNew);
  });
  func::ReturnOp::create(b, loc);
}

} // namespace

void mlir::spectra::tiles::buildCausalForward(OpBuilder &b, Location loc, ComponentOp component,
                                              const Dims &s, const Types &t, StringRef map,
                                              unsigned numParams) {
  buildCausalPrefix(b, loc, component, s, t, (map + "_causal_prefix").str());
  buildCausalReadout(b, loc, component, s, t, (map + "_causal_readout").str(), numParams,
                     "causal_readout");
}

void mlir::spectra::tiles::buildCausalDecode(OpBuilder &b, Location loc, ComponentOp component,
                                             const Dims &s, const Types &t, StringRef map,
                                             unsigned numParams) {
  Dims one = s;
  one.T = 1;
  buildCausalReadout(b, loc, component, one, t, (map + "_causal_decode").str(), numParams,
                     "causal_decode");
}

void mlir::spectra::tiles::buildCausalBackward(OpBuilder &b, Location loc, ComponentOp component,
                                               FeaturePartialsOp partials, const Dims &s,
                                               const Types &t, StringRef map, unsigned numParams) {
  buildCausalQueryBackward(b, loc, component, partials, s, t, (map + "_causal_query_backward").str(),
                           numParams);
  buildCausalSuffix(b, loc, component, s, t, (map + "_causal_suffix").str(), numParams);
  buildCausalSuffixScan(b, loc, component, s, t, (map + "_causal_suffix_scan").str());
  buildCausalKeyBackward(b, loc, component, partials, s, t, (map + "_causal_key_backward").str(),
                         numParams);
}
