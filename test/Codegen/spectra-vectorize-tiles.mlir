// RUN: spectra-opt %s -split-input-file -spectra-vectorize-tiles="vector-width=8 register-rows=2 register-vectors=2" -canonicalize -cse | FileCheck %s

// Tests that a contraction C[m, n] += A[m, k] B[k, n] on static tiles becomes register
// tiles of 2 rows x 2 vectors of 8 lanes: the accumulators are loaded once, carried
// across k (one load of B's row segment and one broadcast of A per row per k, four
// vector.fma), and stored once; the 20 columns end in a tail of 4 lanes.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @matmul(
// CHECK: scf.for %[[ROW:.*]] = %c0 to %c4 step %c2 {
// CHECK: %[[ACC:.*]] = vector.load %arg2[%[[ROW]], %{{.*}}] : memref<4x20xf32>, vector<8xf32>
// CHECK: scf.for %[[K:.*]] = %c0 to %c3 step %c1 iter_args(%{{.*}} = %[[ACC]], %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK: vector.load %arg1[%[[K]], %{{.*}}] : memref<3x20xf32>, vector<8xf32>
// CHECK: %[[A:.*]] = memref.load %arg0[%[[ROW]], %[[K]]] : memref<4x3xf32>
// CHECK: %[[BA:.*]] = vector.broadcast %[[A]] : f32 to vector<8xf32>
// CHECK: vector.fma %[[BA]], %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK-COUNT-3: vector.fma
// CHECK: vector.store
// The last 4 columns: one vector of 4 lanes per row.
// CHECK: vector.fma {{.*}} : vector<4xf32>
// CHECK-NOT: linalg.generic
func.func @matmul(%A: memref<4x3xf32>, %B: memref<3x20xf32>, %C: memref<4x20xf32>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x20xf32>) outs(%C : memref<4x20xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that the first operand may be read transposed (A[k, m]).
#at = affine_map<(m, n, k) -> (k, m)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @matmul_at(
// CHECK: memref.load %arg0[%{{.*}}, %{{.*}}] : memref<3x4xf32>
// CHECK: vector.fma
func.func @matmul_at(%A: memref<3x4xf32>, %B: memref<3x16xf32>, %C: memref<4x16xf32>) {
  linalg.generic {indexing_maps = [#at, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<3x4xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that an elementwise body runs along the innermost dimension in vectors: a
// row-indexed operand is broadcast, a column-indexed one loaded, a value defined
// above the body broadcast, constants splat, and 12 columns end in a 4-lane tail.
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @features(
// CHECK: scf.for %[[I:.*]] = %c0 to %c2 step %c1 {
// CHECK: %[[L:.*]] = vector.load %arg0[%[[I]], %c0] : memref<2x12xf32>, vector<8xf32>
// CHECK: %[[X:.*]] = memref.load %arg1[%[[I]]] : memref<2xf32>
// CHECK: %[[XB:.*]] = vector.broadcast %[[X]] : f32 to vector<8xf32>
// CHECK: vector.load %arg2[%c0] : memref<12xf32>, vector<8xf32>
// CHECK: arith.mulf %[[XB]], %{{.*}} : vector<8xf32>
// CHECK: math.exp %{{.*}} : vector<8xf32>
// CHECK: vector.store %{{.*}}, %arg4[%[[I]], %c0] : memref<2x12xf32>, vector<8xf32>
// CHECK: math.exp %{{.*}} : vector<4xf32>
// CHECK: vector.store %{{.*}}, %arg4[%[[I]], %c8] : memref<2x12xf32>, vector<4xf32>
func.func @features(%l: memref<2x12xf32>, %xx: memref<2xf32>, %ww: memref<12xf32>, %c: f32, %out: memref<2x12xf32>) {
  linalg.generic {indexing_maps = [#full, #row, #col, #full], iterator_types = ["parallel", "parallel"]}
      ins(%l, %xx, %ww : memref<2x12xf32>, memref<2xf32>, memref<12xf32>) outs(%out : memref<2x12xf32>) {
  ^bb0(%wx: f32, %x: f32, %w: f32, %o: f32):
    %half = arith.constant 5.000000e-01 : f32
    %h = arith.mulf %x, %half : f32
    %d = arith.subf %wx, %h : f32
    %t = arith.mulf %d, %w : f32
    %e = math.exp %t : f32
    %r = arith.mulf %e, %c : f32
    linalg.yield %r : f32
  }
  return
}

// -----

// Tests that a reduction along the innermost dimension keeps a vector accumulator
// from the combiner's identity (-inf for maximumf) and reduces it horizontally once
// per row into the output's old value (a maximum as a tree of shuffles and maximumf:
// 8 -> 4 -> 2 -> 1 lanes), along the outer dimension it accumulates whole vectors from
// the output. A sum across lanes is a reassociating vector.reduction (a tree, not a
// lane-by-lane chain).
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @reductions(
// CHECK: %[[NEG:.*]] = arith.constant dense<0xFF800000> : vector<8xf32>
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %[[NEG]]) -> (vector<8xf32>)
// CHECK: arith.maximumf %{{.*}} : vector<8xf32>
// CHECK: vector.shuffle {{.*}} [4, 5, 6, 7] : vector<8xf32>, vector<8xf32>
// CHECK: arith.maximumf %{{.*}} : vector<4xf32>
// CHECK: vector.shuffle {{.*}} [2, 3] : vector<4xf32>, vector<4xf32>
// CHECK: arith.maximumf %{{.*}} : vector<2xf32>
// CHECK: vector.shuffle {{.*}} [1] : vector<2xf32>, vector<2xf32>
// CHECK: arith.maximumf %{{.*}} : vector<1xf32>
// CHECK-NOT: vector.reduction
// CHECK: vector.extract %{{.*}}[0] : f32 from vector<1xf32>
// CHECK: memref.store
// CHECK: %[[COL:.*]] = vector.load %arg2[%{{.*}}] : memref<16xf32>, vector<8xf32>
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %[[COL]]) -> (vector<8xf32>)
// CHECK: arith.addf %{{.*}} : vector<8xf32>
// CHECK: vector.store %{{.*}}, %arg2[%{{.*}}] : memref<16xf32>, vector<8xf32>
func.func @reductions(%x: memref<4x16xf32>, %rows: memref<4xf32>, %cols: memref<16xf32>) {
  linalg.generic {indexing_maps = [#full, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<4x16xf32>) outs(%rows : memref<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %m = arith.maximumf %v, %acc : f32
    linalg.yield %m : f32
  }
  linalg.generic {indexing_maps = [#full, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<4x16xf32>) outs(%cols : memref<16xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %a = arith.addf %acc, %v : f32
    linalg.yield %a : f32
  }
  return
}


// -----

// Tests the dot-product form C[m, n] += A[m, k] B[n, k] (the causal kernels' q k^T): a
// vector accumulator per (row, column) of a 2 x 2 register tile, and their lane sums taken
// together: the four vector<8> accumulators folded in pairs (8 -> 4 -> 2 -> 1 lanes per sum,
// two shuffles and one add per fold: 2 + 1 + 1 folds), no per-accumulator reduction.
#a = affine_map<(m, n, k) -> (m, k)>
#bt = affine_map<(m, n, k) -> (n, k)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @dot(
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK-COUNT-4: vector.fma
// CHECK-NOT: vector.reduction
// CHECK: vector.shuffle %{{.*}}, %{{.*}} [0, 1, 2, 3, 8, 9, 10, 11]
// CHECK-NEXT: vector.shuffle %{{.*}}, %{{.*}} [4, 5, 6, 7, 12, 13, 14, 15]
// CHECK-COUNT-4: vector.shuffle
// CHECK: vector.shuffle %[[X:.*]], %[[X]] [0, 8, 2, 10, 4, 12, 6, 14]
// CHECK-NEXT: vector.shuffle %[[X]], %[[X]] [1, 9, 3, 11, 5, 13, 7, 15]
// CHECK-NOT: vector.shuffle
// CHECK-COUNT-4: vector.extract
// CHECK-NOT: vector.reduction
func.func @dot(%A: memref<4x16xf32>, %B: memref<6x16xf32>, %C: memref<4x6xf32>) {
  linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x16xf32>, memref<6x16xf32>) outs(%C : memref<4x6xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that a row staged from a kernel argument (a subview of a memref<?x32xf32> in
// memory) prefetches the same row of the next tile, spectra.tile_rows (here 16) further and
// at most the last row, one prefetch per 64-byte line (two for 32 f32), into L2 (locality 1:
// prefetcht2; into L1 the lines evicted the working tile's buffers); a row of a local
// tile is not prefetched.
#row = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @stage(
// CHECK-SAME: %[[SRC:.*]]: memref<?x32xf32>, %[[N:.*]]: index
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : index
// CHECK-DAG: %[[C1:.*]] = arith.constant 1 : index
// CHECK: %[[DIM:.*]] = memref.dim %[[SRC]], %c0
// CHECK: %[[LAST:.*]] = arith.subi %[[DIM]], %[[C1]]
// CHECK: %[[AHEAD:.*]] = arith.addi %[[N]], %[[C16]]
// CHECK: %[[NEXT:.*]] = arith.minsi %[[AHEAD]], %[[LAST]]
// CHECK: memref.prefetch %[[SRC]][%[[NEXT]], %c0], read, locality<1>, data : memref<?x32xf32>
// CHECK: memref.prefetch %[[SRC]][%[[NEXT]], %c16], read, locality<1>, data : memref<?x32xf32>
// CHECK-NOT: memref.prefetch
// CHECK: return
func.func @stage(%src: memref<?x32xf32>, %n: index) attributes {spectra.tile_rows = 16 : i64} {
  %tile = memref.alloca() : memref<16x32xf32>
  %copy = memref.alloca() : memref<16x32xf32>
  %in = memref.subview %src[%n, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
  %out = memref.subview %tile[0, 0] [1, 32] [1, 1] : memref<16x32xf32> to memref<1x32xf32, strided<[32, 1]>>
  linalg.generic {indexing_maps = [#row, #row], iterator_types = ["parallel", "parallel"]}
      ins(%in : memref<1x32xf32, strided<[32, 1], offset: ?>>) outs(%out : memref<1x32xf32, strided<[32, 1]>>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  linalg.generic {indexing_maps = [#row, #row], iterator_types = ["parallel", "parallel"]}
      ins(%tile : memref<16x32xf32>) outs(%copy : memref<16x32xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  return
}

// -----

// Tests that where a contraction over the tile's rows follows the staging loop, the staged
// rows' prefetches leave the staging (where they went out in one burst beside its own loads,
// and came no sooner than none: scripts/staging-prefetch.c) for that contraction's register
// tiles: each block of register-rows rows prefetches the same rows of the next tile
// (spectra.tile_rows = 4 further, at most the last row), two lines a row.
#row = affine_map<(i, j) -> (i, j)>
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @stage_spread(
// CHECK-SAME: %[[SRC:[^:]*]]: memref<?x32xf32>, %[[R0:[^:]*]]: index
// CHECK: scf.for
// CHECK-NOT: memref.prefetch
// CHECK: vector.store
// CHECK: scf.for %[[ROW0:.*]] = %c0 to %c4 step %c2 {
// CHECK-NEXT: %[[FIRST:.*]] = arith.addi %[[R0]], %[[ROW0]]
// CHECK: %[[DIM:.*]] = memref.dim %[[SRC]], %c0
// CHECK-NEXT: %[[LAST:.*]] = arith.subi %[[DIM]], %c1
// CHECK: %[[A0:.*]] = arith.addi %[[FIRST]], %c4
// CHECK: %[[N0:.*]] = arith.minsi %[[A0]], %[[LAST]]
// CHECK-NEXT: memref.prefetch %[[SRC]][%[[N0]], %c0], read, locality<1>, data
// CHECK-NEXT: memref.prefetch %[[SRC]][%[[N0]], %c16], read, locality<1>, data
// CHECK-NEXT: %[[A1:.*]] = arith.addi %[[FIRST]], %c5
// CHECK-NEXT: %[[N1:.*]] = arith.minsi %[[A1]], %[[LAST]]
// CHECK-NEXT: memref.prefetch %[[SRC]][%[[N1]], %c0], read, locality<1>, data
// CHECK-NEXT: memref.prefetch %[[SRC]][%[[N1]], %c16], read, locality<1>, data
// CHECK-NOT: memref.prefetch
// CHECK: vector.fma
// CHECK-NOT: memref.prefetch
// CHECK: return
func.func @stage_spread(%src: memref<?x32xf32>, %r0: index, %rows: index, %B: memref<32x16xf32>,
                        %C: memref<4x16xf32>) attributes {spectra.tile_rows = 4 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %tile = memref.alloca() : memref<4x32xf32>
  scf.for %i = %c0 to %rows step %c1 {
    %at = arith.addi %r0, %i : index
    %in = memref.subview %src[%at, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %out = memref.subview %tile[%i, 0] [1, 32] [1, 1] : memref<4x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    linalg.generic {indexing_maps = [#row, #row], iterator_types = ["parallel", "parallel"]}
        ins(%in : memref<1x32xf32, strided<[32, 1], offset: ?>>) outs(%out : memref<1x32xf32, strided<[32, 1], offset: ?>>) {
    ^bb0(%x: f32, %y: f32):
      linalg.yield %x : f32
    }
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%tile, %B : memref<4x32xf32>, memref<32x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that in a tile loop that runs from the last tile to the first (the causal key
// backward: spectra.tile_loop_reversed), a staged row prefetches the same row of the tile it
// takes next, tile_rows (4) rows back and at least row 0, not the one it has just finished.
#row = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @stage_reversed(
// CHECK-SAME: %[[SRC:[^:]*]]: memref<?x32xf32>
// CHECK: %[[AT:.*]] = arith.muli
// CHECK: %[[BACK:.*]] = arith.addi %[[AT]], %c-4
// CHECK-NEXT: %[[NEXT:.*]] = arith.maxsi %[[BACK]], %c0
// CHECK-NEXT: memref.prefetch %[[SRC]][%[[NEXT]], %c0], read, locality<1>, data
// CHECK-NEXT: memref.prefetch %[[SRC]][%[[NEXT]], %c16], read, locality<1>, data
// CHECK-NOT: memref.prefetch
// CHECK: return
func.func @stage_reversed(%src: memref<?x32xf32>, %tiles: index) attributes {spectra.tile_rows = 4 : i64} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %tile = memref.alloca() : memref<4x32xf32>
  scf.for %t = %c0 to %tiles step %c1 {
    %at = arith.muli %t, %c4 : index
    %in = memref.subview %src[%at, 0] [1, 32] [1, 1] : memref<?x32xf32> to memref<1x32xf32, strided<[32, 1], offset: ?>>
    %out = memref.subview %tile[0, 0] [1, 32] [1, 1] : memref<4x32xf32> to memref<1x32xf32, strided<[32, 1]>>
    linalg.generic {indexing_maps = [#row, #row], iterator_types = ["parallel", "parallel"]}
        ins(%in : memref<1x32xf32, strided<[32, 1], offset: ?>>) outs(%out : memref<1x32xf32, strided<[32, 1]>>) {
    ^bb0(%x: f32, %y: f32):
      linalg.yield %x : f32
    }
  } {spectra.tile_loop, spectra.tile_loop_reversed}
  return
}

// -----

// Tests that a row sum reduces its vector accumulator across lanes with a reassociating
// vector.reduction (LLVM then adds the lanes as a tree; without reassoc it would add them
// one by one, a chain of 8 dependent adds per row).
#rs_full = affine_map<(i, j) -> (i, j)>
#rs_row = affine_map<(i, j) -> (i)>
// CHECK-LABEL: func.func @row_sum(
// CHECK: arith.addf %{{.*}} : vector<8xf32>
// CHECK: vector.reduction <add>, %{{.*}} fastmath<reassoc> : vector<8xf32> into f32
// CHECK: memref.store
func.func @row_sum(%x: memref<4x16xf32>, %rows: memref<4xf32>) {
  linalg.generic {indexing_maps = [#rs_full, #rs_row], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<4x16xf32>) outs(%rows : memref<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %a = arith.addf %v, %acc : f32
    linalg.yield %a : f32
  }
  return
}

// -----

// Tests that a contraction into a tile the fill just before it set to +0 starts its
// accumulators at 0 and only stores C (the fill goes: no zeros stored, no C loaded back);
// a second contraction into the same tile accumulates onto it; a fill of another value,
// or of another tile, is kept and the contraction after it loads C.
#z_a = affine_map<(m, n, k) -> (m, k)>
#z_b = affine_map<(m, n, k) -> (k, n)>
#z_bt = affine_map<(m, n, k) -> (n, k)>
#z_c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @zero_filled(
// CHECK-DAG: %[[Z:.*]] = arith.constant dense<0.000000e+00> : vector<8xf32>
// CHECK-NOT: vector.load %arg2
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %[[Z]], %{{.*}} = %[[Z]], %{{.*}} = %[[Z]], %{{.*}} = %[[Z]])
// CHECK: vector.store {{.*}}, %arg2
// The second contraction accumulates onto the first's result.
// CHECK: %[[ACC:.*]] = vector.load %arg2
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %[[ACC]]
// The dot-product form stores its lane sums without reading C.
// CHECK-NOT: memref.load %arg4
// CHECK: memref.store {{.*}}, %arg4
// A fill of 1 stays and the contraction after it reads C.
// CHECK: vector.store {{.*}}, %arg5
// CHECK: vector.load %arg5
func.func @zero_filled(%A: memref<2x3xf32>, %B: memref<3x16xf32>, %C: memref<2x16xf32>,
                       %Bt: memref<2x8xf32>, %P: memref<2x2xf32>, %D: memref<2x16xf32>,
                       %A8: memref<2x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<2x16xf32>)
  linalg.generic {indexing_maps = [#z_a, #z_b, #z_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#z_a, #z_b, #z_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.fill ins(%zero : f32) outs(%P : memref<2x2xf32>)
  linalg.generic {indexing_maps = [#z_a, #z_bt, #z_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A8, %Bt : memref<2x8xf32>, memref<2x8xf32>) outs(%P : memref<2x2xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.fill ins(%one : f32) outs(%D : memref<2x16xf32>)
  linalg.generic {indexing_maps = [#z_a, #z_b, #z_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%D : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that the fill stays when the contraction also reads the filled buffer (a view of
// it here): the operand must see the zeros.
#y_a = affine_map<(m, n, k) -> (m, k)>
#y_b = affine_map<(m, n, k) -> (k, n)>
#y_c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @zero_filled_operand(
// CHECK: vector.store {{.*}}, %arg0
// CHECK: vector.load %arg0
// CHECK: scf.for
func.func @zero_filled_operand(%C: memref<8x8xf32>, %B: memref<8x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<8x8xf32>)
  %A = memref.subview %C[0, 0] [8, 8] [1, 1] : memref<8x8xf32> to memref<8x8xf32, strided<[8, 1]>>
  linalg.generic {indexing_maps = [#y_a, #y_b, #y_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<8x8xf32, strided<[8, 1]>>, memref<8x8xf32>) outs(%C : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that the fill of another buffer between the fill and the contraction (the keys'
// backward zeroes two tiles, then fills them by products) does not keep the first fill:
// %C's zeros go, %D's stay (%D has another type: an argument of %C's type could be %C).
#x_a = affine_map<(m, n, k) -> (m, k)>
#x_b = affine_map<(m, n, k) -> (k, n)>
#x_c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @two_fills(
// CHECK-NOT: vector.store {{.*}}, %arg2
// CHECK: vector.store {{.*}}, %arg3
// CHECK-NOT: vector.load %arg2
// CHECK: scf.for
// CHECK: vector.store {{.*}}, %arg2
func.func @two_fills(%A: memref<2x3xf32>, %B: memref<3x16xf32>, %C: memref<2x16xf32>,
                     %D: memref<4x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<2x16xf32>)
  linalg.fill ins(%zero : f32) outs(%D : memref<4x16xf32>)
  linalg.generic {indexing_maps = [#x_a, #x_b, #x_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests a reduction whose generic also writes an elementwise result (an output whose map
// keeps the reduction dim): e = exp(l - c) is stored element by element while its column
// sums accumulate in the loop-carried vector; no second pass reads e back.
#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @exp_and_column_sums(
// CHECK: scf.for %[[J:.*]] = %c0 to %c16 step %c8 {
// CHECK: %[[INIT:.*]] = vector.load %arg3[%[[J]]] : memref<16xf32>, vector<8xf32>
// CHECK: %[[SUM:.*]] = scf.for %[[I:.*]] = %c0 to %c4 step %c1 iter_args(%[[ACC:.*]] = %[[INIT]]) -> (vector<8xf32>) {
// CHECK: %[[E:.*]] = math.exp
// CHECK: %[[NEXT:.*]] = arith.addf %[[ACC]], %[[E]] : vector<8xf32>
// CHECK: vector.store %[[E]], %arg2[%[[I]], %[[J]]] : memref<4x16xf32>, vector<8xf32>
// CHECK: scf.yield %[[NEXT]]
// CHECK: vector.store %[[SUM]], %arg3[%[[J]]] : memref<16xf32>, vector<8xf32>
// CHECK-NOT: linalg.generic
func.func @exp_and_column_sums(%l: memref<4x16xf32>, %c: memref<16xf32>, %e: memref<4x16xf32>,
                               %z: memref<16xf32>) {
  linalg.generic {indexing_maps = [#id, #col, #id, #col], iterator_types = ["reduction", "parallel"]}
      ins(%l, %c : memref<4x16xf32>, memref<16xf32>) outs(%e, %z : memref<4x16xf32>, memref<16xf32>) {
  ^bb0(%x: f32, %cc: f32, %old: f32, %acc: f32):
    %d = arith.subf %x, %cc : f32
    %p = math.exp %d : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %p, %s : f32, f32
  }
  return
}

// -----

// The same along rows: the row maximum of l - c is taken while l - c is written; 12
// columns are one vector of 8 and a tail of 4, each folded into the row's maximum.
#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @shifted_and_row_maxima(
// CHECK: scf.for %[[I:.*]] = %c0 to %c2 step %c1 {
// CHECK: %[[D:.*]] = arith.subf %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK: vector.store %[[D]], %arg2[%[[I]], %c0] : memref<2x12xf32>, vector<8xf32>
// CHECK: arith.maximumf {{.*}} : vector<4xf32>
// CHECK: %[[T:.*]] = arith.subf %{{.*}}, %{{.*}} : vector<4xf32>
// CHECK: vector.store %[[T]], %arg2[%[[I]], %c8] : memref<2x12xf32>, vector<4xf32>
// CHECK: arith.maximumf {{.*}} : vector<2xf32>
// CHECK: %[[OLD:.*]] = memref.load %arg3[%[[I]]] : memref<2xf32>
// CHECK: %[[NEW:.*]] = arith.maximumf %[[OLD]], %{{.*}} : f32
// CHECK: memref.store %[[NEW]], %arg3[%[[I]]] : memref<2xf32>
// CHECK-NOT: linalg.generic
func.func @shifted_and_row_maxima(%l: memref<2x12xf32>, %c: memref<12xf32>, %d: memref<2x12xf32>,
                                  %m: memref<2xf32>) {
  linalg.generic {indexing_maps = [#id, #col, #id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%l, %c : memref<2x12xf32>, memref<12xf32>) outs(%d, %m : memref<2x12xf32>, memref<2xf32>) {
  ^bb0(%x: f32, %cc: f32, %old: f32, %acc: f32):
    %s = arith.subf %x, %cc : f32
    %n = arith.maximumf %s, %acc : f32
    linalg.yield %s, %n : f32, f32
  }
  return
}

// -----

// Tests that the elementwise generic right after a contraction, reading its output C
// element by element, runs as the contraction's epilogue: on each register tile's
// finished accumulators (a row operand read once per row, a column operand once per
// column vector), its result stored, and C (a local tile nothing else reads) neither
// stored nor read back (the alloca goes).
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @epilogue(
// CHECK-NOT: memref.alloca
// CHECK: scf.for %[[ROW:.*]] = %c0 to %c4 step %c2 {
// CHECK: %[[ACC:.*]]:4 = scf.for
// CHECK: vector.fma
// CHECK: scf.yield
// CHECK: %[[X:.*]] = memref.load %arg2[%[[ROW]]] : memref<4xf32>
// CHECK: %[[XB:.*]] = vector.broadcast %[[X]] : f32 to vector<8xf32>
// CHECK: %[[W0:.*]] = vector.load %arg3[%c0] : memref<16xf32>, vector<8xf32>
// CHECK: %[[D:.*]] = arith.subf %[[ACC]]#0, %[[XB]] : vector<8xf32>
// CHECK: %[[E:.*]] = arith.mulf %[[D]], %[[W0]] : vector<8xf32>
// CHECK: vector.store %[[E]], %arg4[%[[ROW]], %c0] : memref<4x16xf32>, vector<8xf32>
// CHECK: %[[W1:.*]] = vector.load %arg3[%c8] : memref<16xf32>, vector<8xf32>
// CHECK: arith.subf %[[ACC]]#1, %[[XB]] : vector<8xf32>
// CHECK: memref.load %arg2[%{{.*}}] : memref<4xf32>
// CHECK: arith.subf %[[ACC]]#2
// CHECK: arith.mulf %{{.*}}, %[[W0]] : vector<8xf32>
// CHECK: arith.subf %[[ACC]]#3
// CHECK: arith.mulf %{{.*}}, %[[W1]] : vector<8xf32>
// CHECK-NOT: memref.load %arg3
// CHECK-NOT: vector.load %arg3
// CHECK-NOT: scf.for
// CHECK: return
func.func @epilogue(%A: memref<4x3xf32>, %B: memref<3x16xf32>, %xx: memref<4xf32>,
                    %ww: memref<16xf32>, %out: memref<4x16xf32>) {
  %C = memref.alloca() : memref<4x16xf32>
  %zero = arith.constant 0.000000e+00 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<4x16xf32>)
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#full, #row, #col, #full], iterator_types = ["parallel", "parallel"]}
      ins(%C, %xx, %ww : memref<4x16xf32>, memref<4xf32>, memref<16xf32>) outs(%out : memref<4x16xf32>) {
  ^bb0(%l: f32, %x: f32, %w: f32, %o: f32):
    %d = arith.subf %l, %x : f32
    %e = arith.mulf %d, %w : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// Tests that an epilogue still lets C be stored where something else may read it (here an
// argument), and that a write to memory between the two keeps them apart.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#full = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @epilogue_stores_argument(
// CHECK: %[[ACC:.*]]:4 = scf.for
// CHECK: vector.store %[[ACC]]#0, %arg2
// CHECK: math.exp %[[ACC]]#0 : vector<8xf32>
// CHECK: vector.store %{{.*}}, %arg3
// CHECK-LABEL: func.func @no_epilogue_across_a_write(
// CHECK: vector.fma
// CHECK: vector.store %{{.*}}, %arg2
// CHECK: memref.store
// CHECK: vector.load %arg2
// CHECK: math.exp
func.func @epilogue_stores_argument(%A: memref<2x3xf32>, %B: memref<3x16xf32>,
                                    %C: memref<2x16xf32>, %out: memref<2x16xf32>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<2x16xf32>) outs(%out : memref<2x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}
func.func @no_epilogue_across_a_write(%A: memref<2x3xf32>, %B: memref<3x16xf32>,
                                      %C: memref<2x16xf32>, %out: memref<2x16xf32>,
                                      %i: index, %v: f32) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  memref.store %v, %C[%i, %i] : memref<2x16xf32>
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<2x16xf32>) outs(%out : memref<2x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// Tests that two function arguments marked spectra.may_alias count as one memory (the
// in-place call of moments_backward passes dx as dxin): an epilogue writing an argument that
// may be B could overwrite B while later register tiles still read it, and one reading an
// argument that may be C could read C; both then run as their own loops after the
// contraction's stores. Unmarked, two arguments of one type are distinct: the epilogue
// stays. So does one
// writing another view of C's buffer that overlaps C (written before later tiles load C);
// one beside C (SGQ's features of P and -P, columns of one tile) stays the epilogue.
#ea_a = affine_map<(m, n, k) -> (m, k)>
#ea_b = affine_map<(m, n, k) -> (k, n)>
#ea_c = affine_map<(m, n, k) -> (m, n)>
#ea_full = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @no_epilogue_output_in_c_buffer(
// CHECK: %[[BUF:.*]] = memref.alloca() : memref<2x32xf32>
// CHECK: %[[CV:.*]] = memref.subview %[[BUF]][0, 0]
// CHECK: %[[OV:.*]] = memref.subview %[[BUF]][0, 8]
// CHECK: vector.fma
// CHECK: vector.store %{{.*}}, %[[CV]]
// CHECK: scf.for
// CHECK: vector.load %[[CV]]
// CHECK: math.exp
// CHECK: vector.store %{{.*}}, %[[OV]]
// CHECK-LABEL: func.func @epilogue_beside_c(
// CHECK: %[[BUF:.*]] = memref.alloca() : memref<2x32xf32>
// CHECK: %[[OV:.*]] = memref.subview %[[BUF]][0, 16]
// CHECK: %[[ACC:.*]]:4 = scf.for
// CHECK: math.exp %[[ACC]]#0
// CHECK: vector.store %{{.*}}, %[[OV]]
// CHECK-LABEL: func.func @no_epilogue_output_may_be_b(
// CHECK: vector.fma
// CHECK: vector.store %{{.*}}, %arg2
// CHECK: scf.for
// CHECK: vector.load %arg2
// CHECK: math.exp
// CHECK: vector.store %{{.*}}, %arg3
// CHECK-LABEL: func.func @no_epilogue_input_may_be_c(
// CHECK: vector.fma
// CHECK: vector.store %{{.*}}, %arg2
// CHECK: scf.for
// CHECK: vector.load %arg2
// CHECK: vector.load %arg3
// CHECK: math.exp
// CHECK-LABEL: func.func @epilogue_output_of_b_type_unmarked(
// CHECK: %[[ACC:.*]]:4 = scf.for
// CHECK-NEXT: vector.load %arg1
// CHECK: vector.store %[[ACC]]#0, %arg2
// CHECK-NEXT: %[[E:.*]] = math.exp %[[ACC]]#0
// CHECK-NEXT: vector.store %[[E]], %arg3
// CHECK-NOT: scf.for
// CHECK: return
func.func @no_epilogue_output_in_c_buffer(%A: memref<2x3xf32>, %B: memref<3x16xf32>) {
  %buf = memref.alloca() : memref<2x32xf32>
  %C = memref.subview %buf[0, 0] [2, 16] [1, 1] : memref<2x32xf32> to memref<2x16xf32, strided<[32, 1]>>
  %out = memref.subview %buf[0, 8] [2, 16] [1, 1] : memref<2x32xf32> to memref<2x16xf32, strided<[32, 1], offset: 8>>
  linalg.generic {indexing_maps = [#ea_a, #ea_b, #ea_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32, strided<[32, 1]>>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#ea_full, #ea_full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<2x16xf32, strided<[32, 1]>>) outs(%out : memref<2x16xf32, strided<[32, 1], offset: 8>>) {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}
func.func @epilogue_beside_c(%A: memref<2x3xf32>, %B: memref<3x16xf32>) {
  %buf = memref.alloca() : memref<2x32xf32>
  %C = memref.subview %buf[0, 0] [2, 16] [1, 1] : memref<2x32xf32> to memref<2x16xf32, strided<[32, 1]>>
  %out = memref.subview %buf[0, 16] [2, 16] [1, 1] : memref<2x32xf32> to memref<2x16xf32, strided<[32, 1], offset: 16>>
  linalg.generic {indexing_maps = [#ea_a, #ea_b, #ea_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32, strided<[32, 1]>>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#ea_full, #ea_full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<2x16xf32, strided<[32, 1]>>) outs(%out : memref<2x16xf32, strided<[32, 1], offset: 16>>) {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}
func.func @no_epilogue_output_may_be_b(%A: memref<2x2xf32>, %B: memref<2x16xf32> {spectra.may_alias},
                                       %C: memref<2x16xf32>, %out: memref<2x16xf32> {spectra.may_alias}) {
  linalg.generic {indexing_maps = [#ea_a, #ea_b, #ea_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x2xf32>, memref<2x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#ea_full, #ea_full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<2x16xf32>) outs(%out : memref<2x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}
func.func @no_epilogue_input_may_be_c(%A: memref<2x3xf32>, %B: memref<3x16xf32>,
                                      %C: memref<2x16xf32> {spectra.may_alias},
                                      %D: memref<2x16xf32> {spectra.may_alias}) {
  %res = memref.alloca() : memref<2x16xf32>
  linalg.generic {indexing_maps = [#ea_a, #ea_b, #ea_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#ea_full, #ea_full, #ea_full], iterator_types = ["parallel", "parallel"]}
      ins(%C, %D : memref<2x16xf32>, memref<2x16xf32>) outs(%res : memref<2x16xf32>) {
  ^bb0(%l: f32, %d: f32, %o: f32):
    %t = arith.addf %l, %d : f32
    %e = math.exp %t : f32
    linalg.yield %e : f32
  }
  return
}
func.func @epilogue_output_of_b_type_unmarked(%A: memref<2x2xf32>, %B: memref<2x16xf32>,
                                              %C: memref<2x16xf32>, %out: memref<2x16xf32>) {
  linalg.generic {indexing_maps = [#ea_a, #ea_b, #ea_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x2xf32>, memref<2x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#ea_full, #ea_full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<2x16xf32>) outs(%out : memref<2x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// Tests that a contraction's zero fill stays where an input may be C's memory (an argument
// marked spectra.may_alias, as C is: A here) or a fill between the two may write it (the
// fill of such an argument, whatever it writes): the accumulators then load C. Unmarked,
// an input of C's type is distinct memory and the fill goes.
#za_a = affine_map<(m, n, k) -> (m, k)>
#za_b = affine_map<(m, n, k) -> (k, n)>
#za_c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @zero_fill_input_may_be_c(
// CHECK: vector.store {{.*}}, %arg0
// CHECK: vector.load %arg0
// CHECK: scf.for
// CHECK-LABEL: func.func @zero_fill_across_a_fill_that_may_be_c(
// CHECK: vector.store {{.*}}, %arg2
// CHECK: vector.store {{.*}}, %arg3
// CHECK: vector.load %arg2
// CHECK: scf.for
// CHECK-LABEL: func.func @zero_fill_input_of_c_type_unmarked(
// CHECK: %[[ZERO:.*]] = arith.constant dense<0.000000e+00> : vector<8xf32>
// CHECK-NOT: vector.store
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %[[ZERO]],
// CHECK-NOT: vector.load %arg0
// CHECK: vector.store %{{.*}}, %arg0
// CHECK-NOT: vector.load %arg0
// CHECK: return
func.func @zero_fill_input_may_be_c(%C: memref<8x16xf32> {spectra.may_alias},
                                    %A: memref<8x16xf32> {spectra.may_alias}, %B: memref<16x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<8x16xf32>)
  linalg.generic {indexing_maps = [#za_a, #za_b, #za_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<8x16xf32>, memref<16x16xf32>) outs(%C : memref<8x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
func.func @zero_fill_across_a_fill_that_may_be_c(%A: memref<2x3xf32>, %B: memref<3x16xf32>,
                                                 %C: memref<2x16xf32> {spectra.may_alias},
                                                 %D: memref<2x16xf32> {spectra.may_alias}) {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<2x16xf32>)
  linalg.fill ins(%one : f32) outs(%D : memref<2x16xf32>)
  linalg.generic {indexing_maps = [#za_a, #za_b, #za_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<2x3xf32>, memref<3x16xf32>) outs(%C : memref<2x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
func.func @zero_fill_input_of_c_type_unmarked(%C: memref<8x16xf32>, %A: memref<8x16xf32>,
                                              %B: memref<16x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<8x16xf32>)
  linalg.generic {indexing_maps = [#za_a, #za_b, #za_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<8x16xf32>, memref<16x16xf32>) outs(%C : memref<8x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that rows of whole vectors are reduced in groups of 8 (the vector width): each row's
// accumulator is folded into the group's as its loop ends (two shuffles and one op per fold,
// halves of blocks of 8, 4, 2 lanes), so one vector holds the 8 rows' results in order and
// is combined into a contiguous output with one vector load and store, and into a strided
// one lane by lane; the rows past the last whole group (16..19) keep a tree each.
#g_full = affine_map<(i, j) -> (i, j)>
#g_row = affine_map<(i, j) -> (i)>
// CHECK-LABEL: func.func @row_groups(
// CHECK-SAME: %[[X:.*]]: memref<20x16xf32>, %[[SUMS:.*]]: memref<20xf32>, %[[MAXS:.*]]: memref<20xf32, strided<[2]>>)
// CHECK: scf.for %[[I0:.*]] = %c0 to %c16 step %c8 {
// CHECK-COUNT-2: scf.for {{.*}} -> (vector<8xf32>, vector<8xf32>)
// CHECK: vector.shuffle %{{.*}}, %{{.*}} [0, 1, 2, 3, 8, 9, 10, 11] : vector<8xf32>, vector<8xf32>
// CHECK-NEXT: vector.shuffle %{{.*}}, %{{.*}} [4, 5, 6, 7, 12, 13, 14, 15] : vector<8xf32>, vector<8xf32>
// CHECK-NEXT: arith.addf %{{.*}} : vector<8xf32>
// CHECK: vector.shuffle {{.*}} [0, 1, 2, 3, 8, 9, 10, 11]
// CHECK-NEXT: vector.shuffle {{.*}} [4, 5, 6, 7, 12, 13, 14, 15]
// CHECK-NEXT: arith.maximumf %{{.*}} : vector<8xf32>
// CHECK: vector.shuffle {{.*}} [0, 1, 4, 5, 8, 9, 12, 13]
// CHECK-NEXT: vector.shuffle {{.*}} [2, 3, 6, 7, 10, 11, 14, 15]
// CHECK: vector.shuffle {{.*}} [0, 2, 4, 6, 8, 10, 12, 14]
// CHECK-NEXT: vector.shuffle {{.*}} [1, 3, 5, 7, 9, 11, 13, 15]
// CHECK-NEXT: %[[S:.*]] = arith.addf %{{.*}} : vector<8xf32>
// CHECK: vector.shuffle {{.*}} [0, 2, 4, 6, 8, 10, 12, 14]
// CHECK-NEXT: vector.shuffle {{.*}} [1, 3, 5, 7, 9, 11, 13, 15]
// CHECK-NEXT: %[[M:.*]] = arith.maximumf %{{.*}} : vector<8xf32>
// CHECK-NOT: vector.reduction
// CHECK: %[[OLD:.*]] = vector.load %[[SUMS]][%[[I0]]] : memref<20xf32>, vector<8xf32>
// CHECK: %[[NEW:.*]] = arith.addf %[[OLD]], %[[S]] : vector<8xf32>
// CHECK: vector.store %[[NEW]], %[[SUMS]][%[[I0]]] : memref<20xf32>, vector<8xf32>
// CHECK-COUNT-8: vector.extract %[[M]]
// CHECK: }
// CHECK: scf.for %{{.*}} = %c16 to %c20 step %c1 {
// CHECK: vector.reduction <add>
func.func @row_groups(%x: memref<20x16xf32>, %sums: memref<20xf32>, %maxs: memref<20xf32, strided<[2]>>) {
  linalg.generic {indexing_maps = [#g_full, #g_row, #g_row], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<20x16xf32>) outs(%sums, %maxs : memref<20xf32>, memref<20xf32, strided<[2]>>) {
  ^bb0(%v: f32, %s: f32, %m: f32):
    %a = arith.addf %v, %s : f32
    %b = arith.maximumf %v, %m : f32
    linalg.yield %a, %b : f32, f32
  }
  return
}

// -----

// Tests that rows which end in part of a vector (19 columns at 8 lanes: two whole vectors
// and 3 lanes, as SGQ's 65 features end at 16) are reduced in groups too: each row's tail
// is loaded as a vector<3>, widened, blended with the identity into lanes 0..2 (0 for a sum,
// -inf for a maximum) and combined with the row's accumulator before the fold, with no lane
// tree per row. The numbers are checked by the unit tests at m = 17 and 130 (FusedCpu,
// Numerics) at 16 and 8 lanes.
#t_full = affine_map<(i, j) -> (i, j)>
#t_row = affine_map<(i, j) -> (i)>
// CHECK-LABEL: func.func @row_groups_with_tails(
// CHECK-SAME: %[[X:.*]]: memref<8x19xf32>, %[[SUMS:.*]]: memref<8xf32>, %[[MAXS:.*]]: memref<8xf32>)
// CHECK-DAG: %[[ZERO:.*]] = arith.constant dense<0.000000e+00> : vector<8xf32>
// CHECK-DAG: %[[NINF:.*]] = arith.constant dense<0xFF800000> : vector<8xf32>
// CHECK: %[[ROW:.*]]:2 = scf.for {{.*}} -> (vector<8xf32>, vector<8xf32>)
// The tail's accumulators start at the identity (-0 for the sum), so its first step folds
// away and the loaded tail is widened as it is, once for both outputs.
// CHECK: %[[TAIL:.*]] = vector.load %[[X]][%{{.*}}, %c16] : memref<8x19xf32>, vector<3xf32>
// CHECK-NEXT: %[[WS:.*]] = vector.shuffle %[[TAIL]], %[[TAIL]] [0, 1, 2, 0, 0, 0, 0, 0] : vector<3xf32>, vector<3xf32>
// CHECK-NEXT: %[[PS:.*]] = vector.shuffle %[[WS]], %[[ZERO]] [0, 1, 2, 11, 12, 13, 14, 15] : vector<8xf32>, vector<8xf32>
// CHECK-NEXT: arith.addf %[[ROW]]#0, %[[PS]] : vector<8xf32>
// CHECK-NEXT: %[[PM:.*]] = vector.shuffle %[[WS]], %[[NINF]] [0, 1, 2, 11, 12, 13, 14, 15] : vector<8xf32>, vector<8xf32>
// CHECK-NEXT: arith.maximumf %[[ROW]]#1, %[[PM]] : vector<8xf32>
// CHECK-NOT: vector.reduction
// CHECK: vector.shuffle {{.*}} [0, 1, 2, 3, 8, 9, 10, 11]
// CHECK-NOT: vector.reduction
// CHECK: vector.store %{{.*}}, %[[SUMS]][%c0] : memref<8xf32>, vector<8xf32>
// CHECK: vector.store %{{.*}}, %[[MAXS]][%c0] : memref<8xf32>, vector<8xf32>
// CHECK-NOT: vector.reduction
// CHECK: return
func.func @row_groups_with_tails(%x: memref<8x19xf32>, %sums: memref<8xf32>, %maxs: memref<8xf32>) {
  linalg.generic {indexing_maps = [#t_full, #t_row, #t_row], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<8x19xf32>) outs(%sums, %maxs : memref<8xf32>, memref<8xf32>) {
  ^bb0(%v: f32, %s: f32, %m: f32):
    %a = arith.addf %v, %s : f32
    %b = arith.maximumf %v, %m : f32
    linalg.yield %a, %b : f32, f32
  }
  return
}

// -----

// Tests that a contraction whose columns end one past a whole vector (17 at 8 lanes, as SGQ's
// 65 features at 16) forms that column as dot products along k: B's column is gathered into
// K / 8 = 4 vectors once, each row takes one multiply and 3 FMAs on its own row of A, and the
// two rows' lane sums are folded together and stored as one-lane vectors. The first 16
// columns keep the 2 x 2 register tile; no one-lane FMA is left.
#dt_a = affine_map<(m, n, k) -> (m, k)>
#dt_b = affine_map<(m, n, k) -> (k, n)>
#dt_c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @dot_tail(
// CHECK-SAME: %[[A:.*]]: memref<4x32xf32>, %[[B:.*]]: memref<32x17xf32>, %[[C:.*]]: memref<4x17xf32>)
// CHECK-COUNT-4: vector.from_elements {{.*}} : vector<8xf32>
// CHECK-NOT: vector<1xf32>
// CHECK: scf.for %[[R0:.*]] = %c0 to %c4 step %c2 {
// CHECK: scf.for {{.*}} -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK: %[[A0:.*]] = vector.load %[[A]][%[[R0]], %c0] : memref<4x32xf32>, vector<8xf32>
// CHECK: %[[P0:.*]] = arith.mulf %[[A0]], %{{.*}} : vector<8xf32>
// CHECK-COUNT-3: vector.fma {{.*}} : vector<8xf32>
// CHECK: arith.mulf
// CHECK-COUNT-3: vector.fma {{.*}} : vector<8xf32>
// CHECK: vector.shuffle {{.*}} [0, 1, 2, 3, 8, 9, 10, 11]
// CHECK-NOT: vector.fma
// CHECK: vector.store %{{.*}}, %[[C]][%[[R0]], %c16] : memref<4x17xf32>, vector<1xf32>
// CHECK: vector.store %{{.*}}, %[[C]][%{{.*}}, %c16] : memref<4x17xf32>, vector<1xf32>
// CHECK-NOT: vector.fma {{.*}} : vector<1xf32>
// CHECK: return
func.func @dot_tail(%A: memref<4x32xf32>, %B: memref<32x17xf32>, %C: memref<4x17xf32>) {
  linalg.generic {indexing_maps = [#dt_a, #dt_b, #dt_c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x32xf32>, memref<32x17xf32>) outs(%C : memref<4x17xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Reductions down 16 rows take four partial accumulators: rows i, i+1, i+2, i+3 into
// partials 0-3 (the first starts from the output, the others from the identity: -inf for a
// maximum, -0 for a sum), combined pairwise at the end, so no chain is longer than 4 steps
// (one accumulator made it 16, each step waiting the op's latency). An elementwise output in
// the same generic is still written row by row. A combiner other than addf or maximumf keeps
// one accumulator.
#full = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @column_partials(
// CHECK-DAG: %[[ZERO:.*]] = arith.constant dense<-0.000000e+00> : vector<8xf32>
// CHECK-DAG: %[[NEG:.*]] = arith.constant dense<0xFF800000> : vector<8xf32>
// CHECK: %[[OLD:.*]] = vector.load %arg1[%c0] : memref<8xf32>, vector<8xf32>
// CHECK: %[[P:.*]]:4 = scf.for %[[I:.*]] = %c0 to %c16 step %c4 iter_args(%[[A0:.*]] = %[[OLD]], %[[A1:.*]] = %[[NEG]], %[[A2:.*]] = %[[NEG]], %[[A3:.*]] = %[[NEG]])
// CHECK: arith.maximumf %{{.*}}, %[[A0]] : vector<8xf32>
// CHECK: %[[I1:.*]] = arith.addi %[[I]], %c1 : index
// CHECK: vector.load %arg0[%[[I1]], %c0]
// CHECK: arith.maximumf %{{.*}}, %[[A1]] : vector<8xf32>
// CHECK: arith.maximumf %{{.*}}, %[[A2]] : vector<8xf32>
// CHECK: %[[I3:.*]] = arith.addi %[[I]], %c3 : index
// CHECK: arith.maximumf %{{.*}}, %[[A3]] : vector<8xf32>
// CHECK: %[[M01:.*]] = arith.maximumf %[[P]]#0, %[[P]]#1 : vector<8xf32>
// CHECK: %[[M23:.*]] = arith.maximumf %[[P]]#2, %[[P]]#3 : vector<8xf32>
// CHECK: %[[M:.*]] = arith.maximumf %[[M01]], %[[M23]] : vector<8xf32>
// CHECK: vector.store %[[M]], %arg1[%c0]
// CHECK: %[[Z:.*]] = vector.load %arg3[%c0] : memref<8xf32>, vector<8xf32>
// CHECK: %[[S:.*]]:4 = scf.for %[[J:.*]] = %c0 to %c16 step %c4 iter_args(%{{.*}} = %[[Z]], %{{.*}} = %[[ZERO]], %{{.*}} = %[[ZERO]], %{{.*}} = %[[ZERO]])
// CHECK-COUNT-3: math.exp
// CHECK: %[[J3:.*]] = arith.addi %[[J]], %c3 : index
// CHECK: math.exp
// CHECK: vector.store %{{.*}}, %arg2[%[[J3]], %c0]
// CHECK: %[[S01:.*]] = arith.addf %[[S]]#0, %[[S]]#1 : vector<8xf32>
// CHECK: %[[S23:.*]] = arith.addf %[[S]]#2, %[[S]]#3 : vector<8xf32>
// CHECK: %[[SUM:.*]] = arith.addf %[[S01]], %[[S23]] : vector<8xf32>
// CHECK: vector.store %[[SUM]], %arg3[%c0]
func.func @column_partials(%x: memref<16x8xf32>, %m: memref<8xf32>, %e: memref<16x8xf32>,
                           %s: memref<8xf32>) {
  linalg.generic {indexing_maps = [#full, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x8xf32>) outs(%m : memref<8xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.maximumf %v, %acc : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#full, #full, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x8xf32>) outs(%e, %s : memref<16x8xf32>, memref<8xf32>) {
  ^bb0(%v: f32, %old: f32, %acc: f32):
    %p = math.exp %v : f32
    %a = arith.addf %acc, %p : f32
    linalg.yield %p, %a : f32, f32
  }
  return
}
// A difference from the output (the query backward's dz -= ...) takes partials too: the
// others start from -0 (-0 - x is -x exactly) and the four combine by addf. One from the
// other side (x - out) keeps one accumulator.
// CHECK-LABEL: func.func @column_difference(
// CHECK: %[[NZ:.*]] = arith.constant dense<-0.000000e+00> : vector<8xf32>
// CHECK: %[[OUT:.*]] = vector.load %arg1[%c0] : memref<8xf32>, vector<8xf32>
// CHECK: %[[P:.*]]:4 = scf.for %{{.*}} = %c0 to %c16 step %c4 iter_args(%[[A0:.*]] = %[[OUT]], %[[A1:.*]] = %[[NZ]], %[[A2:.*]] = %[[NZ]], %[[A3:.*]] = %[[NZ]])
// CHECK: arith.subf %[[A0]], %{{.*}} : vector<8xf32>
// CHECK: arith.subf %[[A1]], %{{.*}} : vector<8xf32>
// CHECK: arith.subf %[[A2]], %{{.*}} : vector<8xf32>
// CHECK: arith.subf %[[A3]], %{{.*}} : vector<8xf32>
// CHECK: %[[S01:.*]] = arith.addf %[[P]]#0, %[[P]]#1 : vector<8xf32>
// CHECK: %[[S23:.*]] = arith.addf %[[P]]#2, %[[P]]#3 : vector<8xf32>
// CHECK: %[[S:.*]] = arith.addf %[[S01]], %[[S23]] : vector<8xf32>
// CHECK: vector.store %[[S]], %arg1[%c0]
func.func @column_difference(%x: memref<16x8xf32>, %m: memref<8xf32>) {
  linalg.generic {indexing_maps = [#full, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x8xf32>) outs(%m : memref<8xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.subf %acc, %v : f32
    linalg.yield %r : f32
  }
  return
}
// CHECK-LABEL: func.func @column_reversed_difference(
// CHECK: scf.for %{{.*}} = %c0 to %c16 step %c1 iter_args(%{{.*}} = %{{.*}}) -> (vector<8xf32>)
// CHECK: arith.subf
// CHECK-NOT: scf.for
func.func @column_reversed_difference(%x: memref<16x8xf32>, %m: memref<8xf32>) {
  linalg.generic {indexing_maps = [#full, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x8xf32>) outs(%m : memref<8xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.subf %v, %acc : f32
    linalg.yield %r : f32
  }
  return
}
// CHECK-LABEL: func.func @column_product(
// CHECK: scf.for %{{.*}} = %c0 to %c16 step %c1 iter_args(%{{.*}} = %{{.*}}) -> (vector<8xf32>)
// CHECK: arith.mulf
// CHECK-NOT: scf.for
func.func @column_product(%x: memref<16x8xf32>, %m: memref<8xf32>) {
  linalg.generic {indexing_maps = [#full, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x8xf32>) outs(%m : memref<8xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.mulf %v, %acc : f32
    linalg.yield %r : f32
  }
  return
}

// -----

// Two outputs reduced in one generic: the partials' values are grouped by partial (output
// 0, output 1 of partial 0, then of partial 1, ...) and each pair combines with its own
// output's combiner; the last 4 of 12 columns take the same form on vector<4>. An output
// whose contribution reads another output's running value (a partial's, not the column's)
// keeps one accumulator for every output.
#full = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @column_partials_two(
// CHECK: %[[R:.*]]:8 = scf.for %{{.*}} = %c0 to %c16 step %c4 iter_args({{.*}}) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK: %[[M0:.*]] = arith.maximumf %{{.*}}, %[[MA:.*]] : vector<8xf32>
// CHECK: %[[S0:.*]] = arith.addf %[[SA:.*]], %{{.*}} : vector<8xf32>
// CHECK: scf.yield %[[M0]], %[[S0]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} :
// CHECK: %[[M02:.*]] = arith.maximumf %[[R]]#0, %[[R]]#2 : vector<8xf32>
// CHECK: %[[S02:.*]] = arith.addf %[[R]]#1, %[[R]]#3 : vector<8xf32>
// CHECK: %[[M46:.*]] = arith.maximumf %[[R]]#4, %[[R]]#6 : vector<8xf32>
// CHECK: %[[S46:.*]] = arith.addf %[[R]]#5, %[[R]]#7 : vector<8xf32>
// CHECK: %[[M:.*]] = arith.maximumf %[[M02]], %[[M46]] : vector<8xf32>
// CHECK: %[[S:.*]] = arith.addf %[[S02]], %[[S46]] : vector<8xf32>
// CHECK: vector.store %[[M]], %arg1[%c0]
// CHECK: vector.store %[[S]], %arg2[%c0]
// CHECK: scf.for %{{.*}} = %c0 to %c16 step %c4 iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>)
// CHECK: vector.store %{{.*}}, %arg1[%c8] : memref<12xf32>, vector<4xf32>
// CHECK: vector.store %{{.*}}, %arg2[%c8] : memref<12xf32>, vector<4xf32>
func.func @column_partials_two(%x: memref<16x12xf32>, %m: memref<12xf32>, %s: memref<12xf32>) {
  linalg.generic {indexing_maps = [#full, #col, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x12xf32>) outs(%m, %s : memref<12xf32>, memref<12xf32>) {
  ^bb0(%v: f32, %am: f32, %as: f32):
    %r = arith.maximumf %v, %am : f32
    %t = arith.addf %as, %v : f32
    linalg.yield %r, %t : f32, f32
  }
  return
}
// CHECK-LABEL: func.func @column_running(
// CHECK: scf.for %{{.*}} = %c0 to %c16 step %c1 iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (vector<8xf32>, vector<8xf32>)
// CHECK-NOT: scf.for
func.func @column_running(%x: memref<16x8xf32>, %m: memref<8xf32>, %s: memref<8xf32>) {
  linalg.generic {indexing_maps = [#full, #col, #col], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<16x8xf32>) outs(%m, %s : memref<8xf32>, memref<8xf32>) {
  ^bb0(%v: f32, %am: f32, %as: f32):
    %r = arith.maximumf %v, %am : f32
    %t = arith.addf %as, %r : f32
    linalg.yield %r, %t : f32, f32
  }
  return
}

// -----

// Tests that an elementwise update of a contraction's output C in place before it (kv's
// rescale of the summary by exp(old - new), a factor per row), with an op between that
// touches neither C nor the factors, runs as the register tiles' prologue: each
// accumulator is loaded and multiplied by its row's factor, and C is not read and written
// by a loop of its own. An op between that reads C, or writes the factors (a linalg op, a
// store, or an argument of the factors' type, which may be the same memory), keeps the
// update where it was; with a tail of columns (20 at 8 lanes) or in the dot form it runs on
// its own at the contraction.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
// CHECK-LABEL: func.func @prologue(
// CHECK-NOT:     vector.store %{{.*}}, %arg2
// CHECK:         math.exp
// CHECK:         scf.for %[[ROW:.*]] = %c0 to %c4 step %c2 {
// CHECK-NEXT:      %[[ROW1:.*]] = arith.addi %[[ROW]], %c1 : index
// CHECK-NEXT:      %[[C00:.*]] = vector.load %arg2[%[[ROW]], %c0] : memref<4x16xf32>, vector<8xf32>
// CHECK-NEXT:      %[[R0:.*]] = memref.load %arg3[%[[ROW]]] : memref<4xf32>
// CHECK-NEXT:      %[[R0V:.*]] = vector.broadcast %[[R0]] : f32 to vector<8xf32>
// CHECK-NEXT:      %[[I00:.*]] = arith.mulf %[[C00]], %[[R0V]] : vector<8xf32>
// CHECK-NEXT:      %[[C01:.*]] = vector.load %arg2[%[[ROW]], %c8]
// CHECK-NEXT:      %[[I01:.*]] = arith.mulf %[[C01]], %[[R0V]] : vector<8xf32>
// CHECK-NEXT:      %[[C10:.*]] = vector.load %arg2[%[[ROW1]], %c0]
// CHECK-NEXT:      %[[R1:.*]] = memref.load %arg3[%[[ROW1]]] : memref<4xf32>
// CHECK-NEXT:      %[[R1V:.*]] = vector.broadcast %[[R1]] : f32 to vector<8xf32>
// CHECK-NEXT:      %[[I10:.*]] = arith.mulf %[[C10]], %[[R1V]] : vector<8xf32>
// CHECK-NEXT:      %[[C11:.*]] = vector.load %arg2[%[[ROW1]], %c8]
// CHECK-NEXT:      %[[I11:.*]] = arith.mulf %[[C11]], %[[R1V]] : vector<8xf32>
// CHECK-NEXT:      scf.for %{{.*}} = %c0 to %c3 step %c1 iter_args(%{{.*}} = %[[I00]], %{{.*}} = %[[I01]], %{{.*}} = %[[I10]], %{{.*}} = %[[I11]])
// CHECK-COUNT-4:   vector.fma
// CHECK-COUNT-4:   vector.store %{{.*}}, %arg2
// CHECK-NOT:     vector.store %{{.*}}, %arg2
func.func @prologue(%A: memref<4x3xf32>, %B: memref<3x16xf32>, %C: memref<4x16xf32>,
                    %r: memref<4xf32>, %x: memref<4x8xf32>, %e: memref<4x8xf32>) {
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x8xf32>) outs(%e : memref<4x8xf32>) {
  ^bb0(%l: f32, %o: f32):
    %v = math.exp %l : f32
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// CHECK-LABEL: func.func @no_prologue_across_a_read(
// CHECK:         %[[OLD:.*]] = vector.load %arg2
// CHECK-NEXT:    %[[NEW:.*]] = arith.mulf %[[OLD]]
// CHECK-NEXT:    vector.store %[[NEW]], %arg2
// CHECK:         %[[C:.*]] = vector.load %arg2
// CHECK-NEXT:    math.exp %[[C]]
// CHECK:         scf.for %{{.*}} = %c0 to %c3 step %c1
func.func @no_prologue_across_a_read(%A: memref<4x3xf32>, %B: memref<3x16xf32>,
                                     %C: memref<4x16xf32>, %r: memref<4xf32>,
                                     %e: memref<4x16xf32>) {
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<4x16xf32>) outs(%e : memref<4x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %v = math.exp %l : f32
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// CHECK-LABEL: func.func @no_prologue_factors_written(
// CHECK:         %[[OLD:.*]] = vector.load %arg2
// CHECK-NEXT:    %[[NEW:.*]] = arith.mulf %[[OLD]]
// CHECK-NEXT:    vector.store %[[NEW]], %arg2
// CHECK:         vector.store %{{.*}}, %arg3
// CHECK:         scf.for %{{.*}} = %c0 to %c3 step %c1
func.func @no_prologue_factors_written(%A: memref<4x3xf32>, %B: memref<3x16xf32>,
                                       %C: memref<4x16xf32>, %r: memref<4xf32>) {
  %one = arith.constant 1.0 : f32
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  linalg.fill ins(%one : f32) outs(%r : memref<4xf32>)
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// CHECK-LABEL: func.func @prologue_with_a_tail(
// CHECK:         math.exp
// CHECK:         %[[OLD:.*]] = vector.load %arg2
// CHECK-NEXT:    %[[NEW:.*]] = arith.mulf %[[OLD]]
// CHECK-NEXT:    vector.store %[[NEW]], %arg2
// CHECK:         scf.for %{{.*}} = %c0 to %c3 step %c1
func.func @prologue_with_a_tail(%A: memref<4x3xf32>, %B: memref<3x20xf32>, %C: memref<4x20xf32>,
                                %r: memref<4xf32>, %x: memref<4x16xf32>, %e: memref<4x16xf32>) {
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x20xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x16xf32>) outs(%e : memref<4x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %v = math.exp %l : f32
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x20xf32>) outs(%C : memref<4x20xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// CHECK-LABEL: func.func @no_prologue_across_a_store(
// CHECK:         %[[OLD:.*]] = vector.load %arg2
// CHECK-NEXT:    %[[NEW:.*]] = arith.mulf %[[OLD]]
// CHECK-NEXT:    vector.store %[[NEW]], %arg2
// CHECK:         memref.store %{{.*}}, %arg3
// CHECK:         scf.for %{{.*}} = %c0 to %c3 step %c1
func.func @no_prologue_across_a_store(%A: memref<4x3xf32>, %B: memref<3x16xf32>,
                                      %C: memref<4x16xf32>, %r: memref<4xf32>, %i: index) {
  %one = arith.constant 1.0 : f32
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  memref.store %one, %r[%i] : memref<4xf32>
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// Arguments marked spectra.may_alias may be the same memory: a fill of %r2 between may
// write %r.
// CHECK-LABEL: func.func @no_prologue_aliased_arguments(
// CHECK:         %[[OLD:.*]] = vector.load %arg2
// CHECK-NEXT:    %[[NEW:.*]] = arith.mulf %[[OLD]]
// CHECK-NEXT:    vector.store %[[NEW]], %arg2
// CHECK:         vector.store %{{.*}}, %arg4
// CHECK:         scf.for %{{.*}} = %c0 to %c3 step %c1
func.func @no_prologue_aliased_arguments(%A: memref<4x3xf32>, %B: memref<3x16xf32>,
                                         %C: memref<4x16xf32>, %r: memref<4xf32> {spectra.may_alias},
                                         %r2: memref<4xf32> {spectra.may_alias}) {
  %one = arith.constant 1.0 : f32
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  linalg.fill ins(%one : f32) outs(%r2 : memref<4xf32>)
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// The dot form (C[m, n] += A[m, k] B[n, k]) stores C from its own loop: the update runs on
// its own first, at the contraction (after the exp between).
// CHECK-LABEL: func.func @prologue_dot(
// CHECK:         math.exp
// CHECK:         %[[OLD:.*]] = vector.load %arg2
// CHECK-NEXT:    %[[NEW:.*]] = arith.mulf %[[OLD]]
// CHECK-NEXT:    vector.store %[[NEW]], %arg2
// CHECK:         vector.fma
#bt = affine_map<(m, n, k) -> (n, k)>
func.func @prologue_dot(%A: memref<4x16xf32>, %B: memref<8x16xf32>, %C: memref<4x8xf32>,
                        %r: memref<4xf32>, %x: memref<4x16xf32>, %e: memref<4x16xf32>) {
  linalg.generic {indexing_maps = [#row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%r : memref<4xf32>) outs(%C : memref<4x8xf32>) {
  ^bb0(%s: f32, %o: f32):
    %p = arith.mulf %o, %s : f32
    linalg.yield %p : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x16xf32>) outs(%e : memref<4x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %v = math.exp %l : f32
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x16xf32>, memref<8x16xf32>) outs(%C : memref<4x8xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
// An update that is already a contraction's epilogue (it reads that contraction's output
// element by element) stays that one's: it runs once, on the first contraction's
// accumulators, and the second contraction loads C as written.
// CHECK-LABEL: func.func @prologue_taken_as_epilogue(
// CHECK-COUNT-4: arith.addf %{{.*}} : vector<8xf32>
// CHECK:         vector.store %{{.*}}, %arg2
// CHECK-NOT:     arith.addf
// CHECK:         return
func.func @prologue_taken_as_epilogue(%A: memref<4x3xf32>, %B: memref<3x16xf32>,
                                      %C: memref<4x16xf32>) {
  %X = memref.alloca() : memref<4x16xf32>
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%X : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%X : memref<4x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%l: f32, %o: f32):
    %v = arith.addf %o, %l : f32
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x3xf32>, memref<3x16xf32>) outs(%C : memref<4x16xf32>) {
  ^bb0(%x0: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x0, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
