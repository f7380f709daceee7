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

// Inside a loop's body the nests merge as well. A warp nest (tensor cores) is not merged
// but joins a phase: independent of the rest, the first, after its thread nests, which
// then need no barrier before it (spectra.no_barrier). The last nest writes what the
// second wrote, in other threads (the columns reversed): a phase after theirs.
// CHECK-LABEL: func.func @in_a_loop
// CHECK: scf.for
// CHECK:   scf.forall (%{{.*}}) in (64) {
// CHECK:     scf.if
// CHECK:   } {mapping = [#gpu.thread<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT:   scf.forall (%{{.*}}) in (32) {
// CHECK:   } {mapping = [#gpu.thread<x>], spectra.thread_nest}
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
      %c31 = arith.constant 31 : index
      %r = arith.subi %c31, %t : index
      memref.store %x, %b[%r] : memref<32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}

// A tile's fill, its load, the next tile's fill and load, in turn (a causal kernel's
// prologue): each load writes its tile's elements in other threads than the fill did (here
// reversed), so it conflicts with that fill only; the fills move up into one phase and the
// loads into the next. Two barriers where there were four.
// CHECK-LABEL: func.func @fills_and_loads
// CHECK: scf.forall (%[[T:.*]]) in (256) {
// CHECK-NEXT:   memref.store %cst, %[[A:.*]][%[[T]]]
// CHECK-NEXT:   memref.store %cst, %[[B:.*]][%[[T]]]
// CHECK-NEXT:   memref.store %cst, %[[C:.*]][%[[T]]]
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%[[U:.*]]) in (256) {
// CHECK-NEXT:   %[[X:.*]] = memref.load %arg0[%[[U]]]
// CHECK-NEXT:   %[[R:.*]] = arith.subi %c255, %[[U]]
// CHECK-NEXT:   memref.store %[[X]], %[[A]][%[[R]]]
// CHECK-NEXT:   %[[Y:.*]] = memref.load %arg1[%[[U]]]
// CHECK-NEXT:   %[[R:.*]] = arith.subi %c255, %[[U]]
// CHECK-NEXT:   memref.store %[[Y]], %[[B]][%[[R]]]
// CHECK-NEXT:   %[[Z:.*]] = memref.load %arg2[%[[U]]]
// CHECK-NEXT:   %[[R:.*]] = arith.subi %c255, %[[U]]
// CHECK-NEXT:   memref.store %[[Z]], %[[C]][%[[R]]]
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @fills_and_loads(%q: memref<256xf32>, %k: memref<256xf32>, %v: memref<256xf32>) {
  %zero = arith.constant 0.0 : f32
  %last = arith.constant 255 : index
  %a = memref.alloca() : memref<256xf32, #gpu.address_space<workgroup>>
  %b = memref.alloca() : memref<256xf32, #gpu.address_space<workgroup>>
  %c = memref.alloca() : memref<256xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (256) {
    memref.store %zero, %a[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (256) {
    %x = memref.load %q[%t] : memref<256xf32>
    %r = arith.subi %last, %t : index
    memref.store %x, %a[%r] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (256) {
    memref.store %zero, %b[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (256) {
    %x = memref.load %k[%t] : memref<256xf32>
    %r = arith.subi %last, %t : index
    memref.store %x, %b[%r] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (256) {
    memref.store %zero, %c[%t] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (256) {
    %x = memref.load %v[%t] : memref<256xf32>
    %r = arith.subi %last, %t : index
    memref.store %x, %c[%r] : memref<256xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// A warp nest reads what the first nest wrote: a phase after it. The third nest is
// independent of both: it joins the first. The fourth reads what the third wrote and
// nothing of the warp nest's: it joins the warp nest's phase, no barrier between them.
// The view the fourth nest takes is made where it is used.
// CHECK-LABEL: func.func @past_a_warp_nest
// CHECK: scf.forall (%{{.*}}) in (64) {
// CHECK:   memref.store %{{.*}}, %[[A:.*]][
// CHECK:   memref.store %{{.*}}, %[[B:.*]][
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (2) {
// CHECK:   memref.load %[[A]]
// CHECK: } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: %[[HALF:.*]] = memref.subview %[[B]][32] [32] [1]
// CHECK-NEXT: scf.forall (%{{.*}}) in (32) {
// CHECK:   memref.load %[[HALF]]
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @past_a_warp_nest(%q: memref<64xf32>, %out: memref<32xf32>, %w: memref<2xf32>) {
  %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  %b = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (2) {
    %x = memref.load %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
    memref.store %x, %w[%t] : memref<2xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  %half = memref.subview %b[32] [32] [1] : memref<64xf32, #gpu.address_space<workgroup>> to memref<32xf32, strided<[1], offset: 32>, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %b[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (32) {
    %x = memref.load %half[%t] : memref<32xf32, strided<[1], offset: 32>, #gpu.address_space<workgroup>>
    memref.store %x, %out[%t] : memref<32xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// Two independent row sums over one buffer (each a linalg op with a reduction loop) keep
// a phase each: merged, the compilers below load the common rows once for both and hoist
// the loads above either sum. The second sum, with nothing to wait for, opens its phase
// first; a sum over another buffer, independent of both, joins it.
// CHECK-LABEL: func.func @reductions_over_one_buffer
// CHECK: scf.forall (%{{.*}}) in (32) {
// CHECK-NEXT:   memref.subview %arg0
// CHECK-NEXT:   %[[KS:.*]] = memref.subview %alloca_0
// CHECK-NEXT:   linalg.generic
// CHECK:   memref.subview %arg1
// CHECK:   linalg.generic
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (32) {
// CHECK-NEXT:   memref.subview %arg0
// CHECK-NEXT:   memref.subview %alloca[
// CHECK-NEXT:   linalg.generic
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
#rows = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
func.func @reductions_over_one_buffer(%q: memref<32x32xf32>, %k: memref<32x32xf32>) {
  %qs = memref.alloca() : memref<32xf32, #gpu.address_space<workgroup>>
  %qs2 = memref.alloca() : memref<32xf32, #gpu.address_space<workgroup>>
  %ks = memref.alloca() : memref<32xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (32) {
    %x = memref.subview %q[%t, 0] [1, 32] [1, 1] : memref<32x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %s = memref.subview %qs[%t] [1] [1] : memref<32xf32, #gpu.address_space<workgroup>> to memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
    linalg.generic {indexing_maps = [#rows, #row], iterator_types = ["parallel", "reduction"]}
        ins(%x : memref<1x32xf32, strided<[32, 1], offset: ?>>)
        outs(%s : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>) {
    ^bb0(%in: f32, %acc: f32):
      %sum = arith.addf %in, %acc : f32
      linalg.yield %sum : f32
    }
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (32) {
    %x = memref.subview %q[%t, 0] [1, 32] [1, 1] : memref<32x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %s = memref.subview %qs2[%t] [1] [1] : memref<32xf32, #gpu.address_space<workgroup>> to memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
    linalg.generic {indexing_maps = [#rows, #row], iterator_types = ["parallel", "reduction"]}
        ins(%x : memref<1x32xf32, strided<[32, 1], offset: ?>>)
        outs(%s : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>) {
    ^bb0(%in: f32, %acc: f32):
      %sum = arith.maximumf %in, %acc : f32
      linalg.yield %sum : f32
    }
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (32) {
    %x = memref.subview %k[%t, 0] [1, 32] [1, 1] : memref<32x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %s = memref.subview %ks[%t] [1] [1] : memref<32xf32, #gpu.address_space<workgroup>> to memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
    linalg.generic {indexing_maps = [#rows, #row], iterator_types = ["parallel", "reduction"]}
        ins(%x : memref<1x32xf32, strided<[32, 1], offset: ?>>)
        outs(%s : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>) {
    ^bb0(%in: f32, %acc: f32):
      %sum = arith.addf %in, %acc : f32
      linalg.yield %sum : f32
    }
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// A buffer each thread touches only in its own column (its index, plus the same constant
// in every access) orders no two threads: a nest reading or writing what the same thread
// wrote in an earlier nest joins that nest's phase, after it. Row statistics set, updated
// and stored by 16 threads are one nest. A nest reading a neighbour's column (offset 1)
// waits for the barrier.
// CHECK-LABEL: func.func @own_columns
// CHECK: scf.forall (%[[T:.*]]) in (16) {
// CHECK-NEXT:   memref.store %cst, %[[S:.*]][%[[T]]]
// CHECK-NEXT:   %[[X:.*]] = memref.load %[[S]][%[[T]]]
// CHECK-NEXT:   %[[Y:.*]] = memref.load %arg0[%[[T]]]
// CHECK-NEXT:   %[[Z:.*]] = arith.addf %[[X]], %[[Y]]
// CHECK-NEXT:   memref.store %[[Z]], %[[S]][%[[T]]]
// CHECK-NEXT:   %[[W:.*]] = memref.load %[[S]][%[[T]]]
// CHECK-NEXT:   memref.store %[[W]], %arg1[%[[T]]]
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: %[[NEXT:.*]] = memref.subview %[[S]][1] [15] [1]
// CHECK-NEXT: scf.forall (%[[U:.*]]) in (15) {
// CHECK-NEXT:   memref.load %[[NEXT]][%[[U]]]
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @own_columns(%q: memref<16xf32>, %out: memref<16xf32>, %shifted: memref<15xf32>) {
  %zero = arith.constant 0.0 : f32
  %s = memref.alloca() : memref<16xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (16) {
    memref.store %zero, %s[%t] : memref<16xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (16) {
    %x = memref.load %s[%t] : memref<16xf32, #gpu.address_space<workgroup>>
    %y = memref.load %q[%t] : memref<16xf32>
    %z = arith.addf %x, %y : f32
    memref.store %z, %s[%t] : memref<16xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (16) {
    %x = memref.load %s[%t] : memref<16xf32, #gpu.address_space<workgroup>>
    memref.store %x, %out[%t] : memref<16xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  %next = memref.subview %s[1] [15] [1] : memref<16xf32, #gpu.address_space<workgroup>> to memref<15xf32, strided<[1], offset: 1>, #gpu.address_space<workgroup>>
  scf.forall (%t) in (15) {
    %x = memref.load %next[%t] : memref<15xf32, strided<[1], offset: 1>, #gpu.address_space<workgroup>>
    memref.store %x, %shifted[%t] : memref<15xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// A nest that may share its column-wise predecessor's phase but cannot (both reduce over
// the rows of q) opens a phase after it, never before.
// CHECK-LABEL: func.func @own_column_after_a_reduction
// CHECK: scf.forall (%{{.*}}) in (32) {
// CHECK:   linalg.generic
// CHECK-SAME: ins(%{{.*}} : memref<1x32xf32
// CHECK-NOT: memref.load
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (32) {
// CHECK:   memref.load %[[SUMS:.*]][%{{.*}}] : memref<32xf32, #gpu.address_space<workgroup>>
// CHECK:   linalg.generic
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @own_column_after_a_reduction(%q: memref<32x32xf32>, %k: memref<32x32xf32>,
                                        %out: memref<32xf32>) {
  %qs = memref.alloca() : memref<32xf32, #gpu.address_space<workgroup>>
  %ks = memref.alloca() : memref<32xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (32) {
    %x = memref.subview %q[%t, 0] [1, 32] [1, 1] : memref<32x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %s = memref.subview %qs[%t] [1] [1] : memref<32xf32, #gpu.address_space<workgroup>> to memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
    linalg.generic {indexing_maps = [#rows, #row], iterator_types = ["parallel", "reduction"]}
        ins(%x : memref<1x32xf32, strided<[32, 1], offset: ?>>)
        outs(%s : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>) {
    ^bb0(%in: f32, %acc: f32):
      %sum = arith.addf %in, %acc : f32
      linalg.yield %sum : f32
    }
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (32) {
    %before = memref.load %qs[%t] : memref<32xf32, #gpu.address_space<workgroup>>
    memref.store %before, %out[%t] : memref<32xf32>
    %x = memref.subview %q[%t, 0] [1, 32] [1, 1] : memref<32x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %s = memref.subview %ks[%t] [1] [1] : memref<32xf32, #gpu.address_space<workgroup>> to memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
    linalg.generic {indexing_maps = [#rows, #row], iterator_types = ["parallel", "reduction"]}
        ins(%x : memref<1x32xf32, strided<[32, 1], offset: ?>>)
        outs(%s : memref<1xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>) {
    ^bb0(%in: f32, %acc: f32):
      %sum = arith.addf %in, %acc : f32
      linalg.yield %sum : f32
    }
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// A mark from an earlier run of the pass (spectra.no_barrier) is dropped and set afresh:
// here the marked nest reads what the nest before it wrote and ends the run, so it keeps
// its barrier.
// CHECK-LABEL: func.func @stale_mark
// CHECK: scf.forall (%{{.*}}) in (2) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (2) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @stale_mark(%q: memref<64xf32>, %w: memref<2xf32>) {
  %a = memref.alloca() : memref<2xf32, #gpu.address_space<workgroup>>
  scf.forall (%v) in (2) {
    %x = memref.load %q[%v] : memref<64xf32>
    memref.store %x, %a[%v] : memref<2xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  scf.forall (%v) in (2) {
    %x = memref.load %a[%v] : memref<2xf32, #gpu.address_space<workgroup>>
    memref.store %x, %w[%v] : memref<2xf32>
  } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
  return
}

// A guarded nest (the learnable-W switch around dW: an scf.if with one nest in it) is
// scheduled as its nest would be, the guard moving with it: it reads what the first nest
// wrote, so it goes a phase after it; the third nest, independent of it, moves above it and
// joins the first; the fourth reads what the third wrote and joins the guarded nest's phase,
// whose barrier (inside the guard) is left out.
// CHECK-LABEL: func.func @guarded_nest
// CHECK: scf.forall (%{{.*}}) in (64) {
// CHECK:   memref.store %{{.*}}, %[[A:.*]][
// CHECK:   memref.store %{{.*}}, %[[B:.*]][
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.if %arg3 {
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:     memref.load %[[A]][
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: }
// CHECK-NEXT: scf.forall (%{{.*}}) in (2) {
// CHECK:   memref.load %[[B]][
// CHECK: } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @guarded_nest(%q: memref<64xf32>, %out: memref<2xf32>, %w: memref<2xf32>, %learn: i1) {
  %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  %b = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.if %learn {
    scf.forall (%v) in (2) {
      %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %w[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  }
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %b[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%v) in (2) {
    %x = memref.load %b[%v] : memref<64xf32, #gpu.address_space<workgroup>>
    memref.store %x, %out[%v] : memref<2xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  return
}

// A branch that is not one guarded nest (here: two nests) ends the run: the nest
// after it stays after it, and is not merged with the first, though independent of both;
// the two nests inside the branch are scheduled there (independent: one phase).
// CHECK-LABEL: func.func @branch_of_two_nests
// CHECK: scf.forall (%{{.*}}) in (64) {
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.if %arg3 {
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: }
// CHECK-NEXT: scf.forall (%{{.*}}) in (64) {
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @branch_of_two_nests(%q: memref<64xf32>, %out: memref<2xf32>, %w: memref<2xf32>, %learn: i1) {
  %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  %b = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.if %learn {
    scf.forall (%v) in (2) {
      %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %w[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
    scf.forall (%v) in (2) {
      %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %out[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  }
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %b[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// Independent warp nests of one phase of a 256-thread block (8 warps): those of half the
// warps or more go side by side while they fit (spectra.first_warp), from warp 0 again where
// the next does not fit; a narrower one (the second) stays on warp 0 and leaves the warps
// the first left to the third. The stale mark on the first is dropped.
// CHECK-LABEL: func.func @warps_side_by_side
// CHECK: scf.forall (%{{.*}}) in (4) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (2) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (4) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.first_warp = 4 : index, spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (8) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: scf.forall (%{{.*}}) in (4) {
// CHECK: } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @warps_side_by_side(%q: memref<64xf32>, %a: memref<8xf32>, %b: memref<8xf32>,
                              %c: memref<8xf32>, %d: memref<8xf32>, %e: memref<8xf32>) {
  scf.forall (%v) in (4) {
    %x = memref.load %q[%v] : memref<64xf32>
    memref.store %x, %a[%v] : memref<8xf32>
  } {mapping = [#gpu.warp<x>], spectra.first_warp = 6 : index, spectra.thread_nest}
  scf.forall (%v) in (2) {
    %x = memref.load %q[%v] : memref<64xf32>
    memref.store %x, %c[%v] : memref<8xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  scf.forall (%v) in (4) {
    %x = memref.load %q[%v] : memref<64xf32>
    memref.store %x, %b[%v] : memref<8xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  scf.forall (%v) in (8) {
    %x = memref.load %q[%v] : memref<64xf32>
    memref.store %x, %d[%v] : memref<8xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  scf.forall (%v) in (4) {
    %x = memref.load %q[%v] : memref<64xf32>
    memref.store %x, %e[%v] : memref<8xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  return
}

// The phase's barrier is never one inside a guard, which is passed only where the guard
// holds: a guarded nest goes ahead of the nests of its phase that always run (here the warp
// nest before it, reading the same tile), and keeps no barrier of its own. A phase of guarded
// nests alone keeps the barrier of each (one guard may hold where the other does not).
// CHECK-LABEL: func.func @guard_not_last
// CHECK: scf.forall (%{{.*}}) in (64) {
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.if %arg3 {
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:     memref.store %{{.*}}, %arg2[
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.no_barrier, spectra.thread_nest}
// CHECK-NEXT: }
// CHECK-NEXT: scf.forall (%{{.*}}) in (2) {
// CHECK:   memref.store %{{.*}}, %arg1[
// CHECK: } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @guard_not_last(%q: memref<64xf32>, %out: memref<2xf32>, %w: memref<2xf32>, %learn: i1) {
  %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%v) in (2) {
    %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
    memref.store %x, %out[%v] : memref<2xf32>
  } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  scf.if %learn {
    scf.forall (%v) in (2) {
      %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %w[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  }
  return
}

// CHECK-LABEL: func.func @only_guards
// CHECK: scf.forall (%{{.*}}) in (64) {
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.if %arg3 {
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: }
// CHECK-NEXT: scf.if %arg4 {
// CHECK-NEXT:   scf.forall (%{{.*}}) in (2) {
// CHECK:   } {mapping = [#gpu.warp<x>], spectra.thread_nest}
// CHECK-NEXT: }
// CHECK-NEXT: return
func.func @only_guards(%q: memref<64xf32>, %out: memref<2xf32>, %w: memref<2xf32>, %learn: i1, %other: i1) {
  %a = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %a[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.if %learn {
    scf.forall (%v) in (2) {
      %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %w[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  }
  scf.if %other {
    scf.forall (%v) in (2) {
      %x = memref.load %a[%v] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %x, %out[%v] : memref<2xf32>
    } {mapping = [#gpu.warp<x>], spectra.thread_nest}
  }
  return
}

// Kernel arguments marked spectra.may_alias may be one buffer (moments_backward's dxin and
// dx): a nest writing dx waits for the barrier after the nest reading dxin. Arguments of one
// type left unmarked are distinct memory: the nest reading q and the one writing out join
// the first phase.
// CHECK-LABEL: func.func @in_place_arguments
// CHECK: scf.forall (%[[T:.*]]) in (64) {
// CHECK-NEXT:   memref.load %arg0[%[[T]]]
// CHECK-NEXT:   memref.store
// CHECK-NEXT:   memref.load %arg2[%[[T]]]
// CHECK-NEXT:   memref.store
// CHECK-NEXT:   memref.store %{{.*}}, %arg3[%[[T]]]
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%[[U:.*]]) in (64) {
// CHECK-NEXT:   memref.store %{{.*}}, %arg1[%[[U]]]
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @in_place_arguments(%dxin: memref<64xf32> {spectra.may_alias},
                              %dx: memref<64xf32> {spectra.may_alias},
                              %q: memref<64xf32>, %out: memref<64xf32>) {
  %one = arith.constant 1.0 : f32
  %s = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  %s2 = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    %x = memref.load %dxin[%t] : memref<64xf32>
    memref.store %x, %s[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (64) {
    memref.store %one, %dx[%t] : memref<64xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (64) {
    %x = memref.load %q[%t] : memref<64xf32>
    memref.store %x, %s2[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (64) {
    memref.store %one, %out[%t] : memref<64xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// The other way round: a nest reading dxin waits for the barrier after the nest writing dx.
// CHECK-LABEL: func.func @in_place_write_first
// CHECK: scf.forall (%[[T:.*]]) in (64) {
// CHECK-NEXT:   memref.store %{{.*}}, %arg1[%[[T]]]
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: scf.forall (%[[U:.*]]) in (64) {
// CHECK-NEXT:   memref.load %arg0[%[[U]]]
// CHECK-NEXT:   memref.store
// CHECK-NEXT: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
func.func @in_place_write_first(%dxin: memref<64xf32> {spectra.may_alias},
                                %dx: memref<64xf32> {spectra.may_alias}) {
  %one = arith.constant 1.0 : f32
  %s = memref.alloca() : memref<64xf32, #gpu.address_space<workgroup>>
  scf.forall (%t) in (64) {
    memref.store %one, %dx[%t] : memref<64xf32>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  scf.forall (%t) in (64) {
    %x = memref.load %dxin[%t] : memref<64xf32>
    memref.store %x, %s[%t] : memref<64xf32, #gpu.address_space<workgroup>>
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}
