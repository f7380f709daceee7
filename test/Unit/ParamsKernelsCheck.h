//===- ParamsKernelsCheck.h - the params kernels against their program ---===//
//
// Shared by the CPU and the gpu-emulated suites: the compiled params program
// (moments_params, moments_params_backward) of any launcher that has it, against the
// LibTorch interpreter of the same program in float64 and its autograd.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_TEST_UNIT_PARAMSKERNELSCHECK_H
#define SPECTRA_TEST_UNIT_PARAMSKERNELSCHECK_H

#include "runtime/KernelLaunch.h"
#include "runtime/Reference.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace spectra::test {

/// A declared component whose params program reads every statistic kind and uses ops the
/// built-in ones do not (cmpf and select, exp, log1p, absf, minimumf, powf, negf), so the
/// params kernels' generic lowering and adjoint meet them.
inline constexpr const char *kStatisticsComponentIR = R"mlir(
    spectra.component @stats params(%m, %d) {
      %mq = spectra.statistic mean of queries : tensor<?xf32>
      %mk = spectra.statistic mean_square of keys : tensor<?xf32>
      %sq = spectra.statistic sum_square of queries : tensor<?xf32>
      %nq = spectra.statistic mean_sq_norm of queries : f32
      %nk = spectra.statistic mean_sq_norm of keys : f32
      %cq = spectra.statistic count of queries : f32
      %half = arith.constant 5.000000e-01 : f32
      %a = spectra.option "a" default 2.500000e-01 : f32
      %hv = spectra.splat %half : f32 -> tensor<?xf32>
      %e = math.exp %mq : tensor<?xf32>
      %t = arith.mulf %e, %hv : tensor<?xf32>
      %l = math.log1p %mk : tensor<?xf32>
      %ab = math.absf %mq : tensor<?xf32>
      %mn = arith.minimumf %l, %ab : tensor<?xf32>
      %big = arith.cmpf ogt, %t, %hv : tensor<?xf32>
      %pick = arith.select %big, %mn, %t : tensor<?xi1>, tensor<?xf32>
      %scale = arith.addf %pick, %hv : tensor<?xf32>
      %one = arith.constant 1.000000e+00 : f32
      %ov = spectra.splat %one : f32 -> tensor<?xf32>
      %inv = arith.divf %ov, %scale : tensor<?xf32>
      %dot = spectra.dot %mq, %sq : tensor<?xf32>, tensor<?xf32> -> f32
      %u = arith.addf %nq, %nk : f32
      %p = math.powf %u, %a : f32
      %ndot = arith.negf %dot : f32
      %w = arith.mulf %ndot, %cq : f32
      %s0 = arith.divf %w, %cq : f32
      %s1 = arith.mulf %p, %half : f32
      %s2 = math.rsqrt %m : f32
      spectra.params_yield scalars(%s0, %s1, %s2 : f32, f32, f32) query_scale(%scale : tensor<?xf32>) key_scale(%inv : tensor<?xf32>)
    } features(%wx, %xx, %ww, %p0, %p1, %p2) {
      %h = arith.constant -5.000000e-01 : f32
      %x = arith.mulf %xx, %h : f32
      %l = arith.addf %wx, %x : f32
      %l2 = arith.mulf %p0, %p1 : f32
      %l3 = arith.addf %l, %l2 : f32
      spectra.feature_yield exp(%l3 : f32) scaled(%p2 : f32)
    }
    spectra.feature_map @stats_orf component @stats weights @orf m = 16 d = 8 seed = 2
  )mlir";

