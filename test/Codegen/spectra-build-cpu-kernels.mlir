// RUN: spectra-opt %s -spectra-build-cpu-kernels | FileCheck %s
// RUN: spectra-opt %s -spectra-build-cpu-kernels -spectra-cpu-lowering | FileCheck %s --check-prefix=LLVM

// Tests that the fused forward of a feature map is loops over memrefs with the
// features region inlined, the exact stabiliser kept online with one key
// constant per feature (when a key's logit exceeds its feature's constant, that
// feature's z, zabs and S row are rescaled by exp(old - new)), the denominator
// guard in the readout, and no buffer for phi (the only allocation is the
// stack buffer of the m row norms ||w_i||^2).
// The partials the backward is built from sit next to the component.
// CHECK-LABEL: spectra.feature_partials @posrf_partials of @posrf
// CHECK-LABEL: func.func @posrf_orf_forward(
// CHECK-SAME: %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?xf32, strided<[1]>>,
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NOT: memref.alloc(
// CHECK: memref.alloca(%{{.*}}) : memref<?xf32>
// CHECK-NOT: memref.alloc
// The per-feature constants start at -inf (arg11), z and zabs at 0.
// CHECK: memref.store %{{.*}}, %arg11[%{{.*}}]
// One pass over kept keys: a larger logit than feature f's constant rescales
// z_f (arg8), zabs_f (arg9) and S_f (arg7) by r = exp(c_f - l) and raises c_f.
// CHECK: %[[C:[[:alnum:]_]+]] = memref.load %arg11[%[[F:[[:alnum:]_]+]]]
// CHECK-NEXT: %[[ABOVE:[[:alnum:]_]+]] = arith.cmpf ogt, %[[L:[[:alnum:]_]+]], %[[C]] : f32
// CHECK-NEXT: scf.if %[[ABOVE]] {
// CHECK: %[[R:.*]] = math.exp
// CHECK: arith.mulf %{{.*}}, %[[R]]
// CHECK: memref.store %{{.*}}, %arg8[%[[F]]]
// CHECK: memref.store %{{.*}}, %arg9[%[[F]]]
// CHECK: memref.store %{{.*}}, %arg7[%[[F]], %{{.*}}]
// CHECK: memref.store %[[L]], %arg11[%[[F]]]
// Then phi = c * exp(logit - c_f) * rowscale accumulates into z, zabs and S.
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %arg8
// CHECK: math.absf
// CHECK: memref.store %{{.*}}, %arg9
// CHECK: memref.store %{{.*}}, %arg7
// A feature no kept key reached keeps the constant 0.
// CHECK: arith.select
// CHECK: memref.store %{{.*}}, %arg11
// Readout: one pass per query with its own running constant over l_f + c_f,
// carrying the denominator and the guard's scale T; the guard, then num / den;
// the constant, the guarded denominator and whether it fired go to qstat.
// CHECK: scf.for {{.*}} -> (f32, f32, f32)
// CHECK: memref.load %arg11
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: arith.cmpf ule
// CHECK: arith.select
// CHECK: arith.divf
// CHECK: memref.store %{{.*}}, %arg12
// CHECK: memref.store %{{.*}}, %arg12
// CHECK: memref.store %{{.*}}, %arg12
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
