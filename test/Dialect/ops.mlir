// RUN: spectra-opt %s | spectra-opt | FileCheck %s
// RUN: spectra-opt %s --mlir-print-op-generic | spectra-opt | FileCheck %s

// Tests that every weight-recipe building block round-trips.
// CHECK-LABEL: spectra.weight_recipe @every_block
// CHECK-SAME: (%[[M:.*]], %[[D:.*]]) {
// CHECK: %[[N:.*]] = spectra.next_pow2 %[[D]]
// CHECK: spectra.gaussian [%[[M]], %[[D]]] : tensor<?x?xf32>
// CHECK: spectra.gaussian [%[[N]]] : tensor<?xf32>
// CHECK: spectra.uniform [%[[M]], %[[D]]] : tensor<?x?xf32>
// CHECK: spectra.rademacher [%[[N]]] : tensor<?xf32>
// CHECK: spectra.chi [%[[N]]] dof %[[N]] : tensor<?xf32>
// CHECK: spectra.permutation [%[[N]]] : tensor<?xi64>
// CHECK: spectra.low_discrepancy sobol [%[[M]], %[[D]]] random_shift : tensor<?x?xf32>
// CHECK: spectra.low_discrepancy halton [%[[M]], %[[D]]] : tensor<?x?xf32>
// CHECK: spectra.inverse_normal_cdf %{{.*}} : tensor<?x?xf32>
// CHECK: spectra.moment_match %{{.*}} : tensor<?x?xf32>
// CHECK: spectra.orthogonalize %{{.*}} : tensor<?x?xf32>
// CHECK: spectra.scale_rows %{{.*}}, %{{.*}} : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
// CHECK: spectra.hadamard_diagonal_chain [%[[N]], %[[N]]] length 3 normalized : tensor<?x?xf32>
// CHECK: spectra.hadamard_diagonal_chain [%[[N]], %[[N]]] length 1 : tensor<?x?xf32>
// CHECK: spectra.scale %{{.*}} by %[[N]] pow 5.000000e-01 : tensor<?x?xf32>
// CHECK: spectra.take_cols %{{.*}}, %[[D]] : tensor<?x?xf32> -> tensor<?x?xf32>
// CHECK: spectra.sparse_grid [%[[D]]] degree 3 : tensor<?x?xf32>, tensor<?xf32>
// CHECK: spectra.rotate %{{.*}} by %{{.*}} : tensor<?x?xf32>, tensor<?x?xf32>
// CHECK: spectra.simplex [%[[D]]] : tensor<?x?xf32>
// CHECK: spectra.norm_coupling %{{.*}} sweeps 3 : tensor<?x?xf32>
// CHECK: spectra.circulant %{{.*}} : tensor<?xf32> -> tensor<?x?xf32>
// CHECK: spectra.fastfood %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
// CHECK: spectra.stack_blocks rows %[[M]] average_weights : tensor<?x?xf32>, tensor<?xf32> {
// CHECK: spectra.yield %{{.*}}, %{{.*}} : tensor<?x?xf32>, tensor<?xf32>
spectra.weight_recipe @every_block(%m, %d) {
  %n = spectra.next_pow2 %d
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  %gv = spectra.gaussian [%n] : tensor<?xf32>
  %u = spectra.uniform [%m, %d] : tensor<?x?xf32>
  %b = spectra.rademacher [%n] : tensor<?xf32>
  %s = spectra.chi [%n] dof %n : tensor<?xf32>
  %p = spectra.permutation [%n] : tensor<?xi64>
  %t = spectra.low_discrepancy sobol [%m, %d] random_shift : tensor<?x?xf32>
  %t2 = spectra.low_discrepancy halton [%m, %d] : tensor<?x?xf32>
  %w = spectra.inverse_normal_cdf %t : tensor<?x?xf32>
  %mm = spectra.moment_match %w : tensor<?x?xf32>
  %gd = spectra.gaussian [%d, %d] : tensor<?x?xf32>
  %q = spectra.orthogonalize %gd : tensor<?x?xf32>
  %cd = spectra.chi [%d] dof %d : tensor<?xf32>
  %orf = spectra.scale_rows %q, %cd : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
  %h = spectra.hadamard_diagonal_chain [%n, %n] length 3 normalized : tensor<?x?xf32>
  %h1 = spectra.hadamard_diagonal_chain [%n, %n] length 1 : tensor<?x?xf32>
  %hs = spectra.scale %h by %n pow 0.5 : tensor<?x?xf32>
  %hc = spectra.take_cols %hs, %d : tensor<?x?xf32> -> tensor<?x?xf32>
  %pts, %wts = spectra.sparse_grid [%d] degree 3 : tensor<?x?xf32>, tensor<?xf32>
  %rot = spectra.rotate %pts by %q : tensor<?x?xf32>, tensor<?x?xf32>
  %sx = spectra.simplex [%d] : tensor<?x?xf32>
  %nc = spectra.norm_coupling %sx sweeps 3 : tensor<?x?xf32>
  %circ = spectra.circulant %gv : tensor<?xf32> -> tensor<?x?xf32>
  %ff = spectra.fastfood %s, %gv, %p, %b : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
  %sw, %sa = spectra.stack_blocks rows %m average_weights : tensor<?x?xf32>, tensor<?xf32> {
    %bp, %bw = spectra.sparse_grid [%d] degree 3 : tensor<?x?xf32>, tensor<?xf32>
    spectra.yield %bp, %bw : tensor<?x?xf32>, tensor<?xf32>
  }
  spectra.yield %sw, %sa : tensor<?x?xf32>, tensor<?xf32>
}

