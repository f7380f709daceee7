// RUN: spectra-opt %s -spectra-build-cpu-kernels | FileCheck %s
// RUN: spectra-opt %s -spectra-build-cpu-kernels -spectra-cpu-lowering | FileCheck %s --check-prefix=LLVM

// Tests that the fused forward of a feature map is loops over memrefs with the
// features region inlined, the exact stabiliser (a key pre-pass taking the
// max logit over kept keys, then logit - shift), and no buffer for phi (the
// only allocation is the stack buffer of the m row norms ||w_i||^2).
// The partials the backward is built from sit next to the component.
// CHECK-LABEL: spectra.feature_partials @posrf_partials of @posrf
// CHECK-LABEL: func.func @posrf_orf_forward(
// CHECK-SAME: %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?x?xf32, strided<[?, 1]>>, %{{.*}}: memref<?xf32, strided<[1]>>,
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NOT: memref.alloc(
// CHECK: memref.alloca(%{{.*}}) : memref<?xf32>
// CHECK-NOT: memref.alloc
// Key pre-pass: max of the logit over features, kept keys only.
// CHECK: scf.for
// CHECK: scf.for
// CHECK: arith.subf
// CHECK: arith.maximumf
// CHECK: arith.cmpf ogt
// CHECK: arith.select
// The shift is saved for the backward.
// CHECK: memref.store %{{.*}}, %arg10
// Accumulation of S and z under the mask, phi = c * exp(logit - shift) * rowscale.
// CHECK: scf.if
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %arg8
// CHECK: memref.store %{{.*}}, %arg7
// Readout: per-query max, then num / den.
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: arith.divf
// CHECK-NOT: memref.alloc
// CHECK: return

// Tests that the backward is built from the derived partials (added next to
// the component, see above) and stores no phi either.
// CHECK-LABEL: func.func @posrf_orf_backward(
// CHECK-NOT: memref.alloc(
// CHECK: memref.alloca(%{{.*}}) : memref<?xf32>
// CHECK-NOT: memref.alloc
// CHECK: return

// LLVM-LABEL: llvm.func @posrf_orf_forward(
// LLVM: llvm.func @_mlir_ciface_posrf_orf_forward(
// LLVM: llvm.func @_mlir_ciface_posrf_orf_backward(
// LLVM-NOT: scf.for
spectra.feature_map @posrf_orf component @posrf weights @orf m = 16 d = 8 seed = 0
