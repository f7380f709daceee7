// RUN: spectra-opt %s -split-input-file -spectra-vectorize-tiles="vector-width=16 register-rows=8 amx=1" -canonicalize -cse | FileCheck %s

// Tests the contractions on AMX tiles (amx=1). C[m, n] = A[m, k] W[k, n] after a zero fill, W
// an argument nothing in the function writes: W's bf16 parts are packed once at the entry, in
// pairs along k ([K/2 x 2N]: rows 2i and 2i + 1 interleaved), A's row-major; each part is the
// f32 value rounded to bf16 (hi) and the rest rounded (lo). Per 16 x 16 tile of C: a zeroed
// accumulator (the fill goes), four operand tiles, three tile products (lo hi', hi lo', hi hi')
// and one store. The exp after it (an epilogue on the FMA path) reads C as its own loop.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#e = affine_map<(i, j) -> (i, j)>
// CHECK-LABEL: func.func @amx_plain(
// CHECK-DAG: %[[BLO:.*]] = memref.alloca() : memref<16x128xbf16>
// CHECK-DAG: %[[BHI:.*]] = memref.alloca() : memref<16x128xbf16>
// CHECK-DAG: %[[ALO:.*]] = memref.alloca() : memref<48x32xbf16>
// CHECK-DAG: %[[AHI:.*]] = memref.alloca() : memref<48x32xbf16>
// CHECK: scf.for %[[I:.*]] = %c0 to %c16 step %c1 {
// CHECK: %[[K0:.*]] = arith.muli %[[I]], %c2
// CHECK: %[[X0:.*]] = vector.load %arg1[%[[K0]], %c0] : memref<32x64xf32>, vector<16xf32>
// CHECK: %[[H0:.*]] = arith.truncf %[[X0]] : vector<16xf32> to vector<16xbf16>
// CHECK: %[[E0:.*]] = arith.extf %[[H0]] : vector<16xbf16> to vector<16xf32>
// CHECK: %[[R0:.*]] = arith.subf %[[X0]], %[[E0]] : vector<16xf32>
// CHECK: arith.truncf %[[R0]] : vector<16xf32> to vector<16xbf16>
// CHECK: %[[H1:.*]] = arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// CHECK: %[[PAIRS:.*]] = vector.interleave %[[H0]], %[[H1]] : vector<16xbf16> -> vector<32xbf16>
// CHECK: vector.store %[[PAIRS]], %[[BHI]][%[[I]], %c0] : memref<16x128xbf16>, vector<32xbf16>
// CHECK: scf.for %[[R:.*]] = %c0 to %c48 step %c1 {
// CHECK: vector.load %arg0[%[[R]], %c0] : memref<48x32xf32>, vector<16xf32>
// CHECK: vector.store %{{.*}}, %[[AHI]][%[[R]], %c0] : memref<48x32xbf16>, vector<16xbf16>
// CHECK: scf.for %[[M:.*]] = %c0 to %c48 step %c16 {
// CHECK-NEXT: scf.for %[[N:.*]] = %c0 to %c64 step %c16 {
// CHECK-NEXT: %[[ACC:.*]] = amx.tile_zero : !amx.tile<16x16xf32>
// CHECK-NEXT: %[[COL:.*]] = arith.muli %[[N]], %c2
// CHECK-NEXT: %[[AH:.*]] = amx.tile_load %[[AHI]][%[[M]], %c0] : memref<48x32xbf16> into !amx.tile<16x32xbf16>
// CHECK-NEXT: %[[AL:.*]] = amx.tile_load %[[ALO]][%[[M]], %c0]
// CHECK-NEXT: %[[BH:.*]] = amx.tile_load %[[BHI]][%c0, %[[COL]]] : memref<16x128xbf16> into !amx.tile<16x32xbf16>
// CHECK-NEXT: %[[BL:.*]] = amx.tile_load %[[BLO]][%c0, %[[COL]]]
// CHECK-NEXT: %[[P1:.*]] = amx.tile_mulf %[[AL]], %[[BH]], %[[ACC]]
// CHECK-NEXT: %[[P2:.*]] = amx.tile_mulf %[[AH]], %[[BL]], %[[P1]]
// CHECK-NEXT: %[[P3:.*]] = amx.tile_mulf %[[AH]], %[[BH]], %[[P2]]
// CHECK-NEXT: amx.tile_store %arg2[%[[M]], %[[N]]], %[[P3]] : memref<48x64xf32>, !amx.tile<16x16xf32>
// CHECK: vector.load %arg2[%{{.*}}, %{{.*}}] : memref<48x64xf32>, vector<16xf32>
// CHECK-NEXT: math.exp
// CHECK-NOT: vector.fma
// CHECK-NOT: linalg.
func.func @amx_plain(%A: memref<48x32xf32>, %W: memref<32x64xf32>, %C: memref<48x64xf32>,
                     %E: memref<48x64xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<48x64xf32>)
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %W : memref<48x32xf32>, memref<32x64xf32>) outs(%C : memref<48x64xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#e, #e], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<48x64xf32>) outs(%E : memref<48x64xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = math.exp %x : f32
    linalg.yield %y : f32
  }
  return
}

