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

/// The dialect's one argument attribute, spectra.may_alias: a unit attribute on an argument
/// of a function.
LogicalResult SpectraDialect::verifyRegionArgAttribute(Operation *op, unsigned region,
                                                       unsigned index, NamedAttribute attr) {
  if (attr.getName() != kMayAliasArgAttr)
    return op->emitError() << "unknown argument attribute '" << attr.getName().getValue()
                           << "' (the spectra dialect's argument attributes: '"
                           << kMayAliasArgAttr << "')";
  if (!isa<UnitAttr>(attr.getValue()))
    return op->emitError() << "'" << kMayAliasArgAttr << "' on argument #" << index
                           << " takes no value (a unit attribute), got " << attr.getValue();
  // Any type: after the lowering to LLVM the argument is the memref's pointer. (MLIR asks
  // this only of a function's arguments.)
  return success();
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
// Region arguments written in the op syntax are defined inside the region. The
// ops using these directives (weight_recipe, component, feature_partials) are
// IsolatedFromAbove, and their regions must be parsed as isolated name scopes
// (`enableNameShadowing`): otherwise a forward reference left unresolved in one
// op's region stays pending in the module's scope and binds to a value defined
// later in another op's region (a cross-region use the verifier never sees if
// that later op fails to parse: its region is freed while the first op still
// uses the value, a use-after-free found by the malformed-input sweep). In an
// isolated scope the reference is reported where it is used.

static ParseResult parseArgsRegion(OpAsmParser &parser, Region &region, Type type) {
  SmallVector<OpAsmParser::Argument> args;
  if (parser.parseArgumentList(args, OpAsmParser::Delimiter::Paren, /*allowType=*/false))
    return failure();
  for (OpAsmParser::Argument &arg : args)
    arg.type = type;
  return parser.parseRegion(region, args, /*enableNameShadowing=*/true);
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

/// custom<MaskTypes>: `, type` for each mask present, in operand order. Two optional
/// operands of one type cannot be told apart by optional groups of the declarative
/// format: a query mask alone would be read as the key mask's type.
static ParseResult parseMaskTypes(OpAsmParser &parser,
                                  std::optional<OpAsmParser::UnresolvedOperand> mask,
                                  std::optional<OpAsmParser::UnresolvedOperand> queryMask,
                                  Type &maskType, Type &queryMaskType) {
  if (mask && (parser.parseComma() || parser.parseType(maskType)))
    return failure();
  if (queryMask && (parser.parseComma() || parser.parseType(queryMaskType)))
    return failure();
  return success();
}

static void printMaskTypes(OpAsmPrinter &printer, Operation *, Value mask, Value queryMask,
                           Type maskType, Type queryMaskType) {
  if (mask)
    printer << ", " << maskType;
  if (queryMask)
    printer << ", " << queryMaskType;
}

#define GET_OP_CLASSES
#include "dialect/SpectraOps.cpp.inc"
