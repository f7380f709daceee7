// RUN: spectra-opt %s -pass-pipeline='builtin.module(func.func(spectra-strip-tiles{strip=16}))' | FileCheck %s
// RUN: spectra-compile --variant posrf-mm --fma-chains 0 --emit=tiles | spectra-opt -pass-pipeline='builtin.module(func.func(spectra-strip-tiles{strip=16}))' | FileCheck %s --check-prefix=KV

// The compiled kv (m = 128): its logits, features and their epilogue's output, which share one
// tile (spectra-reuse-tile-buffers), as one strip, and the chain in a loop of 16-feature strips
// inside the row-tile loop.
// KV-LABEL:   func.func @posrf_mm_kv
// KV-COUNT-1: memref.alloca() : memref<32x16xf32>
// KV-NOT:     memref.alloca() : memref<32x16xf32>
// KV-NOT:     memref.alloca() : memref<32x128xf32>
// KV:         scf.for
// KV:           scf.for %{{.*}} = %{{.*}} to %c128 step %c16
// KV-LABEL:   func.func @posrf_mm_readout

#kn = affine_map<(i, j, k) -> (i, k)>
#kw = affine_map<(i, j, k) -> (k, j)>
#ij = affine_map<(i, j, k) -> (i, j)>
#kb = affine_map<(i, j, k) -> (k)>
#pt = affine_map<(f, c, r) -> (r, f)>
#v = affine_map<(f, c, r) -> (r, c)>
#s = affine_map<(f, c, r) -> (f, c)>
#id = affine_map<(i, j) -> (i, j)>
#col = affine_map<(i, j) -> (j)>
#row = affine_map<(i, j) -> (i)>

