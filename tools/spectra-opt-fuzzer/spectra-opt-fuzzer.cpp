//===- spectra-opt-fuzzer.cpp - libFuzzer target for parse + verify ------===//
//
// spectra-opt's front door as a libFuzzer target: any byte string is parsed as
// a module with the dialects spectra IR is written in, and a module that parses
// is verified (op verifiers, region and symbol checks). Diagnostics are the
// expected outcome for malformed input; a crash, a sanitizer report or a leak
// is a bug. Built by scripts/fuzz-spectra-opt.sh (clang, -fsanitize=fuzzer,address).
//
//===----------------------------------------------------------------------===//

#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const mlir::DialectRegistry registry = [] {
    mlir::DialectRegistry r;
    r.insert<mlir::spectra::SpectraDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect,
             mlir::math::MathDialect, mlir::scf::SCFDialect, mlir::tensor::TensorDialect>();
    return r;
  }();
  // A fresh context per input: no state carries over between inputs.
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  context.getDiagEngine().registerHandler([](mlir::Diagnostic &) { return mlir::success(); });
  mlir::ParserConfig config(&context);
  // MLIR's lexer stops at the NUL that ends every buffer spectra-opt reads (MemoryBuffer adds
  // it); libFuzzer's bytes have none, so they are parsed from a NUL-terminated copy.
  std::string text(reinterpret_cast<const char *>(data), size);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(text, config, "fuzz-input");
  if (module)
    (void)mlir::verify(*module);
  return 0;
}
