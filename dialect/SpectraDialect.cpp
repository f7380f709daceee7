//===- SpectraDialect.cpp - dialect registration and shared helpers ------===//

#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/Matchers.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::spectra;

#include "dialect/SpectraOpsDialect.cpp.inc"
#include "dialect/SpectraOpsEnums.cpp.inc"

void SpectraDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialect/SpectraOps.cpp.inc"
      >();
}

InFlightDiagnostic mlir::spectra::constraintError(Operation *op, llvm::StringRef id,
                                                  Value offending) {
  InFlightDiagnostic diag = op->emitOpError();
  diag << id << ": ";
  if (offending)
    diag.attachNote(offending.getLoc()) << "offending value defined here";
  return diag;
}

std::optional<int64_t> mlir::spectra::knownIndex(Value value) {
  if (!value)
    return std::nullopt;
  APInt constant;
  if (matchPattern(value, m_ConstantInt(&constant)))
    return constant.getSExtValue();
  if (auto pow2 = value.getDefiningOp<NextPowerOfTwoOp>()) {
    std::optional<int64_t> in = knownIndex(pow2.getValue());
    if (!in || *in <= 0)
      return std::nullopt;
    return static_cast<int64_t>(llvm::PowerOf2Ceil(static_cast<uint64_t>(*in)));
  }
  return std::nullopt;
}

#define GET_OP_CLASSES
#include "dialect/SpectraOps.cpp.inc"
