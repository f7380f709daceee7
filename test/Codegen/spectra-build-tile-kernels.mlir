// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels="tile-rows=4" | FileCheck %s
// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels="value-dim=5" | FileCheck %s --check-prefix=DV
// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels -spectra-keep-kernels | FileCheck %s --check-prefix=KEEP
// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels 2>&1 >/dev/null | FileCheck %s --check-prefix=WARN
// RUN: not spectra-opt %s -split-input-file -spectra-build-tile-kernels="shared-limit=49152 warp-chain-threads=256 warp-chain-mma=tf32" 2>&1 >/dev/null | FileCheck %s --check-prefix=BADMMA
// BADMMA: error: spectra-build-tile-kernels: warp-chain-mma takes bf16, bf16x3 or f16, got 'tf32'

// Tests that a feature map gains its four kernels next to it, specialised on m = 16,
// d = 8, the value dimension (default d) and the tile rows: the key pass stages a
// 4-row tile of k (times kscale) and of v, computes L = K W^T as a contraction
// generic, ||k||^2 as a row reduction, the features region inlined as an
// elementwise body over [rows x m] (ww broadcast along rows, ||k||^2 along
// features), each feature's maximum as a column reduction, the rescale by
// exp(old - new), phi = c exp(l - c_f) rowscale, and S += phi^T V as a contraction
// with the first operand transposed. Every buffer is a static tile: phi is never
// stored at the sequence's size.
// CHECK-DAG: #[[$ROWCOL:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-DAG: #[[$A:.*]] = affine_map<(d0, d1, d2) -> (d0, d2)>
// CHECK-DAG: #[[$AT:.*]] = affine_map<(d0, d1, d2) -> (d2, d0)>
// CHECK-LABEL: spectra.feature_map @posrf_orf
// CHECK-LABEL: func.func @posrf_orf_kv(
// CHECK-SAME: memref<?x8xf32>, %{{.*}}: memref<?x8xf32>, %{{.*}}: memref<?xf32>, %{{.*}}: memref<8x16xf32>
// CHECK-SAME: attributes {llvm.emit_c_interface, spectra.arg_names = ["k", "v", "keep", "Wt", "ww", "rowscale", "params", "S", "z", "zabs", "c", "kscale"]
// CHECK-SAME: spectra.arg_roles = ["rows", "rows", "mask", "shared", "shared", "shared", "slice", "partial", "partial", "partial", "partial", "slice"], spectra.grid = "keys", spectra.kernel = "kv", spectra.tile_rows = 4 : i64}
// CHECK-NOT: memref.alloc(
// CHECK-NOT: memref.alloca(%
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c4
// ||k||^2, then the logits, right before the features that read both.
// CHECK: iterator_types = ["parallel", "reduction"]
// CHECK: linalg.generic {indexing_maps = [#[[$A]], {{.*}}], iterator_types = ["parallel", "parallel", "reduction"]}
// CHECK-SAME: outs(%{{.*}} : memref<4x16xf32>)
// The features region: l = wx - xx / 2, masked keys' logits -inf.
// CHECK: iterator_types = ["parallel", "parallel"]
// CHECK: arith.mulf %{{.*}}, %cst
// CHECK: arith.subf
// CHECK: arith.select
// CHECK: iterator_types = ["reduction", "parallel"]
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: math.exp
// CHECK: linalg.generic {indexing_maps = [#[[$AT]], {{.*}}], iterator_types = ["parallel", "parallel", "reduction"]}
// CHECK-SAME: outs(%{{.*}} : memref<16x8xf32, strided<[8, 1]>>)
// CHECK-LABEL: func.func @posrf_orf_readout(
// The guard writes the guarded denominator, its count and its reciprocal (one division a
// row); the numerator is multiplied by the reciprocal, no division per element.
// CHECK: arith.cmpf ule
// CHECK: %[[G:.*]] = arith.select
// CHECK: %[[R:.*]] = arith.divf %{{.*}}, %[[G]] : f32
// CHECK: linalg.yield %[[G]], %{{.*}}, %[[R]] : f32, f32, f32
// CHECK: linalg.generic {{.*}} ins(%{{.*}} : memref<4xf32>) outs(%{{.*}} : memref<4x8xf32>)
// CHECK-NEXT: ^bb0(%[[IN:.*]]: f32, %[[OUT:.*]]: f32):
// CHECK-NEXT: arith.mulf %[[OUT]], %[[IN]] : f32
// The backward kernels take a last `wgrad` switch; dW is zeroed and formed (dW += dwx^T q,
// the first operand transposed, into the [16 x 8] dW) only where it is not 0.
// CHECK-LABEL: func.func @posrf_orf_query_backward(
// CHECK-SAME: %[[QWG:[a-z0-9]+]]: memref<1xf32>) attributes
// CHECK-SAME: spectra.arg_names = [{{.*}}"dW", "dparams", "qscale", "dqscale", "wgrad"]
// CHECK: %[[QFLAG:.*]] = memref.load %[[QWG]]
// CHECK: %[[QWANT:.*]] = arith.cmpf une, %[[QFLAG]]
// CHECK: scf.if %[[QWANT]] {
// CHECK: linalg.fill {{.*}} outs(%{{.*}} : memref<16x8xf32>)
// CHECK-NEXT: }
// CHECK: scf.for
// CHECK: scf.if %[[QWANT]] {
// CHECK-NEXT: linalg.generic {indexing_maps = [#[[$AT]], {{.*}}], iterator_types = ["parallel", "parallel", "reduction"]}
// CHECK-SAME: outs(%{{.*}} : memref<16x8xf32>)
// CHECK-LABEL: func.func @posrf_orf_key_backward(
// CHECK-SAME: spectra.arg_names = [{{.*}}"dW", "dparams", "kscale", "dkscale", "wgrad"]
// CHECK-NOT: memref.alloc(
// DV-LABEL: func.func @posrf_orf_kv(
// DV-SAME: memref<?x8xf32>, %{{.*}}: memref<?x5xf32>
// KEEP-NOT: {{^ *}}spectra.
// KEEP: func.func @posrf_orf_kv(
// KEEP-NOT: {{^ *}}spectra.
spectra.feature_map @posrf_orf component @posrf weights @orf m = 16 d = 8 seed = 0

// -----

// Tests that a component with two outputs (PosRF-Hyp) keeps both outputs' features in
// one elementwise body and accumulates each into its own rows of S (offset m).
// CHECK-LABEL: func.func @posrf_hyp_base_kv(
// CHECK-SAME: memref<32x8xf32>
// CHECK: arith.negf
// CHECK: memref.subview %{{.*}}[16, 0] [16, 8] [1, 1] : memref<32x8xf32> to memref<16x8xf32, strided<[8, 1], offset: 128>>
spectra.feature_map @posrf_hyp_base component @posrf_hyp weights @base m = 16 d = 8 seed = 0

// -----

// Tests that a component the compiler cannot differentiate still gets its forward
// kernels, with a warning saying why there is no backward.
spectra.component @floored params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %f = math.floor %wx : f32
  spectra.feature_yield exp(%f : f32) scaled(%c : f32)
}
// CHECK-LABEL: func.func @floored_orf_kv(
// CHECK-LABEL: func.func @floored_orf_readout(
// CHECK-NOT: func.func @floored_orf_query_backward(
// WARN: warning: no backward kernels: 'math.floor' op cannot be differentiated by spectra-derive-partials (component 'floored')
spectra.feature_map @floored_orf component @floored weights @orf m = 16 d = 8 seed = 0
