// RUN: spectra-opt %s --spectra-row-loop-nests=columns=false | FileCheck %s
// RUN: spectra-opt %s "--spectra-row-loop-nests=threads=64 columns=false" | FileCheck %s --check-prefix=NARROW
// RUN: spectra-opt %s --spectra-row-loop-nests | FileCheck %s --check-prefix=COLS

// A partial tile's rows of q loaded into a workgroup tile, a nest of 32 threads per row:
// one nest over rows x elements, each thread every eighth row.
// CHECK-LABEL: func.func @load_rows
// CHECK: %[[ROWS:.*]] = arith.minsi
// CHECK: scf.forall (%[[T:.*]]) in (256) {
// CHECK:   %[[R0:.*]] = arith.divui %[[T]], %c32
// CHECK:   %[[E:.*]] = arith.remui %[[T]], %c32
// CHECK:   scf.for %[[R:.*]] = %[[R0]] to %[[ROWS]] step %c8 {
// CHECK:     %[[ROW:.*]] = arith.addi %{{.*}}, %[[R]]
// CHECK:     memref.subview %{{.*}}[%[[ROW]], 0] [1, 32]
// CHECK:     memref.subview %{{.*}}[%[[R]], 0] [1, 32]
// CHECK:     memref.load %{{.*}}[%c0, %[[E]]]
// CHECK-NOT: scf.forall
// CHECK: } {mapping = [#gpu.thread<x>], spectra.thread_nest}
// CHECK-NEXT: return
// NARROW-LABEL: func.func @load_rows
// NARROW: scf.forall (%{{.*}}) in (64) {
// NARROW:   scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c2 {
func.func @load_rows(%q: memref<?x32xf32>, %first: index, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %tile = memref.alloca() : memref<16x32xf32, #gpu.address_space<workgroup>>
  %rows = arith.minsi %n, %c16 : index
  scf.for %r = %c0 to %rows step %c1 {
    %row = arith.addi %first, %r : index
    %src = memref.subview %q[%row, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %dst = memref.subview %tile[%r, 0] [1, 32] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    scf.forall (%t) in (32) {
      %x = memref.load %src[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>>
      memref.store %x, %dst[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}

// A one-thread nest storing a mask entry per row: one nest of 16 threads, a row each.
// CHECK-LABEL: func.func @mask_rows
// CHECK: scf.forall (%[[T:.*]]) in (16) {
// CHECK:   scf.for %[[R:.*]] = %[[T]] to %{{.*}} step %c16
// CHECK:     memref.load %{{.*}}[%{{.*}}]
// CHECK:     memref.store %{{.*}}, %{{.*}}[%[[R]]]
// CHECK-NOT: scf.for
// CHECK: return
func.func @mask_rows(%mask: memref<?xf32>, %first: index, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %keep = memref.alloca() : memref<16xf32, #gpu.address_space<workgroup>>
  %rows = arith.minsi %n, %c16 : index
  scf.forall (%u) in (1) {
    scf.for %r = %c0 to %rows step %c1 {
      %row = arith.addi %first, %r : index
      %x = memref.load %mask[%row] : memref<?xf32>
      memref.store %x, %keep[%r] : memref<16xf32, #gpu.address_space<workgroup>>
    }
  } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  return
}

// Left as they are: an iteration that reads the row the one before wrote (a running sum
// down the rows), one that writes outside its row (every iteration the same row 0), and
// the rows past the end of a partial tile (from min(n, 16) to 16: the last tile only).
// With columns: the first two run their rows inside one nest, each thread down its own
// column in order (the running sum; row 0 of column t, rewritten by thread t each time);
// the rows past the end stay.
// CHECK-LABEL: func.func @dependent_rows
// COLS-LABEL: func.func @dependent_rows
// COLS: scf.forall (%[[T:.*]]) in (32) {
// COLS-NEXT: scf.for %[[R:.*]] = %c1 to %{{.*}} step %c1 {
// COLS:   memref.load %{{.*}}[%c0, %[[T]]]
// COLS:   memref.load %{{.*}}[%c0, %[[T]]]
// COLS:   memref.store %{{.*}}, %{{.*}}[%c0, %[[T]]]
// COLS: scf.forall (%[[U:.*]]) in (32) {
// COLS-NEXT: scf.for %{{.*}} = %c0 to %{{.*}} step %c1 {
// COLS:   memref.store %{{.*}}, %{{.*}}[%c0, %[[U]]]
// COLS: scf.for %{{.*}} = %{{.*}} to %c16 step %c1 {
// COLS:   scf.forall (%{{.*}}) in (32)
// CHECK: scf.for %{{.*}} = %c1 to %{{.*}} step %c1 {
// CHECK:   scf.forall (%{{.*}}) in (32)
// CHECK: scf.for %{{.*}} = %c0 to %{{.*}} step %c1 {
// CHECK:   scf.forall (%{{.*}}) in (32)
// CHECK: scf.for %{{.*}} = %{{.*}} to %c16 step %c1 {
// CHECK:   scf.forall (%{{.*}}) in (32)
func.func @dependent_rows(%q: memref<?x32xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %zero = arith.constant 0.0 : f32
  %tile = memref.alloca() : memref<16x32xf32, #gpu.address_space<workgroup>>
  %rows = arith.minsi %n, %c16 : index
  scf.for %r = %c1 to %rows step %c1 {
    %p = arith.subi %r, %c1 : index
    %prev = memref.subview %tile[%p, 0] [1, 32] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    %dst = memref.subview %tile[%r, 0] [1, 32] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    scf.forall (%t) in (32) {
      %a = memref.load %prev[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
      %b = memref.load %dst[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
      %s = arith.addf %a, %b : f32
      memref.store %s, %dst[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  scf.for %r = %c0 to %rows step %c1 {
    %src = memref.subview %q[%r, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    scf.forall (%t) in (32) {
      %x = memref.load %src[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>>
      memref.store %x, %tile[%c0, %t] : memref<16x32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  scf.for %r = %rows to %c16 step %c1 {
    %dst = memref.subview %tile[%r, 0] [1, 32] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    scf.forall (%t) in (32) {
      memref.store %zero, %dst[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}

// Recurrences that cross columns stay a nest per row, columns or not: a thread reading its
// neighbour's column of the row before, one reading the whole row before (a row sum), one
// writing at a column offset from outside the nest, two threads sharing a column (t mod 16
// of 32 threads), and a thread reading column t and writing column t + 16 (thread t + 16's
// column a row on).
// COLS-LABEL: func.func @crossing_columns
// COLS: scf.for %{{.*}} = %c1 to %{{.*}} step %c1 {
// COLS:   scf.forall (%{{.*}}) in (31)
// COLS: scf.for %{{.*}} = %c1 to %{{.*}} step %c1 {
// COLS:   scf.forall (%{{.*}}) in (32)
// COLS: scf.for %{{.*}} = %c1 to %{{.*}} step %c1 {
// COLS:   scf.forall (%{{.*}}) in (16)
// COLS: scf.for %{{.*}} = %c1 to %{{.*}} step %c1 {
// COLS:   scf.forall (%{{.*}}) in (32)
// COLS: scf.for %{{.*}} = %c1 to %{{.*}} step %c1 {
// COLS:   scf.forall (%{{.*}}) in (16)
// COLS: return
func.func @crossing_columns(%n: index, %shift: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %tile = memref.alloca() : memref<16x32xf32, #gpu.address_space<workgroup>>
  %rows = arith.minsi %n, %c16 : index
  scf.for %r = %c1 to %rows step %c1 {
    %p = arith.subi %r, %c1 : index
    scf.forall (%t) in (31) {
      %u = arith.addi %t, %c1 : index
      %a = memref.load %tile[%p, %u] : memref<16x32xf32, #gpu.address_space<workgroup>>
      memref.store %a, %tile[%r, %t] : memref<16x32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  scf.for %r = %c1 to %rows step %c1 {
    %p = arith.subi %r, %c1 : index
    %prev = memref.subview %tile[%p, 0] [1, 32] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<32xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
    scf.forall (%t) in (32) {
      %sum = memref.alloca() : memref<f32>
      scf.for %j = %c0 to %c16 step %c1 {
        %x = memref.load %prev[%j] : memref<32xf32, strided<[1], offset: ?>, #gpu.address_space<workgroup>>
        memref.store %x, %sum[] : memref<f32>
      }
      %s = memref.load %sum[] : memref<f32>
      memref.store %s, %tile[%r, %t] : memref<16x32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  scf.for %r = %c1 to %rows step %c1 {
    %p = arith.subi %r, %c1 : index
    %half = memref.subview %tile[0, %shift] [16, 16] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<16x16xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    scf.forall (%t) in (16) {
      %a = memref.load %tile[%p, %t] : memref<16x32xf32, #gpu.address_space<workgroup>>
      memref.store %a, %half[%r, %t] : memref<16x16xf32, strided<[32, 1], offset: ?>, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  scf.for %r = %c1 to %rows step %c1 {
    %p = arith.subi %r, %c1 : index
    scf.forall (%t) in (32) {
      %col = arith.remui %t, %c16 : index
      %a = memref.load %tile[%p, %col] : memref<16x32xf32, #gpu.address_space<workgroup>>
      %b = memref.load %tile[%r, %col] : memref<16x32xf32, #gpu.address_space<workgroup>>
      %s = arith.addf %a, %b : f32
      memref.store %s, %tile[%r, %col] : memref<16x32xf32, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  %right = memref.subview %tile[0, 16] [16, 16] [1, 1] : memref<16x32xf32, #gpu.address_space<workgroup>> to memref<16x16xf32, strided<[32, 1], offset: 16>, #gpu.address_space<workgroup>>
  scf.for %r = %c1 to %rows step %c1 {
    %p = arith.subi %r, %c1 : index
    scf.forall (%t) in (16) {
      %a = memref.load %tile[%p, %t] : memref<16x32xf32, #gpu.address_space<workgroup>>
      memref.store %a, %right[%r, %t] : memref<16x16xf32, strided<[32, 1], offset: 16>, #gpu.address_space<workgroup>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}

// Rows of dx written from the next row of dxin: with the two marked spectra.may_alias (one
// buffer in an in-place call), row r's write may be row r - 1's read, so the loop stays; left
// unmarked they are distinct tensors and the rows become one nest.
// CHECK-LABEL: func.func @in_place_rows
// CHECK-NOT: scf.forall
// CHECK: scf.for
// CHECK-NEXT: arith.addi
// CHECK: scf.forall (%{{.*}}) in (32) {
// CHECK-LABEL: func.func @distinct_rows
// CHECK: scf.forall (%{{.*}}) in (256) {
// CHECK: arith.divui
// CHECK: scf.for
func.func @in_place_rows(%dxin: memref<?x32xf32> {spectra.may_alias}, %dx: memref<?x32xf32> {spectra.may_alias}, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %rows = arith.minsi %n, %c16 : index
  scf.for %r = %c0 to %rows step %c1 {
    %next = arith.addi %r, %c1 : index
    %src = memref.subview %dxin[%next, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %dst = memref.subview %dx[%r, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    scf.forall (%t) in (32) {
      %x = memref.load %src[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>>
      memref.store %x, %dst[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}
func.func @distinct_rows(%dxin: memref<?x32xf32>, %dx: memref<?x32xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %rows = arith.minsi %n, %c16 : index
  scf.for %r = %c0 to %rows step %c1 {
    %next = arith.addi %r, %c1 : index
    %src = memref.subview %dxin[%next, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %dst = memref.subview %dx[%r, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    scf.forall (%t) in (32) {
      %x = memref.load %src[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>>
      memref.store %x, %dst[%c0, %t] : memref<1x32xf32, strided<[32, 1], offset: ?>>
    } {mapping = [#gpu.thread<x>], spectra.thread_nest}
  }
  return
}
