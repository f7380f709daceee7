//===- Passes.h - code generation passes and pipelines --------------------===//

#ifndef SPECTRA_CODEGEN_PASSES_H
#define SPECTRA_CODEGEN_PASSES_H

#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::spectra {

#define GEN_PASS_DECL
#include "codegen/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "codegen/Passes.h.inc"

/// Registers the codegen passes and the `spectra-cpu-lowering` and
/// `spectra-gpu-lowering` pipelines (for spectra-opt).
void registerSpectraCodegenPassesAndPipelines();

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_PASSES_H