/// The compiled params program (moments_params) and its adjoint (moments_params_backward)
/// against the LibTorch interpreter of the same program in float64 and its autograd, on
/// random moments and counts: the built-in components with statistics and a declared one.
template <typename Attention>
void expectParamsKernelsMatch(const Attention &fused, const std::string &what) {
  const KernelLauncher &l = fused.launcher(torch::Tensor(), 8);
  ASSERT_TRUE(l.has("moments_params") && l.has("moments_params_backward")) << what;
  const Descriptor &desc = fused.descriptor();
  const int64_t B = 2, H = 3, D = desc.d, P = std::max<int64_t>(1, desc.component.scalars.size());
  torch::manual_seed(5);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor counts = torch::tensor({{40.0, 37.0}, {25.0, 31.0}}, f64)
                             .view({B, 1, 2}).expand({B, H, 2}).contiguous();
  // Moments of rows of scale about 0.7 (sums over the counts' rows; squares positive).
  std::array<torch::Tensor, 4> m;
  for (int side = 0; side < 2; ++side) {
    torch::Tensor n = counts.select(2, side).unsqueeze(-1);
    m[2 * side] = torch::randn({B, H, D}, f64) * n.sqrt() * 0.7;
    m[2 * side + 1] = (torch::rand({B, H, D}, f64) + 0.3) * n * 0.5;
  }
  const double s = 0.6;
  std::vector<torch::Tensor> leaves;
  for (torch::Tensor &t : m)
    leaves.push_back(t.clone().requires_grad_(true));
  ReferenceFeatureMap ref(desc);
  RowMoments qm{leaves[0], leaves[1], counts.select(2, 0).unsqueeze(-1)},
      km{leaves[2], leaves[3], counts.select(2, 1).unsqueeze(-1)};
  ComponentParams expected = ref.paramsFromMoments(qm, km, B, H, s, f64);
  torch::Tensor params = torch::stack(expected.scalars, -1);
  torch::Tensor qscale = expected.queryScale.defined() ? expected.queryScale * s
                                                       : torch::full({B, H, D}, s, f64);
  torch::Tensor kscale = expected.keyScale.defined() ? expected.keyScale * s
                                                     : torch::full({B, H, D}, s, f64);

  std::array<torch::Tensor, 4> m32;
  for (int i = 0; i < 4; ++i)
    m32[i] = m[i].to(torch::kFloat32);
  auto [p, qs, ks] = launchMomentsParams(l, m32, counts.to(torch::kFloat32), s, P);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{B, H, P})) << what;
  auto maxAbs = [](const torch::Tensor &t) { return t.abs().max().item<double>(); };
  auto rel = [&](const torch::Tensor &a, const torch::Tensor &b) {
    return maxAbs(a.to(torch::kFloat64) - b) / std::max(maxAbs(b), 1e-30);
  };
  EXPECT_LT(rel(p, params.detach()), 1e-5) << what << " params";
  EXPECT_LT(rel(qs, qscale.detach()), 1e-5) << what << " qscale";
  EXPECT_LT(rel(ks, kscale.detach()), 1e-5) << what << " kscale";

  torch::Tensor gp = torch::randn({B, H, P}, f64), gq = torch::randn({B, H, D}, f64),
                gk = torch::randn({B, H, D}, f64);
  torch::Tensor loss = (params * gp).sum();
  if (expected.queryScale.defined())
    loss = loss + (qscale * gq).sum() + (kscale * gk).sum();
  std::vector<torch::Tensor> dm = torch::autograd::grad({loss}, leaves, {}, false, false, true);
  std::array<torch::Tensor, 4> got = launchMomentsParamsBackward(
      l, m32, counts.to(torch::kFloat32), s, P, gp.to(torch::kFloat32), gq.to(torch::kFloat32),
      gk.to(torch::kFloat32));
  const char *names[] = {"dqsum", "dqsq", "dksum", "dksq"};
  for (int i = 0; i < 4; ++i) {
    torch::Tensor want = dm[i].defined() ? dm[i] : torch::zeros({B, H, D}, f64);
    if (maxAbs(want) == 0)
      EXPECT_EQ(maxAbs(got[i].to(torch::kFloat64)), 0.0) << what << " " << names[i];
    else
      EXPECT_LT(rel(got[i], want), 2e-5) << what << " " << names[i];
  }
}

} // namespace spectra::test

#endif // SPECTRA_TEST_UNIT_PARAMSKERNELSCHECK_H
