// RUN: spectra-opt %s -split-input-file -pass-pipeline='builtin.module(func.func(spectra-hoist-column-terms))' | FileCheck %s
// RUN: spectra-compile --variant oprf-mm --emit=tiles | FileCheck %s --check-prefix=OPRF

// The compiled OPRF query backward: its exponent a1 l - ||x||^2/2 - max + (a0 ||w||^2 + a2 + c),
// the parenthesis summed once per kernel before the tile loop.
// OPRF-LABEL: func.func @oprf_mm_query_backward(
// OPRF:         linalg.generic {indexing_maps = [#{{.*}}, #{{.*}}, #{{.*}}], iterator_types = ["parallel"]} ins(%arg3, %arg8 : memref<128xf32>, memref<128xf32>) outs(%[[COL:.*]] : memref<128xf32>)
// OPRF-NEXT:    ^bb0(%[[WW:.*]]: f32, %[[C:.*]]: f32, %{{.*}}: f32):
// OPRF-NEXT:      %[[A0WW:.*]] = arith.mulf %{{.*}}, %[[WW]] : f32
// OPRF-NEXT:      %[[S:.*]] = arith.addf %[[A0WW]], %{{.*}} : f32
// OPRF-NEXT:      %[[T:.*]] = arith.addf %[[S]], %[[C]] : f32
// OPRF-NEXT:      linalg.yield %[[T]] : f32
// OPRF:         scf.for
// OPRF:           ins({{.*}}%[[COL]]{{.*}})
// OPRF:             arith.mulf
// OPRF-NEXT:        arith.mulf
// OPRF-NEXT:        arith.subf
// OPRF-NEXT:        arith.subf
// OPRF-NEXT:        arith.addf
// OPRF-NEXT:        math.exp
// OPRF-LABEL: func.func @oprf_mm_dsummary_combine(

#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>

// Three column terms (a0 ww, a2, -c) among five: summed before the tile loop in their order,
// the chain then a1 l - xx + col, and the op reads neither ww nor c any more.
// CHECK-LABEL: func.func @oprf
// CHECK-SAME:    (%[[N:.*]]: index, %[[P:.*]]: memref<3xf32>, %[[WW:.*]]: memref<16xf32>, %[[C:.*]]: memref<16xf32>, %[[XX:.*]]: memref<4xf32>, %[[OUT:.*]]: memref<4x16xf32>)
// CHECK-DAG:     %[[A0:.*]] = memref.load %[[P]][%c0]
// CHECK-DAG:     %[[A1:.*]] = memref.load %[[P]][%c1]
// CHECK-DAG:     %[[A2:.*]] = memref.load %[[P]][%c2]
// CHECK:         %[[COL:.*]] = memref.alloca() : memref<16xf32>
// CHECK-NEXT:    linalg.generic {{.*}} iterator_types = ["parallel"]} ins(%[[WW]], %[[C]] : memref<16xf32>, memref<16xf32>) outs(%[[COL]] : memref<16xf32>)
// CHECK-NEXT:    ^bb0(%[[W:.*]]: f32, %[[CC:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:      %[[T0:.*]] = arith.mulf %[[A0]], %[[W]] : f32
// CHECK-NEXT:      %[[T1:.*]] = arith.addf %[[T0]], %[[A2]] : f32
// CHECK-NEXT:      %[[T2:.*]] = arith.subf %[[T1]], %[[CC]] : f32
// CHECK-NEXT:      linalg.yield %[[T2]] : f32
// CHECK:         scf.for
// CHECK-NEXT:      linalg.generic {{.*}} ins(%{{.*}}, %[[XX]], %[[COL]] : memref<4x16xf32>, memref<4xf32>, memref<16xf32>) outs(%[[OUT]] : memref<4x16xf32>)
// CHECK-NEXT:      ^bb0(%[[X:.*]]: f32, %[[S:.*]]: f32, %[[SUM:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:        %[[L:.*]] = arith.mulf %[[A1]], %[[X]] : f32
// CHECK-NEXT:        %[[D:.*]] = arith.subf %[[L]], %[[S]] : f32
// CHECK-NEXT:        %[[E:.*]] = arith.addf %[[D]], %[[SUM]] : f32
// CHECK-NEXT:        %[[F:.*]] = math.exp %[[E]] : f32
// CHECK-NEXT:        linalg.yield %[[F]] : f32
func.func @oprf(%n: index, %p: memref<3xf32>, %ww: memref<16xf32>, %c: memref<16xf32>, %xx: memref<4xf32>, %out: memref<4x16xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %l = memref.alloca() : memref<4x16xf32>
  %a0 = memref.load %p[%c0] : memref<3xf32>
  %a1 = memref.load %p[%c1] : memref<3xf32>
  %a2 = memref.load %p[%c2] : memref<3xf32>
  scf.for %r = %c0 to %n step %c4 {
    linalg.generic {indexing_maps = [#id, #row, #col, #col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%l, %xx, %ww, %c : memref<4x16xf32>, memref<4xf32>, memref<16xf32>, memref<16xf32>) outs(%out : memref<4x16xf32>) {
    ^bb0(%x: f32, %s: f32, %w: f32, %cc: f32, %o: f32):
      %0 = arith.mulf %a0, %w : f32
      %1 = arith.mulf %a1, %x : f32
      %2 = arith.addf %0, %1 : f32
      %3 = arith.subf %2, %s : f32
      %4 = arith.addf %3, %a2 : f32
      %5 = arith.subf %4, %cc : f32
      %6 = math.exp %5 : f32
      linalg.yield %6 : f32
    }
  } {spectra.tile_loop}
  return
}

// -----

#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>

// The column input is written in the tile loop (kv's running maximum): its term stays, and
// with one column term left (a2) nothing is hoisted.
// CHECK-LABEL: func.func @written
// CHECK-NOT:     memref.alloca() : memref<16xf32>
// CHECK:         scf.for
// CHECK:           arith.addf
// CHECK-NEXT:      arith.subf
// CHECK-NEXT:      math.exp
func.func @written(%n: index, %a2: f32, %c: memref<16xf32>, %l: memref<4x16xf32>, %out: memref<4x16xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  scf.for %r = %c0 to %n step %c4 {
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%l : memref<4x16xf32>) outs(%c : memref<16xf32>) {
    ^bb0(%x: f32, %m: f32):
      %0 = arith.maximumf %x, %m : f32
      linalg.yield %0 : f32
    }
    linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%l, %c : memref<4x16xf32>, memref<16xf32>) outs(%out : memref<4x16xf32>) {
    ^bb0(%x: f32, %cc: f32, %o: f32):
      %0 = arith.addf %x, %a2 : f32
      %1 = arith.subf %0, %cc : f32
      %2 = math.exp %1 : f32
      linalg.yield %2 : f32
    }
  } {spectra.tile_loop}
  return
}

