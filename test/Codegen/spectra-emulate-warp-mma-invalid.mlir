// RUN: spectra-opt %s -split-input-file -spectra-emulate-warp-mma -verify-diagnostics

// Tests that a tensor-core tile without its plan is an error naming the fields it needs.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
func.func @no_plan(%A: memref<16x16xf32>, %B: memref<16x8xf32>, %C: memref<16x8xf32>) {
  // expected-error@+1 {{'linalg.generic' op spectra-emulate-warp-mma: a spectra.mma contraction needs m, n, k, a, k_step (8 or 16) and type}}
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<16x16xf32>, memref<16x8xf32>) outs(%C : memref<16x8xf32>)
      attrs = {spectra.mma = {m = 0 : i64, n = 1 : i64}} {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Tests that a tile's epilogue must say which of its inputs is the tile and whether the tile
// is still stored.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#full = affine_map<(i, j) -> (i, j)>
func.func @epilogue_without_store(%A: memref<16x16xf32>, %B: memref<16x8xf32>,
                                  %C: memref<16x8xf32>, %out: memref<16x8xf32>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<16x16xf32>, memref<16x8xf32>) outs(%C : memref<16x8xf32>)
      attrs = {spectra.mma = {a = 0 : i64, k = 2 : i64, k_step = 16 : i64, m = 0 : i64, n = 1 : i64, split = false, type = bf16}} {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  // expected-error@+1 {{'linalg.generic' op spectra-emulate-warp-mma: a spectra.mma_epilogue needs its input (the tile, an input of the tile's type) and store}}
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%C : memref<16x8xf32>) outs(%out : memref<16x8xf32>)
      attrs = {spectra.mma_epilogue = {input = 0 : i64}} {
  ^bb0(%l: f32, %o: f32):
    %e = math.exp %l : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// Tests that a warp chain's nest must say its mma operand type and whether it splits them.
func.func @chain_without_type() {
  // expected-error@+1 {{'scf.forall' op spectra-emulate-warp-mma: spectra.warp_chain needs type (bf16 or f16) and split}}
  scf.forall (%w) in (8) {
  } {mapping = [#gpu.warp<x>], spectra.warp_chain = {split = true}}
  return
}

// -----

// Tests that a warp chain's nest must hold a chain: a contraction, its epilogue and the ops
// that read the tiles they form (WarpChains.h).
func.func @chain_without_ops(%A: memref<16x8xf32>) {
  %cst = arith.constant 0.0 : f32
  // expected-error@+1 {{'scf.forall' op spectra-emulate-warp-mma: a spectra.warp_chain nest (type, split, transposed) must hold a contraction, its epilogue and the ops that read its register tiles}}
  scf.forall (%w) in (8) {
    linalg.fill ins(%cst : f32) outs(%A : memref<16x8xf32>)
  } {mapping = [#gpu.warp<x>], spectra.warp_chain = {split = true, transposed = false, type = bf16}}
  return
}
