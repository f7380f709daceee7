// RUN: spectra-opt %s -pass-pipeline='builtin.module(func.func(spectra-full-tiles-in-place))' | FileCheck %s
// RUN: spectra-compile --variant oprf-orf --fma-chains 0 --emit=tiles | FileCheck %s --check-prefix=OPRF

// The compiled statistics (32-row tiles: --fma-chains 0, the width's default register tile): a
// whole tile of the moments reads q's rows and the mask in place, and their backward reads x
// and dxin and writes dx in place; the kernels with a contraction keep their staged body alone.
// OPRF-LABEL: func.func @oprf_orf_moments(
// OPRF:         scf.if
// OPRF-COUNT-2:   memref.subview %arg{{[01]}}[%{{.*}}, 0] [32, 32] [1, 1]
// OPRF:           memref.subview %arg2[%{{.*}}] [32] [1]
// OPRF-NEXT:      linalg.generic
// OPRF:         } else {
// OPRF-LABEL: func.func @oprf_orf_moments_backward(
// OPRF:         scf.if
// OPRF:           %[[DX:.*]] = memref.subview %arg5[%{{.*}}, 0] [32, 32] [1, 1]
// OPRF-NEXT:      linalg.generic
// OPRF-SAME:        outs(%[[DX]] :
// OPRF-NEXT:      ^bb0
// OPRF-NOT:       memref.subview %arg5
// OPRF:         } else {
// OPRF-LABEL: func.func @oprf_orf_kv(
// OPRF-NOT:     scf.if
// OPRF-LABEL: func.func @oprf_orf_kv_combine(
// OPRF-LABEL: func.func @oprf_orf_readout(
// OPRF-NOT:     ] [32, 32] [1, 1]
// OPRF-LABEL: func.func @oprf_orf_query_backward(
// OPRF-NOT:     ] [32, 32] [1, 1]
// OPRF-LABEL: func.func @oprf_orf_key_backward(
// OPRF-NOT:     ] [32, 32] [1, 1]
// OPRF-LABEL: func.func @oprf_orf_dweights_chunk_combine(

#id = affine_map<(i, j) -> (i, j)>
#tr = affine_map<(i, j) -> (j, i)>
#col = affine_map<(i, j) -> (j)>
#row = affine_map<(i, j) -> (i)>
#mk = affine_map<(i, j, k) -> (i, k)>
#kn = affine_map<(i, j, k) -> (k, j)>
#mn = affine_map<(i, j, k) -> (i, j)>

