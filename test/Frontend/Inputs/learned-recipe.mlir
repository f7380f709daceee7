// ORF directions followed by a learnable affine map A w + b (A = I, b = 0 at the start).
spectra.weight_recipe @learned_orf(%m, %d) {
  %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    %s = spectra.chi [%d] dof %d : tensor<?xf32>
    %o = spectra.scale_rows %q, %s : tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
    %a = spectra.eye [%d] learnable : tensor<?x?xf32>
    %b = spectra.zeros [%d] learnable : tensor<?xf32>
    %r = spectra.affine %o by %a plus %b : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>
    spectra.yield %r : tensor<?x?xf32>
  }
  spectra.yield %w : tensor<?x?xf32>
}
spectra.feature_map @mine component @posrf weights @learned_orf m = 64 d = 32 seed = 0
// The library's GMM with four mixture components instead of its default two.
spectra.feature_map @gmm4 component @trigrf weights @gmm m = 64 d = 32 seed = 0 options {components = 4}
