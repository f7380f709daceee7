// The built-in component functions, in softmax form (target exp(x^T y) for
// inputs already scaled by d^(-1/4)). Every output is coeff * exp(logit) of
// the per-feature scalars wx = w^T x, xx = ||x||^2, ww = ||w||^2. The
// normalisation (m^(-1/2), GERF's D) is part of the coefficient.

// PosRF: m^(-1/2) exp(w^T x - ||x||^2 / 2). Unbiased, positive.
spectra.component @posrf params(%m, %d) {
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %h = arith.mulf %xx, %half : f32
  %l = arith.subf %wx, %h : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}

// GERF (s = +1) with a given A < 1/4: D exp(A ||w||^2 + B w^T x - ||x||^2/2),
// B = sqrt(1 - 4A), D = (1 - 4A)^(d/4). Unbiased for every such A. D is a
// constant factor, so it enters the logit as log D = (d/4) log(1 - 4A): the
// stabiliser absorbs it, where (1 - 4A)^(d/4) itself overflows float32 for
// large inputs (OPRF's A* at logits of hundreds).
spectra.component @gerf params(%m, %d) {
  %a = spectra.option "a" default -1.250000e-01 : f32
  %one = arith.constant 1.000000e+00 : f32
  %four = arith.constant 4.000000e+00 : f32
  %quarter = arith.constant 2.500000e-01 : f32
  %a4 = arith.mulf %four, %a : f32
  %t = arith.subf %one, %a4 : f32
  %b = math.sqrt %t : f32
  %e = arith.mulf %d, %quarter : f32
  %lt = math.log %t : f32
  %logd = arith.mulf %e, %lt : f32
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%a, %b, %logd, %c : f32, f32, f32, f32)
} features(%wx, %xx, %ww, %a, %b, %logd, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %aw = arith.mulf %a, %ww : f32
  %bw = arith.mulf %b, %wx : f32
  %h = arith.mulf %xx, %half : f32
  %s = arith.addf %aw, %bw : f32
  %l0 = arith.subf %s, %h : f32
  %l = arith.addf %l0, %logd : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}

// OPRF: GERF with the variance-optimal A* = (1 - 1/rho)/8,
// rho = (sqrt((2u + d)^2 + 8du) - 2u - d) / (4u), u the mean of
// ||q_i + k_j||^2 over ALL query-key pairs of a (batch, head):
// u = mean||q||^2 + mean||k||^2 + 2 mean(q).mean(k). At its limits: u = 0
// (constant zero inputs) gives A* = 0 (PosRF); large u gives A* ~ -u/(4d),
// B ~ sqrt(u/d) and log D ~ (d/4) log(u/d), all finite in float32.
spectra.component @oprf params(%m, %d) {
  %qn = spectra.statistic mean_sq_norm of queries : f32
  %kn = spectra.statistic mean_sq_norm of keys : f32
  %qm = spectra.statistic mean of queries : tensor<?xf32>
  %km = spectra.statistic mean of keys : tensor<?xf32>
  %dot = spectra.dot %qm, %km : tensor<?xf32>, tensor<?xf32> -> f32
  %one = arith.constant 1.000000e+00 : f32
  %two = arith.constant 2.000000e+00 : f32
  %four = arith.constant 4.000000e+00 : f32
  %eight = arith.constant 8.000000e+00 : f32
  %eighth = arith.constant 1.250000e-01 : f32
  %quarter = arith.constant 2.500000e-01 : f32
  %dot2 = arith.mulf %two, %dot : f32
  %n2 = arith.addf %qn, %kn : f32
  %u0 = arith.addf %n2, %dot2 : f32
  // rho in the rationalised form 2d / (t (1 + sqrt(1 + 8du/t^2))), t = 2u + d: no
  // cancellation for large u, no 0/0 at u = 0 (rho = 1, A* = 0: PosRF), no overflow
  // (8du/t^2 <= 1). u >= 0 in exact arithmetic; rounding may leave it just below 0.
  %zero = arith.constant 0.000000e+00 : f32
  %u = arith.maximumf %u0, %zero : f32
  %u2 = arith.mulf %two, %u : f32
  %t = arith.addf %u2, %d : f32
  %du = arith.mulf %d, %u : f32
  %du8 = arith.mulf %eight, %du : f32
  %r0 = arith.divf %du8, %t : f32
  %r1 = arith.divf %r0, %t : f32
  %r2 = arith.addf %one, %r1 : f32
  %root = math.sqrt %r2 : f32
  %den0 = arith.addf %one, %root : f32
  %den = arith.mulf %t, %den0 : f32
  %d2 = arith.mulf %two, %d : f32
  %rho = arith.divf %d2, %den : f32
  %inv = arith.divf %one, %rho : f32
  %omr = arith.subf %one, %inv : f32
  %a = arith.mulf %omr, %eighth : f32
  // 1 - 4A* = (1 + 1/rho) / 2 >= 1; D = (1 - 4A*)^(d/4) goes into the logit as log D.
  %opr = arith.addf %one, %inv : f32
  %half = arith.constant 5.000000e-01 : f32
  %s = arith.mulf %opr, %half : f32
  %b = math.sqrt %s : f32
  %e = arith.mulf %d, %quarter : f32
  %ls = math.log %s : f32
  %logd = arith.mulf %e, %ls : f32
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%a, %b, %logd, %c : f32, f32, f32, f32)
} features(%wx, %xx, %ww, %a, %b, %logd, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %aw = arith.mulf %a, %ww : f32
  %bw = arith.mulf %b, %wx : f32
  %h = arith.mulf %xx, %half : f32
  %s = arith.addf %aw, %bw : f32
  %l0 = arith.subf %s, %h : f32
  %l = arith.addf %l0, %logd : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}

