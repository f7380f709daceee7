//===- TrainStepTest.cpp - the trainer's device-side step ----------------===//
//
// DeviceStep against LibTorch's own AdamW and gradient clip (the step the
// trainer took before, with its host reads), and its skip rules: a non-finite
// loss, attention inputs or gradients skip the update and count; fp16's
// overflow skips it without counting and halves the loss scale; a run of
// non-finite steps halts the updates at the divergence step.
//
//===----------------------------------------------------------------------===//

#include "models/LraModel.h"
#include "models/TrainStep.h"
#include "runtime/Reference.h"

#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include <cmath>

namespace {
using spectra::models::DeviceStep;
using spectra::models::StepCounters;
using spectra::models::StepWindow;

struct Toy {
  std::vector<torch::Tensor> params;
  explicit Toy(int64_t seed) {
    torch::manual_seed(seed);
    // One f64 parameter, as the learnable random-feature factors are beside the model's f32 ones.
    params = {torch::randn({3, 4}).requires_grad_(), torch::randn({5}).requires_grad_(),
              torch::randn({2, 2}).requires_grad_(), torch::randn({3}, torch::kFloat64).requires_grad_()};
  }
  Toy clone() const {
    Toy t(0);
    for (size_t i = 0; i < params.size(); ++i)
      t.params[i] = params[i].detach().clone().requires_grad_();
    return t;
  }
  void setGrads(const std::vector<torch::Tensor> &grads) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].mutable_grad() = grads[i].clone();
  }
};

torch::optim::AdamW adamw(const Toy &t, double weightDecay = 0.01) {
  return torch::optim::AdamW(t.params, torch::optim::AdamWOptions(1e-3)
                                           .betas({0.9, 0.999})
                                           .eps(1e-6)
                                           .weight_decay(weightDecay));
}

std::vector<torch::Tensor> randomGrads(const Toy &t, double scale) {
  std::vector<torch::Tensor> g;
  for (const auto &p : t.params)
    g.push_back(torch::randn_like(p) * scale);
  return g;
}

torch::Tensor scalar(double v) { return torch::full({}, v); }
torch::Tensor count(int64_t v) { return torch::full({}, v, torch::kInt64); }

void expectSameParams(const Toy &a, const Toy &b, double tol, const std::string &what) {
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(torch::allclose(a.params[i], b.params[i], tol, tol))
        << what << ": parameter " << i << " differs by "
        << (a.params[i] - b.params[i]).abs().max().item<double>();
}

TEST(DeviceStep, MatchesLibTorchsAdamWWithClipping) {
  Toy fused(1), plain = fused.clone();
  torch::optim::AdamW fusedOpt = adamw(fused), plainOpt = adamw(plain);
  DeviceStep step(fusedOpt, torch::kCPU, /*lossScaling=*/false, 20, {});
  torch::manual_seed(7);
  // Norms around 0.3 (no clip) and around 30 (clipped to 1), learning rates of a schedule.
  for (int s = 0; s < 8; ++s) {
    std::vector<torch::Tensor> g = randomGrads(fused, s % 2 ? 10.0 : 0.1);
    double lr = 1e-3 * (s + 1) / 8;
    plain.setGrads(g);
    double norm = torch::nn::utils::clip_grad_norm_(plain.params, 1.0);
    EXPECT_TRUE(std::isfinite(norm));
    static_cast<torch::optim::AdamWOptions &>(plainOpt.param_groups()[0].options()).lr(lr);
    plainOpt.step();
    fused.setGrads(g);
    step.update(s, lr, 1.0, scalar(0.5 + s), count(3), 4, {});
  }
  expectSameParams(fused, plain, 1e-6, "after 8 steps");
  step.syncOptimizerState();
  for (const auto &p : fused.params) {
    auto &state = static_cast<torch::optim::AdamWParamState &>(
        *fusedOpt.state().at(p.unsafeGetTensorImpl()));
    auto &reference = static_cast<torch::optim::AdamWParamState &>(
        *plainOpt.state().at(plain.params[&p - fused.params.data()].unsafeGetTensorImpl()));
    EXPECT_EQ(state.step(), 8);
    EXPECT_TRUE(torch::allclose(state.exp_avg(), reference.exp_avg(), 1e-6, 1e-7));
    EXPECT_TRUE(torch::allclose(state.exp_avg_sq(), reference.exp_avg_sq(), 1e-6, 1e-9));
  }
  StepWindow w = step.read();
  EXPECT_DOUBLE_EQ(w.lossSum, 4 * (0.5 + 1.5 + 2.5 + 3.5 + 4.5 + 5.5 + 6.5 + 7.5));
  EXPECT_EQ(w.correct, 24);
  EXPECT_EQ(w.examples, 32);
  EXPECT_EQ(w.nonFinite, 0);
  EXPECT_EQ(w.counters.skipped, 0);
  // The window restarts; the counters do not.
  EXPECT_EQ(step.read().examples, 0);
}

