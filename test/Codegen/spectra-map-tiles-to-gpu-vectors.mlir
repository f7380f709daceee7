// RUN: spectra-opt %s -split-input-file -spectra-map-tiles-to-gpu -canonicalize -cse -verify-diagnostics | FileCheck %s
// REQUIRES: ptxas
// RUN: spectra-compile --variant saderf-orf --m 16 --d 8 --target sm_80 --emit=gpu -o %t.mapped.mlir
// RUN: FileCheck %s --check-prefix=SADERF --input-file=%t.mapped.mlir
// RUN: spectra-compile --variant saderf-orf --target sm_80 --emit=ptx -o %t.ptx
// RUN: ptxas -arch=sm_80 -v %t.ptx -o %t.cubin 2>&1 | FileCheck %s --check-prefix=PTXAS

// Tests that straight-line vector code at block level (what the params kernels are,
// ParamsKernels.cpp) is spread over threads: one vector entry per thread, runs of
// elementwise ops one thread nest each, the values read later in workgroup tiles, and a
// sum a one-thread reduction every thread reads back; scalar code stays at block level.
// CHECK-LABEL: func.func @program(%{{.*}}: memref<?x8xf32>, %{{.*}}: memref<1xf32>, %{{.*}}: memref<?x8xf32>, %{{.*}}: memref<?x2xf32>)
// CHECK-NOT: vector<
// CHECK: scf.forall (%{{.*}}) in (%{{.*}}) {
// CHECK: memref.alloca() : memref<1xf32, #gpu.address_space<workgroup>>
// CHECK: %[[S:.*]] = memref.load %{{.*}}[%{{.*}}] : memref<1xf32>
// The first run (x s + 2): 8 threads, one entry each, into the tile the sum and the second
// run read.
// CHECK: scf.forall (%{{.*}}) in (8) {
// CHECK: %[[ZE:.*]] = memref.subview %[[Z:.*]][%{{.*}}] [1] [1] : memref<8xf32, #gpu.address_space<workgroup>>
// CHECK: linalg.generic {{.*}} outs(%[[ZE]] : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>)
// CHECK: %[[M:.*]] = arith.mulf %{{.*}}, %[[S]] : f32
// CHECK: arith.addf %[[M]], %{{.*}} : f32
// The sum's zero in the same nest, its first thread's: it writes another tile, so the two
// take one barrier (MergeNests.h).
// CHECK: scf.if
// CHECK: linalg.fill {{.*}} outs(%[[TOTAL:.*]] : memref<1xf32
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK: scf.forall (%{{.*}}) in (1) {
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]{{.*}} ins(%[[Z]] : {{.*}}) outs(%[[TOTAL]] :
// CHECK: %[[T:.*]] = memref.load %[[TOTAL]][%{{.*}}] : memref<1xf32, #gpu.address_space<workgroup>>
// The second run (z / total, exp) writes the output's entries.
// CHECK: scf.forall (%{{.*}}) in (8) {
// CHECK: arith.divf %{{.*}}, %[[T]] : f32
// CHECK: math.exp
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// The scalar stores: one thread.
// CHECK: memref.store %[[T]], %{{.*}}[%{{.*}}] : memref<2xf32
// CHECK-NEXT: memref.store
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK: } {mapping = [#gpu.block<x>]}
func.func @program(%a: memref<8xf32>, %s: memref<1xf32>, %out: memref<8xf32>, %p: memref<2xf32>)
    attributes {spectra.arg_names = ["a", "s", "out", "p"],
                spectra.arg_roles = ["slice", "shared", "slice", "slice"],
                spectra.grid = "slices", spectra.kernel = "moments_params"} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %two = arith.constant dense<2.0> : vector<8xf32>
  %x = vector.load %a[%c0] : memref<8xf32>, vector<8xf32>
  %sc = memref.load %s[%c0] : memref<1xf32>
  %b = vector.broadcast %sc : f32 to vector<8xf32>
  %y = arith.mulf %x, %b : vector<8xf32>
  %z = arith.addf %y, %two : vector<8xf32>
  %t = vector.reduction <add>, %z : vector<8xf32> into f32
  %tb = vector.broadcast %t : f32 to vector<8xf32>
  %w = arith.divf %z, %tb : vector<8xf32>
  %e = math.exp %w : vector<8xf32>
  vector.store %e, %out[%c0] : memref<8xf32>, vector<8xf32>
  // A sum of a broadcast scalar: its tile is filled with the scalar.
  %u = vector.reduction <add>, %b : vector<8xf32> into f32
  memref.store %t, %p[%c0] : memref<2xf32>
  memref.store %u, %p[%c1] : memref<2xf32>
  return
}

// -----

// Tests that a vector op the schedule cannot spread over threads is refused by name.
func.func @shuffle(%a: memref<8xf32>, %p: memref<8xf32>)
    attributes {spectra.arg_names = ["a", "p"], spectra.arg_roles = ["slice", "slice"],
                spectra.grid = "slices", spectra.kernel = "moments_params"} {
  %c0 = arith.constant 0 : index
  %x = vector.load %a[%c0] : memref<8xf32>, vector<8xf32>
  // expected-error@+1 {{'vector.shuffle' op spectra-map-tiles-to-gpu: not an elementwise arith or math op, which the GPU schedule spreads over threads}}
  %r = vector.shuffle %x, %x [7, 6, 5, 4, 3, 2, 1, 0] : vector<8xf32>, vector<8xf32>
  vector.store %r, %p[%c0] : memref<8xf32>, vector<8xf32>
  return
}

// -----

// Tests that a scalar op reading a vector (an entry picked out) is refused.
func.func @extract(%a: memref<8xf32>, %p: memref<1xf32>)
    attributes {spectra.arg_names = ["a", "p"], spectra.arg_roles = ["slice", "slice"],
                spectra.grid = "slices", spectra.kernel = "moments_params"} {
  %c0 = arith.constant 0 : index
  %x = vector.load %a[%c0] : memref<8xf32>, vector<8xf32>
  // expected-error@+1 {{'vector.extract' op spectra-map-tiles-to-gpu: a scalar op that reads a vector, which the GPU schedule cannot spread over threads}}
  %e = vector.extract %x[3] : f32 from vector<8xf32>
  memref.store %e, %p[%c0] : memref<1xf32>
  return
}

// -----

// Tests that a product of all entries (not a sum) is refused.
func.func @product(%a: memref<8xf32>, %p: memref<1xf32>)
    attributes {spectra.arg_names = ["a", "p"], spectra.arg_roles = ["slice", "slice"],
                spectra.grid = "slices", spectra.kernel = "moments_params"} {
  %c0 = arith.constant 0 : index
  %x = vector.load %a[%c0] : memref<8xf32>, vector<8xf32>
  // expected-error@+1 {{'vector.reduction' op spectra-map-tiles-to-gpu: only sums (vector.reduction <add>, no accumulator) are spread over threads}}
  %e = vector.reduction <mul>, %x : vector<8xf32> into f32
  memref.store %e, %p[%c0] : memref<1xf32>
  return
}

// The compiled params program of saderf-orf on the GPU: both kernels mapped, no vector
// left, and ptxas assembles them with no spill (every thread held each vector whole before).
// SADERF-LABEL: func.func @saderf_orf_moments_params(
// SADERF-SAME: spectra.grid = "slices", spectra.kernel = "moments_params"
// SADERF-NOT: vector<
// SADERF: {mapping = [#gpu.block<x>]}
// SADERF-LABEL: func.func @saderf_orf_moments_params_backward(
// SADERF-SAME: spectra.kernel = "moments_params_backward"
// SADERF-NOT: vector<
// SADERF: {mapping = [#gpu.block<x>]}
// PTXAS-DAG: Compiling entry function 'saderf_orf_moments_params' for 'sm_80'
// PTXAS-DAG: Compiling entry function 'saderf_orf_moments_params_backward' for 'sm_80'
// PTXAS-NOT: {{[1-9][0-9]*}} bytes spill stores
