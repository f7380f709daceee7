// RUN: spectra-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

// Tests weight_recipe C1: the body takes (m, d) as two index arguments.
// expected-error@+1 {{'spectra.weight_recipe' op C1: body must have exactly two index arguments (m, d), got 1 argument(s)}}
spectra.weight_recipe @one_arg(%m) {
  %g = spectra.gaussian [%m, %m] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests weight_recipe C2: W must be rank 2.
// expected-error@+1 {{'spectra.weight_recipe' op C2: first yielded value must be a rank-2 float tensor (W), got 'tensor<?xf32>'}}
spectra.weight_recipe @vector_w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %g = spectra.gaussian [%m] : tensor<?xf32>
  spectra.yield %g : tensor<?xf32>
}

// -----

// Tests weight_recipe C2: at most W and the row weights.
// expected-error@+1 {{'spectra.weight_recipe' op C2: body must yield W (rank 2) and optionally row weights (rank 1), got 3 value(s)}}
spectra.weight_recipe @three(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  %a = spectra.gaussian [%m] : tensor<?xf32>
  spectra.yield %g, %a, %a : tensor<?x?xf32>, tensor<?xf32>, tensor<?xf32>
}

// -----

// Tests weight_recipe C2: the row weights must be rank 1.
// expected-error@+1 {{'spectra.weight_recipe' op C2: second yielded value must be a rank-1 float tensor (row weights), got 'tensor<?x?xf32>'}}
spectra.weight_recipe @matrix_weights(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g, %g : tensor<?x?xf32>, tensor<?x?xf32>
}

// -----

// Tests gaussian C1: one size per result dimension.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.gaussian' op C1: expects one size per result dimension: 1 size(s) for a rank-2 result}}
  %g = spectra.gaussian [%m] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests gaussian C2: known sizes are positive.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c0 = arith.constant 0 : index
  // expected-error@+1 {{'spectra.gaussian' op C2: size #0 must be positive, got 0}}
  %g = spectra.gaussian [%c0, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests gaussian C2: known sizes agree with the static result type.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c4 = arith.constant 4 : index
  // expected-error@+1 {{'spectra.gaussian' op C2: size #1 is 4 but result dimension 1 is 5}}
  %g = spectra.gaussian [%m, %c4] : tensor<?x5xf32>
  spectra.yield %g : tensor<?x5xf32>
}

// -----

// Tests uniform C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.uniform' op C1: expects one size per result dimension: 3 size(s) for a rank-2 result}}
  %u = spectra.uniform [%m, %d, %d] : tensor<?x?xf32>
  spectra.yield %u : tensor<?x?xf32>
}

// -----

// Tests uniform C2.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant -3 : index
  // expected-error@+1 {{'spectra.uniform' op C2: size #1 must be positive, got -3}}
  %u = spectra.uniform [%m, %c] : tensor<?x?xf32>
  spectra.yield %u : tensor<?x?xf32>
}

// -----

// Tests rademacher C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.rademacher' op C1: expects one size per result dimension: 2 size(s) for a rank-1 result}}
  %b = spectra.rademacher [%d, %d] : tensor<?xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests rademacher C2.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 8 : index
  // expected-error@+1 {{'spectra.rademacher' op C2: size #0 is 8 but result dimension 0 is 4}}
  %b = spectra.rademacher [%c] : tensor<4xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests chi C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.chi' op C1: expects one size per result dimension: 0 size(s) for a rank-1 result}}
  %s = spectra.chi [] dof %d : tensor<?xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests chi C2.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 0 : index
  // expected-error@+1 {{'spectra.chi' op C2: size #0 must be positive, got 0}}
  %s = spectra.chi [%c] dof %d : tensor<?xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests chi C3: degrees of freedom are positive.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 0 : index
  // expected-error@+1 {{'spectra.chi' op C3: degrees of freedom must be positive, got 0}}
  %s = spectra.chi [%d] dof %c : tensor<?xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests permutation C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.permutation' op C1: expects one size per result dimension: 2 size(s) for a rank-1 result}}
  %p = spectra.permutation [%d, %d] : tensor<?xi64>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests permutation C2.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 0 : index
  // expected-error@+1 {{'spectra.permutation' op C2: size #0 must be positive, got 0}}
  %p = spectra.permutation [%c] : tensor<?xi64>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests low_discrepancy C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.low_discrepancy' op C1: expects one size per result dimension: 1 size(s) for a rank-2 result}}
  %t = spectra.low_discrepancy halton [%m] : tensor<?x?xf32>
  spectra.yield %t : tensor<?x?xf32>
}

// -----

// Tests low_discrepancy C2.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 0 : index
  // expected-error@+1 {{'spectra.low_discrepancy' op C2: size #0 must be positive, got 0}}
  %t = spectra.low_discrepancy halton [%c, %d] : tensor<?x?xf32>
  spectra.yield %t : tensor<?x?xf32>
}

// -----

// Tests low_discrepancy C3: Sobol's direction numbers cover 21201 dimensions.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 30000 : index
  // expected-error@+1 {{'spectra.low_discrepancy' op C3: sobol supports at most 21201 dimensions, got 30000}}
  %t = spectra.low_discrepancy sobol [%m, %c] : tensor<?x?xf32>
  spectra.yield %t : tensor<?x?xf32>
}

// -----

// Tests inverse_normal_cdf C1: only unit-cube point sets.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.inverse_normal_cdf' op C1: input must be a point set in the open unit cube (spectra.low_discrepancy or spectra.uniform)}}
  %w = spectra.inverse_normal_cdf %g : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests orthogonalize C1: only Gaussian blocks give Haar rows.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %u = spectra.uniform [%d, %d] : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.orthogonalize' op C1: input must be a spectra.gaussian draw (sign-corrected QR is Haar only for Gaussian blocks)}}
  %q = spectra.orthogonalize %u : tensor<?x?xf32>
  spectra.yield %q : tensor<?x?xf32>
}