// -----

#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>

// A sum of column terms only (nothing per element left) and a loop that is no tile loop are
// left as they are.
// CHECK-LABEL: func.func @left
// CHECK-NOT:     memref.alloca
// CHECK:         scf.for
// CHECK:           ^bb0(%[[CC:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:        arith.addf %[[CC]], %{{.*}} : f32
// CHECK-NEXT:        linalg.yield
// CHECK:         } {spectra.tile_loop}
// CHECK-NOT:     memref.alloca
// CHECK:         scf.for
// CHECK-NEXT:      linalg.generic
// CHECK-NEXT:      ^bb0(%[[X:.*]]: f32, %[[C2:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:        %[[S:.*]] = arith.addf %[[X]], %{{.*}} : f32
// CHECK-NEXT:        arith.addf %[[S]], %[[C2]] : f32
// CHECK-NEXT:        linalg.yield
// CHECK-NOT:     memref.alloca
// CHECK:         return
func.func @left(%n: index, %a2: f32, %c: memref<16xf32>, %l: memref<4x16xf32>, %out: memref<4x16xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  scf.for %r = %c0 to %n step %c4 {
    linalg.generic {indexing_maps = [#col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%c : memref<16xf32>) outs(%out : memref<4x16xf32>) {
    ^bb0(%cc: f32, %o: f32):
      %0 = arith.addf %cc, %a2 : f32
      linalg.yield %0 : f32
    }
  } {spectra.tile_loop}
  scf.for %r = %c0 to %n step %c4 {
    linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%l, %c : memref<4x16xf32>, memref<16xf32>) outs(%out : memref<4x16xf32>) {
    ^bb0(%x: f32, %cc: f32, %o: f32):
      %0 = arith.addf %x, %a2 : f32
      %1 = arith.addf %0, %cc : f32
      linalg.yield %1 : f32
    }
  }
  return
}
