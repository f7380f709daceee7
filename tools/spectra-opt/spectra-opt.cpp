//===- spectra-opt.cpp - the spectra optimizer driver --------------------===//
//
// MlirOptMain with the spectra dialect, every spectra pass and pipeline, and
// the upstream dialects and passes the spectra pipelines use, so every
// lowering stage can be inspected and tested with lit.
//
//===----------------------------------------------------------------------===//

#include "dialect/SpectraDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::spectra::SpectraDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::math::MathDialect, mlir::scf::SCFDialect,
                  mlir::tensor::TensorDialect>();
  mlir::registerTransformsPasses();
  mlir::spectra::registerSpectraPassesAndPipelines();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "Spectra optimizer driver\n", registry));
}
