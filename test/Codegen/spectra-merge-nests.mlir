// RUN: spectra-opt %s --spectra-merge-nests | FileCheck %s

// Loads of q and k rows and of a mask into three tiles: no nest touches what another
// writes, so they are one nest of 256 threads, the mask's 16 behind a guard.
// CHECK-LABEL: func.func @disjoint
// CHECK: scf.forall (%[[T:.*]]) in (256) {
// CHECK:   memref.load %arg0[%[[T]]]
// CHECK:   memref.store %{{.*}}, %[[QT:.*]][%[[T]]]
// CHECK:   memref.load %arg1[%[[T]]]
// CHECK:   memref.store
// CHECK:   %[[LIVE:.*]] = arith.cmpi ult, %[[T]], %c16
// CHECK:   scf.if %[[LIVE]] {
// CHECK:     memref.load %arg2[%[[T]]]
// CHECK:     memref.store
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NOT: scf.forall
// CHECK: return
func.func @disjoint(%q: memref<256xf32>, %k: memref<256xf32>, %mask: memref<16xf32>) {
  %qt = memref.alloca() : memref<256xf32, #gpu.address_space<workgroup>>
  %kt = memref.alloca() : memref<256xf32, #gpu.address_space<workgroup>>
  %kept = memref.alloca() : memref<16xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (256) {
    %x = memref.load %q[%t] : memref<256xf32>
    memref.store %x, %qt[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (256) {
    %x = memref.load %k[%t] : memref<256xf32>
    memref.store %x, %kt[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (16) {
    %x = memref.load %mask[%t] : memref<16xf32>
    memref.store %x, %kept[%t] : memref<16xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// Left apart: a nest reading a tile the one before wrote (through a view of it), a nest
// writing a tile the one before read, and two nests with a block-level store between
// them. The third pair's second nest and the next one are independent: they merge.
// CHECK-LABEL: func.func @dependent
// CHECK: scf.forall (%{{.*}}) in (256)
// CHECK: scf.forall (%{{.*}}) in (128)
// CHECK: scf.forall (%{{.*}}) in (128)
// CHECK: }
// CHECK-NEXT: memref.store %{{.*}}, %{{.*}}[%c0]
// CHECK-NEXT: scf.forall (%{{.*}}) in (256) {
// CHECK:   memref.store %{{.*}}, %arg1
// CHECK:   scf.if
// CHECK: }
// CHECK-NOT: scf.forall
// CHECK: return
func.func @dependent(%q: memref<256xf32>, %out: memref<256xf32>) {
  %c0 = arith.constant 0 : index
  %one = arith.constant 1.0 : f32
  %qt = memref.alloca() : memref<256xf32, #gpu.address_space<workgroup>>
  %st = memref.alloca() : memref<128xf32, #gpu.address_space<workgroup>>
  %flag = memref.alloca() : memref<1xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (256) {
    %x = memref.load %q[%t] : memref<256xf32>
    memref.store %x, %qt[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  %hi = memref.subview %qt[128] [128] [1] : memref<256xf32, #gpu.address_space<workgroup>> to memref<128xf32, strided<[1], offset: 128>, #gpu.address_space<workgroup>>
  scf.forall (%t) in (128) {
    %x = memref.load %hi[%t] : memref<128xf32, strided<[1], offset: 128>, #gpu.address_space<workgroup>>
    memref.store %x, %st[%t] : memref<128xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (128) {
    memref.store %one, %qt[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  memref.store %one, %flag[%c0] : memref<1xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (256) {
    %x = memref.load %q[%t] : memref<256xf32>
    memref.store %x, %out[%t] : memref<256xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (128) {
    %x = memref.load %st[%t] : memref<128xf32, #gpu.address_space<workgroup>>
    memref.store %x, %st[%t] : memref<128xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// Inside a loop's body the nests merge as well; a warp nest (tensor cores) stays alone
// and ends the run.
// CHECK-LABEL: func.func @in_a_loop
// CHECK: scf.for
// CHECK:   scf.forall (%{{.*}}) in (64) {
// CHECK:     scf.if
// CHECK:   } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK:   scf.forall (%{{.*}}) in (2) {
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK:   scf.forall (%{{.*}}) in (32) {
// CHECK-NOT: scf.forall
// CHECK: return
func.func @in_a_loop(%q: memref<64xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  %b = memref.alloca() : memref<32xf32, #gpu.address_space<workgroup>>
  %c = memref.alloca() : memref<2xf32, #gpu.address_space<workgroup>>
  scf.for %i = %c0 to %n step %c1 {
    scf.forall (%t) in (64) {
      %x = memref.load %q[%t] : memref<64xf32>
      memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
    scf.forall (%t) in (32) {
      %x = memref.load %q[%t] : memref<64xf32>
      memref.store %x, %b[%t] : memref<32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
    scf.forall (%w) in (2) {
      %x = memref.load %q[%w] : memref<64xf32>
      memref.store %x, %c[%w] : memref<2xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
    scf.forall (%t) in (32) {
      %x = memref.load %q[%t] : memref<64xf32>
      memref.store %x, %b[%t] : memref<32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}
