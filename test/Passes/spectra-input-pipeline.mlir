// RUN: spectra-opt %s -spectra-input-pipeline | FileCheck %s

// Tests that the input pipeline links the library and folds next_pow2 of
// constants, the stage spectra-compile prints for --emit=spectra.
// CHECK: spectra.component @posrf
// CHECK-LABEL: spectra.weight_recipe @pow2
// CHECK: %[[C:.*]] = arith.constant 32 : index
// CHECK: spectra.hadamard_diagonal_chain [%[[C]], %[[C]]]
// CHECK-NOT: spectra.next_pow2
spectra.weight_recipe @pow2(%m, %d) {
  %c = arith.constant 20 : index
  %n = spectra.next_pow2 %c
  %h = spectra.hadamard_diagonal_chain [%n, %n] length 3 normalized : tensor<?x?xf32>
  spectra.yield %h : tensor<?x?xf32>
}
spectra.feature_map @f component @posrf weights @pow2 m = 32 d = 20 seed = 0
