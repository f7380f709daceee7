//===- TileBuilder.cpp - the builders the tile kernels are written with --===//

#include "codegen/TileBuilder.h"
#include "codegen/TileKernels.h"

#include "mlir/IR/Matchers.h"

using namespace mlir;

namespace mlir::spectra::tiles {

/// The values of the params region that depend on a statistic: a statistic's result, and
/// every result of an op that reads one or holds one in a region of its own.
static llvm::SmallPtrSet<Value, 16> statisticDependent(ComponentOp component) {
  llvm::SmallPtrSet<Value, 16> varies;
  if (component.getParams().empty())
    return varies;
  for (Operation &op : component.getParams().front()) {
    bool reads = isa<StatisticOp>(op) ||
                 llvm::any_of(op.getOperands(), [&](Value v) { return varies.contains(v); });
    if (!reads && op.getNumRegions() > 0)
      op.walk([&](Operation *inner) {
        reads = reads || isa<StatisticOp>(inner) ||
                llvm::any_of(inner->getOperands(), [&](Value v) { return varies.contains(v); });
      });
    if (reads)
      varies.insert(op.result_begin(), op.result_end());
  }
  return varies;
}

SmallVector<bool> parametersWithGradient(ComponentOp component) {
  ParamsYieldOp yield = component.getParamsYield();
  if (!yield)
    return {};
  llvm::SmallPtrSet<Value, 16> varies = statisticDependent(component);
  SmallVector<bool> out;
  for (Value v : yield.getScalars())
    out.push_back(varies.contains(v));
  return out;
}

bool scalesWithGradient(ComponentOp component) {
  ParamsYieldOp yield = component.getParamsYield();
  if (!yield || !yield.getQueryScale())
    return false;
  llvm::SmallPtrSet<Value, 16> varies = statisticDependent(component);
  return varies.contains(yield.getQueryScale()) || varies.contains(yield.getKeyScale());
}

SmallVector<bool> usedArguments(ComponentOp component, FeaturePartialsOp partials,
                                unsigned outputs, unsigned args) {
  auto yield = cast<PartialsYieldOp>(partials.getBody().front().getTerminator());
  SmallVector<bool> used(args, false);
  used[0] = used[1] = true;
  for (unsigned o = 0; o < outputs; ++o)
    for (unsigned v = 0; v < args; ++v)
      for (unsigned which = 0; which < 2; ++which)
        if (!matchPattern(yield.getValues()[2 * (o * args + v) + which], m_AnyZeroFloat()))
          used[v] = true;
  SmallVector<bool> varies = parametersWithGradient(component);
  for (unsigned v = 3; v < args; ++v)
    used[v] = used[v] && v - 3 < varies.size() && varies[v - 3];
  return used;
}

/// The value of `v` where it folds to a float constant (the derived partials are not yet
/// canonicalised: -1/2 is negf(mulf(0.5, 1.0))). Folds without changing the IR.
static std::optional<double> foldedConstant(Value v, unsigned depth = 0) {
  APFloat f(0.0);
  if (matchPattern(v, m_ConstantFloat(&f)))
    return f.convertToDouble();
  Operation *op = v.getDefiningOp();
  if (!op || depth > 8 || op->getNumResults() != 1 || op->getNumRegions() != 0)
    return std::nullopt;
  SmallVector<Attribute> operands;
  for (Value o : op->getOperands()) {
    std::optional<double> c = foldedConstant(o, depth + 1);
    if (!c || !isa<FloatType>(o.getType()))
      return std::nullopt;
    operands.push_back(FloatAttr::get(o.getType(), *c));
  }
  SmallVector<OpFoldResult> results;
  if (failed(op->fold(operands, results)) || results.size() != 1)
    return std::nullopt;
  if (auto same = dyn_cast_if_present<Value>(results[0]))  // x * 1 folds to x
    return same == v ? std::nullopt : foldedConstant(same, depth + 1);
  auto attr = dyn_cast_if_present<FloatAttr>(dyn_cast_if_present<Attribute>(results[0]));
  if (!attr)
    return std::nullopt;
  return attr.getValueAsDouble();
}

std::optional<double> dxxPerDwx(FeaturePartialsOp partials, unsigned outputs, unsigned args) {
  auto yield = cast<PartialsYieldOp>(partials.getBody().front().getTerminator());
  auto partial = [&](unsigned o, unsigned v, unsigned which) {
    return foldedConstant(yield.getValues()[2 * (o * args + v) + which]);
  };
  std::optional<double> k;
  for (unsigned o = 0; o < outputs; ++o) {
    std::optional<double> wx = partial(o, 0, 0), xx = partial(o, 1, 0),
                          cwx = partial(o, 0, 1), cxx = partial(o, 1, 1);
    if (!wx || !xx || *wx == 0 || !cwx || *cwx != 0 || !cxx || *cxx != 0)
      return std::nullopt;
    double ratio = *xx / *wx;
    if (!std::isfinite(ratio) || (k && *k != ratio))
      return std::nullopt;
    k = ratio;
  }
  return k;
}

/// The element arguments (bit 0: wx, bit 1: xx, bit 2: ww) that `v`, a value of the
/// partials' `body`, reads. An op with regions or side effects counts as reading all three.
static unsigned elementsRead(Block &body, Value v) {
  unsigned read = 0;
  SmallVector<Value> work = {v};
  llvm::SmallPtrSet<Value, 16> seen;
  while (!work.empty()) {
    Value u = work.pop_back_val();
    if (!seen.insert(u).second)
      continue;
    if (auto arg = dyn_cast<BlockArgument>(u)) {
      if (arg.getOwner() == &body && arg.getArgNumber() < 3)
        read |= 1u << arg.getArgNumber();
      continue;
    }
    Operation *def = u.getDefiningOp();
    if (!def)
      continue;
    if (def->getNumRegions() != 0 || !isPure(def))
      return 7;
    llvm::append_range(work, def->getOperands());
  }
  return read;
}

/// Element `i` of the partials' yield.
static Value partialValue(FeaturePartialsOp partials, unsigned i) {
  return cast<PartialsYieldOp>(partials.getBody().front().getTerminator()).getValues()[i];
}

SmallVector<std::optional<FactoredGradient>> factoredArguments(FeaturePartialsOp partials,
                                                               unsigned outputs, unsigned args,
                                                               bool ratio) {
  SmallVector<std::optional<FactoredGradient>> factored(args);
  if (outputs != 1)
    return factored;
  Block &body = partials.getBody().front();
  for (unsigned v = ratio ? 2 : 0; v < args; ++v) {
    bool noLogit = matchPattern(partialValue(partials, 2 * v), m_AnyZeroFloat()),
         noCoeff = matchPattern(partialValue(partials, 2 * v + 1), m_AnyZeroFloat());
    if (noLogit == noCoeff)  // no term (unused), or two
      continue;
    unsigned partial = noLogit ? 2 * v + 1 : 2 * v;
    unsigned read = elementsRead(body, partialValue(partials, partial));
    // wx's and ||x||^2's tiles are reduced along the features (dx, the row sums): their
    // factor must read no element. (wx's is also reduced along the rows, for dW.)
    if ((read & 3) || (v < 2 && read))
      continue;
    factored[v] = FactoredGradient{noLogit ? 1u : 0u, partial, read != 0};
  }
  return factored;
}

Value invariantCoefficient(OpBuilder &b, Location loc, ComponentOp component, Value any,
                           ArrayRef<Value> params, int64_t o) {
  KernelBuilder kb(b, loc, component);
  return kb.features(any, any, any, params).second[o];
}

Chained chain(KernelBuilder &kb, Scalar &x, FeaturePartialsOp partials, ArrayRef<bool> used,
              Value wx, Value xx, Value ww, ArrayRef<Value> params, ArrayRef<Value> coeffs,
              ArrayRef<Value> e, ArrayRef<Value> a) {
  SmallVector<Value> pv = kb.partials(partials, wx, xx, ww, params);
  // A derived partial that is the constant 0 says the feature does not depend on that
  // argument: its term is left out (null below), not multiplied by 0, and a partial of 1
  // is not multiplied by. a phi and a e are formed once per output, so each term costs one
  // multiply: SADERF's query_backward body went from 53 to 33 ops per element.
  auto mul = [&](Value factor, Value partial) -> Value {
    if (!partial || matchPattern(partial, m_AnyZeroFloat()))
      return Value();
    if (matchPattern(partial, m_OneFloat()))
      return factor;
    return x.mul(factor, partial);
  };
  auto add = [&](Value y, Value z) -> Value { return !y ? z : !z ? y : x.add(y, z); };
  unsigned args = 3 + params.size();
  std::vector<Value> sums(args);  // null: no term yet
  Chained out;
  for (unsigned o = 0; o < e.size(); ++o) {
    // dL/d arg = a (phi dlogit + e dcoeff) = (a phi) dlogit + (a e) dcoeff.
    Value aphi, ae;
    for (unsigned v = 0; v < args; ++v) {
      if (!used[v])
        continue;
      Value dlogit = pv[2 * (o * args + v)], dcoeff = pv[2 * (o * args + v) + 1];
      if (!matchPattern(dlogit, m_AnyZeroFloat()) && !aphi)
        aphi = x.mul(a[o], x.mul(coeffs[o], e[o]));
      if (!matchPattern(dcoeff, m_AnyZeroFloat()) && !ae)
        ae = x.mul(a[o], e[o]);
      sums[v] = add(sums[v], add(mul(aphi, dlogit), mul(ae, dcoeff)));
    }
    if (o == 0) {
      out.aphi = aphi;
      out.ae = ae;
    }
  }
  for (unsigned v = 0; v < args; ++v)
    if (used[v] && !sums[v])
      sums[v] = x.c(0);
  out.dwx = sums[0];
  out.dxx = sums[1];
  out.dww = sums[2];
  out.dparams.assign(sums.begin() + 3, sums.end());
  return out;
}

Kernel makeKernel(OpBuilder &b, Location loc, StringRef name, StringRef kind, StringRef grid,
                  ArrayRef<Arg> args, unsigned paramsArg, unsigned numParams) {
  SmallVector<Type> types;
  SmallVector<Attribute> names, roles;
  for (const Arg &a : args) {
    types.push_back(a.type);
    names.push_back(b.getStringAttr(a.name));
    roles.push_back(b.getStringAttr(a.role));
  }
  auto fn = func::FuncOp::create(b, loc, name, b.getFunctionType(types, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  fn->setAttr(kKernelKindAttr, b.getStringAttr(kind));
  fn->setAttr(kKernelGridAttr, b.getStringAttr(grid));
  fn->setAttr(kKernelArgNamesAttr, b.getArrayAttr(names));
  fn->setAttr(kKernelArgRolesAttr, b.getArrayAttr(roles));
  for (auto [i, a] : llvm::enumerate(args))
    if (a.mayAlias)
      fn.setArgAttr(i, kMayAliasArgAttr, b.getUnitAttr());
  Kernel k{fn, fn.addEntryBlock(), {}};
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(k.entry);
  for (unsigned i = 0; i < numParams; ++i)
    k.params.push_back(memref::LoadOp::create(
        b, loc, k.arg(paramsArg), ValueRange{arith::ConstantIndexOp::create(b, loc, i)}));
  return k;
}

GradientTiles gradientTiles(TileBuilder &tb, const Dims &s, ArrayRef<bool> used,
                            std::optional<double> dxxScale,
                            ArrayRef<std::optional<FactoredGradient>> factored,
                            FeaturePartialsOp partials, ArrayRef<Value> params, Value ww) {
  GradientTiles g;
  g.used.assign(used.begin(), used.end());
  g.dxxScale = dxxScale;
  g.factored.assign(factored.begin(), factored.end());
  g.factored.resize(used.size());
  for (unsigned v = 0; v < used.size(); ++v)
    if (!used[v])  // no gradient taken: no base or base sums for it either
      g.factored[v].reset();
  g.partials = partials;
  g.params.assign(params.begin(), params.end());
  g.ww = ww;
  // A tile only where the argument is used and not factored: with dxxScale ||x||^2 has none.
  auto ownTile = [&](unsigned v) { return used[v] && !g.factored[v]; };
  if (!g.factored[0])
    g.dwx = tb.buffer({s.T, s.M});
  if (!dxxScale && ownTile(1))
    g.dxx = tb.buffer({s.T, s.M});
  g.dxxRow = tb.buffer({s.T});
  g.dx = tb.buffer({s.T, s.D});
  if (ownTile(2)) {
    g.dww = tb.buffer({s.T, s.M});
    g.dwwAcc = tb.buffer({s.M});
    tb.fill(g.dwwAcc, 0);
  }
  for (unsigned p = 3; p < used.size(); ++p) {
    g.dp.push_back(ownTile(p) ? tb.buffer({s.T, s.M}) : Value());
    g.dpAcc.push_back(ownTile(p) ? tb.buffer({s.M}) : Value());
    if (ownTile(p))
      tb.fill(g.dpAcc.back(), 0);
  }
  SmallVector<Value> atEntry;  // the partials inlined once at kernel entry, where needed
  for (unsigned v = 0; v < used.size(); ++v) {
    if (!g.factored[v])
      continue;
    unsigned b = g.factored[v]->base;
    if (!g.base[b])
      g.base[b] = tb.buffer({s.T, s.M});
    if (v < 2) {
      // wx's and ||x||^2's factors read no element: formed once, here at kernel entry. wx's
      // products (dx, dW) read the base tile and are scaled after.
      if (atEntry.empty()) {
        Value zero = tb.f32(0);
        atEntry = tb.partials(partials, zero, zero, zero, params);
      }
      Value f = atEntry[g.factored[v]->partial];
      (v == 0 ? g.dwxFactor : g.xxFactor) = f;
      if (v == 0)
        g.dwx = g.base[b];
      continue;
    }
    if (!g.baseCols[b]) {
      g.baseCols[b] = tb.buffer({s.M});
      tb.fill(g.baseCols[b], 0);
    }
    if (v > 2)
      g.baseColsForWOnly[b] = false;
  }
  return g;
}

Value weightGradFlag(TileBuilder &tb, Value wgrad) {
  return arith::CmpFOp::create(tb.b, tb.loc, arith::CmpFPredicate::UNE, tb.load(wgrad, {tb.idx(0)}),
                               tb.f32(0));
}

void TileBuilder::logitsAndFeatures(Value X, Value Wt, Value L, Value xx,
                                    ArrayRef<Operand> ins, ArrayRef<Value> outs, Body body,
                                    bool keepLogits) {
  assert(!ins.empty() && ins[0].buffer == L && ins[0].at == At::Full &&
         "the features read the logits first");
  if (s.pairs == 0) {
    logits(X, Wt, L, xx);
    elementwise(ins, outs, body);
    return;
  }
  rowNorms(X, xx);
  const int64_t h = s.pairs;
  // An operand's window of L's columns [first, first + n).
  auto cols = [&](Operand o, int64_t first, int64_t n) -> Operand {
    switch (o.at) {
    case At::Row:
      return o;
    case At::Col:
      return {window(o.buffer, {first}, {n}), At::Col};
    case At::Full:
      break;
    }
    return {window(o.buffer, {0, first}, {s.T, n}), At::Full};
  };
  auto outCols = [&](int64_t first, int64_t n) {
    SmallVector<Value> w;
    for (Value v : outs)
      w.push_back(window(v, {0, first}, {s.T, n}));
    return w;
  };
  const size_t numIns = ins.size(), numOuts = outs.size();
  // Unless L is kept, the logits each part reads are in buffers of their own: the zero row's
  // (0) in one, each block's P logits in another, so nothing but a block's product and its
  // epilogue touches its buffer and the P logits stay in registers (Epilogue.h's
  // readElsewhere asks about the whole buffer a window is of, not the window).
  Value zero = buffer({s.T, 1});
  fill(zero, 0);
  for (int64_t first = 0; first < s.M; first += 2 * h + 1) {
    if (keepLogits)
      fill(window(L, {0, first}, {s.T, 1}), 0);
    SmallVector<Operand> zeroIns = {{zero}};
    for (size_t i = 1; i < numIns; ++i)
      zeroIns.push_back(cols(ins[i], first, 1));
    elementwise(zeroIns, outCols(first, 1), body);
    // The P columns as the product's epilogue, the -P columns from the same logits negated
    // (exact: X (-P)^T rounds as -(X P^T)).
    Value plus = keepLogits ? window(L, {0, first + 1}, {s.T, h}) : buffer({s.T, h});
    fill(plus, 0);
    matmul(X, window(Wt, {0, first + 1}, {s.D, h}), plus);
    SmallVector<Operand> partIns = {{plus}};
    for (size_t i = 1; i < numIns; ++i)
      partIns.push_back(cols(ins[i], first + 1, h));
    SmallVector<size_t> minusAt(numIns, 0);  // input i of the -P part among partIns
    for (size_t i = 1; i < numIns; ++i) {
      minusAt[i] = i;
      if (ins[i].at != At::Row) {
        minusAt[i] = partIns.size();
        partIns.push_back(cols(ins[i], first + 1 + h, h));
      }
    }
    SmallVector<Value> partOuts = outCols(first + 1, h);
    partOuts.append(outCols(first + 1 + h, h));
    if (keepLogits)
      partOuts.push_back(window(L, {0, first + 1 + h}, {s.T, h}));
    const size_t outsAt = partIns.size();
    elementwise(partIns, partOuts, [&](OpBuilder &nb, Location l, ValueRange a) {
      SmallVector<Value> plusArgs, minusArgs;
      Value negated = arith::NegFOp::create(nb, l, a[0]);
      for (size_t i = 0; i < numIns; ++i) {
        plusArgs.push_back(a[i]);
        minusArgs.push_back(i == 0 ? negated : a[minusAt[i]]);
      }
      for (size_t j = 0; j < numOuts; ++j) {
        plusArgs.push_back(a[outsAt + j]);
        minusArgs.push_back(a[outsAt + numOuts + j]);
      }
      SmallVector<Value> y = body(nb, l, plusArgs);
      y.append(body(nb, l, minusArgs));
      if (keepLogits)
        y.push_back(negated);
      return y;
    });
  }
}

void ifWeightGrad(TileBuilder &tb, Value flag, function_ref<void()> body) {
  if (!flag)
    return body();
  auto branch = scf::IfOp::create(tb.b, tb.loc, flag, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(tb.b);
  tb.b.setInsertionPoint(branch.thenBlock()->getTerminator());
  body();
}

void accumulateGradients(TileBuilder &tb, const Dims &s, GradientTiles &g, Value X, Value W,
                         Value dW) {
  tb.fill(g.dxxRow, 0);
  if (g.dxxScale && *g.dxxScale == 0) {
    // No ||x||^2 term: the row sums stay 0.
  } else if (g.dxxScale) {
    double k = *g.dxxScale;
    tb.reduceRows({{g.dwx}}, {g.dxxRow}, [k](OpBuilder &nb, Location l, ValueRange a) {
      Scalar x{nb, l};
      return SmallVector<Value>{x.add(a[1], x.mul(x.c(k), a[0]))};
    });
  } else if (g.factored[1]) {
    Value f = g.xxFactor;
    tb.reduceRows({{g.base[g.factored[1]->base]}}, {g.dxxRow},
                  [f](OpBuilder &nb, Location l, ValueRange a) {
                    Scalar x{nb, l};
                    return SmallVector<Value>{x.add(a[1], x.mul(f, a[0]))};
                  });
  } else {
    tb.reduceRows({{g.dxx}}, {g.dxxRow}, [](OpBuilder &nb, Location l, ValueRange a) {
      return SmallVector<Value>{arith::AddFOp::create(nb, l, a[1], a[0])};
    });
  }
  tb.fill(g.dx, 0);
  if (s.pairs == 0) {
    tb.matmul(g.dwx, W, g.dx);
  } else {
    // Antipodal weights (Dims::pairs): per block, G W = (G_P - G_-P) P; the zero row adds 0.
    const int64_t h = s.pairs;
    Value diff = tb.buffer({s.T, h});
    for (int64_t first = 0; first < s.M; first += 2 * h + 1) {
      tb.elementwise({{tb.window(g.dwx, {0, first + 1}, {s.T, h})},
                      {tb.window(g.dwx, {0, first + 1 + h}, {s.T, h})}},
                     {diff}, [](OpBuilder &nb, Location l, ValueRange a) {
                       return SmallVector<Value>{arith::SubFOp::create(nb, l, a[0], a[1])};
                     });
      tb.matmul(diff, tb.window(W, {first + 1, 0}, {h, s.D}), g.dx);
    }
  }
  Value f = g.dwxFactor;  // dx = f (base W) where wx is factored
  tb.elementwise({{X}, {g.dxxRow, At::Row}}, {g.dx}, [f](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    Value dx = f ? x.mul(f, a[2]) : a[2];
    return SmallVector<Value>{x.add(dx, x.mul(x.mul(x.c(2), a[1]), a[0]))};
  });
  auto sum = [](OpBuilder &nb, Location l, ValueRange a) {
    return SmallVector<Value>{arith::AddFOp::create(nb, l, a[1], a[0])};
  };
  ifWeightGrad(tb, g.weightGrad, [&] {
    tb.matmul(g.dwx, X, dW, /*transposeA=*/true);
    if (g.dww)
      tb.reduceCols({{g.dww}}, {g.dwwAcc}, sum);
  });
  for (unsigned p = 0; p < g.dp.size(); ++p)
    if (g.dp[p])
      tb.reduceCols({{g.dp[p]}}, {g.dpAcc[p]}, sum);
  for (unsigned b = 0; b < 2; ++b) {
    if (!g.baseCols[b])
      continue;
    auto reduce = [&] { tb.reduceCols({{g.base[b]}}, {g.baseCols[b]}, sum); };
    if (g.baseColsForWOnly[b])
      ifWeightGrad(tb, g.weightGrad, reduce);
    else
      reduce();
  }
}

void finishGradients(TileBuilder &tb, const Dims &s, GradientTiles &g, Value W, Value dW,
                     Value dparams) {
  // A factored gradient's sums per feature [M]: its base's column sums times its factor (the
  // sums themselves for a factor of 1), by one elementwise op over the features (mapped to
  // a block's threads on the GPU, where a loop that formed the factor per feature in every
  // thread spilled registers on sm_80). One buffer serves them in turn.
  Value terms;
  auto factoredSums = [&](const FactoredGradient &f) -> Value {
    if (matchPattern(partialValue(g.partials, f.partial), m_OneFloat()))
      return g.baseCols[f.base];
    if (!terms)
      terms = tb.buffer({s.M});
    tb.elementwise({{g.baseCols[f.base]}, {g.ww}}, {terms},
                   [&](OpBuilder &nb, Location l, ValueRange a) {
                     KernelBuilder kb(nb, l, tb.component);
                     Value zero = kb.f32(0);
                     Value factor = kb.partials(g.partials, zero, zero, f.column ? a[1] : zero,
                                                g.params)[f.partial];
                     return SmallVector<Value>{kb.mul(a[0], factor)};
                   });
    return terms;
  };
  // dW += 2 (the ||w||^2 sums) W; where wx is factored, dW holds sum_n base^T x and f times
  // that is wx's term.
  const std::optional<FactoredGradient> &fww = g.factored[2];
  Value fwx = g.dwxFactor;
  if (g.dww || fww || fwx)
    ifWeightGrad(tb, g.weightGrad, [&] {
      Value acc = g.dww ? g.dwwAcc : fww ? factoredSums(*fww) : Value();
      SmallVector<Operand> ins;
      if (acc)
        ins = {{acc, At::Row}, {W}};
      tb.elementwise(ins, {dW}, [&](OpBuilder &nb, Location l, ValueRange a) {
        Scalar x{nb, l};
        Value wx = fwx ? x.mul(fwx, a.back()) : a.back();
        return SmallVector<Value>{acc ? x.add(wx, x.mul(x.mul(x.c(2), a[0]), a[1])) : wx};
      });
    });
  tb.fill(dparams, 0);
  for (unsigned p = 0; p < g.dp.size(); ++p) {
    const std::optional<FactoredGradient> &f = g.factored[3 + p];
    if (!g.dp[p] && !f)
      continue;
    Value acc = f ? factoredSums(*f) : g.dpAcc[p];
    tb.forRange(tb.idx(0), tb.idx(s.M), [&](Value j) {
      Value sum = tb.add(tb.load(dparams, {tb.idx(p)}), tb.load(acc, {j}));
      tb.store(sum, dparams, {tb.idx(p)});
    });
  }
}

void scaleGradient(TileBuilder &tb, Value dx, Value X, Value acc) {
  if (!scalesWithGradient(tb.component))
    return;  // a constant scale: acc stays as the kernel filled it (0)
  tb.reduceCols({{dx}, {X}}, {acc}, [](OpBuilder &nb, Location l, ValueRange a) {
    Scalar x{nb, l};
    return SmallVector<Value>{x.add(a[2], x.mul(a[0], a[1]))};
  });
}

Value chunkOf(TileBuilder &tb, Value buf, Value c) {
  OpBuilder &b = tb.b;
  auto type = llvm::cast<MemRefType>(buf.getType());
  SmallVector<OpFoldResult> offsets = {c}, sizes = {b.getIndexAttr(1)},
                            strides(type.getRank(), b.getIndexAttr(1));
  SmallVector<int64_t> shape;
  for (int64_t i = 1; i < type.getRank(); ++i) {
    offsets.push_back(b.getIndexAttr(0));
    sizes.push_back(b.getIndexAttr(type.getDimSize(i)));
    shape.push_back(type.getDimSize(i));
  }
  MemRefType result =
      memref::SubViewOp::inferRankReducedResultType(shape, type, offsets, sizes, strides);
  return memref::SubViewOp::create(b, tb.loc, result, buf, offsets, sizes, strides);
}

void sumChunks(TileBuilder &tb, Value parts, Value total) {
  tb.fill(total, 0);
  tb.forRange(tb.idx(0), tb.dim(parts, 0), [&](Value r) {
    tb.elementwise({{chunkOf(tb, parts, r)}}, {total}, [](OpBuilder &nb, Location l, ValueRange a) {
      return SmallVector<Value>{arith::AddFOp::create(nb, l, a[1], a[0])};
    });
  });
}

} // namespace mlir::spectra::tiles