// -----

// Tests orthogonalize C2: no more orthonormal rows than columns.
spectra.weight_recipe @r(%m, %d) {
  %c8 = arith.constant 8 : index
  %c4 = arith.constant 4 : index
  // expected-note@+1 {{offending value defined here}}
  %g = spectra.gaussian [%c8, %c4] : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.orthogonalize' op C2: a 8x4 block cannot have more orthonormal rows than columns; stack d x d blocks with spectra.stack_blocks}}
  %q = spectra.orthogonalize %g : tensor<?x?xf32>
  spectra.yield %q : tensor<?x?xf32>
}

// -----

// Tests scale_rows C1: the result keeps the matrix type.
spectra.weight_recipe @r(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  %s = spectra.chi [%m] dof %d : tensor<?xf32>
  // expected-error@+1 {{'spectra.scale_rows' op C1: result type 'tensor<?x?xf64>' must equal the matrix type 'tensor<?x?xf32>'}}
  %w = spectra.scale_rows %g, %s : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf64>
  spectra.yield %w : tensor<?x?xf64>
}

// -----

// Tests scale_rows C2: one factor per row.
spectra.weight_recipe @r(%m, %d) {
  %c4 = arith.constant 4 : index
  %c3 = arith.constant 3 : index
  %g = spectra.gaussian [%c4, %d] : tensor<4x?xf32>
  // expected-note@+1 {{offending value defined here}}
  %s = spectra.chi [%c3] dof %d : tensor<3xf32>
  // expected-error@+1 {{'spectra.scale_rows' op C2: vector of length 3 cannot scale the 4 rows}}
  %w = spectra.scale_rows %g, %s : tensor<4x?xf32>, tensor<3xf32> -> tensor<4x?xf32>
  spectra.yield %w : tensor<4x?xf32>
}

// -----

// Tests scale C1: the base is positive.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c0 = arith.constant 0 : index
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.scale' op C1: base must be positive, got 0}}
  %w = spectra.scale %g by %c0 pow -0.5 : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests next_pow2 C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c0 = arith.constant 0 : index
  // expected-error@+1 {{'spectra.next_pow2' op C1: operand must be positive, got 0}}
  %n = spectra.next_pow2 %c0
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests hadamard_diagonal_chain C1.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.hadamard_diagonal_chain' op C1: expects one size per result dimension: 1 size(s) for a rank-2 result}}
  %h = spectra.hadamard_diagonal_chain [%d] length 3 : tensor<?x?xf32>
  spectra.yield %h : tensor<?x?xf32>
}

// -----

// Tests hadamard_diagonal_chain C2.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 16 : index
  // expected-error@+1 {{'spectra.hadamard_diagonal_chain' op C2: size #0 is 16 but result dimension 0 is 8}}
  %h = spectra.hadamard_diagonal_chain [%c, %c] length 3 : tensor<8x8xf32>
  spectra.yield %h : tensor<8x8xf32>
}

// -----

// Tests hadamard_diagonal_chain C3: at least one factor.
spectra.weight_recipe @r(%m, %d) {
  %n = spectra.next_pow2 %d
  // expected-error@+1 {{'spectra.hadamard_diagonal_chain' op C3: length must be >= 1, got 0}}
  %h = spectra.hadamard_diagonal_chain [%n, %n] length 0 : tensor<?x?xf32>
  spectra.yield %h : tensor<?x?xf32>
}

// -----

// Tests hadamard_diagonal_chain C4: Hadamard sizes are powers of two.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 24 : index
  // expected-error@+1 {{'spectra.hadamard_diagonal_chain' op C4: Hadamard size must be a power of two, got 24 (use spectra.next_pow2 and spectra.take_cols)}}
  %h = spectra.hadamard_diagonal_chain [%c, %c] length 3 : tensor<?x?xf32>
  spectra.yield %h : tensor<?x?xf32>
}

// -----

// Tests hadamard_diagonal_chain C4: the chain is square.
// expected-note@+1 {{offending value defined here}}
spectra.weight_recipe @r(%m, %d) {
  %n = spectra.next_pow2 %d
  // expected-error@+1 {{'spectra.hadamard_diagonal_chain' op C4: the chain is square: both sizes must be the same value}}
  %h = spectra.hadamard_diagonal_chain [%n, %m] length 3 : tensor<?x?xf32>
  spectra.yield %h : tensor<?x?xf32>
}

// -----

// Tests take_cols C1: cannot take more columns than there are.
spectra.weight_recipe @r(%m, %d) {
  %c8 = arith.constant 8 : index
  // expected-note@+1 {{offending value defined here}}
  %c12 = arith.constant 12 : index
  %h = spectra.hadamard_diagonal_chain [%c8, %c8] length 3 : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.take_cols' op C1: cannot take 12 columns of a matrix with 8}}
  %w = spectra.take_cols %h, %c12 : tensor<?x?xf32> -> tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests moment_match C1: more points than dimensions.
spectra.weight_recipe @r(%m, %d) {
  %c16 = arith.constant 16 : index
  %c32 = arith.constant 32 : index
  %t = spectra.low_discrepancy halton [%c16, %c32] random_shift : tensor<?x?xf32>
  // expected-note@+1 {{offending value defined here}}
  %p = spectra.inverse_normal_cdf %t : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.moment_match' op C1: needs more points than dimensions (16 <= 32): the sample covariance would be singular}}
  %w = spectra.moment_match %p : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests sparse_grid C1: only the degree-3 rule.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.sparse_grid' op C1: only the degree-3 rule (3-point Gauss-Hermite Smolyak) is provided, got degree 5}}
  %p, %w = spectra.sparse_grid [%d] degree 5 : tensor<?x?xf32>, tensor<?xf32>
  spectra.yield %p, %w : tensor<?x?xf32>, tensor<?xf32>
}

// -----

// Tests sparse_grid C2: 2d+1 points of dimension d.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 4 : index
  // expected-error@+1 {{'spectra.sparse_grid' op C2: with d = 4 result dimension 0 must be 9, got 8}}
  %p, %w = spectra.sparse_grid [%c] degree 3 : tensor<8x4xf32>, tensor<?xf32>
  spectra.yield %p, %w : tensor<8x4xf32>, tensor<?xf32>
}

