// RUN: spectra-opt %s -split-input-file -pass-pipeline='builtin.module(func.func(spectra-reuse-tile-buffers))' | FileCheck %s
// RUN: spectra-compile --variant posrf-mm --fma-chains 0 --emit=tiles | FileCheck %s --check-prefix=KV

// The compiled kv (32-row tiles: --fma-chains 0, the width's default register tile): the
// logits' contraction output, the features (masked logits) and phi = exp(l - c) share one
// [32 x 128] tile, which the column maximum, the summary's contraction and the z sums read.
// KV-LABEL: func.func @posrf_mm_kv(
// KV-COUNT-1:   memref.alloca() : memref<32x128xf32>
// KV-NOT:       memref.alloca() : memref<32x128xf32>
// KV:           scf.for
// KV:             linalg.fill ins(%{{.*}} : f32) outs(%[[L:.*]] : memref<32x128xf32>)
// KV-NEXT:        linalg.generic {{.*}} outs(%[[L]] : memref<32x128xf32>)
// KV-NEXT:        ^bb0
// KV:             linalg.generic {{.*}} ins(%[[L]], {{.*}}) outs(%[[L]] : memref<32x128xf32>)
// KV:             linalg.generic {{.*}} ins(%[[L]] : memref<32x128xf32>) outs(%{{.*}} : memref<128xf32>)
// KV:             linalg.generic {{.*}} ins(%[[L]], %{{.*}}, %{{.*}} : memref<32x128xf32>, memref<128xf32>, memref<128xf32>) outs(%[[L]] : memref<32x128xf32>)
// KV:             linalg.generic {{.*}} ins(%[[L]], %{{.*}} : memref<32x128xf32>, memref<32x32xf32>) outs(%{{.*}} : memref<128x32xf32>)
// KV:             linalg.generic {{.*}} ins(%[[L]] : memref<32x128xf32>) outs(%{{.*}} : memref<128xf32>)
// KV-LABEL: func.func @posrf_mm_kv_combine(

#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
#mk = affine_map<(i, j, k) -> (k, i)>
#kn = affine_map<(i, j, k) -> (k, j)>
#mn = affine_map<(i, j, k) -> (i, j)>

// kv's shape: the logits written whole, their column maximum, the exp into a tile of its own
// that the summary's contraction and a column sum read. The exp writes over the logits, and
// the chain before it (a second elementwise op from a first tile) shares the buffer too.
// CHECK-LABEL: func.func @chain
// CHECK-SAME:    (%[[N:.*]]: index, %[[V:.*]]: memref<4x8xf32>, %[[S:.*]]: memref<16x8xf32>, %[[Z:.*]]: memref<16xf32>, %[[M:.*]]: memref<16xf32>)
// CHECK:         %[[T:.*]] = memref.alloca() : memref<4x16xf32>
// CHECK-NOT:     memref.alloca
// CHECK:         scf.for
// CHECK-NEXT:      linalg.fill ins(%{{.*}} : f32) outs(%[[T]] : memref<4x16xf32>)
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[T]] : memref<4x16xf32>) outs(%[[T]] : memref<4x16xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[T]] : memref<4x16xf32>) outs(%[[M]] : memref<16xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[T]], %[[M]] : memref<4x16xf32>, memref<16xf32>) outs(%[[T]] : memref<4x16xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[T]], %[[V]] : memref<4x16xf32>, memref<4x8xf32>) outs(%[[S]] : memref<16x8xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[T]] : memref<4x16xf32>) outs(%[[Z]] : memref<16xf32>)
// CHECK:         } {spectra.tile_loop}
func.func @chain(%n: index, %v: memref<4x8xf32>, %S: memref<16x8xf32>, %z: memref<16xf32>, %m: memref<16xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %raw = memref.alloca() : memref<4x16xf32>
  %l = memref.alloca() : memref<4x16xf32>
  %phi = memref.alloca() : memref<4x16xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    linalg.fill ins(%zero : f32) outs(%raw : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%raw : memref<4x16xf32>) outs(%l : memref<4x16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.mulf %a, %a : f32
      linalg.yield %s : f32
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%l : memref<4x16xf32>) outs(%m : memref<16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %x = arith.maximumf %a, %o : f32
      linalg.yield %x : f32
    }
    linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%l, %m : memref<4x16xf32>, memref<16xf32>) outs(%phi : memref<4x16xf32>) {
    ^bb0(%a: f32, %c: f32, %o: f32):
      %d = arith.subf %a, %c : f32
      %e = math.exp %d : f32
      linalg.yield %e : f32
    }
    linalg.generic {indexing_maps = [#mk, #kn, #mn], iterator_types = ["parallel", "parallel", "reduction"]}
        ins(%phi, %v : memref<4x16xf32>, memref<4x8xf32>) outs(%S : memref<16x8xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %p = arith.mulf %a, %b : f32
      %s = arith.addf %o, %p : f32
      linalg.yield %s : f32
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%phi : memref<4x16xf32>) outs(%z : memref<16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %s = arith.addf %o, %a : f32
      linalg.yield %s : f32
    }
  } {spectra.tile_loop}
  return
}

