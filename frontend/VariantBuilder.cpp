//===- VariantBuilder.cpp - variant name to spectra IR --------------------===//

#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"
#include "frontend/Variant.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace ::spectra::frontend;

static Type elementType(MLIRContext *ctx, llvm::StringRef dtype) {
  Builder b(ctx);
  if (dtype == "f64")
    return b.getF64Type();
  if (dtype == "f16")
    return b.getF16Type();
  if (dtype == "bf16")
    return b.getBF16Type();
  return b.getF32Type();
}

/// The library symbol of a CLI name: '-' is spelled '_'.
static std::string librarySymbol(llvm::StringRef cliName) {
  std::string s = cliName.str();
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

namespace spectra::frontend {
llvm::Expected<OwningOpRef<ModuleOp>>
buildVariantModule(MLIRContext *context, const Variant &variant,
                                      const VariantOptions &options, Instantiation *planOut) {
  llvm::Expected<Instantiation> plan = planVariant(variant, options);
  if (!plan)
    return plan.takeError();
  if (planOut)
    *planOut = *plan;

  context->loadDialect<mlir::spectra::SpectraDialect, func::FuncDialect>();
  // Collect diagnostics so a failure here comes back as an llvm::Error.
  std::string diagnostics;
  ScopedDiagnosticHandler handler(context, [&](Diagnostic &diag) {
    llvm::raw_string_ostream os(diagnostics);
    os << diag.getLocation() << ": " << diag << "\n";
    for (Diagnostic &note : diag.getNotes())
      os << note.getLocation() << ": note: " << note << "\n";
    return success();
  });

  Location loc = NameLoc::get(StringAttr::get(context, "variant:" + variant.name()));
  OpBuilder b(context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  module->setSymName(variant.symbol());
  b.setInsertionPointToEnd(module->getBody());

  NamedAttrList componentOptions;
  for (const auto &[key, value] : options.componentOptions)
    componentOptions.append(key, isRecipeOption(variant, key)
                                     ? Attribute(b.getI64IntegerAttr(static_cast<int64_t>(value)))
                                     : Attribute(b.getF32FloatAttr(static_cast<float>(value))));
  auto featureMap = mlir::spectra::FeatureMapOp::create(
      b, loc, b.getStringAttr(variant.symbol()),
      FlatSymbolRefAttr::get(context, librarySymbol(variant.component)),
      FlatSymbolRefAttr::get(context, librarySymbol(variant.weights)), b.getI64IntegerAttr(plan->m),
      b.getI64IntegerAttr(options.d), b.getI64IntegerAttr(options.seed),
      componentOptions.empty() ? DictionaryAttr() : componentOptions.getDictionary(context));

  // func.func @attention(q, k, v, mask, query_mask) -> out on [B, H, N, d] tensors.
  Type elt = elementType(context, options.dtype);
  int64_t dyn = ShapedType::kDynamic;
  auto act = RankedTensorType::get({dyn, dyn, dyn, options.d}, elt);
  auto mask = RankedTensorType::get({dyn, dyn}, b.getI1Type());
  auto fnType = b.getFunctionType({act, act, act, mask, mask}, {act});
  auto fn = func::FuncOp::create(b, loc, "attention", fnType);
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto attention = mlir::spectra::AttentionOp::create(
      b, loc, act, entry->getArgument(0), entry->getArgument(1), entry->getArgument(2),
      entry->getArgument(3), entry->getArgument(4),
      FlatSymbolRefAttr::get(featureMap.getSymNameAttr()), FloatAttr());
  func::ReturnOp::create(b, loc, attention.getResult());

  if (failed(mlir::spectra::linkBuiltinLibrary(*module)) || failed(verify(*module)))
    return llvm::createStringError("internal error building variant '" + variant.name() +
                                   "':\n" + diagnostics);
  return module;
}
} // namespace spectra::frontend
