//===- spectra-opt.cpp - the spectra optimizer driver --------------------===//
//
// MlirOptMain with the spectra dialect, every spectra pass and pipeline, and
// the upstream dialects and passes the spectra pipelines use, so every
// lowering stage can be inspected and tested with lit.
//
//===----------------------------------------------------------------------===//

#include "codegen/CpuKernel.h"
#include "codegen/GpuLowering.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/Passes.h"
#include "dialect/SpectraDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringRef.h"

#include <vector>

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::spectra::SpectraDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::math::MathDialect, mlir::scf::SCFDialect,
                  mlir::tensor::TensorDialect>();
  // The dialects of the CPU kernels and what convert-to-llvm needs to lower them.
  mlir::spectra::registerCpuLoweringDialects(registry);
  // ... and of the GPU kernels, with the NVVM target and translations.
  mlir::spectra::registerGpuLoweringDialects(registry);
  mlir::registerTransformsPasses();
  mlir::spectra::registerSpectraPassesAndPipelines();
  mlir::spectra::registerSpectraCodegenPassesAndPipelines();
  // Diagnostics without MLIR's "see current operation" note (the op again, in generic form):
  // the error already names the op and its location. --mlir-print-op-on-diagnostic brings
  // the note back for debugging.
  std::vector<char *> args(argv, argv + argc);
  bool asked = false;
  for (int i = 1; i < argc; ++i)
    asked = asked || llvm::StringRef(argv[i]).contains("mlir-print-op-on-diagnostic");
  static char quiet[] = "--mlir-print-op-on-diagnostic=false";
  if (!asked)
    args.insert(args.begin() + 1, quiet);
  return mlir::asMainReturnCode(mlir::MlirOptMain(static_cast<int>(args.size()), args.data(),
                                                  "Spectra optimizer driver\n", registry));
}