// -----

#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>

// The query backward's shape: the output's rows past a short tile zeroed by a loop of
// stores after the op that writes it (a use through a loop, placed at the loop): it still
// takes the input's buffer, and so do the stores.
// CHECK-LABEL: func.func @zeroed_rows
// CHECK:         %[[A:.*]] = memref.alloca() : memref<4x16xf32>
// CHECK-NOT:     memref.alloca
// CHECK:           linalg.generic {{.*}} ins(%[[A]] : memref<4x16xf32>) outs(%[[A]] : memref<4x16xf32>)
// CHECK:           scf.for
// CHECK:             memref.store %{{.*}}, %[[A]][
// CHECK:           linalg.generic {{.*}} ins(%[[A]] : memref<4x16xf32>) outs(%{{.*}} : memref<16xf32>)
func.func @zeroed_rows(%n: index, %rows: index, %z: memref<16xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c16 = arith.constant 16 : index
  %zero = arith.constant 0.0 : f32
  %a = memref.alloca() : memref<4x16xf32>
  %b = memref.alloca() : memref<4x16xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    linalg.fill ins(%zero : f32) outs(%a : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a : memref<4x16xf32>) outs(%b : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %e = math.exp %x : f32
      linalg.yield %e : f32
    }
    scf.for %i = %rows to %c4 step %c1 {
      scf.for %j = %c0 to %c16 step %c1 {
        memref.store %zero, %b[%i, %j] : memref<4x16xf32>
      }
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%b : memref<4x16xf32>) outs(%z : memref<16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %s = arith.addf %o, %x : f32
      linalg.yield %s : f32
    }
  } {spectra.tile_loop}
  return
}

// -----

#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
#tr = affine_map<(i, j) -> (j, i)>