// The moments: x and y staged (zeros, then the tile's rows), the mask staged, a column
// reduction that only reads them. A whole tile reads the arguments' rows through views; a
// short one keeps the staged body.
// CHECK-LABEL: func.func @moments
// CHECK-SAME:    (%[[X:.*]]: memref<?x8xf32>, %[[Y:.*]]: memref<?x8xf32>, %[[KEEP:.*]]: memref<?xf32>, %[[SUM:.*]]: memref<8xf32>)
// CHECK:         scf.for %[[R0:.*]] = %{{.*}} to %{{.*}} step %[[C4:.*]] {
// CHECK:           %[[ROWS:.*]] = arith.minsi
// CHECK-NEXT:      %[[C4B:.*]] = arith.constant 4 : index
// CHECK-NEXT:      %[[FULL:.*]] = arith.cmpi eq, %[[ROWS]], %[[C4B]] : index
// CHECK:           scf.if %[[FULL]] {
// CHECK-NEXT:        %[[XV:.*]] = memref.subview %[[X]][%[[R0]], 0] [4, 8] [1, 1] : memref<?x8xf32> to memref<4x8xf32, strided<[8, 1], offset: ?>>
// CHECK-NEXT:        %[[YV:.*]] = memref.subview %[[Y]][%[[R0]], 0] [4, 8] [1, 1]
// CHECK-NEXT:        %[[KV:.*]] = memref.subview %[[KEEP]][%[[R0]]] [4] [1] : memref<?xf32> to memref<4xf32, strided<[1], offset: ?>>
// CHECK-NEXT:        linalg.generic {{.*}} ins(%[[XV]], %[[YV]], %[[KV]] : {{.*}}) outs(%[[SUM]] : memref<8xf32>)
// CHECK:           } else {
// CHECK-NEXT:        linalg.fill
// CHECK-NEXT:        scf.for %{{.*}} = %{{.*}} to %[[ROWS]]
// CHECK:             linalg.generic {{.*}} ins(%{{.*}} : memref<1x8xf32, strided<[8, 1], offset: ?>>)
// CHECK:           linalg.generic {{.*}} ins(%{{.*}}, %{{.*}}, %{{.*}} : memref<4x8xf32>, memref<4x8xf32>, memref<4xf32>)
// CHECK:         } {spectra.tile_loop}
func.func @moments(%x: memref<?x8xf32>, %y: memref<?x8xf32>, %keep: memref<?xf32>, %sum: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x8xf32>
  %yt = memref.alloca() : memref<4x8xf32>
  %kt = memref.alloca() : memref<4xf32>
  %n = memref.dim %x, %c0 : memref<?x8xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x8xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    // stage()'s form: only the rows past the end filled.
    scf.for %i = %rows to %c4 step %c1 {
      %to = memref.subview %yt[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.fill ins(%zero : f32) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>)
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %i, %r0 : index
      %from = memref.subview %y[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %yt[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.fill ins(%zero : f32) outs(%kt : memref<4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %k = memref.load %keep[%r] : memref<?xf32>
      memref.store %k, %kt[%i] : memref<4xf32>
    }
    linalg.generic {indexing_maps = [#id, #id, #row, #col], iterator_types = ["reduction", "parallel"]}
        ins(%xt, %yt, %kt : memref<4x8xf32>, memref<4x8xf32>, memref<4xf32>) outs(%sum : memref<8xf32>) {
    ^bb0(%a: f32, %b: f32, %k: f32, %s: f32):
      %p = arith.mulf %a, %b : f32
      %q = arith.mulf %p, %k : f32
      %t = arith.addf %s, %q : f32
      linalg.yield %t : f32
    }
  } {spectra.tile_loop}
  return
}

// The moments' backward: dx = dxin + x, written once by an elementwise op that does not read
// its output, then unstaged. dx may be dxin: the writer reads dxin element for element, so a
// whole tile reads x and dxin and writes dx through views, with no copy.
// CHECK-LABEL: func.func @backward
// CHECK-SAME:    (%[[X:[a-z0-9]*]]: memref<?x8xf32>, %[[DXIN:[a-z0-9]*]]: memref<?x8xf32> {spectra.may_alias}, %[[DX:[a-z0-9]*]]: memref<?x8xf32> {spectra.may_alias})
// CHECK:         scf.for %[[R0:.*]] = %{{.*}} to
// CHECK:         scf.if
// CHECK-NEXT:      %[[XV:.*]] = memref.subview %[[X]][%[[R0]], 0] [4, 8] [1, 1]
// CHECK-NEXT:      %[[INV:.*]] = memref.subview %[[DXIN]][%[[R0]], 0] [4, 8] [1, 1]
// CHECK-NEXT:      %[[OUTV:.*]] = memref.subview %[[DX]][%[[R0]], 0] [4, 8] [1, 1]
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[XV]], %[[INV]] : {{.*}}) outs(%[[OUTV]] : memref<4x8xf32, strided<[8, 1], offset: ?>>)
// CHECK-NOT:       scf.for
// CHECK:           } else {
// CHECK:           scf.for
// CHECK:           scf.for
// CHECK:           linalg.generic {{.*}} outs(%{{.*}} : memref<4x8xf32>)
// CHECK:           scf.for
// CHECK:             memref.subview %[[DX]]
func.func @backward(%x: memref<?x8xf32>, %dxin: memref<?x8xf32> {spectra.may_alias}, %dx: memref<?x8xf32> {spectra.may_alias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x8xf32>
  %it = memref.alloca() : memref<4x8xf32>
  %ot = memref.alloca() : memref<4x8xf32>
  %n = memref.dim %x, %c0 : memref<?x8xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x8xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.fill ins(%zero : f32) outs(%it : memref<4x8xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %dxin[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %it[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xt, %it : memref<4x8xf32>, memref<4x8xf32>) outs(%ot : memref<4x8xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %s = arith.addf %a, %b : f32
      linalg.yield %s : f32
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %ot[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %dx[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
  } {spectra.tile_loop}
  return
}

// x is read again after the output's writer: dx may be x, so x stays staged (read before
// anything is written, as before); the output is still written in place.
// CHECK-LABEL: func.func @read_after_write
// CHECK-SAME:    (%[[X:[a-z0-9]*]]: memref<?x8xf32> {spectra.may_alias}, %[[DX:[a-z0-9]*]]: memref<?x8xf32> {spectra.may_alias}, %[[SUM:[a-z0-9]*]]: memref<8xf32>)
// CHECK:         scf.if
// CHECK-NEXT:      %[[OUTV:.*]] = memref.subview %[[DX]]
// CHECK-NEXT:      linalg.fill
// CHECK-NEXT:      scf.for
// CHECK:             memref.subview %[[X]]
// CHECK:           linalg.generic {{.*}} ins(%[[XT:.*]] : memref<4x8xf32>) outs(%[[OUTV]] :
// CHECK:           linalg.generic {{.*}} ins(%[[XT]] : memref<4x8xf32>) outs(%[[SUM]] :
// CHECK-NEXT:      ^bb0
// CHECK-NOT:       memref.subview %[[DX]]
// CHECK:         } else {
func.func @read_after_write(%x: memref<?x8xf32> {spectra.may_alias}, %dx: memref<?x8xf32> {spectra.may_alias}, %sum: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x8xf32>
  %ot = memref.alloca() : memref<4x8xf32>
  %n = memref.dim %x, %c0 : memref<?x8xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x8xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xt : memref<4x8xf32>) outs(%ot : memref<4x8xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.mulf %a, %a : f32
      linalg.yield %s : f32
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%xt : memref<4x8xf32>) outs(%sum : memref<8xf32>) {
    ^bb0(%a: f32, %s: f32):
      %t = arith.addf %s, %a : f32
      linalg.yield %t : f32
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %ot[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %dx[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
  } {spectra.tile_loop}
  return
}

// The same with x and dx unmarked: distinct memory, so x is read in place too.
// CHECK-LABEL: func.func @read_after_write_distinct
// CHECK-SAME:    (%[[X:[a-z0-9]*]]: memref<?x8xf32>, %[[DX:[a-z0-9]*]]: memref<?x8xf32>, %[[SUM:[a-z0-9]*]]: memref<8xf32>)
// CHECK:         scf.if
// CHECK-NEXT:      %[[XV:.*]] = memref.subview %[[X]]
// CHECK-NOT:       scf.for
// CHECK:           linalg.generic {{.*}} ins(%[[XV]] : memref<4x8xf32, strided
// CHECK:           linalg.generic {{.*}} ins(%[[XV]] : memref<4x8xf32, strided{{.*}}) outs(%[[SUM]] :
// CHECK:         } else {
func.func @read_after_write_distinct(%x: memref<?x8xf32>, %dx: memref<?x8xf32>, %sum: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x8xf32>
  %ot = memref.alloca() : memref<4x8xf32>
  %n = memref.dim %x, %c0 : memref<?x8xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x8xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xt : memref<4x8xf32>) outs(%ot : memref<4x8xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.mulf %a, %a : f32
      linalg.yield %s : f32
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%xt : memref<4x8xf32>) outs(%sum : memref<8xf32>) {
    ^bb0(%a: f32, %s: f32):
      %t = arith.addf %s, %a : f32
      linalg.yield %t : f32
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %ot[%i, 0] [1, 8] [1, 1] : memref<4x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      %to = memref.subview %dx[%r, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<1x8xf32, strided<[8, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x8xf32, strided<[8, 1], offset: ?>>) outs(%to : memref<1x8xf32, strided<[8, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
  } {spectra.tile_loop}
  return
}

// The writer reads its output's old value (the last tile's, in the buffer; dx's row would be
// another), and reads x transposed: the output stays staged, and so x, read before anything is
// written, is read in place.
// CHECK-LABEL: func.func @writer_reads_output
// CHECK-SAME:    (%[[X:.*]]: memref<?x4xf32>, %[[DX:.*]]: memref<?x4xf32>)
// CHECK:         scf.if
// CHECK-NEXT:      %[[XV:.*]] = memref.subview %[[X]]
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[XV]] : {{.*}}) outs(%[[OT:.*]] : memref<4x4xf32>)
// CHECK:           scf.for
// CHECK:             memref.subview %[[OT]]
// CHECK:             memref.subview %[[DX]]
// CHECK:         } else {
func.func @writer_reads_output(%x: memref<?x4xf32>, %dx: memref<?x4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x4xf32>
  %ot = memref.alloca() : memref<4x4xf32>
  %n = memref.dim %x, %c0 : memref<?x4xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#tr, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xt : memref<4x4xf32>) outs(%ot : memref<4x4xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.addf %a, %o : f32
      linalg.yield %s : f32
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %ot[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %dx[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
  } {spectra.tile_loop}
  return
}

// The writer reads x transposed, and dx may be x: x stays staged (its every row read before
// dx is written), and the output is written in place.
// CHECK-LABEL: func.func @transposed_read
// CHECK-SAME:    (%[[X:[a-z0-9]*]]: memref<?x4xf32> {spectra.may_alias}, %[[DX:[a-z0-9]*]]: memref<?x4xf32> {spectra.may_alias})
// CHECK:         scf.if
// CHECK-NEXT:      %[[OUTV:.*]] = memref.subview %[[DX]]
// CHECK-NEXT:      linalg.fill
// CHECK-NEXT:      scf.for
// CHECK:           linalg.generic {{.*}} ins(%{{.*}} : memref<4x4xf32>) outs(%[[OUTV]] :
// CHECK-NOT:       scf.for
// CHECK:         } else {
func.func @transposed_read(%x: memref<?x4xf32> {spectra.may_alias}, %dx: memref<?x4xf32> {spectra.may_alias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x4xf32>
  %ot = memref.alloca() : memref<4x4xf32>
  %n = memref.dim %x, %c0 : memref<?x4xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#tr, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xt : memref<4x4xf32>) outs(%ot : memref<4x4xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.mulf %a, %a : f32
      linalg.yield %s : f32
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %ot[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %dx[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
  } {spectra.tile_loop}
  return
}

// The output's writer comes before y is staged, and dx may be y: written in place, dx would
// change before y's rows are read. So the output keeps its copy-out, which comes after every
// read of x and y; x and y, read before it, are read in place.
// CHECK-LABEL: func.func @write_before_a_staged_read
// CHECK-SAME:    (%[[X:[a-z0-9]*]]: memref<?x4xf32>, %[[Y:[a-z0-9]*]]: memref<?x4xf32> {spectra.may_alias}, %[[DX:[a-z0-9]*]]: memref<?x4xf32> {spectra.may_alias}, %[[SUM:[a-z0-9]*]]: memref<4xf32>)
// CHECK:         scf.if
// CHECK-NEXT:      %[[XV:.*]] = memref.subview %[[X]]
// CHECK-NEXT:      %[[YV:.*]] = memref.subview %[[Y]]
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[XV]] : {{.*}}) outs(%[[OT:.*]] : memref<4x4xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[YV]] : {{.*}}) outs(%[[SUM]] :
// CHECK:           scf.for
// CHECK:             memref.subview %[[OT]]
// CHECK:             memref.subview %[[DX]]
// CHECK:         } else {
func.func @write_before_a_staged_read(%x: memref<?x4xf32>, %y: memref<?x4xf32> {spectra.may_alias}, %dx: memref<?x4xf32> {spectra.may_alias}, %sum: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x4xf32>
  %yt = memref.alloca() : memref<4x4xf32>
  %ot = memref.alloca() : memref<4x4xf32>
  %n = memref.dim %x, %c0 : memref<?x4xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%xt : memref<4x4xf32>) outs(%ot : memref<4x4xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.mulf %a, %a : f32
      linalg.yield %s : f32
    }
    linalg.fill ins(%zero : f32) outs(%yt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %y[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %yt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%yt : memref<4x4xf32>) outs(%sum : memref<4xf32>) {
    ^bb0(%a: f32, %s: f32):
      %t = arith.addf %s, %a : f32
      linalg.yield %t : f32
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %ot[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %dx[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
  } {spectra.tile_loop}
  return
}

// Zeros stored after the rows (the reads see zeros), a read before the copy (it sees the last
// tile's rows), and a stage without zeros (a short tile's tail would hold what the last full
// tile left in the buffer, which is no longer written): none is read in place.
// CHECK-LABEL: func.func @out_of_order
// CHECK-NOT:     scf.if
// CHECK:         return
func.func @out_of_order(%x: memref<?x4xf32>, %y: memref<?x4xf32>, %z: memref<?x4xf32>, %sum: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x4xf32>
  %yt = memref.alloca() : memref<4x4xf32>
  %zt = memref.alloca() : memref<4x4xf32>
  %n = memref.dim %x, %c0 : memref<?x4xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x4xf32>)
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%yt : memref<4x4xf32>) outs(%sum : memref<4xf32>) {
    ^bb0(%a: f32, %s: f32):
      %t = arith.addf %s, %a : f32
      linalg.yield %t : f32
    }
    linalg.fill ins(%zero : f32) outs(%yt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %y[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %yt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %z[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %zt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%xt, %zt : memref<4x4xf32>, memref<4x4xf32>) outs(%sum : memref<4xf32>) {
    ^bb0(%a: f32, %b: f32, %s: f32):
      %p = arith.mulf %a, %b : f32
      %t = arith.addf %s, %p : f32
      linalg.yield %t : f32
    }
  } {spectra.tile_loop}
  return
}

// A contraction in the loop (its copies weigh little beside it), and a staged buffer read after
// the loop: both loops are left as they were.
// CHECK-LABEL: func.func @left_alone
// CHECK-NOT:     scf.if
// CHECK:         return
func.func @left_alone(%x: memref<?x4xf32>, %w: memref<4x4xf32>, %c: memref<4x4xf32>, %sum: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %xt = memref.alloca() : memref<4x4xf32>
  %yt = memref.alloca() : memref<4x4xf32>
  %n = memref.dim %x, %c0 : memref<?x4xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%xt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %xt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#mk, #kn, #mn], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%xt, %w : memref<4x4xf32>, memref<4x4xf32>) outs(%c : memref<4x4xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %p = arith.mulf %a, %b : f32
      %s = arith.addf %o, %p : f32
      linalg.yield %s : f32
    }
  } {spectra.tile_loop}
  scf.for %r0 = %c0 to %n step %c4 {
    %left = arith.subi %n, %r0 : index
    %rows = arith.minsi %left, %c4 : index
    linalg.fill ins(%zero : f32) outs(%yt : memref<4x4xf32>)
    scf.for %i = %c0 to %rows step %c1 {
      %r = arith.addi %r0, %i : index
      %from = memref.subview %x[%r, 0] [1, 4] [1, 1] : memref<?x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      %to = memref.subview %yt[%i, 0] [1, 4] [1, 1] : memref<4x4xf32> to memref<1x4xf32, strided<[4, 1], offset: ?>>
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%from : memref<1x4xf32, strided<[4, 1], offset: ?>>) outs(%to : memref<1x4xf32, strided<[4, 1], offset: ?>>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%yt : memref<4x4xf32>) outs(%sum : memref<4xf32>) {
    ^bb0(%a: f32, %s: f32):
      %t = arith.addf %s, %a : f32
      linalg.yield %t : f32
    }
  } {spectra.tile_loop}
  %after = memref.load %yt[%c0, %c0] : memref<4x4xf32>
  memref.store %after, %sum[%c0] : memref<4xf32>
  return
}