TEST(DeviceStep, NonFiniteStepsAreSkippedAndCounted) {
  Toy t(2);
  torch::optim::AdamW opt = adamw(t);
  DeviceStep step(opt, torch::kCPU, false, 20, {});
  t.setGrads(randomGrads(t, 0.1));
  step.update(0, 1e-3, 1.0, scalar(1.0), count(1), 2, {});
  Toy before = t.clone();
  auto momentOf = [&](size_t i) {
    return static_cast<torch::optim::AdamWParamState &>(*opt.state().at(t.params[i].unsafeGetTensorImpl()))
        .exp_avg()
        .clone();
  };
  torch::Tensor moment = momentOf(0);

  // A NaN loss, attention inputs flagged non-finite, a NaN gradient: each skipped.
  t.setGrads(randomGrads(t, 0.1));
  step.update(1, 1e-3, 1.0, scalar(NAN), count(1), 2, {});
  t.setGrads(randomGrads(t, 0.1));
  step.update(2, 1e-3, 1.0, scalar(1.0), count(1), 2, torch::full({}, true));
  std::vector<torch::Tensor> g = randomGrads(t, 0.1);
  g[1][2] = NAN;
  t.setGrads(g);
  step.update(3, 1e-3, 1.0, scalar(1.0), count(1), 2, torch::full({}, false));
  expectSameParams(t, before, 0, "after three skipped steps");
  EXPECT_TRUE(torch::equal(momentOf(0), moment));
  StepWindow w = step.read();
  EXPECT_EQ(w.nonFinite, 3);
  EXPECT_EQ(w.firstNonFinite, 2);  // 1-based: the second step
  EXPECT_EQ(w.counters.skipped, 3);
  EXPECT_EQ(w.counters.nonFiniteRun, 3);
  EXPECT_EQ(w.counters.divergedAt, 0);
  EXPECT_EQ(w.examples, 2);  // only the first step's
  EXPECT_DOUBLE_EQ(w.lossSum, 2.0);

  // A finite step applies (and its AdamW step count is 2: the skipped ones did not count).
  t.setGrads(randomGrads(t, 0.1));
  step.update(4, 1e-3, 1.0, scalar(2.0), count(2), 2, {});
  EXPECT_FALSE(torch::equal(t.params[0], before.params[0]));
  step.syncOptimizerState();
  EXPECT_EQ(static_cast<torch::optim::AdamWParamState &>(*opt.state().at(t.params[0].unsafeGetTensorImpl())).step(), 2);
  w = step.read();
  EXPECT_EQ(w.counters.nonFiniteRun, 0);
  EXPECT_EQ(w.counters.skipped, 3);
  EXPECT_EQ(w.nonFinite, 0);
  EXPECT_EQ(w.correct, 2);
}

TEST(DeviceStep, ARunOfNonFiniteStepsHaltsTheUpdatesAtTheDivergence) {
  Toy t(3);
  torch::optim::AdamW opt = adamw(t);
  DeviceStep step(opt, torch::kCPU, false, /*divergeAfter=*/3, {});
  for (int s = 0; s < 3; ++s) {
    t.setGrads(randomGrads(t, 0.1));
    step.update(s, 1e-3, 1.0, scalar(s == 1 ? NAN : 1.0), count(0), 1, {});
  }
  for (int s = 3; s < 6; ++s) {
    t.setGrads(randomGrads(t, 0.1));
    step.update(s, 1e-3, 1.0, scalar(INFINITY), count(0), 1, {});  // steps 4, 5, 6: the third diverges
  }
  Toy halted = t.clone();
  for (int s = 6; s < 9; ++s) {
    // Finite, but after the divergence: nothing changes and nothing counts.
    t.setGrads(randomGrads(t, 0.1));
    step.update(s, 1e-3, 1.0, scalar(1.0), count(1), 1, {});
  }
  expectSameParams(t, halted, 0, "after the divergence");
  StepWindow w = step.read();
  EXPECT_EQ(w.counters.divergedAt, 6);
  EXPECT_EQ(w.counters.nonFiniteRun, 3);
  EXPECT_EQ(w.counters.skipped, 4);
  EXPECT_EQ(w.examples, 2);
  EXPECT_EQ(w.correct, 0);

  // Resumed from the diverged counters, it stays halted.
  DeviceStep resumed(opt, torch::kCPU, false, 3, w.counters);
  t.setGrads(randomGrads(t, 0.1));
  resumed.update(9, 1e-3, 1.0, scalar(1.0), count(1), 1, {});
  expectSameParams(t, halted, 0, "resumed after the divergence");
}

