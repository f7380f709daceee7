// RUN: spectra-opt %s -split-input-file -spectra-derive-partials -canonicalize -cse -verify-diagnostics | FileCheck %s

// Tests that PosRF's partials fold to constants: dl/dwx = 1, dl/dxx = -1/2,
// dl/dww = 0, dl/dc = 0, and the coefficient depends on c alone.
// CHECK-LABEL: spectra.feature_partials @posrf_partials of @posrf(%wx, %xx, %ww, %p0) {
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-DAG: %[[MHALF:.*]] = arith.constant -5.000000e-01 : f32
// CHECK: spectra.partials_yield %[[ONE]], %[[ZERO]], %[[MHALF]], %[[ZERO]], %[[ZERO]], %[[ZERO]], %[[ZERO]], %[[ONE]] :
spectra.component @posrf params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %h = arith.mulf %xx, %half : f32
  %l = arith.subf %wx, %h : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}

// -----

// Tests that TrigRF's coefficients c*cos(wx), c*sin(wx) get -c*sin(wx) and
// c*cos(wx) as wx-partials (two outputs: 2 x 2 x 4 = 16 partials).
// CHECK-LABEL: spectra.feature_partials @trigrf_partials of @trigrf
// CHECK-DAG: %[[COS:.*]] = math.cos %wx : f32
// CHECK-DAG: %[[SIN:.*]] = math.sin %wx : f32
// CHECK-DAG: %[[NSIN:.*]] = arith.negf %[[SIN]] : f32
// CHECK-DAG: arith.mulf %p0, %[[NSIN]] : f32
// CHECK-DAG: arith.mulf %p0, %[[COS]] : f32
// CHECK: spectra.partials_yield
// CHECK-SAME: : f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32

spectra.component @trigrf params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %l = arith.mulf %xx, %half : f32
  %cos = math.cos %wx : f32
  %sin = math.sin %wx : f32
  %c0 = arith.mulf %cos, %c : f32
  %c1 = arith.mulf %sin, %c : f32
  spectra.feature_yield exp(%l, %l : f32, f32) scaled(%c0, %c1 : f32, f32)
}

// -----

// Tests that an existing partials op is kept (the pass is idempotent).
// CHECK-LABEL: spectra.feature_partials @p_partials of @p
// CHECK-NEXT: spectra.partials_yield
// CHECK-NOT: spectra.feature_partials
spectra.component @p params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  spectra.feature_yield exp(%wx : f32) scaled(%xx : f32)
}
spectra.feature_partials @p_partials of @p(%wx, %xx, %ww) {
  spectra.partials_yield %wx, %wx, %wx, %wx, %wx, %wx : f32, f32, f32, f32, f32, f32
}

// -----

// Tests that an op outside the differentiable set is named.
spectra.component @odd params(%m, %d) {
  spectra.params_yield scalars()
} features(%wx, %xx, %ww) {
  // expected-error@+1 {{'math.atan' op cannot be differentiated by spectra-derive-partials (component 'odd'); supported:}}
  %t = math.atan %wx : f32
  spectra.feature_yield exp(%t : f32) scaled(%xx : f32)
}