// SADERF: OPRF on q' = Psi q, k' = Psi^{-1} k with the diagonal
// Psi_ll = (sum_j k_jl^2 / sum_i q_il^2)^(1/4). q'^T k' = q^T k, so the target
// is unchanged. The transformed statistics follow from the raw ones:
// mean||q'||^2 = Psi^2 . mean(q^2), mean||k'||^2 = Psi^-2 . mean(k^2),
// mean(q') . mean(k') = mean(q) . mean(k).
spectra.component @saderf params(%m, %d) {
  %sq0 = spectra.statistic sum_square of queries : tensor<?xf32>
  %sk0 = spectra.statistic sum_square of keys : tensor<?xf32>
  // Any Psi > 0 keeps the kernel exact; these guards only keep it finite and bounded:
  // a dimension where queries or keys are all zero has no optimal Psi (0/0 or x/0).
  // A floor of 1e-20 on the sums makes such a dimension's ratio 1 (or large), and the
  // ratio is clamped to [1e-12, 1e12] (Psi in [1e-3, 1e3]).
  %floor0 = arith.constant 1.000000e-20 : f32
  %lo0 = arith.constant 9.99999996E-13 : f32
  %hi0 = arith.constant 9.99999995E+11 : f32
  %floor = spectra.splat %floor0 : f32 -> tensor<?xf32>
  %lo = spectra.splat %lo0 : f32 -> tensor<?xf32>
  %hi = spectra.splat %hi0 : f32 -> tensor<?xf32>
  %sq = arith.addf %sq0, %floor : tensor<?xf32>
  %sk = arith.addf %sk0, %floor : tensor<?xf32>
  %ratio0 = arith.divf %sk, %sq : tensor<?xf32>
  %ratio1 = arith.maximumf %ratio0, %lo : tensor<?xf32>
  %ratio = arith.minimumf %ratio1, %hi : tensor<?xf32>
  %psi2 = math.sqrt %ratio : tensor<?xf32>
  %psi = math.sqrt %psi2 : tensor<?xf32>
  // Psi^-1 as the reciprocal of the same Psi, so that q'^T k' = q^T k.
  %onef = arith.constant 1.000000e+00 : f32
  %ones = spectra.splat %onef : f32 -> tensor<?xf32>
  %ipsi2 = arith.divf %ones, %psi2 : tensor<?xf32>
  %ipsi = arith.divf %ones, %psi : tensor<?xf32>
  %mq2 = spectra.statistic mean_square of queries : tensor<?xf32>
  %mk2 = spectra.statistic mean_square of keys : tensor<?xf32>
  %qn = spectra.dot %psi2, %mq2 : tensor<?xf32>, tensor<?xf32> -> f32
  %kn = spectra.dot %ipsi2, %mk2 : tensor<?xf32>, tensor<?xf32> -> f32
  %qm = spectra.statistic mean of queries : tensor<?xf32>
  %km = spectra.statistic mean of keys : tensor<?xf32>
  %dot = spectra.dot %qm, %km : tensor<?xf32>, tensor<?xf32> -> f32
  %one = arith.constant 1.000000e+00 : f32
  %two = arith.constant 2.000000e+00 : f32
  %four = arith.constant 4.000000e+00 : f32
  %eight = arith.constant 8.000000e+00 : f32
  %eighth = arith.constant 1.250000e-01 : f32
  %quarter = arith.constant 2.500000e-01 : f32
  %dot2 = arith.mulf %two, %dot : f32
  %n2 = arith.addf %qn, %kn : f32
  %u0 = arith.addf %n2, %dot2 : f32
  // rho in the rationalised form 2d / (t (1 + sqrt(1 + 8du/t^2))), t = 2u + d: no
  // cancellation for large u, no 0/0 at u = 0 (rho = 1, A* = 0: PosRF), no overflow
  // (8du/t^2 <= 1). u >= 0 in exact arithmetic; rounding may leave it just below 0.
  %zero = arith.constant 0.000000e+00 : f32
  %u = arith.maximumf %u0, %zero : f32
  %u2 = arith.mulf %two, %u : f32
  %t = arith.addf %u2, %d : f32
  %du = arith.mulf %d, %u : f32
  %du8 = arith.mulf %eight, %du : f32
  %r0 = arith.divf %du8, %t : f32
  %r1 = arith.divf %r0, %t : f32
  %r2 = arith.addf %one, %r1 : f32
  %root = math.sqrt %r2 : f32
  %den0 = arith.addf %one, %root : f32
  %den = arith.mulf %t, %den0 : f32
  %d2 = arith.mulf %two, %d : f32
  %rho = arith.divf %d2, %den : f32
  %inv = arith.divf %one, %rho : f32
  %omr = arith.subf %one, %inv : f32
  %a = arith.mulf %omr, %eighth : f32
  // 1 - 4A* = (1 + 1/rho) / 2 >= 1; D = (1 - 4A*)^(d/4) goes into the logit as log D.
  %opr = arith.addf %one, %inv : f32
  %half = arith.constant 5.000000e-01 : f32
  %s = arith.mulf %opr, %half : f32
  %b = math.sqrt %s : f32
  %e = arith.mulf %d, %quarter : f32
  %ls = math.log %s : f32
  %logd = arith.mulf %e, %ls : f32
  %c = math.rsqrt %m : f32
  spectra.params_yield scalars(%a, %b, %logd, %c : f32, f32, f32, f32) query_scale(%psi : tensor<?xf32>) key_scale(%ipsi : tensor<?xf32>)
} features(%wx, %xx, %ww, %a, %b, %logd, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %aw = arith.mulf %a, %ww : f32
  %bw = arith.mulf %b, %wx : f32
  %h = arith.mulf %xx, %half : f32
  %s = arith.addf %aw, %bw : f32
  %l0 = arith.subf %s, %h : f32
  %l = arith.addf %l0, %logd : f32
  spectra.feature_yield exp(%l : f32) scaled(%c : f32)
}