// kv's chain: logits (a fill and a contraction along the 32 features), their exponentials,
// the summary's update. Every op is parallel along the features, so the chain runs one
// 16-feature strip at a time: the logits and features (used by the chain only, each first set
// whole) shrink to one strip, the weights, the bias and the summary are read or written
// through their strip's subview, the keys and values whole.
// CHECK-LABEL: func.func @chain
// CHECK-SAME:    (%[[K:.*]]: memref<4x8xf32>, %[[V:.*]]: memref<4x8xf32>, %[[W:.*]]: memref<8x32xf32>, %[[B:.*]]: memref<32xf32>, %[[S:.*]]: memref<32x8xf32>)
// CHECK-DAG:     %[[L:.*]] = memref.alloca() : memref<4x16xf32>
// CHECK-DAG:     %[[P:.*]] = memref.alloca() : memref<4x16xf32>
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[C32:.*]] = arith.constant 32 : index
// CHECK-DAG:     %[[C16:.*]] = arith.constant 16 : index
// CHECK-DAG:     %[[HALF:.*]] = arith.constant 5.000000e-01 : f32
// CHECK:         scf.for %[[J:.*]] = %[[C0]] to %[[C32]] step %[[C16]] {
// CHECK-DAG:       %[[WJ:.*]] = memref.subview %[[W]][0, %[[J]]] [8, 16] [1, 1]
// CHECK-DAG:       %[[BJ:.*]] = memref.subview %[[B]][%[[J]]] [16] [1]
// CHECK-DAG:       %[[SJ:.*]] = memref.subview %[[S]][%[[J]], 0] [16, 8] [1, 1]
// CHECK:           linalg.fill ins(%{{.*}} : f32) outs(%[[L]] : memref<4x16xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[K]], %[[WJ]] : memref<4x8xf32>, memref<8x16xf32, strided<[32, 1], offset: ?>>) outs(%[[L]] : memref<4x16xf32>)
// CHECK:           linalg.generic {{.*}} ins(%[[L]], %[[BJ]] : {{.*}}) outs(%[[P]] : memref<4x16xf32>)
// CHECK:             arith.mulf %{{.*}}, %[[HALF]]
// CHECK:             math.exp
// CHECK:           linalg.generic {{.*}} ins(%[[P]], %[[V]] : memref<4x16xf32>, memref<4x8xf32>) outs(%[[SJ]] : memref<16x8xf32, strided<[8, 1], offset: ?>>)
// CHECK-NOT:     memref<4x32xf32>
// CHECK-NOT:     linalg.{{generic|fill}}
// CHECK:         return
func.func @chain(%k: memref<4x8xf32>, %v: memref<4x8xf32>, %w: memref<8x32xf32>, %b: memref<32xf32>,
                 %s: memref<32x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %l = memref.alloca() : memref<4x32xf32>
  %p = memref.alloca() : memref<4x32xf32>
  linalg.fill ins(%zero : f32) outs(%l : memref<4x32xf32>)
  linalg.generic {indexing_maps = [#kn, #kw, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%k, %w : memref<4x8xf32>, memref<8x32xf32>) outs(%l : memref<4x32xf32>) {
  ^bb0(%a: f32, %x: f32, %acc: f32):
    %m = arith.mulf %a, %x : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  // A pure op between two of the chain's ops: it moves before the loop, whose bodies use it.
  %half = arith.constant 0.5 : f32
  linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%l, %b : memref<4x32xf32>, memref<32xf32>) outs(%p : memref<4x32xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %h = arith.mulf %y, %half : f32
    %d = arith.subf %x, %h : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  }
  linalg.generic {indexing_maps = [#pt, #v, #s], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%p, %v : memref<4x32xf32>, memref<4x8xf32>) outs(%s : memref<32x8xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

// The readout's stabiliser is a maximum over the features (a reduction along them), which
// no strip can compute alone: the run ends before it, the logits are read after the run, so
// nothing shrinks and nothing is rewritten.
// CHECK-LABEL: func.func @row_maximum
// CHECK-NOT:     scf.for
// CHECK-NOT:     memref.subview
// CHECK:         return
func.func @row_maximum(%k: memref<4x8xf32>, %w: memref<8x32xf32>, %mx: memref<4xf32>) {
  %zero = arith.constant 0.0 : f32
  %l = memref.alloca() : memref<4x32xf32>
  linalg.fill ins(%zero : f32) outs(%l : memref<4x32xf32>)
  linalg.generic {indexing_maps = [#kn, #kw, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%k, %w : memref<4x8xf32>, memref<8x32xf32>) outs(%l : memref<4x32xf32>) {
  ^bb0(%a: f32, %x: f32, %acc: f32):
    %m = arith.mulf %a, %x : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%l : memref<4x32xf32>) outs(%mx : memref<4xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %r = arith.maximumf %x, %acc : f32
    linalg.yield %r : f32
  }
  return
}

// A buffer written along the features and then read whole by the next op (here %b,
// rewritten before a contraction sums over all of it) ends the run at that op: strip 0 of
// the contraction would read strip 1 of %b before it is written.
// CHECK-LABEL: func.func @written_then_read_whole
// CHECK-NOT:     scf.for
// CHECK:         return
func.func @written_then_read_whole(%k: memref<4x32xf32>, %b: memref<32xf32>, %t: memref<4x32xf32>,
                                   %w: memref<32x32xf32>) {
  %zero = arith.constant 0.0 : f32
  %u = memref.alloca() : memref<4x32xf32>
  linalg.generic {indexing_maps = [#id, #col], iterator_types = ["parallel", "parallel"]}
      ins(%t : memref<4x32xf32>) outs(%b : memref<32xf32>) {
  ^bb0(%x: f32, %o: f32):
    linalg.yield %x : f32
  }
  linalg.fill ins(%zero : f32) outs(%u : memref<4x32xf32>)
  linalg.generic {indexing_maps = [#kn, #kw, #kb, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%k, %w, %b : memref<4x32xf32>, memref<32x32xf32>, memref<32xf32>) outs(%u : memref<4x32xf32>) {
  ^bb0(%a: f32, %x: f32, %y: f32, %acc: f32):
    %m = arith.mulf %a, %x : f32
    %n = arith.mulf %m, %y : f32
    %r = arith.addf %acc, %n : f32
    linalg.yield %r : f32
  }
  return
}

// Two in-place arguments: %o is written along the features and %i, both marked
// spectra.may_alias, may be the same memory (dx may be dxin); %i is read whole (summed over
// its features), which strip 0 would do before strip 1 of %o is written, so the run ends
// before that op.
// CHECK-LABEL: func.func @in_place
// CHECK-NOT:     scf.for
// CHECK:         return
func.func @in_place(%k: memref<4x8xf32>, %w: memref<8x32xf32>, %o: memref<4x32xf32> {spectra.may_alias},
                    %i: memref<4x32xf32> {spectra.may_alias}) {
  %zero = arith.constant 0.0 : f32
  %l = memref.alloca() : memref<4x32xf32>
  linalg.fill ins(%zero : f32) outs(%l : memref<4x32xf32>)
  linalg.generic {indexing_maps = [#kn, #kw, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%k, %w : memref<4x8xf32>, memref<8x32xf32>) outs(%l : memref<4x32xf32>) {
  ^bb0(%a: f32, %x: f32, %acc: f32):
    %m = arith.mulf %a, %x : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#kn, #ij, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%i, %l : memref<4x32xf32>, memref<4x32xf32>) outs(%o : memref<4x32xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

// The same unmarked: arguments of one type not marked spectra.may_alias are distinct
// memory, so the run goes on and the ops run strip after strip.
// CHECK-LABEL: func.func @distinct_arguments
// CHECK:         scf.for %{{.*}} = %c0 to %c32 step %c16 {
// CHECK:           linalg.fill {{.*}} outs(%[[L:.*]] : memref<4x16xf32>)
// CHECK:           linalg.generic {{.*}} outs(%[[L]] : memref<4x16xf32>)
// CHECK:           linalg.generic {{.*}} ins(%arg3, %[[L]] : memref<4x32xf32>, memref<4x16xf32>)
// CHECK:         return
func.func @distinct_arguments(%k: memref<4x8xf32>, %w: memref<8x32xf32>, %o: memref<4x32xf32>, %i: memref<4x32xf32>) {
  %zero = arith.constant 0.0 : f32
  %l = memref.alloca() : memref<4x32xf32>
  linalg.fill ins(%zero : f32) outs(%l : memref<4x32xf32>)
  linalg.generic {indexing_maps = [#kn, #kw, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%k, %w : memref<4x8xf32>, memref<8x32xf32>) outs(%l : memref<4x32xf32>) {
  ^bb0(%a: f32, %x: f32, %acc: f32):
    %m = arith.mulf %a, %x : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#kn, #ij, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%i, %l : memref<4x32xf32>, memref<4x32xf32>) outs(%o : memref<4x32xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A body that reads its position (linalg.index) would see the strip's, not the tile's.
// CHECK-LABEL: func.func @index
// CHECK-NOT:     scf.for
// CHECK:         return
func.func @index(%k: memref<4x8xf32>, %w: memref<8x32xf32>, %o: memref<4x32xf32>) {
  %zero = arith.constant 0.0 : f32
  %l = memref.alloca() : memref<4x32xf32>
  linalg.fill ins(%zero : f32) outs(%l : memref<4x32xf32>)
  linalg.generic {indexing_maps = [#kn, #kw, #ij], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%k, %w : memref<4x8xf32>, memref<8x32xf32>) outs(%l : memref<4x32xf32>) {
  ^bb0(%a: f32, %x: f32, %acc: f32):
    %m = arith.mulf %a, %x : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%l : memref<4x32xf32>) outs(%o : memref<4x32xf32>) {
  ^bb0(%x: f32, %y: f32):
    %j = linalg.index 1 : index
    %c16 = arith.constant 16 : index
    %lo = arith.cmpi ult, %j, %c16 : index
    %r = arith.select %lo, %x, %zero : f32
    linalg.yield %r : f32
  }
  return
}

// Errors: a strip must be positive.
// RUN: not spectra-opt %s -pass-pipeline='builtin.module(func.func(spectra-strip-tiles{strip=0}))' 2>&1 | FileCheck %s --check-prefix=ERR
// ERR: error: spectra-strip-tiles: strip must be positive