// Left alone: the input is read after the op (its values are still needed), its first use in
// the body reads what the last iteration left (a running tile), the output is read before
// the op writes it, the output is used after the loop, the two differ in type, the op reads
// the output's old value, a loop not marked spectra.tile_loop, the input read by another map,
// and the input used after the loop.
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-18: memref.alloca()
// CHECK-NOT:     memref.alloca()
func.func @kept(%n: index, %z: memref<16xf32>, %out: memref<4x16xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %a1 = memref.alloca() : memref<4x16xf32>
  %b1 = memref.alloca() : memref<4x16xf32>
  %a2 = memref.alloca() : memref<4x16xf32>
  %b2 = memref.alloca() : memref<4x16xf32>
  %a3 = memref.alloca() : memref<4x16xf32>
  %b3 = memref.alloca() : memref<4x16xf32>
  %a4 = memref.alloca() : memref<4x16xf32>
  %b4 = memref.alloca() : memref<4x16xf32>
  %a5 = memref.alloca() : memref<4x16xf32>
  %b5 = memref.alloca() : memref<4x16xf64>
  %a6 = memref.alloca() : memref<4x16xf32>
  %b6 = memref.alloca() : memref<4x16xf32>
  %a7 = memref.alloca() : memref<4x16xf32>
  %b7 = memref.alloca() : memref<4x16xf32>
  %a8 = memref.alloca() : memref<16x16xf32>
  %b8 = memref.alloca() : memref<16x16xf32>
  %a9 = memref.alloca() : memref<4x16xf32>
  %b9 = memref.alloca() : memref<4x16xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    // The input read after the op.
    linalg.fill ins(%zero : f32) outs(%a1 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a1 : memref<4x16xf32>) outs(%b1 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      linalg.yield %x : f32
    }
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%a1 : memref<4x16xf32>) outs(%z : memref<16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %s = arith.addf %o, %x : f32
      linalg.yield %s : f32
    }
    // The input's first use reads it (a tile carried from the last iteration) before it is
    // set anew and read last by the op.
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%a2 : memref<4x16xf32>) outs(%z : memref<16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %s = arith.addf %o, %x : f32
      linalg.yield %s : f32
    }
    linalg.fill ins(%zero : f32) outs(%a2 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a2 : memref<4x16xf32>) outs(%b2 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %e = math.exp %x : f32
      linalg.yield %e : f32
    }
    // The input read transposed.
    linalg.fill ins(%zero : f32) outs(%a8 : memref<16x16xf32>)
    linalg.generic {indexing_maps = [#tr, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a8 : memref<16x16xf32>) outs(%b8 : memref<16x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      linalg.yield %x : f32
    }
    // The input used after the loop (below).
    linalg.fill ins(%zero : f32) outs(%a9 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a9 : memref<4x16xf32>) outs(%b9 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      linalg.yield %x : f32
    }
    // The output read before the op writes it.
    linalg.fill ins(%zero : f32) outs(%a3 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
        ins(%b3 : memref<4x16xf32>) outs(%z : memref<16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %s = arith.addf %o, %x : f32
      linalg.yield %s : f32
    }
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a3 : memref<4x16xf32>) outs(%b3 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      linalg.yield %x : f32
    }
    // The output used after the loop (below).
    linalg.fill ins(%zero : f32) outs(%a4 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a4 : memref<4x16xf32>) outs(%b4 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      linalg.yield %x : f32
    }
    // Of different types: the output in f64.
    linalg.fill ins(%zero : f32) outs(%a5 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a5 : memref<4x16xf32>) outs(%b5 : memref<4x16xf64>) {
    ^bb0(%x: f32, %o: f64):
      %w = arith.extf %x : f32 to f64
      linalg.yield %w : f64
    }
    // The op reads the output's old value.
    linalg.fill ins(%zero : f32) outs(%a6 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a6 : memref<4x16xf32>) outs(%b6 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      %s = arith.addf %o, %x : f32
      linalg.yield %s : f32
    }
  } {spectra.tile_loop}
  memref.copy %b4, %out : memref<4x16xf32> to memref<4x16xf32>
  memref.copy %a9, %out : memref<4x16xf32> to memref<4x16xf32>
  // Not a tile loop.
  scf.for %r0 = %c0 to %n step %c4 {
    linalg.fill ins(%zero : f32) outs(%a7 : memref<4x16xf32>)
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a7 : memref<4x16xf32>) outs(%b7 : memref<4x16xf32>) {
    ^bb0(%x: f32, %o: f32):
      linalg.yield %x : f32
    }
  }
  return
}

// -----

#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>

// Left alone: the op reads a view of its input beside the input (a row of it broadcast down
// the columns), which would see the new values once the output is written over it.
// CHECK-LABEL: func.func @view_read
// CHECK-COUNT-2: memref.alloca()
func.func @view_read(%n: index) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  %a = memref.alloca() : memref<4x16xf32>
  %b = memref.alloca() : memref<4x16xf32>
  scf.for %r0 = %c0 to %n step %c4 {
    linalg.fill ins(%zero : f32) outs(%a : memref<4x16xf32>)
    %row = memref.subview %a[0, 0] [1, 16] [1, 1] : memref<4x16xf32> to memref<16xf32, strided<[1]>>
    linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a, %row : memref<4x16xf32>, memref<16xf32, strided<[1]>>) outs(%b : memref<4x16xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %s = arith.addf %x, %y : f32
      linalg.yield %s : f32
    }
  } {spectra.tile_loop}
  return
}
