// RUN: spectra-opt %s -split-input-file -spectra-link-library -verify-diagnostics | FileCheck %s

// Tests that the recipe and component a feature map names are copied from the
// built-in library, once each, while the user's definitions are kept.
// CHECK-LABEL: module @links
// CHECK-DAG: spectra.weight_recipe @orf(%m, %d) {
// CHECK-DAG: spectra.component @posrf params(%m, %d) {
// CHECK-DAG: spectra.component @oprf params(%m, %d) {
// CHECK-NOT: spectra.weight_recipe @orf
// CHECK: spectra.feature_map @a component @posrf weights @orf
// CHECK: spectra.feature_map @b component @oprf weights @orf
module @links {
  spectra.feature_map @a component @posrf weights @orf m = 64 d = 16 seed = 0
  spectra.feature_map @b component @oprf weights @orf m = 64 d = 16 seed = 1
}

// -----

// Tests that a user definition overrides the built-in of the same name.
// CHECK-LABEL: module @override
// CHECK: spectra.weight_recipe @orf(%m, %d) {
// CHECK-NEXT: spectra.uniform
// CHECK-NOT: spectra.orthogonalize
module @override {
  spectra.weight_recipe @orf(%m, %d) {
    %u = spectra.uniform [%m, %d] : tensor<?x?xf32>
    %w = spectra.inverse_normal_cdf %u : tensor<?x?xf32>
    spectra.yield %w : tensor<?x?xf32>
  }
  spectra.feature_map @a component @posrf weights @orf m = 64 d = 16 seed = 0
}

// -----

// Tests that names which resolve nowhere are caught by the verifier before
// the pass runs (the pass's own check guards API users who skip verification).
module @missing {
  // expected-error@+1 {{'spectra.feature_map' op C2: component 'nosuch' does not name a spectra.component (in this module or the built-in library)}}
  spectra.feature_map @a component @nosuch weights @orf m = 64 d = 16 seed = 0
}
