// A recipe whose gaussian misses its closing bracket.
spectra.weight_recipe @broken(%m, %d) {
  %g = spectra.gaussian [%m, %d : tensor<?x?xf32>
  spectra.yield %g : tensor<?x?xf32>
}
