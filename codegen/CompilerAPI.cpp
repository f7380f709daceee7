//===- CompilerAPI.cpp - libspectra-compiler's extern "C" surface --------===//

#include "codegen/spectra_compiler.h"

#include "codegen/ExportFeatureMap.h"
#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"
#include "frontend/Variant.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/SourceMgr.h"

#include <cstdlib>
#include <cstring>

using namespace mlir;
namespace fe = ::spectra::frontend;

#ifndef SPECTRA_COMPILER_VERSION
#define SPECTRA_COMPILER_VERSION "dev"
#endif

static char *duplicate(const std::string &s) {
  char *p = static_cast<char *>(std::malloc(s.size() + 1));
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = 0;
  return p;
}

static char *fail(char **error, const std::string &message) {
  if (error)
    *error = duplicate(message);
  return nullptr;
}

namespace {
/// A context with the dialects spectra IR uses, collecting diagnostics as text.
struct Context {
  MLIRContext context{MLIRContext::Threading::DISABLED};
  std::string diagnostics;
  Context() {
    DialectRegistry registry;
    mlir::spectra::registerLibraryDialects(registry);
    registry.insert<func::FuncDialect>();
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    context.getDiagEngine().registerHandler([this](Diagnostic &diag) {
      llvm::raw_string_ostream os(diagnostics);
      os << diag.getLocation() << ": " << diag << "\n";
      for (Diagnostic &note : diag.getNotes())
        os << note.getLocation() << ": note: " << note << "\n";
    });
  }
};
} // namespace

extern "C" const char *spectra_compiler_version(void) { return SPECTRA_COMPILER_VERSION; }

extern "C" char *spectra_describe_variant(const char *variant, int64_t m, int64_t d, int64_t seed,
                                          const char *options, char **error) {
  if (!variant)
    return fail(error, "spectra_describe_variant: variant is NULL");
  llvm::Expected<fe::Variant> parsed = fe::parseVariantName(variant);
  if (!parsed)
    return fail(error, llvm::toString(parsed.takeError()));
  fe::VariantOptions opts;
  opts.m = m;
  opts.d = d;
  opts.seed = seed;
  llvm::SmallVector<llvm::StringRef> pairs;
  llvm::StringRef(options ? options : "").split(pairs, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef pair : pairs) {
    auto [key, value] = pair.split('=');
    double number;
    if (key.trim().empty() || value.trim().getAsDouble(number))
      return fail(error, "option '" + pair.str() + "' is not NAME=VALUE with a number");
    opts.componentOptions[key.trim().str()] = number;
  }
  Context ctx;
  auto module = fe::buildVariantModule(&ctx.context, *parsed, opts);
  if (!module)
    return fail(error, llvm::toString(module.takeError()));
  llvm::Expected<std::string> descriptor = mlir::spectra::exportFeatureMap(**module);
  if (!descriptor)
    return fail(error, llvm::toString(descriptor.takeError()));
  return duplicate(*descriptor);
}

extern "C" char *spectra_describe_ir(const char *ir, const char *sourceName,
                                     const char *featureMap, char **error) {
  if (!ir)
    return fail(error, "spectra_describe_ir: ir is NULL");
  Context ctx;
  ParserConfig config(&ctx.context);
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(ir, config, sourceName ? sourceName : "<spectra-ir>");
  if (!module)
    return fail(error, ctx.diagnostics.empty() ? "the IR does not parse" : ctx.diagnostics);
  llvm::Expected<std::string> descriptor =
      mlir::spectra::exportFeatureMap(*module, featureMap ? featureMap : "");
  if (!descriptor)
    return fail(error, llvm::toString(descriptor.takeError()) +
                           (ctx.diagnostics.empty() ? "" : "\n" + ctx.diagnostics));
  return duplicate(*descriptor);
}

extern "C" void spectra_free(void *pointer) { std::free(pointer); }