// TrigRF: exp(||x||^2/2) m^(-1/2) [cos(w^T x), sin(w^T x)]. Unbiased but can
// be negative; kept for study.
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

// PosRF-Hyp: exp(-||x||^2/2) (2m)^(-1/2) [exp(w^T x), exp(-w^T x)].
spectra.component @posrf_hyp params(%m, %d) {
  %two = arith.constant 2.000000e+00 : f32
  %m2 = arith.mulf %m, %two : f32
  %c = math.rsqrt %m2 : f32
  spectra.params_yield scalars(%c : f32)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %h = arith.mulf %xx, %half : f32
  %l0 = arith.subf %wx, %h : f32
  %nwx = arith.negf %wx : f32
  %l1 = arith.subf %nwx, %h : f32
  spectra.feature_yield exp(%l0, %l1 : f32, f32) scaled(%c, %c : f32, f32)
}

// HCEXP: PosRF-Hyp on A q and A^{-T} k, A diagonal with
// A_ii = ((var_k,i + mean_k,i^2) / (var_q,i + mean_q,i^2))^(1/4)
//      = (mean(k_i^2) / mean(q_i^2))^(1/4).
spectra.component @hcexp params(%m, %d) {
  %mq20 = spectra.statistic mean_square of queries : tensor<?xf32>
  %mk20 = spectra.statistic mean_square of keys : tensor<?xf32>
  // As SADERF's Psi: a floor on the moments, the ratio clamped to [1e-12, 1e12].
  %floor0 = arith.constant 1.000000e-20 : f32
  %lo0 = arith.constant 9.99999996E-13 : f32
  %hi0 = arith.constant 9.99999995E+11 : f32
  %onef = arith.constant 1.000000e+00 : f32
  %floor = spectra.splat %floor0 : f32 -> tensor<?xf32>
  %lo = spectra.splat %lo0 : f32 -> tensor<?xf32>
  %hi = spectra.splat %hi0 : f32 -> tensor<?xf32>
  %ones = spectra.splat %onef : f32 -> tensor<?xf32>
  %mq2 = arith.addf %mq20, %floor : tensor<?xf32>
  %mk2 = arith.addf %mk20, %floor : tensor<?xf32>
  %ratio0 = arith.divf %mk2, %mq2 : tensor<?xf32>
  %ratio1 = arith.maximumf %ratio0, %lo : tensor<?xf32>
  %ratio = arith.minimumf %ratio1, %hi : tensor<?xf32>
  %a2 = math.sqrt %ratio : tensor<?xf32>
  %a = math.sqrt %a2 : tensor<?xf32>
  %ia = arith.divf %ones, %a : tensor<?xf32>
  %two = arith.constant 2.000000e+00 : f32
  %m2 = arith.mulf %m, %two : f32
  %c = math.rsqrt %m2 : f32
  spectra.params_yield scalars(%c : f32) query_scale(%a : tensor<?xf32>) key_scale(%ia : tensor<?xf32>)
} features(%wx, %xx, %ww, %c) {
  %half = arith.constant 5.000000e-01 : f32
  %h = arith.mulf %xx, %half : f32
  %l0 = arith.subf %wx, %h : f32
  %nwx = arith.negf %wx : f32
  %l1 = arith.subf %nwx, %h : f32
  spectra.feature_yield exp(%l0, %l1 : f32, f32) scaled(%c, %c : f32, f32)
}
