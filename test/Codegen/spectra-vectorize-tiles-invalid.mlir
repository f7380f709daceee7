// RUN: spectra-opt %s -split-input-file -spectra-vectorize-tiles="vector-width=8" -verify-diagnostics

// Tests that an operand of dynamic shape is an error naming the constraint.
#full = affine_map<(i, j) -> (i, j)>
func.func @dynamic(%x: memref<?x8xf32>) {
  // expected-error@+1 {{'linalg.generic' op spectra-vectorize-tiles: operands must be memrefs of static shape}}
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<?x8xf32>) outs(%x : memref<?x8xf32>) {
  ^bb0(%v: f32, %o: f32):
    linalg.yield %v : f32
  }
  return
}

// -----

// Tests that a vector dimension read transposed (a gather) is refused.
#full = affine_map<(i, j) -> (i, j)>
#t = affine_map<(i, j) -> (j, i)>
func.func @transposed(%y: memref<8x8xf32>, %z: memref<8x8xf32>) {
  // expected-error@+1 {{'linalg.generic' op spectra-vectorize-tiles: the vector dimension must be innermost in every operand}}
  linalg.generic {indexing_maps = [#t, #full], iterator_types = ["parallel", "parallel"]}
      ins(%y : memref<8x8xf32>) outs(%z : memref<8x8xf32>) {
  ^bb0(%v: f32, %o: f32):
    linalg.yield %v : f32
  }
  return
}

// -----

// Tests that a row reduction must combine with addf or maximumf.
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
func.func @not_a_combiner(%y: memref<8x8xf32>, %r: memref<8xf32>) {
  // expected-error@+1 {{'linalg.generic' op spectra-vectorize-tiles: row reductions combine with addf or maximumf}}
  linalg.generic {indexing_maps = [#full, #row], iterator_types = ["parallel", "reduction"]}
      ins(%y : memref<8x8xf32>) outs(%r : memref<8xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %m = arith.mulf %v, %acc : f32
    linalg.yield %m : f32
  }
  return
}

// -----

// Tests that a body op that is not elementwise arith/math is named.
#full = affine_map<(i, j) -> (i, j)>
func.func @region_op(%y: memref<8x8xf32>, %z: memref<8x8xf32>, %c: i1) {
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%y : memref<8x8xf32>) outs(%z : memref<8x8xf32>) {
  ^bb0(%v: f32, %o: f32):
    // expected-error@+1 {{'scf.if' op spectra-vectorize-tiles: cannot vectorise this op of a tile body}}
    %r = scf.if %c -> f32 {
      scf.yield %v : f32
    } else {
      scf.yield %o : f32
    }
    linalg.yield %r : f32
  }
  return
}

// -----

// Tests that an output of a column reduction that keeps the reduction dim but drops the
// vector dim (a vector store at one element) is refused.
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
func.func @partial_elementwise_output(%y: memref<8x8xf32>, %z: memref<8xf32>, %s: memref<8xf32>) {
  // expected-error@+1 {{'linalg.generic' op spectra-vectorize-tiles: an output of a reduction must leave the reduction dimension out or be written element by element (identity map)}}
  linalg.generic {indexing_maps = [#full, #row, #col], iterator_types = ["reduction", "parallel"]}
      ins(%y : memref<8x8xf32>) outs(%z, %s : memref<8xf32>, memref<8xf32>) {
  ^bb0(%v: f32, %o: f32, %acc: f32):
    %a = arith.addf %acc, %v : f32
    linalg.yield %v, %a : f32, f32
  }
  return
}

// -----

// Tests that an elementwise output of a row reduction may not read the accumulator (its lanes
// hold partial sums, not the running value).
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
func.func @running_sum_output(%y: memref<8x8xf32>, %z: memref<8x8xf32>, %s: memref<8xf32>) {
  // expected-error@+1 {{'linalg.generic' op spectra-vectorize-tiles: an elementwise output of a reduction must not read the accumulator}}
  linalg.generic {indexing_maps = [#full, #full, #row], iterator_types = ["parallel", "reduction"]}
      ins(%y : memref<8x8xf32>) outs(%z, %s : memref<8x8xf32>, memref<8xf32>) {
  ^bb0(%v: f32, %o: f32, %acc: f32):
    %a = arith.addf %acc, %v : f32
    linalg.yield %a, %a : f32, f32
  }
  return
}
