//===- KernelBuilder.h - shared pieces of the CPU and GPU kernel builders -===//
//
// Both targets build their kernels from the same component IR: the features
// region (logits and coefficients of one feature) and the compiler-derived
// partials (spectra-derive-partials) are cloned into the kernel's loops. This
// header holds the builder state and those inliners, so the CPU loops and the
// GPU tiles fuse the same math.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_KERNELBUILDER_H
#define SPECTRA_CODEGEN_KERNELBUILDER_H

#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::spectra {

/// A unit attribute on math.exp: its argument is at most 0, or NaN (a stabilised exponent, a
/// logit less a constant no smaller than it). The AVX-512 expansion then needs no upper clamp.
inline constexpr llvm::StringLiteral kExpAtMostZeroAttr = "spectra.exp_at_most_zero";

/// Emits kernel code; `b` always points where the next op goes.
class KernelBuilder {
public:
  KernelBuilder(OpBuilder &b, Location loc, ComponentOp component)
      : b(b), loc(loc), component(component) {}

  Value f32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(static_cast<float>(v)));
  }
  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value load(Value memref, ValueRange indices) {
    return memref::LoadOp::create(b, loc, memref, indices);
  }
  void store(Value value, Value memref, ValueRange indices) {
    memref::StoreOp::create(b, loc, value, memref, indices);
  }
  Value dim(Value memref, int64_t i) { return memref::DimOp::create(b, loc, memref, i); }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }

  /// Number of scalar parameters the features region takes after (wx, xx, ww).
  unsigned numParams() { return component.getFeatures().front().getNumArguments() - 3; }
  unsigned numOutputs() { return component.getNumOutputs(); }

  /// sum_c a[ia, c] * bm[ib, c] over c < n.
  Value dot(Value a, Value ia, Value bm, Value ib, Value n) {
    auto loop = scf::ForOp::create(b, loc, idx(0), n, idx(1), ValueRange{f32(0)});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value c = loop.getInductionVar();
    // Reassociation lets LLVM vectorise the reduction; contraction fuses the multiply-add.
    auto fast = arith::FastMathFlagsAttr::get(
        b.getContext(), arith::FastMathFlags::reassoc | arith::FastMathFlags::contract);
    Value prod = arith::MulFOp::create(b, loc, load(a, {ia, c}), load(bm, {ib, c}), fast);
    scf::YieldOp::create(
        b, loc, ValueRange{arith::AddFOp::create(b, loc, loop.getRegionIterArgs()[0], prod, fast)});
    return loop.getResult(0);
  }

  /// Inlines the features region at the insertion point; returns (logits, coeffs).
  std::pair<SmallVector<Value>, SmallVector<Value>> features(Value wx, Value xx, Value ww,
                                                             ArrayRef<Value> params) {
    Block &body = component.getFeatures().front();
    IRMapping map = bind(body, wx, xx, ww, params);
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

  /// Whether some output's coefficient depends on wx, xx or ww (the element); when none
  /// does (PosRF, OPRF, SADERF: constants and parameters), the kernels form it where
  /// they use it instead of keeping a coefficient tile.
  bool coefficientsVary() {
    Block &body = component.getFeatures().front();
    auto yield = llvm::cast<FeatureYieldOp>(body.getTerminator());
    SmallVector<Value> work(yield.getCoeffs().begin(), yield.getCoeffs().end());
    llvm::SmallPtrSet<Value, 16> seen;
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (!seen.insert(v).second)
        continue;
      if (auto arg = llvm::dyn_cast<BlockArgument>(v)) {
        if (arg.getOwner() == &body && arg.getArgNumber() < 3)
          return true;
        continue;
      }
      Operation *def = v.getDefiningOp();
      if (!def)
        continue;
      // An op with regions may read the element inside them, and an impure one may differ
      // per call: either counts as varying (the coefficient keeps its tile).
      if (def->getNumRegions() != 0 || !isPure(def))
        return true;
      llvm::append_range(work, def->getOperands());
    }
    return false;
  }

  /// Inlines a feature_partials body: element 2*(o*args + v) (+1) is
  /// d logit_o (d coeff_o) / d argument v, arguments (wx, xx, ww, params...).
  SmallVector<Value> partials(FeaturePartialsOp op, Value wx, Value xx, Value ww,
                              ArrayRef<Value> params) {
    Block &body = op.getBody().front();
    IRMapping map = bind(body, wx, xx, ww, params);
    for (Operation &inner : body.without_terminator())
      b.clone(inner, map);
    SmallVector<Value> values;
    for (Value y : llvm::cast<PartialsYieldOp>(body.getTerminator()).getValues())
      values.push_back(map.lookupOrDefault(y));
    return values;
  }

  OpBuilder &b;
  Location loc;
  ComponentOp component;

private:
  static IRMapping bind(Block &body, Value wx, Value xx, Value ww, ArrayRef<Value> params) {
    IRMapping map;
    map.map(body.getArgument(0), wx);
    map.map(body.getArgument(1), xx);
    map.map(body.getArgument(2), ww);
    for (auto [i, p] : llvm::enumerate(params))
      map.map(body.getArgument(3 + i), p);
    return map;
  }
};

/// The component's derived partials (`@<component>_partials`), derived and
/// added next to it when the module does not have them yet.
FailureOr<FeaturePartialsOp> lookupOrDerivePartials(ComponentOp component);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_KERNELBUILDER_H
