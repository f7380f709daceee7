//===- LinkBuiltinLibrary.cpp - the spectra-link-library pass ------------===//

#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#define DEBUG_TYPE "spectra-link-library"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRALINKLIBRARY
#include "passes/Passes.h.inc"

namespace {
struct LinkLibraryPass : impl::SpectraLinkLibraryBase<LinkLibraryPass> {
  void runOnOperation() override {
    if (failed(linkBuiltinLibrary(getOperation())))
      signalPassFailure();
  }
};
} // namespace
} // namespace mlir::spectra
