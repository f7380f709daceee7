// The built-in weight recipes: the named weight matrices of the Spectraformer
// paper as short compositions of building blocks. Every recipe is generic in
// the feature count %m and the head dimension %d; a spectra.feature_map fixes
// both and the seed. Target distribution of the rows: N(0, I_d).

// Base: iid N(0, 1) entries.
spectra.weight_recipe @base(%m, %d) {
  %w = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// ORF: d x d blocks with Haar-orthogonal rows rescaled by chi_d norms,
// independent blocks stacked until m rows.
spectra.weight_recipe @orf(%m, %d) {
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    %s = spectra.chi [%d] dof %d : tensor<?xf32>
    %b = spectra.scale_rows %q, %s : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
    spectra.yield %b : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// SORF: sqrt(n) H D1 H D2 H D3 with the normalised Hadamard matrix, n = d
// rounded up to a power of two, the first d columns kept.
spectra.weight_recipe @sorf(%m, %d) {
  %n = spectra.next_pow2 %d
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %h = spectra.hadamard_diagonal_chain [%n, %n] length 3 normalized : tensor<?x?xf32>
    %s = spectra.scale %h by %n pow 5.000000e-01 : tensor<?x?xf32>
    %c = spectra.take_cols %s, %d : tensor<?x?xf32> -> tensor<?x?xf32>
    spectra.yield %c : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// QMC: row i = Phi^{-1}(t_i), t_i the i-th randomly shifted Halton point.
spectra.weight_recipe @qmc(%m, %d) {
  %t = spectra.low_discrepancy halton [%m, %d] random_shift : tensor<?x?xf32>
  %w = spectra.inverse_normal_cdf %t : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// QMC with the Sobol sequence.
spectra.weight_recipe @qmc_sobol(%m, %d) {
  %t = spectra.low_discrepancy sobol [%m, %d] random_shift : tensor<?x?xf32>
  %w = spectra.inverse_normal_cdf %t : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// MM: the QMC points moment-matched, so the sample mean is exactly 0 and the
// sample covariance exactly I (needs m > d).
spectra.weight_recipe @mm(%m, %d) {
  %t = spectra.low_discrepancy halton [%m, %d] random_shift : tensor<?x?xf32>
  %p = spectra.inverse_normal_cdf %t : tensor<?x?xf32>
  %w = spectra.moment_match %p : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}

// SGQ: the degree-3 Smolyak sparse grid (2d+1 points, signed weights).
// Design choice to reach m features: m / (2d+1) copies of the rule, each
// under an independent Haar rotation (exactness for degree <= 3 is rotation
// invariant), weights divided by the copy count so they still sum to 1. The
// frontend rounds m down to a multiple of 2d+1 (at least one copy).
spectra.weight_recipe @sgq(%m, %d) {
  %w, %a = spectra.stack_blocks rows %m average_weights : tensor<?x?xf32>, tensor<?xf32> {
    %p, %wt = spectra.sparse_grid [%d] degree 3 : tensor<?x?xf32>, tensor<?xf32>
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    %r = spectra.rotate %p by %q : tensor<?x?xf32>, tensor<?x?xf32>
    spectra.yield %r, %wt : tensor<?x?xf32>, tensor<?xf32>
  }
  spectra.yield %w, %a : tensor<?x?xf32>, tensor<?xf32>
}

// SSR (Munkhoeva et al., 2018): the degree-3 stochastic spherical-radial rule. Per block of
// 2d+3 rows, a radius rho ~ chi_{d+2}, the origin and +-rho times the d+1 vertices of a regular
// simplex under a random rotation Q, with signed weights 1 - d/rho^2 and d/(2(d+1)rho^2),
// averaged over the blocks. The frontend rounds m down to a multiple of 2d+3 (at least one).
spectra.weight_recipe @ssr(%m, %d) {
  %w, %a = spectra.stack_blocks rows %m average_weights : tensor<?x?xf32>, tensor<?xf32> {
    %one = arith.constant 1 : index
    %two = arith.constant 2 : index
    %dof = arith.addi %d, %two : index
    %rho = spectra.chi [%one] dof %dof : tensor<?xf32>
    %p, %wt = spectra.spherical_radial [%d] radius %rho : tensor<?xf32> -> tensor<?x?xf32>, tensor<?xf32>
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    %r = spectra.rotate %p by %q : tensor<?x?xf32>, tensor<?x?xf32>
    spectra.yield %r, %wt : tensor<?x?xf32>, tensor<?xf32>
  }
  spectra.yield %w, %a : tensor<?x?xf32>, tensor<?xf32>
}

// FastFood: (1/sqrt(n)) S H G Pi H B blocks with chi_n row norms.
spectra.weight_recipe @fastfood(%m, %d) {
  %n = spectra.next_pow2 %d
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %s = spectra.chi [%n] dof %n : tensor<?xf32>
    %g = spectra.gaussian [%n] : tensor<?xf32>
    %p = spectra.permutation [%n] : tensor<?xi64>
    %b = spectra.rademacher [%n] : tensor<?xf32>
    %v = spectra.fastfood %s, %g, %p, %b : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
    %c = spectra.take_cols %v, %d : tensor<?x?xf32> -> tensor<?x?xf32>
    spectra.yield %c : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// FastFoodL: FastFood with S, G and B learnable (trained with the model).
spectra.weight_recipe @fastfoodl(%m, %d) {
  %n = spectra.next_pow2 %d
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %s = spectra.chi [%n] dof %n learnable : tensor<?xf32>
    %g = spectra.gaussian [%n] learnable : tensor<?xf32>
    %p = spectra.permutation [%n] : tensor<?xi64>
    %b = spectra.rademacher [%n] learnable : tensor<?xf32>
    %v = spectra.fastfood %s, %g, %p, %b : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
    %c = spectra.take_cols %v, %d : tensor<?x?xf32> -> tensor<?x?xf32>
    spectra.yield %c : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// SimRF (weight-independent; Reid et al., 2023): per block of d rows, the vertices of a
// regular simplex (pairwise cosine -1/(d-1)), randomly rotated, with chi_d norms. Each row is
// marginally N(0, I); the block's directions are more spread than ORF's orthogonal ones.
spectra.weight_recipe @simrf(%m, %d) {
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %s = spectra.simplex [%d] : tensor<?x?xf32>
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    %r = spectra.rotate %s by %q : tensor<?x?xf32>, tensor<?x?xf32>
    %n = spectra.chi [%d] dof %d : tensor<?xf32>
    %b = spectra.scale_rows %r, %n : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
    spectra.yield %b : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// SimRF+ (weight-dependent; Reid et al., 2023): SimRF's blocks with the directions coupled to
// the drawn norms before the rotation: each row turned to point opposite the sum of the others
// (norm kept), row by row, three sweeps, which drives the block's sum to 0 and makes the
// pairwise inner products as negative as the norms allow. Applied before the random rotation,
// the coupling leaves every row marginally N(0, I) (unbiased), with lower estimator variance.
spectra.weight_recipe @simrf_plus(%m, %d) {
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %s = spectra.simplex [%d] : tensor<?x?xf32>
    %n = spectra.chi [%d] dof %d : tensor<?xf32>
    %b = spectra.scale_rows %s, %n : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
    %c = spectra.norm_coupling %b sweeps 3 : tensor<?x?xf32>
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    %r = spectra.rotate %c by %q : tensor<?x?xf32>, tensor<?x?xf32>
    spectra.yield %r : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// SCRF (Feng et al., 2015): per block of d rows, a signed circulant Gaussian matrix
// D circ(c), c ~ N(0, I), D random signs: every row is N(0, I), and a block costs d draws.
spectra.weight_recipe @scrf(%m, %d) {
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %c = spectra.gaussian [%d] : tensor<?xf32>
    %p = spectra.circulant %c : tensor<?xf32> -> tensor<?x?xf32>
    %s = spectra.rademacher [%d] : tensor<?xf32>
    %b = spectra.scale_rows %p, %s : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
    spectra.yield %b : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// GMM (Kernelized Transformer, Chowdhury et al., 2022): a learned spectral density, a mixture
// of C Gaussians. Component c owns ceil(m / C) rows w = Sigma_c n + mu_c, n ~ N(0, I) fixed
// noise, Sigma_c (d x d) and mu_c learnable, initialised to I and 0, so before training the
// rows are N(0, I) (Base). C is the option "components" (default 2, the paper's LRA setting);
// the last component gets fewer rows when C does not divide m. With trigrf this is GMM-RKS,
// with posrf GMM-PRF.
spectra.weight_recipe @gmm(%m, %d) {
  %c = spectra.recipe_option "components" default 2 : index
  %k = spectra.ceil_div %m, %c
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %n = spectra.gaussian [%k, %d] : tensor<?x?xf32>
    %s = spectra.eye [%d] learnable : tensor<?x?xf32>
    %mu = spectra.zeros [%d] learnable : tensor<?xf32>
    %b = spectra.affine %n by %s plus %mu : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>
    spectra.yield %b : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}

// Generative (Kernelized Transformer): a learned implicit spectral density. Fixed noise
// n_m ~ N(0, I_d) goes through a generator network g, trained with the model: four dense
// layers of width "hidden" (an option, default 64), each followed by batch normalisation and
// LeakyReLU, then a dense layer back to d with tanh (the paper's architecture). Rows are
// w_m = g(n_m). With trigrf this is Generative-RKS, with posrf Generative-PRF.
spectra.weight_recipe @generative(%m, %d) {
  %h = spectra.recipe_option "hidden" default 64 : index
  %n = spectra.gaussian [%m, %d] : tensor<?x?xf32>
  %w1 = spectra.glorot [%h, %d] learnable : tensor<?x?xf32>
  %b1 = spectra.zeros [%h] learnable : tensor<?xf32>
  %l1 = spectra.linear %n by %w1 plus %b1 : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
  %n1 = spectra.batch_norm %l1 : tensor<?x?xf32>
  %a1 = spectra.activation "leaky_relu" %n1 : tensor<?x?xf32>
  %w2 = spectra.glorot [%h, %h] learnable : tensor<?x?xf32>
  %b2 = spectra.zeros [%h] learnable : tensor<?xf32>
  %l2 = spectra.linear %a1 by %w2 plus %b2 : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
  %n2 = spectra.batch_norm %l2 : tensor<?x?xf32>
  %a2 = spectra.activation "leaky_relu" %n2 : tensor<?x?xf32>
  %w3 = spectra.glorot [%h, %h] learnable : tensor<?x?xf32>
  %b3 = spectra.zeros [%h] learnable : tensor<?xf32>
  %l3 = spectra.linear %a2 by %w3 plus %b3 : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
  %n3 = spectra.batch_norm %l3 : tensor<?x?xf32>
  %a3 = spectra.activation "leaky_relu" %n3 : tensor<?x?xf32>
  %w4 = spectra.glorot [%h, %h] learnable : tensor<?x?xf32>
  %b4 = spectra.zeros [%h] learnable : tensor<?xf32>
  %l4 = spectra.linear %a3 by %w4 plus %b4 : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
  %n4 = spectra.batch_norm %l4 : tensor<?x?xf32>
  %a4 = spectra.activation "leaky_relu" %n4 : tensor<?x?xf32>
  %w5 = spectra.glorot [%d, %h] learnable : tensor<?x?xf32>
  %b5 = spectra.zeros [%d] learnable : tensor<?xf32>
  %l5 = spectra.linear %a4 by %w5 plus %b5 : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
  %w = spectra.activation "tanh" %l5 : tensor<?x?xf32>
  spectra.yield %w : tensor<?x?xf32>
}
