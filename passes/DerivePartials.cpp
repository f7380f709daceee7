//===- DerivePartials.cpp - forward-mode derivatives of component functions ===//
//
// Each argument v of the features region is seeded with tangent 1 and pushed
// through the ops in order (forward mode); a null tangent means zero, so
// untouched branches cost nothing. The supported ops are those the runtime's
// reference interpreter evaluates.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/TypeSwitch.h"


#define DEBUG_TYPE "spectra-derive-partials"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRADERIVEPARTIALS
#include "passes/Passes.h.inc"

namespace {

/// Builds tangent expressions; null Values are zero.
class Tangents {
public:
  Tangents(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  /// A constant of the type the rules build in: f32, or a vector of f32 (spectra::localPartial
  /// on an elementwise op over vectors) as a splat.
  Value constant(double v) {
    auto vector = llvm::dyn_cast_or_null<VectorType>(type);
    if (!vector)
      return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(static_cast<float>(v)));
    return arith::ConstantOp::create(
        b, loc, DenseElementsAttr::get(vector, b.getF32FloatAttr(static_cast<float>(v))));
  }
  /// The type of the constants `of` and `constant` build: f32 (null), or a vector type.
  Type type;
  Value add(Value x, Value y) {
    if (!x)
      return y;
    if (!y)
      return x;
    return arith::AddFOp::create(b, loc, x, y);
  }
  Value sub(Value x, Value y) {
    if (!y)
      return x;
    if (!x)
      return arith::NegFOp::create(b, loc, y);
    return arith::SubFOp::create(b, loc, x, y);
  }
  /// factor * tangent (zero when the tangent is).
  Value scale(Value factor, Value tangent) {
    return tangent ? arith::MulFOp::create(b, loc, factor, tangent).getResult() : Value();
  }

  /// The tangent of `op`'s result from its operands' tangents `t`; failure
  /// for an op outside the supported set.
  FailureOr<Value> of(Operation *op, ArrayRef<Value> t) {
    Value r = op->getNumResults() == 1 ? op->getResult(0) : Value();
    type = r && llvm::isa<VectorType>(r.getType()) ? r.getType() : Type();
    auto in = [&](unsigned i) { return op->getOperand(i); };
    return llvm::TypeSwitch<Operation *, FailureOr<Value>>(op)
        .Case<arith::ConstantOp>([&](auto) { return Value(); })
        .Case<arith::AddFOp>([&](auto) { return add(t[0], t[1]); })
        .Case<arith::SubFOp>([&](auto) { return sub(t[0], t[1]); })
        .Case<arith::NegFOp>([&](auto) { return sub(Value(), t[0]); })
        .Case<arith::MulFOp>([&](auto) { return add(scale(in(1), t[0]), scale(in(0), t[1])); })
        .Case<arith::DivFOp>([&](auto) -> Value {
          // d(a/b) = da/b - (a/b) db/b
          Value first = t[0] ? arith::DivFOp::create(b, loc, t[0], in(1)).getResult() : Value();
          Value second;
          if (t[1])
            second = arith::DivFOp::create(b, loc, scale(r, t[1]), in(1));
          return sub(first, second);
        })
        .Case<arith::MaximumFOp, arith::MaxNumFOp, arith::MinimumFOp, arith::MinNumFOp>(
            [&](Operation *) -> Value {
              if (!t[0] && !t[1])
                return Value();
              // The tangent of whichever operand was selected.
              Value takeFirst = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, r, in(0));
              return arith::SelectOp::create(b, loc, takeFirst, t[0] ? t[0] : constant(0),
                                             t[1] ? t[1] : constant(0));
            })
        .Case<math::SqrtOp>([&](auto) -> Value {
          if (!t[0])
            return Value();
          return arith::DivFOp::create(b, loc, t[0], arith::MulFOp::create(b, loc, constant(2), r));
        })
        .Case<math::RsqrtOp>([&](auto) -> Value {
          // d a^(-1/2) = -1/2 a^(-3/2) da = -1/2 (r / a) da
          if (!t[0])
            return Value();
          Value ra = arith::DivFOp::create(b, loc, r, in(0));
          return scale(arith::MulFOp::create(b, loc, constant(-0.5), ra), t[0]);
        })
        .Case<math::ExpOp>([&](auto) { return scale(r, t[0]); })
        .Case<math::Exp2Op>([&](auto) -> Value {
          return t[0] ? scale(arith::MulFOp::create(b, loc, r, constant(0.69314718055994530942)), t[0])
                      : Value();
        })
        .Case<math::ExpM1Op>([&](auto) -> Value {
          return t[0] ? scale(arith::AddFOp::create(b, loc, r, constant(1)), t[0]) : Value();
        })
        .Case<math::LogOp>([&](auto) -> Value {
          return t[0] ? arith::DivFOp::create(b, loc, t[0], in(0)).getResult() : Value();
        })
        .Case<math::Log1pOp>([&](auto) -> Value {
          return t[0] ? arith::DivFOp::create(b, loc, t[0],
                                              arith::AddFOp::create(b, loc, in(0), constant(1)))
                            .getResult()
                      : Value();
        })
        .Case<math::PowFOp>([&](auto) -> Value {
          // d a^c = a^c (c da / a + log(a) dc)
          Value da, dc;
          if (t[0])
            da = arith::DivFOp::create(b, loc, scale(in(1), t[0]), in(0));
          if (t[1])
            dc = scale(math::LogOp::create(b, loc, in(0)), t[1]);
          Value sum = add(da, dc);
          return sum ? scale(r, sum) : Value();
        })
        .Case<math::CosOp>([&](auto) -> Value {
          return t[0] ? scale(arith::NegFOp::create(b, loc, math::SinOp::create(b, loc, in(0))), t[0])
                      : Value();
        })
        .Case<math::SinOp>([&](auto) -> Value {
          return t[0] ? scale(math::CosOp::create(b, loc, in(0)), t[0]) : Value();
        })
        .Case<math::TanhOp>([&](auto) -> Value {
          return t[0] ? scale(arith::SubFOp::create(b, loc, constant(1),
                                                    arith::MulFOp::create(b, loc, r, r)),
                              t[0])
                      : Value();
        })
        .Case<math::AbsFOp>([&](auto) -> Value {
          return t[0] ? scale(math::CopySignOp::create(b, loc, constant(1), in(0)), t[0]) : Value();
        })
        .Default([&](Operation *) -> FailureOr<Value> { return failure(); });
  }

private:
  OpBuilder &b;
  Location loc;
};

} // namespace

