// RUN: spectra-opt %s --spectra-launch-mapped-kernels | FileCheck %s

// Each nest of a mapped kernel ends with a barrier, except one marked spectra.no_barrier
// (MergeNests.h: the next nest of its phase is independent of it). Here the warp nest and
// the nest after it: one barrier after the first nest, none after the warp nest, one after
// the last.
// CHECK-LABEL: func.func @launched
// CHECK: gpu.launch
// CHECK: memref.store %{{.*}}, %[[TILE:.*]][%{{.*}}] : memref<64xf32, #gpu.address_space<workgroup>>
// CHECK-NEXT: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK: memref.store %{{.*}}, %arg2
// CHECK-NOT: gpu.barrier
// CHECK: memref.load %[[TILE]]
// CHECK-NEXT: memref.store %{{.*}}, %arg1
// CHECK-NEXT: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK: gpu.terminator
func.func @launched(%q: memref<64xf32>, %out: memref<64xf32>, %w: memref<2xf32>) attributes {spectra.threads = 64 : i64} {
  scf.forall (%b) in (1) {
    %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
    scf.forall (%t) in (64) {
      %x = memref.load %q[%t] : memref<64xf32>
      memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
    scf.forall (%v) in (2) {
      %x = memref.load %q[%v] : memref<64xf32>
      memref.store %x, %w[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
    scf.forall (%t) in (64) {
      %c63 = arith.constant 63 : index
      %r = arith.subi %c63, %t : index
      %x = memref.load %a[%r] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %out[%t] : memref<64xf32>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  } {mapping = [#gpu.block<x>]}
  return
}

// A warp nest marked spectra.first_warp (MergeNests.h: beside the warp nests before it in
// its phase) takes warps from there: its warp index is tid / 32 - 2, and warps 0 and 1,
// whose index wraps past its count, take no tile. The unmarked nest before it keeps warps
// 0 and 1.
// CHECK-LABEL: func.func @side_by_side
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}}) threads(%[[TX:[^,]*]], {{.*}}) in
// CHECK: %[[W0:.*]] = arith.divui %[[TX]], %c32{{.*}} : index
// CHECK: %[[LIVE0:.*]] = arith.cmpi ult, %[[W0]], %c2{{.*}} : index
// CHECK: scf.if %[[LIVE0]] {
// CHECK:   memref.store %{{.*}}, %arg1[%[[W0]]]
// CHECK-NOT: gpu.barrier
// CHECK: %[[W:.*]] = arith.divui %[[TX]], %c32{{.*}} : index
// CHECK: %[[U:.*]] = arith.subi %[[W]], %c2{{.*}} : index
// CHECK: %[[LIVE:.*]] = arith.cmpi ult, %[[U]], %c2{{.*}} : index
// CHECK: scf.if %[[LIVE]] {
// CHECK:   memref.store %{{.*}}, %arg2[%[[U]]]
// CHECK: gpu.barrier
// CHECK-NOT: gpu.barrier
// CHECK: gpu.terminator
func.func @side_by_side(%q: memref<64xf32>, %w: memref<2xf32>, %u: memref<2xf32>) attributes {spectra.threads = 128 : i64} {
  scf.forall (%b) in (1) {
    scf.forall (%v) in (2) {
      %x = memref.load %q[%v] : memref<64xf32>
      memref.store %x, %w[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
    scf.forall (%v) in (2) {
      %x = memref.load %q[%v] : memref<64xf32>
      memref.store %x, %u[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.first_warp = 2 : index, spectra.thread_nest}
  } {mapping = [#gpu.block<x>]}
  return
}

// The block's buffers are views of one pool, the dynamic shared memory, each at an offset
// aligned to 16 bytes (their vector<4xf32> accesses are ld/st.shared.v4): SGQ's 65 features
// make 260-byte tiles, so the next buffer starts at 272, and the launch carries 288 bytes.
// One pool, not a workgroup attribution per buffer, whose 64-bit addresses each held two
// registers through the loops (MapTilesToGpu.cpp, launch).
// CHECK-LABEL: func.func @one_pool
// CHECK: %[[BYTES:.*]] = arith.constant 288 : i32
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}}) threads({{.*}}) in ({{.*}}) dynamic_shared_memory_size %[[BYTES]] {
// CHECK-NEXT: %[[POOL:.*]] = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
// CHECK-NEXT: %[[AT0:.*]] = arith.constant 0 : index
// CHECK-NEXT: %[[A:.*]] = memref.view %[[POOL]][%[[AT0]]][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<65xf32, #gpu.address_space<workgroup>>
// CHECK-NEXT: %[[AT1:.*]] = arith.constant 272 : index
// CHECK-NEXT: %[[B:.*]] = memref.view %[[POOL]][%[[AT1]]][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<4xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: memref.alloca
// CHECK: memref.store %{{.*}}, %[[A]]
// CHECK: memref.store %{{.*}}, %[[B]]
func.func @one_pool(%q: memref<65xf32>) attributes {spectra.threads = 65 : i64} {
  scf.forall (%b) in (1) {
    %a = memref.alloca() : memref<65xf32, #gpu.address_space<workgroup>>
    %s = memref.alloca() : memref<4xf32, #gpu.address_space<workgroup>>
    scf.forall (%t) in (65) {
      %x = memref.load %q[%t] : memref<65xf32>
      memref.store %x, %a[%t] : memref<65xf32, #gpu.address_space<workgroup>>
      %c0 = arith.constant 0 : index
      memref.store %x, %s[%c0] : memref<4xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  } {mapping = [#gpu.block<x>]}
  return
}
