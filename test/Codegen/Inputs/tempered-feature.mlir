// A user-declared random feature (not in the built-in library): PosRF with a
// tanh-squashed, tempered projection.
spectra.component @tempered params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %t = arith.constant 1.500000e+00 : f32
  %h = arith.mulf %xx, %half : f32
  %s = arith.divf %wx, %t : f32
  %th = math.tanh %s : f32
  %l = arith.subf %th, %h : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}
spectra.feature_map @tempered_orf component @tempered weights @orf m = 64 d = 32 seed = 3
