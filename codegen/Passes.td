//===- Passes.td - code generation passes ---------------------------------===//

#ifndef SPECTRA_CODEGEN_PASSES_TD
#define SPECTRA_CODEGEN_PASSES_TD

include "mlir/Pass/PassBase.td"

def SpectraBuildCpuKernels : Pass<"spectra-build-cpu-kernels", "::mlir::ModuleOp"> {
  let summary = "emit the fused CPU forward kernel of every feature map";
  let description = [{
    For each `spectra.feature_map @f` adds `func.func @f_forward`, one
    (batch, head) slice of the attention as scf loops over memrefs with the
    component's features region inlined: a pre-pass for the key stabiliser
    (one constant per slice), the key pass accumulating S and z, and the
    readout with one constant per query. phi is never stored: the kernel
    allocates nothing. See codegen/CpuKernel.h for the arguments.

    ```mlir
    // spectra.feature_map @posrf_orf ... becomes, besides itself,
    // func.func @posrf_orf_forward(%q: memref<?x?xf32>, ...) attributes {llvm.emit_c_interface}
    ```
  }];
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::scf::SCFDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
}

#endif // SPECTRA_CODEGEN_PASSES_TD