FailureOr<Value> localPartial(OpBuilder &b, Location loc, Operation *op, unsigned operand) {
  Tangents tangents(b, loc);
  Value r = op->getNumResults() == 1 ? op->getResult(0) : Value();
  tangents.type = r && llvm::isa<VectorType>(r.getType()) ? r.getType() : Type();
  SmallVector<Value> seeds(op->getNumOperands());
  seeds[operand] = tangents.constant(1);
  return tangents.of(op, seeds);
}

FailureOr<FeaturePartialsOp> derivePartials(ComponentOp component) {
  OpBuilder b(component.getContext());
  b.setInsertionPointAfter(component);
  Location loc = component.getLoc();
  Block &features = component.getFeatures().front();
  auto yield = llvm::cast<FeatureYieldOp>(features.getTerminator());

  std::string name = (component.getSymName() + "_partials").str();
  auto partials = FeaturePartialsOp::create(b, loc, b.getStringAttr(name),
                                            FlatSymbolRefAttr::get(component.getSymNameAttr()));
  Block *body = new Block();
  partials.getBody().push_back(body);
  IRMapping map;
  for (BlockArgument arg : features.getArguments())
    map.map(arg, body->addArgument(arg.getType(), arg.getLoc()));
  b.setInsertionPointToEnd(body);
  for (Operation &op : features.without_terminator())
    b.clone(op, map);
  SmallVector<Operation *> primal;
  for (Operation &op : *body)
    primal.push_back(&op);

  Tangents tangents(b, loc);
  unsigned numArgs = features.getNumArguments();
  // tangent[v][value]: d value / d argument v.
  SmallVector<DenseMap<Value, Value>> tangent(numArgs);
  for (unsigned v = 0; v < numArgs; ++v) {
    tangent[v][body->getArgument(v)] = tangents.constant(1);
    for (Operation *op : primal) {
      SmallVector<Value> operandTangents;
      for (Value operand : op->getOperands())
        operandTangents.push_back(tangent[v].lookup(operand));
      bool anyTangent = llvm::any_of(operandTangents, [](Value t) { return static_cast<bool>(t); });
      if (!anyTangent && !llvm::isa<arith::ConstantOp>(op) && op->getNumOperands() > 0)
        continue;  // d op / d v = 0
      FailureOr<Value> t = tangents.of(op, operandTangents);
      if (failed(t)) {
        op->emitOpError() << "cannot be differentiated by spectra-derive-partials (component '"
                          << component.getSymName() << "'); supported: arith add/sub/mul/div/neg/"
                             "constant/maximum/minimum, math sqrt/rsqrt/exp/exp2/expm1/log/log1p/"
                             "powf/cos/sin/tanh/absf";
        partials.erase();
        return failure();
      }
      if (*t && op->getNumResults() == 1)
        tangent[v][op->getResult(0)] = *t;
    }
  }

  SmallVector<Value> values;
  Value zero;
  auto orZero = [&](Value t) {
    if (t)
      return t;
    if (!zero)
      zero = tangents.constant(0);
    return zero;
  };
  for (unsigned o = 0; o < yield.getLogits().size(); ++o)
    for (unsigned v = 0; v < numArgs; ++v) {
      values.push_back(orZero(tangent[v].lookup(map.lookup(yield.getLogits()[o]))));
      values.push_back(orZero(tangent[v].lookup(map.lookup(yield.getCoeffs()[o]))));
    }
  PartialsYieldOp::create(b, loc, values);
  return partials;
}

namespace {
struct DerivePartialsPass : impl::SpectraDerivePartialsBase<DerivePartialsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    for (ComponentOp component : llvm::to_vector(module.getOps<ComponentOp>())) {
      if (symbols.lookup((component.getSymName() + "_partials").str()))
        continue;
      if (failed(derivePartials(component)))
        return signalPassFailure();
    }
  }
};
} // namespace
} // namespace mlir::spectra
