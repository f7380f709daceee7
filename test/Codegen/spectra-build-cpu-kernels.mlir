// RUN: spectra-opt %s -spectra-build-cpu-kernels | FileCheck %s
// RUN: spectra-opt %s -spectra-build-cpu-kernels -spectra-cpu-lowering | FileCheck %s --check-prefix=LLVM

// Tests that the fused forward of a feature map is loops over memrefs with the
// features region inlined, the exact stabiliser kept online (a running key
// constant: when a logit exceeds it, S and z are rescaled by exp(old - new)),
// and no buffer for phi (the only allocation is the stack buffer of the m row
// norms ||w_i||^2).
// The partials the backward is built from sit next to the component.
// CHECK-LABEL: spectra.feature_partials @posrf_partials of @posrf
// CHECK-LABEL: func.func @posrf_orf_forward(
// CHECK-SAME: %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?xf32, strided<[1]>>,
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NOT: memref.alloc(
// CHECK: memref.alloca(%{{.*}}) : memref<?xf32>
// CHECK-NOT: memref.alloc
// One pass over kept keys carrying the running constant through the mask branch.
// CHECK: scf.if %{{.*}} -> (f32)
// A larger logit rescales what was accumulated: r = exp(M - l), S and z times r.
// CHECK: %[[ABOVE:[[:alnum:]_]+]] = arith.cmpf ogt, %[[L:[[:alnum:]_]+]], %[[M:[[:alnum:]_]+]] : f32
// CHECK-NEXT: scf.if %[[ABOVE]] {
// CHECK: %[[R:.*]] = math.exp
// CHECK: arith.mulf %{{.*}}, %[[R]]
// CHECK: %[[NEWM:.*]] = arith.maximumf %[[M]], %[[L]]
// Then phi = c * exp(logit - M) * rowscale accumulates into z and S.
// CHECK: arith.subf %[[L]], %[[NEWM]]
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %arg8
// CHECK: memref.store %{{.*}}, %arg7
// The final constant (0 when no key is kept) is saved for the backward.
// CHECK: arith.select
// CHECK: memref.store %{{.*}}, %arg10
// Readout: one pass per query with its own running constant, then num / den;
// the constant and denominator go to qstat for the backward.
// CHECK: scf.for {{.*}} -> (f32, f32)
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: arith.divf
// CHECK: memref.store %{{.*}}, %arg11
// CHECK-NOT: memref.alloc
// CHECK: return

// Tests that the backward is built from the derived partials (added next to
// the component, see above) and stores no phi either.
// CHECK-LABEL: func.func @posrf_orf_backward(
// CHECK-NOT: memref.alloc(
// CHECK: memref.alloca(%{{.*}}) : memref<?xf32>
// CHECK-NOT: memref.alloc
// CHECK: return

// Tests that the lowering approximates exp by a polynomial (no libm call left).
// LLVM-LABEL: llvm.func @posrf_orf_forward(
// LLVM-NOT: llvm.intr.exp
// LLVM-NOT: @expf
// LLVM: llvm.func @_mlir_ciface_posrf_orf_forward(
// LLVM: llvm.func @_mlir_ciface_posrf_orf_backward(
// LLVM-NOT: scf.for
spectra.feature_map @posrf_orf component @posrf weights @orf m = 16 d = 8 seed = 0