TEST(DeviceStep, LossScalingUnscalesSkipsOverflowsAndAdaptsTheScale) {
  // fp16's dynamic loss scale: the gradients of loss * scale are unscaled before the clip (the
  // update equals the unscaled one); an overflow skips the update without counting as
  // non-finite and halves the scale; 2000 clean steps double it.
  Toy scaled(4), plain = scaled.clone();
  torch::optim::AdamW scaledOpt = adamw(scaled, 0), plainOpt = adamw(plain, 0);
  StepCounters from;
  from.lossScale = 1024;
  DeviceStep step(scaledOpt, torch::kCPU, /*lossScaling=*/true, 20, from);
  DeviceStep reference(plainOpt, torch::kCPU, false, 20, {});
  torch::Tensor x = torch::randn({4});
  auto lossOf = [&](const Toy &t) {
    return (t.params[0].matmul(x)).square().sum() + t.params[1].sum() + t.params[2].square().sum();
  };
  for (int s = 0; s < 3; ++s) {
    for (auto *t : {&scaled, &plain})
      for (auto &p : t->params)
        p.mutable_grad() = torch::Tensor();
    torch::Tensor ls = lossOf(scaled), lp = lossOf(plain);
    step.lossToBackward(ls).backward();
    reference.lossToBackward(lp).backward();
    EXPECT_NEAR(scaled.params[1].grad()[0].item<double>(), 1024, 1e-3);  // scaled by 1024
    step.update(s, 1e-2, 1.0, ls.detach(), count(1), 1, {});
    reference.update(s, 1e-2, 1.0, lp.detach(), count(1), 1, {});
  }
  expectSameParams(scaled, plain, 1e-6, "scaled against unscaled");

  Toy before = scaled.clone();
  std::vector<torch::Tensor> g = randomGrads(scaled, 1.0);
  g[0][1][1] = INFINITY;
  scaled.setGrads(g);
  step.update(3, 1e-2, 1.0, scalar(0.25), count(1), 1, {});
  expectSameParams(scaled, before, 0, "after an overflow");
  StepWindow w = step.read();
  EXPECT_DOUBLE_EQ(w.counters.lossScale, 512);
  EXPECT_EQ(w.counters.goodSteps, 0);
  EXPECT_EQ(w.counters.skipped, 0);  // an overflow is not a non-finite step
  EXPECT_EQ(w.nonFinite, 0);
  EXPECT_EQ(w.examples, 4);          // and its loss counts in the window

  // A non-finite loss leaves the scale alone (its gradients are NaN too).
  g = randomGrads(scaled, 1.0);
  g[2][0][1] = NAN;
  scaled.setGrads(g);
  step.update(4, 1e-2, 1.0, scalar(NAN), count(0), 1, {});
  w = step.read();
  EXPECT_DOUBLE_EQ(w.counters.lossScale, 512);
  EXPECT_EQ(w.counters.skipped, 1);

  // 2000 clean steps in a row double it (and restart the count).
  for (int s = 0; s < 2000; ++s) {
    scaled.setGrads(randomGrads(scaled, 1e-3));
    step.update(5 + s, 1e-6, 1.0, scalar(1.0), count(1), 1, {});
    if (s == 1998) {
      w = step.read();
      EXPECT_DOUBLE_EQ(w.counters.lossScale, 512);
      EXPECT_EQ(w.counters.goodSteps, 1999);
    }
  }
  w = step.read();
  EXPECT_DOUBLE_EQ(w.counters.lossScale, 1024);
  EXPECT_EQ(w.counters.goodSteps, 0);
}

TEST(DeviceStep, ResumesFromTheOptimizersState) {
  // The step counts come from the AdamW state (a loaded checkpoint's), so bias correction
  // continues: 3 steps then 2 more from a new DeviceStep equal 5 in one.
  Toy a(5), b = a.clone();
  torch::optim::AdamW optA = adamw(a), optB = adamw(b);
  torch::manual_seed(11);
  std::vector<std::vector<torch::Tensor>> grads;
  for (int s = 0; s < 5; ++s)
    grads.push_back(randomGrads(a, 0.2));
  DeviceStep once(optA, torch::kCPU, false, 20, {});
  for (int s = 0; s < 5; ++s) {
    a.setGrads(grads[s]);
    once.update(s, 1e-2, 1.0, scalar(1), count(1), 1, {});
  }
  {
    DeviceStep first(optB, torch::kCPU, false, 20, {});
    for (int s = 0; s < 3; ++s) {
      b.setGrads(grads[s]);
      first.update(s, 1e-2, 1.0, scalar(1), count(1), 1, {});
    }
    first.syncOptimizerState();
  }
  DeviceStep second(optB, torch::kCPU, false, 20, {});
  for (int s = 3; s < 5; ++s) {
    b.setGrads(grads[s]);
    second.update(s, 1e-2, 1.0, scalar(1), count(1), 1, {});
  }
  expectSameParams(a, b, 0, "resumed");
}