// -----

// Tests rotate C1: the rotation is square.
spectra.weight_recipe @r(%m, %d) {
  %c = arith.constant 4 : index
  %p, %w = spectra.sparse_grid [%c] degree 3 : tensor<9x4xf32>, tensor<9xf32>
  // expected-note@+1 {{offending value defined here}}
  %q = spectra.gaussian [%c, %d] : tensor<4x5xf32>
  // expected-error@+1 {{'spectra.rotate' op C1: rotation must be square, got 4x5}}
  %r = spectra.rotate %p by %q : tensor<9x4xf32>, tensor<4x5xf32>
  spectra.yield %r, %w : tensor<9x4xf32>, tensor<9xf32>
}

// -----

// Tests rotate C2: the rotation acts on the points' dimension.
spectra.weight_recipe @r(%m, %d) {
  %c = arith.constant 4 : index
  %p, %w = spectra.sparse_grid [%c] degree 3 : tensor<9x4xf32>, tensor<9xf32>
  // expected-note@+1 {{offending value defined here}}
  %q = spectra.gaussian [%d, %d] : tensor<5x5xf32>
  // expected-error@+1 {{'spectra.rotate' op C2: points have 4 columns but the rotation acts on 5}}
  %r = spectra.rotate %p by %q : tensor<9x4xf32>, tensor<5x5xf32>
  spectra.yield %r, %w : tensor<9x4xf32>, tensor<9xf32>
}

// -----

// Tests simplex C1: at least two vertices.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %c = arith.constant 1 : index
  // expected-error@+1 {{'spectra.simplex' op C1: a simplex needs at least 2 vertices, got 1}}
  %s = spectra.simplex [%c] : tensor<?x?xf32>
  spectra.yield %s : tensor<?x?xf32>
}

// -----

// Tests simplex C2: a static result has the vertex count.
spectra.weight_recipe @r(%m, %d) {
  %c = arith.constant 4 : index
  // expected-error@+1 {{'spectra.simplex' op C2: result dimension 1 is 5 but the simplex has 4 vertices}}
  %s = spectra.simplex [%c] : tensor<4x5xf32>
  spectra.yield %s : tensor<4x5xf32>
}

// -----

// Tests norm_coupling C1: at least one sweep.
spectra.weight_recipe @r(%m, %d) {
  %s = spectra.simplex [%d] : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.norm_coupling' op C1: sweeps must be at least 1, got 0}}
  %c = spectra.norm_coupling %s sweeps 0 : tensor<?x?xf32>
  spectra.yield %c : tensor<?x?xf32>
}

// -----

// Tests norm_coupling C2: one row has nothing to be coupled to.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %t = spectra.gaussian [%m, %d] : tensor<1x?xf32>
  // expected-error@+1 {{'spectra.norm_coupling' op C2: couples at least 2 rows, got 1}}
  %c = spectra.norm_coupling %t sweeps 3 : tensor<1x?xf32>
  spectra.yield %c : tensor<1x?xf32>
}

// -----

// Tests circulant C1: the result is square also when n is not known.
spectra.weight_recipe @r(%m, %d) {
  %v = spectra.gaussian [%d] : tensor<?xf32>
  // expected-error@+1 {{'spectra.circulant' op C1: the result is square, got 4x5}}
  %p = spectra.circulant %v : tensor<?xf32> -> tensor<4x5xf32>
  spectra.yield %p : tensor<4x5xf32>
}

// -----

// Tests circulant C1: a static result is n x n.
spectra.weight_recipe @r(%m, %d) {
  %c = arith.constant 4 : index
  %v = spectra.gaussian [%c] : tensor<4xf32>
  // expected-error@+1 {{'spectra.circulant' op C1: result dimension 0 is 3 but the vector has length 4}}
  %p = spectra.circulant %v : tensor<4xf32> -> tensor<3x4xf32>
  spectra.yield %p : tensor<3x4xf32>
}

// -----

// Tests fastfood C1: the factors have one length.
spectra.weight_recipe @r(%m, %d) {
  %c8 = arith.constant 8 : index
  %c4 = arith.constant 4 : index
  %s = spectra.chi [%c8] dof %c8 : tensor<?xf32>
  // expected-note@+1 {{offending value defined here}}
  %g = spectra.gaussian [%c4] : tensor<?xf32>
  %p = spectra.permutation [%c8] : tensor<?xi64>
  %b = spectra.rademacher [%c8] : tensor<?xf32>
  // expected-error@+1 {{'spectra.fastfood' op C1: factor of length 4 does not match length 8}}
  %v = spectra.fastfood %s, %g, %p, %b : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
  spectra.yield %v : tensor<?x?xf32>
}

// -----

// Tests fastfood C2: power-of-two blocks.
spectra.weight_recipe @r(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %s = spectra.chi [%d] dof %d : tensor<6xf32>
  %g = spectra.gaussian [%d] : tensor<6xf32>
  %p = spectra.permutation [%d] : tensor<6xi64>
  %b = spectra.rademacher [%d] : tensor<6xf32>
  // expected-error@+1 {{'spectra.fastfood' op C2: FastFood blocks need a power-of-two length, got 6}}
  %v = spectra.fastfood %s, %g, %p, %b : tensor<6xf32>, tensor<6xf32>, tensor<6xi64>, tensor<6xf32> -> tensor<?x?xf32>
  spectra.yield %v : tensor<?x?xf32>
}

// -----

