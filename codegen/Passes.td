//===- Passes.td - code generation passes ---------------------------------===//

#ifndef SPECTRA_CODEGEN_PASSES_TD
#define SPECTRA_CODEGEN_PASSES_TD

include "mlir/Pass/PassBase.td"

def SpectraBuildCpuKernels : Pass<"spectra-build-cpu-kernels", "::mlir::ModuleOp"> {
  let summary = "emit the fused CPU forward and backward kernels of every feature map";
  let description = [{
    For each `spectra.feature_map @f` adds `func.func @f_forward`, one
    (batch, head) slice of the attention as scf loops over memrefs with the
    component's features region inlined: a pre-pass for the key stabiliser
    (one constant per slice), the key pass accumulating S and z, and the
    readout with one constant per query. phi is never stored: the kernel
    allocates nothing but a stack array of the m row norms. Also adds
    `@f_backward`, built from the compiler-derived partials
    (spectra-derive-partials). See codegen/CpuKernel.h for the arguments.

    ```mlir
    // spectra.feature_map @posrf_orf ... becomes, besides itself,
    // func.func @posrf_orf_forward(%q: memref<?x?xf32>, ...) attributes {llvm.emit_c_interface}
    ```
  }];
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::scf::SCFDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
}

def SpectraBuildGpuKernels : Pass<"spectra-build-gpu-kernels", "::mlir::ModuleOp"> {
  let summary = "emit the fused GPU kernels (forward and backward) of every feature map";
  let description = [{
    For each `spectra.feature_map @f` adds `gpu.module @f_kernels` with six
    kernels (codegen/GpuKernel.h): `@f_key_max`, `@f_kv_summary` and
    `@f_readout` (forward), `@f_query_backward`, `@f_dsummary` and
    `@f_key_backward` (backward, built from the derived partials). The
    component's features region is inlined into every kernel: phi lives in
    registers or in a shared-memory tile, never in global memory. The
    kernels are specialised on m, d, dv and the q/k/v element type (`dtype`),
    accumulating in f32. The module becomes a `gpu.container_module`.

    ```mlir
    // spectra.feature_map @posrf_orf ... becomes, besides itself,
    // gpu.module @posrf_orf_kernels {
    //   gpu.func @posrf_orf_key_max(%k: memref<?x?x32xbf16>, ...) kernel ...
    //   ...
    // }
    ```
  }];
  let options = [
    Option<"dtype", "dtype", "std::string", /*default=*/"\"f32\"",
           "element type of q, k, v and out: f32, bf16 or f16">,
    Option<"valueDim", "value-dim", "int64_t", /*default=*/"0",
           "value head dimension (0: the feature map's d)">,
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
}

def SpectraPolynomialExp : Pass<"spectra-polynomial-exp"> {
  let summary = "replace math.exp by its polynomial approximation (vectorisable, no libm call)";
  let description = [{
    The CPU kernels spend much of their time in `exp`; lowered as a libm call
    it is scalar and opaque to the loop vectoriser. This pass applies MLIR's
    polynomial approximation of `math.exp` (arith ops only, within a few ulp
    in f32), run by spectra-cpu-lowering before the conversion to LLVM.

    ```mlir
    %e = math.exp %x : f32   // becomes arith.mulf/addf/... and a bitcast
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

#endif // SPECTRA_CODEGEN_PASSES_TD
