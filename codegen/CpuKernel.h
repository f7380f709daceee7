//===- CpuKernel.h - the fused CPU forward kernel --------------------------===//
//
// One (batch, head) slice of random-feature attention as loops with the
// component's features region inlined, so phi is never stored: the key pass
// accumulates S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j) and zabs = sum_j
// |phi(k_j)| with one stabiliser constant per feature, and the readout
// computes phi(q_n)^T S / phi(q_n)^T z with one constant per query and the
// denominator guard (spectra_compiler.h: SPECTRA_DENOMINATOR_GUARD).
//
// Signature (all f32, llvm.emit_c_interface):
//   forward(q [Nq,d], k [Nk,d], v [Nk,dv], keep [Nk] (1 or 0), W [m,d],
//           rowscale [m], params [P], S [K*m,dv], z [K*m], zabs [K*m],
//           out [Nq,dv], shift [K*m], qstat [Nq,3])
// q and k arrive normalised and transformed (diag scales applied);
// rowscale is m*a_i for quadrature weights, else 1; S, z, shift (each
// feature's key constant) and qstat (each query's constant, guarded
// denominator, and 1 where the guard fired) are saved for the backward.
// Both stabilisers are online (flash attention's rescaling): one pass over
// the keys and one over each query's features.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_CPUKERNEL_H
#define SPECTRA_CODEGEN_CPUKERNEL_H

#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::spectra {

/// Adds `func.func @<name>` (the fused forward of `component`) to `module`.
FailureOr<func::FuncOp> buildCpuForwardKernel(ModuleOp module, ComponentOp component,
                                              StringRef name);

/// Adds `func.func @<name>`, the fused backward of `component` for one slice,
/// built from the compiler-derived partials (spectra-derive-partials):
///   backward(q, k, v, keep, W, rowscale, params, S, z, out, shift [K*m], qstat,
///            gout, dq, dk, dv, dW, dparams, dS, dz)
/// q, k are the forward's normalised, transformed inputs; S, z, out, shift,
/// qstat what the forward saved; gout = dL/dout. Outputs dq, dk, dv, dW (this
/// slice's share), dparams; dS, dz are scratch [outputs*m, dv], [outputs*m].
/// The stabiliser constants cancel in the output, so they get no gradient.
FailureOr<func::FuncOp> buildCpuBackwardKernel(ModuleOp module, ComponentOp component,
                                               StringRef name);

/// Registers the dialects the CPU kernels use and their convert-to-llvm
/// interfaces; every tool that runs buildCpuLoweringPipeline needs them.
void registerCpuLoweringDialects(DialectRegistry &registry);

/// Lowers the kernel module to the LLVM dialect (scf, arith, math, memref,
/// func to LLVM). Registered in spectra-opt as spectra-cpu-lowering.
void buildCpuLoweringPipeline(OpPassManager &pm);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_CPUKERNEL_H