// -----

// Tests A read transposed (stored [k, m]: the summary's phi^T v) and a B the function writes
// (a fill): A's 16 x 16 blocks are transposed in registers (four rounds of 16 two-vector
// shuffles) before the split; B is packed where the contraction runs, after the fill, not at
// the entry; C is loaded into the accumulator, which has no fill before it.
#at = affine_map<(m, n, k) -> (k, m)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @amx_transposed_a(
// CHECK: vector.store %cst, %arg1
// CHECK: scf.for %{{.*}} = %c0 to %c32 step %c16 {
// CHECK-COUNT-64: vector.shuffle
// CHECK: vector.store %{{.*}} : memref<16x32xbf16>, vector<16xbf16>
// CHECK: vector.load %arg1
// CHECK: vector.interleave
// CHECK: amx.tile_load %arg2[%{{.*}}, %{{.*}}] : memref<16x16xf32> into !amx.tile<16x16xf32>
// CHECK-COUNT-3: amx.tile_mulf
// CHECK: amx.tile_store %arg2
func.func @amx_transposed_a(%A: memref<32x16xf32>, %B: memref<32x16xf32>, %C: memref<16x16xf32>) {
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%B : memref<32x16xf32>)
  linalg.generic {indexing_maps = [#at, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<32x16xf32>, memref<32x16xf32>) outs(%C : memref<16x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests B read transposed (stored [n, k]: the causal kernels' q k^T): each row's bf16 parts,
// read as 32-bit pairs along k, are transposed 16 x 16 into the pair layout.
#a = affine_map<(m, n, k) -> (m, k)>
#bt = affine_map<(m, n, k) -> (n, k)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @amx_transposed_b(
// CHECK-COUNT-16: vector.bitcast %{{.*}} : vector<32xbf16> to vector<16xi32>
// CHECK-COUNT-64: vector.shuffle %{{.*}} : vector<16xi32>, vector<16xi32>
// CHECK: vector.bitcast %{{.*}} : vector<16xi32> to vector<32xbf16>
// CHECK: amx.tile_mulf
func.func @amx_transposed_b(%A: memref<16x32xf32>, %B: memref<16x32xf32>, %C: memref<16x16xf32>) {
  linalg.generic {indexing_maps = [#a, #bt, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<16x32xf32>, memref<16x32xf32>) outs(%C : memref<16x16xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that a contraction AMX's tiles do not fit (8 rows; k = 8) stays on vector FMAs.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
// CHECK-LABEL: func.func @fma_where_tiles_do_not_fit(
// CHECK-NOT: amx.
// CHECK: vector.fma
func.func @fma_where_tiles_do_not_fit(%A: memref<8x8xf32>, %B: memref<8x32xf32>, %C: memref<8x32xf32>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<8x8xf32>, memref<8x32xf32>) outs(%C : memref<8x32xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
