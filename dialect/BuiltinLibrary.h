//===- BuiltinLibrary.h - the random features that ship with Spectra -----===//
//
// The named weight recipes and component functions are written in the dialect
// itself (dialect/library/*.mlir) and embedded in the compiler at build time.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_BUILTINLIBRARY_H
#define SPECTRA_DIALECT_BUILTINLIBRARY_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"

#include <string>
#include <vector>

namespace mlir {
class DialectRegistry;
namespace spectra {

/// One embedded library file.
struct LibraryFile {
  llvm::StringRef name;
  llvm::StringRef text;
};

/// The embedded library files, in a fixed order.
llvm::ArrayRef<LibraryFile> getBuiltinLibraryFiles();

/// What verifiers need to know of a library definition without linking it.
struct BuiltinSymbol {
  enum class Kind { Recipe, Component } kind;
  std::vector<std::string> options; ///< option names of a component or recipe
};

/// The library's symbols by name, summarised once from a private context
/// (thread-safe), so a module may reference built-ins it has not linked yet.
const llvm::StringMap<BuiltinSymbol> &getBuiltinSymbols();

/// Registers the dialects the library is written in (spectra, arith, math).
void registerLibraryDialects(DialectRegistry &registry);

/// Parses and verifies the whole library into one module. On failure emits
/// diagnostics in `context` (located in the embedded file) and returns null.
OwningOpRef<ModuleOp> parseBuiltinLibrary(MLIRContext *context);

/// Copies into `module` every library recipe and component that its feature
/// maps reference but it does not define itself; user definitions win.
/// Fails (with a diagnostic on the feature map) for a name neither defines.
LogicalResult linkBuiltinLibrary(ModuleOp module);

} // namespace spectra
} // namespace mlir

#endif // SPECTRA_DIALECT_BUILTINLIBRARY_H
