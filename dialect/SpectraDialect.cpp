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

/// Folded index sizes (next_pow2 of a constant) become arith constants.
Operation *SpectraDialect::materializeConstant(OpBuilder &builder, Attribute value, Type type,
                                               Location loc) {
  if (auto integer = llvm::dyn_cast<IntegerAttr>(value); integer && type.isIndex())
    return arith::ConstantOp::create(builder, loc, type, integer);
  return nullptr;
}

InFlightDiagnostic mlir::spectra::constraintError(Operation *op, llvm::StringRef id,
                                                  Value offending) {
  InFlightDiagnostic diag = op->emitOpError();
  diag << id << ": ";
  if (offending)
    diag.attachNote(offending.getLoc()) << "offending value defined here";
  return diag;
}

/// Op verifiers run before dominance is checked, so invalid IR may hold a
/// cycle (`%n = spectra.next_pow2 %n`): the depth bound keeps this total.
static std::optional<int64_t> knownIndexImpl(Value value, unsigned depth) {
  if (!value || depth > 16)
    return std::nullopt;
  APInt constant;
  if (matchPattern(value, m_ConstantInt(&constant)))
    return constant.getSExtValue();
  if (auto pow2 = value.getDefiningOp<NextPowerOfTwoOp>()) {
    std::optional<int64_t> in = knownIndexImpl(pow2.getValue(), depth + 1);
    if (!in || *in <= 0)
      return std::nullopt;
    return static_cast<int64_t>(llvm::PowerOf2Ceil(static_cast<uint64_t>(*in)));
  }
  return std::nullopt;
}

std::optional<int64_t> mlir::spectra::knownIndex(Value value) { return knownIndexImpl(value, 0); }

//===----------------------------------------------------------------------===//
// custom<IndexArgsRegion> / custom<F32ArgsRegion>: `(%a, %b) { ... }`
//===----------------------------------------------------------------------===//
//
// Region arguments written in the op syntax are defined inside the region's
// isolated name scope. A `^bb0(...)` header instead lets an unresolved forward
// reference from outside bind to a block argument, which dangles once a later
// parse error drops the region (found by the malformed-input sweep).

static ParseResult parseArgsRegion(OpAsmParser &parser, Region &region, Type type) {
  SmallVector<OpAsmParser::Argument> args;
  if (parser.parseArgumentList(args, OpAsmParser::Delimiter::Paren, /*allowType=*/false))
    return failure();
  for (OpAsmParser::Argument &arg : args)
    arg.type = type;
  return parser.parseRegion(region, args, /*enableNameShadowing=*/false);
}

static void printArgsRegion(OpAsmPrinter &printer, Region &region) {
  printer << "(";
  if (!region.empty())
    llvm::interleaveComma(region.front().getArguments(), printer,
                          [&](BlockArgument arg) { printer.printOperand(arg); });
  printer << ") ";
  printer.printRegion(region, /*printEntryBlockArgs=*/false);
}

static ParseResult parseIndexArgsRegion(OpAsmParser &parser, Region &region) {
  return parseArgsRegion(parser, region, parser.getBuilder().getIndexType());
}
static void printIndexArgsRegion(OpAsmPrinter &printer, Operation *, Region &region) {
  printArgsRegion(printer, region);
}
static ParseResult parseF32ArgsRegion(OpAsmParser &parser, Region &region) {
  return parseArgsRegion(parser, region, parser.getBuilder().getF32Type());
}
static void printF32ArgsRegion(OpAsmPrinter &printer, Operation *, Region &region) {
  printArgsRegion(printer, region);
}

#define GET_OP_CLASSES
#include "dialect/SpectraOps.cpp.inc"