// Tests that learnable draws round-trip (each reaches W, C3).
// CHECK-LABEL: spectra.weight_recipe @learnable_draws
// CHECK: spectra.gaussian [%{{.*}}] learnable : tensor<?xf32>
// CHECK: spectra.rademacher [%{{.*}}] learnable : tensor<?xf32>
// CHECK: spectra.chi [%{{.*}}] dof %{{.*}} learnable : tensor<?xf32>
spectra.weight_recipe @learnable_draws(%m, %d) {
  %n = spectra.next_pow2 %d
  %g = spectra.gaussian [%n] learnable : tensor<?xf32>
  %b = spectra.rademacher [%n] learnable : tensor<?xf32>
  %s = spectra.chi [%n] dof %n learnable : tensor<?xf32>
  %p = spectra.permutation [%n] : tensor<?xi64>
  %ff = spectra.fastfood %s, %g, %p, %b : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
  spectra.yield %ff : tensor<?x?xf32>
}

// Tests that static shapes are accepted where constants fix the sizes.
// CHECK-LABEL: spectra.weight_recipe @static_shapes
// CHECK: spectra.gaussian [%{{.*}}, %{{.*}}] : tensor<4x8xf32>
// CHECK: spectra.sparse_grid [%{{.*}}] degree 3 : tensor<17x8xf32>, tensor<17xf32>
spectra.weight_recipe @static_shapes(%m, %d) {
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %g = spectra.gaussian [%c4, %c8] : tensor<4x8xf32>
  %p, %w = spectra.sparse_grid [%c8] degree 3 : tensor<17x8xf32>, tensor<17xf32>
  spectra.yield %p, %w : tensor<17x8xf32>, tensor<17xf32>
}

// Tests that a component with statistics, options, input transforms and two
// outputs round-trips, with named region arguments.
// CHECK-LABEL: spectra.component @everything params(%m, %d) {
// CHECK: spectra.option "a" default -1.250000e-01 : f32
// CHECK: spectra.statistic mean of queries : tensor<?xf32>
// CHECK: spectra.statistic mean_square of keys : tensor<?xf32>
// CHECK: spectra.statistic sum_square of keys : tensor<?xf32>
// CHECK: spectra.statistic mean_sq_norm of queries : f32
// CHECK: spectra.statistic count of keys : f32
// CHECK: spectra.dot %{{.*}}, %{{.*}} : tensor<?xf32>, tensor<?xf32> -> f32
// CHECK: spectra.params_yield scalars(%{{.*}}, %{{.*}} : f32, f32) query_scale(%{{.*}} : tensor<?xf32>) key_scale(%{{.*}} : tensor<?xf32>)
// CHECK: } features(%wx, %xx, %ww, %p0, %p1) {
// CHECK: spectra.feature_yield exp(%{{.*}}, %{{.*}} : f32, f32) scaled(%p1, %p1 : f32, f32)
spectra.component @everything params(%m, %d) {
  %a = spectra.option "a" default -0.125 : f32
  %mq = spectra.statistic mean of queries : tensor<?xf32>
  %mk2 = spectra.statistic mean_square of keys : tensor<?xf32>
  %sk2 = spectra.statistic sum_square of keys : tensor<?xf32>
  %n = spectra.statistic mean_sq_norm of queries : f32
  %cnt = spectra.statistic count of keys : f32
  %dot = spectra.dot %mq, %mk2 : tensor<?xf32>, tensor<?xf32> -> f32
  %s = arith.addf %dot, %n : f32
  spectra.params_yield scalars(%a, %s : f32, f32) query_scale(%mk2 : tensor<?xf32>) key_scale(%sk2 : tensor<?xf32>)
} features(%wx, %xx, %ww, %a, %c) {
  %l = arith.subf %wx, %xx : f32
  %nl = arith.negf %l : f32
  spectra.feature_yield exp(%l, %nl : f32, f32) scaled(%c, %c : f32, f32)
}

