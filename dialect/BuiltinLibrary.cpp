//===- BuiltinLibrary.cpp - embedding, parsing and linking the library ---===//

#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

using namespace mlir;
using namespace mlir::spectra;

static const LibraryFile kLibraryFiles[] = {
#include "dialect/BuiltinLibrary.inc"
};

ArrayRef<LibraryFile> mlir::spectra::getBuiltinLibraryFiles() { return kLibraryFiles; }

void mlir::spectra::registerLibraryDialects(DialectRegistry &registry) {
  registry.insert<SpectraDialect, arith::ArithDialect, math::MathDialect>();
}

OwningOpRef<ModuleOp> mlir::spectra::parseBuiltinLibrary(MLIRContext *context) {
  DialectRegistry registry;
  registerLibraryDialects(registry);
  context->appendDialectRegistry(registry);
  context->loadDialect<SpectraDialect, arith::ArithDialect, math::MathDialect>();

  OwningOpRef<ModuleOp> library = ModuleOp::create(UnknownLoc::get(context));
  for (const LibraryFile &file : getBuiltinLibraryFiles()) {
    ParserConfig config(context);
    std::string name = ("<spectra-builtin>/" + file.name).str();
    OwningOpRef<ModuleOp> part = parseSourceString<ModuleOp>(file.text, config, name);
    if (!part)
      return nullptr;
    Block *dest = library->getBody();
    for (Operation &op : llvm::make_early_inc_range(part->getBody()->getOperations()))
      op.moveBefore(dest, dest->end());
  }
  if (failed(verify(*library)))
    return nullptr;
  return library;
}

const llvm::StringMap<BuiltinSymbol> &mlir::spectra::getBuiltinSymbols() {
  static const llvm::StringMap<BuiltinSymbol> symbols = [] {
    llvm::StringMap<BuiltinSymbol> out;
    MLIRContext context(MLIRContext::Threading::DISABLED);
    OwningOpRef<ModuleOp> library = parseBuiltinLibrary(&context);
    if (!library)
      llvm::report_fatal_error("the embedded spectra library does not parse");
    for (auto recipe : library->getOps<WeightRecipeOp>()) {
      BuiltinSymbol symbol{BuiltinSymbol::Kind::Recipe, {}};
      for (StringRef name : recipe.getOptionNames())
        symbol.options.push_back(name.str());
      out[recipe.getSymName()] = std::move(symbol);
    }
    for (auto component : library->getOps<ComponentOp>()) {
      BuiltinSymbol symbol{BuiltinSymbol::Kind::Component, {}};
      for (StringRef name : component.getOptionNames())
        symbol.options.push_back(name.str());
      out[component.getSymName()] = std::move(symbol);
    }
    return out;
  }();
  return symbols;
}

LogicalResult mlir::spectra::linkBuiltinLibrary(ModuleOp module) {
  SymbolTable symbols(module);
  SmallVector<FeatureMapOp> featureMaps(module.getOps<FeatureMapOp>());
  if (featureMaps.empty())
    return success();

  OwningOpRef<ModuleOp> library;
  for (FeatureMapOp featureMap : featureMaps) {
    for (StringRef name : {featureMap.getComponent(), featureMap.getWeights()}) {
      if (symbols.lookup(name))
        continue;
      if (!library && !(library = parseBuiltinLibrary(module.getContext())))
        return module.emitError("the built-in spectra library failed to parse");
      Operation *definition = SymbolTable::lookupSymbolIn(*library, name);
      if (!definition)
        return featureMap.emitOpError()
               << "'" << name << "' is neither defined in this module nor in the built-in library";
      Operation *copy = definition->clone();
      symbols.insert(copy, module.getBody()->begin());
    }
  }
  return success();
}