// Tests fastfood C3: an n x n block.
spectra.weight_recipe @r(%m, %d) {
  %s = spectra.chi [%d] dof %d : tensor<8xf32>
  %g = spectra.gaussian [%d] : tensor<8xf32>
  %p = spectra.permutation [%d] : tensor<8xi64>
  %b = spectra.rademacher [%d] : tensor<8xf32>
  // expected-error@+1 {{'spectra.fastfood' op C3: result must be 8x8, got 'tensor<8x4xf32>'}}
  %v = spectra.fastfood %s, %g, %p, %b : tensor<8xf32>, tensor<8xf32>, tensor<8xi64>, tensor<8xf32> -> tensor<8x4xf32>
  spectra.yield %v : tensor<8x4xf32>
}

// -----

// Tests stack_blocks C1: a block is a matrix.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.stack_blocks' op C1: first yielded value must be a rank-2 float tensor (W), got 'tensor<?xf32>'}}
  %w = spectra.stack_blocks rows %m : tensor<?xf32> {
    // expected-note@+1 {{offending value defined here}}
    %g = spectra.gaussian [%d] : tensor<?xf32>
    spectra.yield %g : tensor<?xf32>
  }
  %g2 = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g2 : tensor<?x?xf32>
}

// -----

// Tests stack_blocks C2: results match what the body yields.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.stack_blocks' op C2: body yields 1 value(s) but the op has 2 result(s)}}
  %w, %a = spectra.stack_blocks rows %m : tensor<?x?xf32>, tensor<?xf32> {
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    spectra.yield %g : tensor<?x?xf32>
  }
  spectra.yield %w, %a : tensor<?x?xf32>, tensor<?xf32>
}

// -----

