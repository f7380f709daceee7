// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels="antipodal-weights=true tile-rows=4" | FileCheck %s
// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels="tile-rows=4" | FileCheck %s --check-prefix=DENSE
// RUN: spectra-opt %s -split-input-file -spectra-build-tile-kernels="antipodal-weights=true causal=true tile-rows=4" | FileCheck %s --check-prefix=CAUSAL

// Tests spectra-build-tile-kernels' antipodal-weights (the CPU schedule's): where the weight
// recipe draws W's rows as blocks of a zero row, P, then -P, the logits contract each block's
// P columns of Wt alone, the -P columns' features read those logits negated and the zero
// row's logit is 0; the kernels say so (spectra.antipodal_pairs, the runtime's check).
// SGQ at d = 8, two rotated copies of its 17 points (m = 34): blocks at columns 0 and 17.
// CHECK-LABEL: func.func @posrf_sgq_kv(
// CHECK-SAME: spectra.antipodal_pairs = 8 : i64
// The zero row's logits (0) and each block's P logits come from buffers of their own (the
// last made first), so that only a block's product and its epilogue touch its buffer.
// CHECK: %[[P1:alloca[_0-9]*]] = memref.alloca() : memref<4x8xf32>
// CHECK-NEXT: %[[P0:alloca[_0-9]*]] = memref.alloca() : memref<4x8xf32>
// CHECK-NEXT: %[[ZERO:alloca[_0-9]*]] = memref.alloca() : memref<4x1xf32>
// CHECK: scf.for
// CHECK: linalg.fill {{.*}} outs(%[[ZERO]] : memref<4x1xf32>)
// CHECK: linalg.generic {{.*}} ins(%[[ZERO]], {{.*}}) outs(%{{.*}} : memref<4x1xf32, strided<[34, 1]>>)
// CHECK: linalg.fill {{.*}} outs(%[[P0]] : memref<4x8xf32>)
// CHECK: %[[W0:.*]] = memref.subview %arg3[0, 1] [8, 8] [1, 1] : memref<8x34xf32>
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %[[W0]] : {{.*}}) outs(%[[P0]] :
// The features of both parts in one generic right after the product (its epilogue on the
// CPU): the P columns' from the P logits, the -P columns' from them negated, with ww's -P
// window.
// CHECK: %[[WN0:.*]] = memref.subview %arg4[9] [8] [1] : memref<34xf32>
// CHECK: %[[FP0:.*]] = memref.subview %[[F:alloca[_0-9]*]][0, 1] [4, 8] [1, 1]
// CHECK: %[[FN0:.*]] = memref.subview %[[F]][0, 9] [4, 8] [1, 1]
// CHECK: linalg.generic {{.*}} ins(%[[P0]], {{.*}}, %[[WN0]] : {{.*}}) outs(%[[FP0]], %[[FN0]] :
// CHECK-NEXT: ^bb0(%[[IN:[^:]*]]: f32,
// CHECK-NEXT: %[[NEG:.*]] = arith.negf %[[IN]] : f32
// CHECK: arith.subf %[[IN]],
// CHECK: %[[FPV:.*]] = arith.select
// CHECK: arith.subf %[[NEG]],
// CHECK: %[[FNV:.*]] = arith.select
// CHECK-NEXT: linalg.yield %[[FPV]], %[[FNV]] : f32, f32
// The second block: its zero column at 17, its P logits in their own buffer.
// CHECK: linalg.generic {{.*}} ins(%[[ZERO]], {{.*}}) outs(%{{.*}} : memref<4x1xf32, strided<[34, 1], offset: 17>>)
// CHECK: linalg.fill {{.*}} outs(%[[P1]] : memref<4x8xf32>)
// CHECK: %[[W1:.*]] = memref.subview %arg3[0, 18] [8, 8] [1, 1] : memref<8x34xf32>
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %[[W1]] : {{.*}}) outs(%[[P1]] :
// CHECK: memref.subview %arg4[26] [8] [1] : memref<34xf32>
// CHECK: memref.subview %[[F]][0, 26] [4, 8] [1, 1]
// CHECK: linalg.generic {{.*}} ins(%[[P1]],
// CHECK-NEXT: ^bb0
// CHECK-NEXT: arith.negf
// The backward kernels' dq: the paired columns' differences times P.
// CHECK-LABEL: func.func @posrf_sgq_query_backward(
// CHECK-SAME: spectra.antipodal_pairs = 8 : i64
// CHECK: arith.subf
// CHECK: memref.subview %arg2[1, 0] [8, 8] [1, 1] : memref<34x8xf32>
// CHECK: memref.subview %arg2[18, 0] [8, 8] [1, 1] : memref<34x8xf32>
// CHECK-LABEL: func.func @posrf_sgq_key_backward(
// CHECK-SAME: spectra.antipodal_pairs = 8 : i64
// The causal queries' backward reads its logits again past the features (its chains), so
// there they are formed in L: the zero column filled, the P product into L, and the -P
// columns one more output of the features' generic, the P logits negated.
// CAUSAL-LABEL: func.func @posrf_sgq_causal_query_backward(
// CAUSAL: %[[Z:.*]] = memref.subview %[[LQ:alloca_[0-9]+]][0, 0] [4, 1] [1, 1]
// CAUSAL: linalg.fill {{.*}} outs(%[[Z]] :
// CAUSAL: %[[LP:.*]] = memref.subview %[[LQ]][0, 1] [4, 8] [1, 1]
// CAUSAL: linalg.generic {{.*}} outs(%[[LP]] :
// CAUSAL: %[[LN:.*]] = memref.subview %[[LQ]][0, 9] [4, 8] [1, 1]
// CAUSAL-NEXT: linalg.generic {{.*}} ins(%[[LP]], {{.*}}) outs({{.*}}, %[[LN]] :
// CAUSAL-NEXT: ^bb0(%[[CIN:[^:]*]]: f32,
// CAUSAL-NEXT: %[[CNEG:.*]] = arith.negf %[[CIN]] : f32
// CAUSAL: linalg.yield {{.*}}, %[[CNEG]] : f32, f32, f32
// Without the option (the GPU schedule) W stays dense.
// DENSE-LABEL: func.func @posrf_sgq_kv(
// DENSE-NOT: antipodal_pairs
// DENSE-NOT: arith.negf
// DENSE-LABEL: func.func @posrf_sgq_kv_combine(
spectra.feature_map @posrf_sgq component @posrf weights @sgq m = 34 d = 8 seed = 0

// -----

// SSR: the origin and +-rho times the d + 1 vertices of a simplex, rotated: 9 pairs at d = 8.
// CHECK-LABEL: func.func @posrf_ssr_kv(
// CHECK-SAME: spectra.antipodal_pairs = 9 : i64
spectra.feature_map @posrf_ssr component @posrf weights @ssr m = 19 d = 8 seed = 0

// -----

// m not a whole number of blocks: the last block is cut short, so W is dense.
// CHECK-LABEL: func.func @posrf_sgq_kv(
// CHECK-NOT: antipodal_pairs
// CHECK-LABEL: func.func @posrf_sgq_kv_combine(
spectra.feature_map @posrf_sgq component @posrf weights @sgq m = 20 d = 8 seed = 0

// -----

// A stack inside the recipe's own may cut its blocks (rows 20 of 17-row blocks), so the
// outer m = 34 does not make W antipodal; nor do points other than the rules'.
spectra.weight_recipe @nested(%m, %d) {
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %twenty = arith.constant 20 : index
    %inner = spectra.stack_blocks rows %twenty : tensor<?x?xf32> {
      %p, %a = spectra.sparse_grid [%d] degree 3 : tensor<?x?xf32>, tensor<?xf32>
      spectra.yield %p : tensor<?x?xf32>
    }
    spectra.yield %inner : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}
spectra.weight_recipe @gaussian(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
// CHECK-LABEL: func.func @posrf_nested_kv(
// CHECK-NOT: antipodal_pairs
// CHECK-LABEL: func.func @posrf_nested_kv_combine(
// CHECK-LABEL: func.func @posrf_gaussian_kv(
// CHECK-NOT: antipodal_pairs
// CHECK-LABEL: func.func @posrf_gaussian_kv_combine(
spectra.feature_map @posrf_nested component @posrf weights @nested m = 34 d = 8 seed = 0
spectra.feature_map @posrf_gaussian component @posrf weights @gaussian m = 34 d = 8 seed = 0