// Tests that feature maps (with and without options) and attention (with and
// without key and query masks, static and dynamic shapes, every element type) round-trip.
// CHECK-LABEL: spectra.feature_map @fm component @everything weights @every_block m = 64 d = 16 seed = 3 options {a = -2.000000e-01 : f32}
// CHECK-LABEL: spectra.feature_map @plain component @everything weights @every_block m = 8 d = 16 seed = 0
// CHECK-LABEL: func.func @attend
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} mask %{{.*}} feature_map @fm : tensor<2x4x128x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1> -> tensor<2x4x128x8xf32>
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} feature_map @plain {scale = 5.000000e-01 : f64} : tensor<?x?x?x16xbf16>, tensor<?x?x?x16xbf16>, tensor<?x?x?x16xbf16> -> tensor<?x?x?x16xbf16>
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} feature_map @plain : tensor<1x1x4x16xf16>, tensor<1x1x4x16xf16>, tensor<1x1x4x16xf16> -> tensor<1x1x4x16xf16>
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} feature_map @plain : tensor<1x1x4x16xf64>, tensor<1x1x4x16xf64>, tensor<1x1x4x16xf64> -> tensor<1x1x4x16xf64>
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} mask %{{.*}} query_mask %{{.*}} feature_map @fm : tensor<2x4x96x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1>, tensor<2x96xi1> -> tensor<2x4x96x8xf32>
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} query_mask %{{.*}} feature_map @fm : tensor<2x4x96x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1> -> tensor<2x4x96x8xf32>
// CHECK: spectra.attention %{{.*}}, %{{.*}}, %{{.*}} mask %{{.*}} causal feature_map @fixed : tensor<2x4x96x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1> -> tensor<2x4x96x8xf32>
spectra.feature_map @fm component @everything weights @every_block m = 64 d = 16 seed = 3 options {a = -0.2 : f32}
spectra.feature_map @plain component @everything weights @every_block m = 8 d = 16 seed = 0
func.func @attend(%q: tensor<2x4x128x16xf32>, %k: tensor<2x4x96x16xf32>, %v: tensor<2x4x96x8xf32>,
                  %mask: tensor<2x96xi1>, %b: tensor<?x?x?x16xbf16>, %h: tensor<1x1x4x16xf16>,
                  %x: tensor<1x1x4x16xf64>) {
  %0 = spectra.attention %q, %k, %v mask %mask feature_map @fm : tensor<2x4x128x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1> -> tensor<2x4x128x8xf32>
  %1 = spectra.attention %b, %b, %b feature_map @plain {scale = 0.5 : f64} : tensor<?x?x?x16xbf16>, tensor<?x?x?x16xbf16>, tensor<?x?x?x16xbf16> -> tensor<?x?x?x16xbf16>
  %2 = spectra.attention %h, %h, %h feature_map @plain : tensor<1x1x4x16xf16>, tensor<1x1x4x16xf16>, tensor<1x1x4x16xf16> -> tensor<1x1x4x16xf16>
  %3 = spectra.attention %x, %x, %x feature_map @plain : tensor<1x1x4x16xf64>, tensor<1x1x4x16xf64>, tensor<1x1x4x16xf64> -> tensor<1x1x4x16xf64>
  %4 = spectra.attention %k, %k, %v mask %mask query_mask %mask feature_map @fm : tensor<2x4x96x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1>, tensor<2x96xi1> -> tensor<2x4x96x8xf32>
  %5 = spectra.attention %k, %k, %v query_mask %mask feature_map @fm : tensor<2x4x96x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1> -> tensor<2x4x96x8xf32>
  %6 = spectra.attention %k, %k, %v mask %mask causal feature_map @fixed : tensor<2x4x96x16xf32>, tensor<2x4x96x16xf32>, tensor<2x4x96x8xf32>, tensor<2x96xi1> -> tensor<2x4x96x8xf32>
  return
}
spectra.component @fixed_params params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  spectra.feature_yield exp(%wx : f32) scaled(%c : f32)
}
spectra.feature_map @fixed component @fixed_params weights @every_block m = 8 d = 16 seed = 0
