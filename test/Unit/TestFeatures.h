//===- TestFeatures.h - random features declared in IR for the unit tests --===//

#ifndef SPECTRA_TEST_UNIT_TESTFEATURES_H
#define SPECTRA_TEST_UNIT_TESTFEATURES_H

namespace spectra::test {

/// A user-declared feature with no derivative rule (math.erf): forward kernels only.
inline constexpr const char *kUndifferentiableFeature = R"(
spectra.component @erfy params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %h = arith.mulf %xx, %half : f32
  %e = math.erf %wx : f32
  %l = arith.subf %e, %h : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}
spectra.feature_map @erfy_orf component @erfy weights @orf m = 16 d = 8 seed = 3
)";

} // namespace spectra::test

#endif // SPECTRA_TEST_UNIT_TESTFEATURES_H