// Tests stack_blocks C2: result types match the yielded types.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.stack_blocks' op C2: yielded 'tensor<4x4xf32>' but the result is 'tensor<?x?xf32>'}}
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %c = arith.constant 4 : index
    // expected-note@+1 {{offending value defined here}}
    %g = spectra.gaussian [%c, %c] : tensor<4x4xf32>
    spectra.yield %g : tensor<4x4xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests stack_blocks C3: averaging needs weights.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{'spectra.stack_blocks' op C3: average_weights needs a body that yields row weights}}
  %w = spectra.stack_blocks rows %m average_weights : tensor<?x?xf32> {
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    spectra.yield %g : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests component C1: params takes (m, d) as f32.
// expected-error@+1 {{'spectra.component' op C1: params region must have exactly two f32 arguments (m, d), got 1 argument(s)}}
spectra.component @c params(%m) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests component C2: params ends in params_yield.
// expected-error@+1 {{'spectra.component' op C2: params region must end in spectra.params_yield}}
spectra.component @c params(%m, %d) {
  "other.terminator"() : () -> ()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests component C2: features ends in feature_yield.
// expected-error@+1 {{'spectra.component' op C2: features region must end in spectra.feature_yield}}
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  "other.terminator"() : () -> ()
}

// -----

// Tests component C3: features takes (wx, xx, ww) plus one argument per scalar parameter.
// expected-error@+1 {{'spectra.component' op C3: features region must take (wx, xx, ww) and the 1 scalar parameter(s) as 4 f32 arguments, got 3}}
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars(%m : f32)
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests component C4: option names are unique.
// expected-error@+1 {{'spectra.component' op C4: option "a" is declared twice}}
spectra.component @c params(%m, %d) {
  %a = spectra.option "a" default 0.0 : f32
  // expected-note@+1 {{offending value defined here}}
  %b = spectra.option "a" default 1.0 : f32
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests statistic C1: per-dimension kinds are vectors.
spectra.component @c params(%m, %d) {
  // expected-error@+1 {{'spectra.statistic' op C1: 'mean' is per dimension: result must be a rank-1 float tensor, got 'f32'}}
  %s = spectra.statistic mean of keys : f32
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests statistic C1: scalar kinds are f32.
spectra.component @c params(%m, %d) {
  // expected-error@+1 {{'spectra.statistic' op C1: 'count' is a scalar: result must be f32, got 'tensor<?xf32>'}}
  %s = spectra.statistic count of keys : tensor<?xf32>
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests dot C1: operands of one type.
spectra.component @c params(%m, %d) {
  %a = spectra.statistic mean of keys : tensor<?xf32>
  // expected-note@+1 {{offending value defined here}}
  %b = spectra.statistic mean of queries : tensor<4xf32>
  // expected-error@+1 {{'spectra.dot' op C1: operands must have the same type, got 'tensor<?xf32>' and 'tensor<4xf32>'}}
  %s = spectra.dot %a, %b : tensor<?xf32>, tensor<4xf32> -> f32
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests option C1: finite defaults.
spectra.component @c params(%m, %d) {
  // expected-error@+1 {{'spectra.option' op C1: default of option "a" must be finite}}
  %a = spectra.option "a" default 0x7F800000 : f32
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests params_yield C1: input transforms come in pairs.
spectra.component @c params(%m, %d) {
  %a = spectra.statistic mean of keys : tensor<?xf32>
  // expected-error@+1 {{'spectra.params_yield' op C1: query_scale and key_scale transform a pair: give both or neither}}
  spectra.params_yield scalars() query_scale(%a : tensor<?xf32>)
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests params_yield C2: both scales have one type.
spectra.component @c params(%m, %d) {
  %a = spectra.statistic mean of keys : tensor<?xf32>
  // expected-note@+1 {{offending value defined here}}
  %b = spectra.statistic mean of keys : tensor<?xf64>
  // expected-error@+1 {{'spectra.params_yield' op C2: query_scale 'tensor<?xf32>' and key_scale 'tensor<?xf64>' must have the same type}}
  spectra.params_yield scalars() query_scale(%a : tensor<?xf32>) key_scale(%b : tensor<?xf64>)
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests params_yield C3: it ends the params region only.
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  // expected-error@+1 {{'spectra.params_yield' op C3: must terminate the params region}}
  spectra.params_yield scalars()
}

// -----

// Tests feature_yield C1: at least one output.
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  // expected-error@+1 {{'spectra.feature_yield' op C1: a component function yields at least one output}}
  spectra.feature_yield exp() scaled()
}

// -----

// Tests feature_yield C2: a coefficient per logit.
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  // expected-error@+1 {{'spectra.feature_yield' op C2: 2 logit(s) but 1 coefficient(s)}}
  spectra.feature_yield exp(%wx, %xx : f32, f32) scaled(%ww : f32)
}

// -----

// Tests feature_yield C3: it ends the features region only.
spectra.component @c params(%m, %d) {
  // expected-error@+1 {{'spectra.feature_yield' op C3: must terminate the features region}}
  spectra.feature_yield exp(%m : f32) scaled(%d : f32)
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}

// -----

// Tests feature_map C1: weights names a recipe.
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
// expected-error@+1 {{'spectra.feature_map' op C1: weights 'c' does not name a spectra.weight_recipe (in this module or the built-in library)}}
spectra.feature_map @f component @c weights @c m = 8 d = 4 seed = 0

// -----

// Tests feature_map C2: component names a component.
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
// expected-error@+1 {{'spectra.feature_map' op C2: component 'nowhere' does not name a spectra.component (in this module or the built-in library)}}
spectra.feature_map @f component @nowhere weights @w m = 8 d = 4 seed = 0

// -----

// Tests feature_map C3: positive sizes, non-negative seed.
// expected-error@+1 {{'spectra.feature_map' op C3: needs m >= 1, d >= 1 and seed >= 0, got m = 0, d = 4, seed = 0}}
spectra.feature_map @f component @posrf weights @orf m = 0 d = 4 seed = 0

// -----

// Tests feature_map C4 against a built-in component that is not linked yet.
// expected-error@+1 {{'spectra.feature_map' op C4: neither component 'gerf' nor weights 'orf' has an option "b" (declared: a)}}
spectra.feature_map @f component @gerf weights @orf m = 8 d = 4 seed = 0 options {b = 1.0 : f32}

// -----

// Tests feature_map C2: a built-in recipe is not a component.
// expected-error@+1 {{'spectra.feature_map' op C2: component 'orf' does not name a spectra.component (in this module or the built-in library)}}
spectra.feature_map @f component @orf weights @orf m = 8 d = 4 seed = 0

// -----

// Tests feature_map C1 and C2: a mistyped name gets the nearest one, built-in or the module's.
// expected-error@+1 {{'spectra.feature_map' op C1: weights 'orff' does not name a spectra.weight_recipe (in this module or the built-in library) (did you mean '@orf'?)}}
spectra.feature_map @f component @posrf weights @orff m = 8 d = 4 seed = 0

// -----

// expected-error@+1 {{'spectra.feature_map' op C2: component 'posfr' does not name a spectra.component (in this module or the built-in library) (did you mean '@posrf'?)}}
spectra.feature_map @f component @posfr weights @orf m = 8 d = 4 seed = 0

// -----

spectra.weight_recipe @my_gaussian(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
// expected-error@+1 {{'spectra.feature_map' op C1: weights 'my_gausian' does not name a spectra.weight_recipe (in this module or the built-in library) (did you mean '@my_gaussian'?)}}
spectra.feature_map @f component @posrf weights @my_gausian m = 8 d = 4 seed = 0

// -----

// Tests feature_map C4: options must be declared by the component.
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
spectra.component @c params(%m, %d) {
  %a = spectra.option "a" default 0.0 : f32
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
// expected-error@+1 {{'spectra.feature_map' op C4: neither component 'c' nor weights 'w' has an option "b" (declared: a)}}
spectra.feature_map @f component @c weights @w m = 8 d = 4 seed = 0 options {b = 1.0 : f32}

// -----

// Tests feature_map C4: option values are floats.
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
spectra.component @c params(%m, %d) {
  %a = spectra.option "a" default 0.0 : f32
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
// expected-error@+1 {{'spectra.feature_map' op C4: option "a" must be a float, got "x"}}
spectra.feature_map @f component @c weights @w m = 8 d = 4 seed = 0 options {a = "x"}

// -----

// Tests attention C1: feature_map names a feature map.
func.func @f(%q: tensor<1x1x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C1: 'missing' does not name a spectra.feature_map}}
  %0 = spectra.attention %q, %q, %q feature_map @missing : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C2: one element type.
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf16>) {
  // expected-error@+1 {{'spectra.attention' op C2: key element type 'f16' differs from the query's 'f32'}}
  %0 = spectra.attention %q, %k, %q feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf16>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C2: the result keeps the element type.
func.func @f(%q: tensor<1x1x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C2: result element type 'bf16' differs from the query's 'f32'}}
  %0 = spectra.attention %q, %q, %q feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xbf16>
  return
}

// -----

// Tests attention C3: batch sizes agree.
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<2x1x4x8xf32>, %k: tensor<3x1x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C3: batch size of key (3) differs from the query's (2)}}
  %0 = spectra.attention %q, %k, %k feature_map @fm : tensor<2x1x4x8xf32>, tensor<3x1x4x8xf32>, tensor<3x1x4x8xf32> -> tensor<2x1x4x8xf32>
  return
}

// -----

// Tests attention C3: head counts agree.
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<2x2x4x8xf32>, %v: tensor<2x4x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C3: head size of value (4) differs from the query's (2)}}
  %0 = spectra.attention %q, %q, %v feature_map @fm : tensor<2x2x4x8xf32>, tensor<2x2x4x8xf32>, tensor<2x4x4x8xf32> -> tensor<2x2x4x8xf32>
  return
}

// -----

// Tests attention C4: keys and values pair up.
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<1x1x4x8xf32>, %v: tensor<1x1x5x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C4: value sequence length 5 differs from the key's 4}}
  %0 = spectra.attention %q, %q, %v feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>, tensor<1x1x5x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C4: queries and keys share the head dimension.
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x16xf32>) {
  // expected-error@+1 {{'spectra.attention' op C4: key head dimension 16 differs from the query's 8}}
  %0 = spectra.attention %q, %k, %q feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x4x16xf32>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C10: causal attention has as many queries as keys.
func.func @f(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x6x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C10: causal attention needs as many queries as keys, got 4 and 6}}
  %0 = spectra.attention %q, %k, %k causal feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x6x8xf32>, tensor<1x1x6x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C11: causal attention refuses parameters from sequence statistics.
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
spectra.component @stats params(%m, %d) {
  %n = spectra.statistic mean_sq_norm of keys : f32
  spectra.params_yield scalars(%n : f32)
} features(%wx, %xx, %ww, %n) {
  spectra.feature_yield exp(%wx : f32) scaled(%n : f32)
}
spectra.feature_map @fm component @stats weights @w m = 8 d = 8 seed = 0
func.func @f(%q: tensor<1x1x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C11: causal attention with component 'stats', whose parameters read data statistics over the whole sequence (a token would see later tokens); use a component with fixed parameters (posrf; gerf with the option a=VALUE for OPRF's family with A fixed)}}
  %0 = spectra.attention %q, %q, %q causal feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C5: the head dimension is the feature map's d.
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
spectra.feature_map @fm component @c weights @w m = 8 d = 16 seed = 0
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<1x1x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C5: head dimension 8 differs from feature map 'fm' d = 16}}
  %0 = spectra.attention %q, %q, %q feature_map @fm : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests attention C6: the mask is [batch, key length].
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<2x1x4x8xf32>, %mask: tensor<2x5xi1>) {
  // expected-error@+1 {{'spectra.attention' op C6: mask must be [batch, key length] = [2, 4], got 'tensor<2x5xi1>'}}
  %0 = spectra.attention %q, %q, %q mask %mask feature_map @fm : tensor<2x1x4x8xf32>, tensor<2x1x4x8xf32>, tensor<2x1x4x8xf32>, tensor<2x5xi1> -> tensor<2x1x4x8xf32>
  return
}

// -----

// Tests attention C9: the query mask is [batch, query length].
// expected-note@+1 {{offending value defined here}}
func.func @f(%q: tensor<2x1x4x8xf32>, %k: tensor<2x1x6x8xf32>, %mask: tensor<2x6xi1>) {
  // expected-error@+1 {{'spectra.attention' op C9: query mask must be [batch, query length] = [2, 4], got 'tensor<2x6xi1>'}}
  %0 = spectra.attention %q, %k, %k mask %mask query_mask %mask feature_map @fm : tensor<2x1x4x8xf32>, tensor<2x1x6x8xf32>, tensor<2x1x6x8xf32>, tensor<2x6xi1>, tensor<2x6xi1> -> tensor<2x1x4x8xf32>
  return
}

// -----

// Tests attention C7: the result is [B, H, Nq, Dv].
func.func @f(%q: tensor<2x1x4x8xf32>, %k: tensor<2x1x6x8xf32>, %v: tensor<2x1x6x3xf32>) {
  // expected-error@+1 {{'spectra.attention' op C7: result must be [B, H, Nq, Dv] = 'tensor<2x1x4x3xf32>', got 'tensor<2x1x4x8xf32>'}}
  %0 = spectra.attention %q, %k, %v feature_map @fm : tensor<2x1x4x8xf32>, tensor<2x1x6x8xf32>, tensor<2x1x6x3xf32> -> tensor<2x1x4x8xf32>
  return
}

// -----

// Tests attention C8: a positive scale.
func.func @f(%q: tensor<1x1x4x8xf32>) {
  // expected-error@+1 {{'spectra.attention' op C8: scale must be positive, got -1.000000e+00}}
  %0 = spectra.attention %q, %q, %q feature_map @fm {scale = -1.0 : f64} : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32> -> tensor<1x1x4x8xf32>
  return
}

// -----

// Tests that a size defined by itself (a cycle, caught by the dominance check)
// does not send the size analysis of the verifiers into a loop.
spectra.weight_recipe @r(%m, %d) {
  // expected-error@+1 {{operand #0 does not dominate this use}}
  %n = spectra.next_pow2 %n
  // expected-note@-1 {{operand defined here (op in the same block)}}
  %h = spectra.hadamard_diagonal_chain [%n, %n] length 3 : tensor<?x?xf32>
  spectra.yield %h : tensor<?x?xf32>
}

// -----

// Tests feature_partials C1: it names a component.
// expected-error@+1 {{'spectra.feature_partials' op C1: 'nothing' does not name a spectra.component of this module}}
spectra.feature_partials @x of @nothing(%wx, %xx, %ww) {
  spectra.partials_yield
}

// -----

// Tests feature_partials C2: the component's arguments.
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
// expected-error@+1 {{'spectra.feature_partials' op C2: body takes 2 argument(s) but the features region of 'c' takes 3}}
spectra.feature_partials @x of @c(%wx, %xx) {
  spectra.partials_yield
}

// -----

// Tests feature_partials C3: one (logit, coeff) pair per output and argument.
spectra.component @c params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
// expected-error@+1 {{'spectra.feature_partials' op C3: body must yield 2 x 1 output(s) x 3 argument(s) = 6 partials, got 2}}
spectra.feature_partials @x of @c(%wx, %xx, %ww) {
  spectra.partials_yield %wx, %xx : f32, f32
}

// -----

// Tests feature_map C4: an unknown option of a built-in recipe with options.
// expected-error@+1 {{'spectra.feature_map' op C4: neither component 'posrf' nor weights 'gmm' has an option "mixtures" (declared: components)}}
spectra.feature_map @f component @posrf weights @gmm m = 8 d = 4 seed = 0 options {mixtures = 2}

// -----

// Tests feature_map C5: a recipe option is a count.
// expected-error@+1 {{'spectra.feature_map' op C5: weight recipe option "components" must be an integer >= 1, got 0 : i64}}
spectra.feature_map @f component @posrf weights @gmm m = 8 d = 4 seed = 0 options {components = 0}

// -----

// Tests feature_map C5: a recipe option is not a float.
// expected-error@+1 {{'spectra.feature_map' op C5: weight recipe option "components" must be an integer >= 1, got 2.000000e+00 : f32}}
spectra.feature_map @f component @posrf weights @gmm m = 8 d = 4 seed = 0 options {components = 2.0 : f32}

// -----

// Tests recipe_option C1: options are counts.
spectra.weight_recipe @w(%m, %d) {
  // expected-error@+1 {{'spectra.recipe_option' op C1: option "c" counts something: its default must be >= 1, got 0}}
  %c = spectra.recipe_option "c" default 0 : index
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests recipe_option C2: one declaration per name.
spectra.weight_recipe @w(%m, %d) {
  %c = spectra.recipe_option "c" default 2 : index
  // expected-error@+1 {{'spectra.recipe_option' op C2: option "c" is declared twice}}
  %e = spectra.recipe_option "c" default 3 : index
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests recipe_option: it belongs to a weight recipe.
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    // expected-error@+1 {{'spectra.recipe_option' op expects parent op 'spectra.weight_recipe'}}
    %c = spectra.recipe_option "c" default 2 : index
    %b = spectra.gaussian [%c, %d] : tensor<?x?xf32>
    spectra.yield %b : tensor<?x?xf32>
  }
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests ceil_div C1: a positive divisor.
spectra.weight_recipe @w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %z = arith.constant 0 : index
  // expected-error@+1 {{'spectra.ceil_div' op C1: divisor must be positive, got 0}}
  %k = spectra.ceil_div %m, %z
  %g = spectra.gaussian [%k, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests eye C1: static dimensions agree with the size.
spectra.weight_recipe @w(%m, %d) {
  %four = arith.constant 4 : index
  // expected-error@+1 {{'spectra.eye' op C1: result dimension 1 is 5 but the identity is 4x4}}
  %e = spectra.eye [%four] learnable : tensor<4x5xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests affine C1: A is square.
spectra.weight_recipe @w(%m, %d) {
  %n = spectra.gaussian [%m, %d] : tensor<?x4xf32>
  // expected-note@+1 {{offending value defined here}}
  %a = spectra.gaussian [%d, %d] : tensor<4x3xf32>
  %b = spectra.zeros [%d] learnable : tensor<?xf32>
  // expected-error@+1 {{'spectra.affine' op C1: A must be square, got 4x3}}
  %w = spectra.affine %n by %a plus %b : tensor<?x4xf32>, tensor<4x3xf32>, tensor<?xf32>
  spectra.yield %w : tensor<?x4xf32>
}

// -----

// Tests affine C3: the shift matches A.
spectra.weight_recipe @w(%m, %d) {
  %n = spectra.gaussian [%m, %d] : tensor<?x4xf32>
  %a = spectra.eye [%d] learnable : tensor<4x4xf32>
  // expected-note@+1 {{offending value defined here}}
  %b = spectra.zeros [%d] learnable : tensor<3xf32>
  // expected-error@+1 {{'spectra.affine' op C3: the shift has length 3 but A has 4 rows}}
  %w = spectra.affine %n by %a plus %b : tensor<?x4xf32>, tensor<4x4xf32>, tensor<3xf32>
  spectra.yield %w : tensor<?x4xf32>
}

// -----

// Tests zeros C1: one size per dimension.
spectra.weight_recipe @w(%m, %d) {
  // expected-error@+1 {{'spectra.zeros' op C1: expects one size per result dimension: 1 size(s) for a rank-2 result}}
  %z = spectra.zeros [%d] learnable : tensor<?x?xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests zeros C2: known sizes are positive.
spectra.weight_recipe @w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %zero = arith.constant 0 : index
  // expected-error@+1 {{'spectra.zeros' op C2: size #0 must be positive, got 0}}
  %z = spectra.zeros [%zero] learnable : tensor<?xf32>
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests affine C2: the points live in A's input space.
spectra.weight_recipe @w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %n = spectra.gaussian [%m, %d] : tensor<?x3xf32>
  %a = spectra.eye [%d] learnable : tensor<4x4xf32>
  %b = spectra.zeros [%d] learnable : tensor<4xf32>
  // expected-error@+1 {{'spectra.affine' op C2: points have 3 columns but A has 4}}
  %w = spectra.affine %n by %a plus %b : tensor<?x3xf32>, tensor<4x4xf32>, tensor<4xf32>
  spectra.yield %w : tensor<?x3xf32>
}

// -----

// Tests glorot C1: a matrix needs two sizes.
spectra.weight_recipe @w(%m, %d) {
  // expected-error@+1 {{'spectra.glorot' op C1: expects one size per result dimension: 1 size(s) for a rank-2 result}}
  %g = spectra.glorot [%d] learnable : tensor<?x?xf32>
  %n = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %n : tensor<?x?xf32>
}

// -----

// Tests glorot C2: static sizes agree.
spectra.weight_recipe @w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %eight = arith.constant 8 : index
  // expected-error@+1 {{'spectra.glorot' op C2: size #0 is 8 but result dimension 0 is 4}}
  %g = spectra.glorot [%eight, %d] learnable : tensor<4x?xf32>
  %n = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %n : tensor<?x?xf32>
}

// -----

// Tests linear C1: a generator layer whose input width does not fit d.
spectra.weight_recipe @w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %n = spectra.gaussian [%m, %d] : tensor<?x16xf32>
  %w1 = spectra.glorot [%d, %d] learnable : tensor<16x32xf32>
  %b1 = spectra.zeros [%d] learnable : tensor<16xf32>
  // expected-error@+1 {{'spectra.linear' op C1: the input has 16 columns but the layer takes 32}}
  %y = spectra.linear %n by %w1 plus %b1 : tensor<?x16xf32>, tensor<16x32xf32>, tensor<16xf32> -> tensor<?x16xf32>
  spectra.yield %y : tensor<?x16xf32>
}

// -----

// Tests linear C2: one bias per output.
spectra.weight_recipe @w(%m, %d) {
  %n = spectra.gaussian [%m, %d] : tensor<?x16xf32>
  %w1 = spectra.glorot [%d, %d] learnable : tensor<16x16xf32>
  // expected-note@+1 {{offending value defined here}}
  %b1 = spectra.zeros [%d] learnable : tensor<8xf32>
  // expected-error@+1 {{'spectra.linear' op C2: the bias has length 8 but the layer has 16 outputs}}
  %y = spectra.linear %n by %w1 plus %b1 : tensor<?x16xf32>, tensor<16x16xf32>, tensor<8xf32> -> tensor<?x16xf32>
  spectra.yield %y : tensor<?x16xf32>
}

// -----

// Tests linear C3: the result has the layer's outputs.
spectra.weight_recipe @w(%m, %d) {
  %n = spectra.gaussian [%m, %d] : tensor<?x16xf32>
  %w1 = spectra.glorot [%d, %d] learnable : tensor<8x16xf32>
  %b1 = spectra.zeros [%d] learnable : tensor<8xf32>
  // expected-error@+1 {{'spectra.linear' op C3: result has 16 columns but the layer has 8 outputs}}
  %y = spectra.linear %n by %w1 plus %b1 : tensor<?x16xf32>, tensor<8x16xf32>, tensor<8xf32> -> tensor<?x16xf32>
  spectra.yield %y : tensor<?x16xf32>
}

// -----

// Tests batch_norm C1: one row has no variance.
spectra.weight_recipe @w(%m, %d) {
  // expected-note@+1 {{offending value defined here}}
  %n = spectra.gaussian [%m, %d] : tensor<1x?xf32>
  // expected-error@+1 {{'spectra.batch_norm' op C1: batch normalisation needs at least 2 rows, got 1}}
  %b = spectra.batch_norm %n : tensor<1x?xf32>
  spectra.yield %b : tensor<1x?xf32>
}

// -----

// Tests activation C1: a known function.
spectra.weight_recipe @w(%m, %d) {
  %n = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  // expected-error@+1 {{'spectra.activation' op C1: unknown activation "relu6" (known: leaky_relu, tanh)}}
  %a = spectra.activation "relu6" %n : tensor<?x?xf32>
  spectra.yield %a : tensor<?x?xf32>
}

// -----

// Tests weight_recipe C3: a learnable value that W does not depend on would never train.
// expected-error@+1 {{'spectra.weight_recipe' op C3: the learnable 'spectra.zeros' does not reach W (the recipe's first result), so it would never train; use it or drop `learnable`}}
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  // expected-note@+1 {{offending value defined here}}
  %mu = spectra.zeros [%d] learnable : tensor<?xf32>
  spectra.yield %g : tensor<?x?xf32>
}

// -----

// Tests weight_recipe C3: reaching only the row weights is not reaching W.
// expected-error@+1 {{'spectra.weight_recipe' op C3: the learnable 'spectra.gaussian' does not reach W}}
spectra.weight_recipe @w(%m, %d) {
  %g = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  // expected-note@+1 {{offending value defined here}}
  %a = spectra.gaussian [%m] learnable : tensor<?xf32>
  spectra.yield %g, %a : tensor<?x?xf32>, tensor<?xf32>
}

// -----

// Tests weight_recipe C4: moment_match of a learned value, through a stack_blocks block.
// expected-error@+1 {{'spectra.weight_recipe' op C4: 'spectra.moment_match' takes a value computed from the learnable 'spectra.eye'; it needs a fixed input (it re-standardises its input, undoing what is learned)}}
spectra.weight_recipe @w(%m, %d) {
  %s = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %n = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    // expected-note@+1 {{offending value defined here}}
    %a = spectra.eye [%d] learnable : tensor<?x?xf32>
    %z = spectra.zeros [%d] : tensor<?xf32>
    %b = spectra.affine %n by %a plus %z : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>
    spectra.yield %b : tensor<?x?xf32>
  }
  %w = spectra.moment_match %s : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// -----

// Tests spherical_radial C1: one radius.
spectra.weight_recipe @w(%m, %d) {
  %two = arith.constant 2 : index
  // expected-note@+1 {{offending value defined here}}
  %rho = spectra.chi [%two] dof %d : tensor<2xf32>
  // expected-error@+1 {{'spectra.spherical_radial' op C1: the radius must hold one value, got length 2}}
  %p, %a = spectra.spherical_radial [%d] radius %rho : tensor<2xf32> -> tensor<?x?xf32>, tensor<?xf32>
  spectra.yield %p, %a : tensor<?x?xf32>, tensor<?xf32>
}

// -----

// Tests spherical_radial C2: 2d+3 points for a constant d.
spectra.weight_recipe @w(%m, %d) {
  %one = arith.constant 1 : index
  // expected-note@+1 {{offending value defined here}}
  %four = arith.constant 4 : index
  %rho = spectra.chi [%one] dof %d : tensor<?xf32>
  // expected-error@+1 {{'spectra.spherical_radial' op C2: with d = 4 result dimension 0 must be 11, got 9}}
  %p, %a = spectra.spherical_radial [%four] radius %rho : tensor<?xf32> -> tensor<9x4xf32>, tensor<?xf32>
  spectra.yield %p, %a : tensor<9x4xf32>, tensor<?xf32>
}

// -----

// Tests spectra.may_alias: a unit attribute on a function's argument.
// expected-error@+1 {{'spectra.may_alias' on argument #0 takes no value (a unit attribute), got 1 : i64}}
func.func @may_alias_with_a_value(%x: memref<4xf32> {spectra.may_alias = 1}) {
  return
}

// -----

// expected-error@+1 {{unknown argument attribute 'spectra.mayalias' (the spectra dialect's argument attributes: 'spectra.may_alias')}}
func.func @may_alias_misspelt(%x: memref<4xf32> {spectra.mayalias}) {
  return
}