TEST(DeviceStep, RefusesWhatItCannotDo) {
  Toy t(6);
  torch::optim::AdamW amsgrad(t.params, torch::optim::AdamWOptions(1e-3).amsgrad(true));
  EXPECT_THROW(DeviceStep(amsgrad, torch::kCPU, false, 20, {}), std::invalid_argument);
}

spectra::models::LraConfig tinyModel(const std::string &attention) {
  spectra::models::LraConfig config;
  config.vocab = 20, config.maxLength = 64, config.classes = 10, config.embed = 16;
  config.heads = 2, config.headDim = 8, config.ffn = 32, config.features = 16;
  config.attention = attention;
  return config;
}

/// One step of a model with a learnable recipe (FastFoodL: f64 factors, f32 everything else).
void expectLearnableFactorsMove(const torch::Device &device) {
  torch::manual_seed(1);
  spectra::models::LraModel model(tinyModel("spectra:posrf-fastfoodl"));
  model->to(device);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  DeviceStep step(optimizer, device, false, 20, {});
  std::vector<torch::Tensor> before;
  bool hasF64 = false;
  for (const auto &p : model->parameters()) {
    before.push_back(p.detach().clone());
    hasF64 = hasF64 || p.scalar_type() == torch::kFloat64;
  }
  ASSERT_TRUE(hasF64) << "the FastFoodL factors are expected in f64";
  torch::Tensor tokens = torch::randint(1, 20, {4, 24}, torch::kInt64).to(device);
  torch::Tensor labels = torch::randint(0, 10, {4}, torch::kInt64).to(device);
  torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(tokens), labels);
  step.lossToBackward(loss).backward();
  step.update(0, 1e-3, 1.0, loss, torch::zeros({}, torch::kInt64).to(device), 4, {});
  std::vector<torch::Tensor> after = model->parameters();
  for (size_t i = 0; i < before.size(); ++i)
    if (after[i].grad().defined()) {
      EXPECT_FALSE(torch::equal(before[i], after[i].detach()))
          << "parameter " << i << " (" << after[i].scalar_type() << ") was not updated";
    }
  EXPECT_EQ(step.read().examples, 4);
}

TEST(DeviceStep, UpdatesLearnableFactorsBesideTheModel) { expectLearnableFactorsMove(torch::kCPU); }

TEST(DeviceStep, ATrainingStepOnCudaNeverWaitsForTheDevice) {
  // The trainer's step (forward with deferred input checks, loss, backward, DeviceStep) under
  // LibTorch's sync debug mode: any synchronising CUDA call inside a step throws. The first step
  // (kernel compile and load, allocations) runs before the mode is switched on.
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device: the step's synchronisations are checked on GPU machines "
                    "(scripts/gpu-check.sh)";
  torch::Device device(torch::kCUDA, 0);
  for (const char *attention : {"softmax", "spectra:posrf-mm", "spectra:saderf-orf"}) {
    torch::manual_seed(0);
    spectra::models::LraModel model(tinyModel(attention));
    model->to(device);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    DeviceStep step(optimizer, device, false, 20, {});
    torch::Tensor tokens = torch::randint(1, 20, {4, 24}, torch::kInt64);
    tokens.index_put_({1, torch::indexing::Slice(19)}, 0);  // padding: the key masks are used
    tokens = tokens.to(device);
    torch::Tensor labels = torch::randint(0, 10, {4}, torch::kInt64).to(device);
    auto once = [&](int64_t s) {
      spectra::DeferredInputChecks checks;
      torch::Tensor logits = model->forward(tokens);
      torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
      optimizer.zero_grad();
      step.lossToBackward(loss).backward();
      step.update(s, 1e-3, 1.0, loss, logits.detach().argmax(-1).eq(labels).sum(), 4, checks.nonFinite());
    };
    once(0);
    torch::cuda::synchronize();
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      for (int64_t s = 1; s < 4; ++s)
        once(s);
    } catch (const c10::Error &e) {
      ADD_FAILURE() << attention << ": a step synchronised: " << e.what_without_backtrace();
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    StepWindow w = step.read();
    EXPECT_EQ(w.examples, 16) << attention;
    // The learnable factors (f64) are updated beside the f32 parameters (one fused call per
    // dtype). A learnable recipe's forward still synchronises (its fixed draws are rebuilt on
    // the host), so it is not run under the debug mode.
    if (std::string(attention) == "spectra:saderf-orf")
      expectLearnableFactorsMove(device);
    EXPECT_EQ(w.nonFinite, 0) << attention;
    EXPECT_TRUE(std::isfinite(w.lossSum)) << attention;
  }
}

} // namespace
