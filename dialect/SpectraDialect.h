//===- SpectraDialect.h - the spectra dialect -----------------------------===//
//
// Public header of the dialect: the dialect class, enums and all op classes,
// plus the shared diagnostics helper every verifier uses.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_SPECTRADIALECT_H
#define SPECTRA_DIALECT_SPECTRADIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <optional>

#include "dialect/SpectraOpsDialect.h.inc"
#include "dialect/SpectraOpsEnums.h.inc"

#define GET_OP_CLASSES
#include "dialect/SpectraOps.h.inc"

namespace mlir::spectra {

/// On a function's argument (a unit attribute; a memref, or its pointer once lowered to
/// LLVM): the caller may pass it as the same buffer as another argument of its type marked
/// so, element for element (an in-place call, as moments_backward's dx and dxin). No
/// argument a kernel writes overlaps another unless both are marked (arguments only read
/// may share a tensor, as the moments' x and y); the compiler's schedules order and fuse
/// by that (codegen/Epilogue.h, spectra::mayAlias).
inline constexpr llvm::StringLiteral kMayAliasArgAttr = "spectra.may_alias";

/// Starts an error that names the violated constraint (`id`, e.g. "C2", as
/// listed in the op's description). When `offending` is given, a note points
/// at where that value is defined, so the user sees both ends.
InFlightDiagnostic constraintError(Operation *op, llvm::StringRef id, Value offending = {});

/// The value of an index SSA value when the verifier can know it: constants
/// and spectra.next_pow2 of known values.
std::optional<int64_t> knownIndex(Value value);

} // namespace mlir::spectra

#endif // SPECTRA_DIALECT_SPECTRADIALECT_H
