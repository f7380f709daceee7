//===- TrainStep.cpp - the optimiser step, decided on the device ---------===//

#include "models/TrainStep.h"

#include <map>
#include <stdexcept>

namespace spectra::models {
namespace {

using torch::Tensor;

/// The parameter's AdamW state, created (zeros, step 0) when the optimiser has none yet.
torch::optim::AdamWParamState &stateOf(torch::optim::AdamW &optimizer, const Tensor &p) {
  auto &states = optimizer.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    it = states.emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
  }
  return static_cast<torch::optim::AdamWParamState &>(*it->second);
}

const torch::optim::AdamWOptions &optionsOf(torch::optim::AdamW &optimizer) {
  if (optimizer.param_groups().size() != 1)
    throw std::invalid_argument("DeviceStep: the optimiser must have one parameter group, it has " +
                                std::to_string(optimizer.param_groups().size()));
  return static_cast<const torch::optim::AdamWOptions &>(optimizer.param_groups()[0].options());
}

} // namespace

DeviceStep::DeviceStep(torch::optim::AdamW &optimizer, const torch::Device &device,
                       bool lossScaling, int64_t divergeAfter, const StepCounters &from)
    : optimizer(optimizer), lossScaling(lossScaling), divergeAfter(divergeAfter) {
  if (optionsOf(optimizer).amsgrad())
    throw std::invalid_argument("DeviceStep: AMSGrad is not supported");
  torch::NoGradGuard noGrad;
  for (const Tensor &p : optimizer.param_groups()[0].params()) {
    if (p.device() != device)
      throw std::invalid_argument("DeviceStep: a parameter is on " + p.device().str() +
                                  ", the step runs on " + device.str());
    torch::optim::AdamWParamState &s = stateOf(optimizer, p);
    params.push_back(p);
    expAvg.push_back(s.exp_avg());
    expAvgSq.push_back(s.exp_avg_sq());
    // The fused kernel reads the step count from an f32 tensor on the parameter's device
    // (exact up to 2^24 steps).
    stepCounts.push_back(torch::full({}, static_cast<double>(s.step()),
                                     torch::TensorOptions().dtype(torch::kFloat32).device(device)));
  }
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  lossSum = torch::zeros({}, f64);
  correct = torch::zeros({}, i64);
  examples = torch::zeros({}, i64);
  nonFinite = torch::zeros({}, i64);
  firstNonFinite = torch::zeros({}, i64);
  skipped = torch::full({}, from.skipped, i64);
  nonFiniteRun = torch::full({}, from.nonFiniteRun, i64);
  divergedAt = torch::full({}, from.divergedAt, i64);
  haltedFlag = torch::full({}, from.divergedAt > 0, i64.dtype(torch::kBool));
  scale = torch::full({}, from.lossScale, f64.dtype(torch::kFloat32));
  goodSteps = torch::full({}, from.goodSteps, i64);
}

Tensor DeviceStep::lossToBackward(const Tensor &loss) const {
  return lossScaling ? loss * scale : loss;
}

void DeviceStep::update(int64_t step, double lr, double clip, const Tensor &loss,
                        const Tensor &batchCorrect, int64_t batchExamples,
                        const Tensor &inputsBad) {
  torch::NoGradGuard noGrad;
  std::vector<Tensor> ps, grads, m, v, steps;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].grad().defined()) {
      ps.push_back(params[i]);
      grads.push_back(params[i].grad());
      m.push_back(expAvg[i]);
      v.push_back(expAvgSq[i]);
      steps.push_back(stepCounts[i]);
    }

  // LibTorch's fused and multi-tensor kernels want one dtype per call on CUDA: the learnable
  // random-feature factors are f64 parameters beside the model's f32 ones.
  std::map<torch::ScalarType, std::vector<size_t>> byDtype;
  for (size_t i = 0; i < ps.size(); ++i)
    byDtype[ps[i].scalar_type()].push_back(i);
  auto pick = [](const std::vector<Tensor> &all, const std::vector<size_t> &which) {
    std::vector<Tensor> out;
    for (size_t i : which)
      out.push_back(all[i]);
    return out;
  };

  Tensor lossBad = torch::isfinite(loss.detach()).logical_not();
  if (inputsBad.defined())
    lossBad = lossBad.logical_or(inputsBad.to(lossBad.device()).to(torch::kBool));
  Tensor overflow = torch::zeros_like(lossBad), normBad = torch::zeros_like(lossBad);
  if (!grads.empty()) {
    if (lossScaling) {
      // Unscaled first, then checked: a gradient that overflows in the unscaling itself (a
      // scale below 1) is an overflow too, as when the trainer divided and then checked.
      Tensor found = torch::zeros({1}, scale.options()), one = torch::ones({1}, scale.options());
      torch::_foreach_div_(grads, scale);
      for (const auto &[dtype, which] : byDtype)
        torch::_amp_foreach_non_finite_check_and_unscale_(pick(grads, which), found, one);
      overflow = found.squeeze(0).to(torch::kBool);
    }
    // torch::nn::utils::clip_grad_norm_'s arithmetic, without its read of the norm.
    std::vector<Tensor> norms = torch::_foreach_norm(grads, 2);
    Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
    torch::_foreach_mul_(grads, torch::clamp(clip / (total + 1e-6), std::nullopt, 1.0));
    normBad = torch::isfinite(total).logical_not();
  }
  // Non-finite: the loss, attention inputs or the gradients' norm (an fp16 overflow is the loss
  // scale's business, not the model's). Halted: the run has diverged; nothing changes any more.
  Tensor active = haltedFlag.logical_not();
  Tensor bad = lossBad.logical_or(normBad.logical_and(overflow.logical_not()));
  Tensor skip = bad.logical_or(overflow).logical_or(haltedFlag);
  if (!ps.empty()) {
    // The step counts advance only for applied updates; the kernel itself returns early when
    // found_inf is set (no weight decay, moments untouched).
    Tensor skipF = skip.to(torch::kFloat32);
    torch::_foreach_add_(steps, 1 - skipF);
    const torch::optim::AdamWOptions &o = optionsOf(optimizer);
    for (const auto &[dtype, which] : byDtype)
      torch::_fused_adamw_(pick(ps, which), pick(grads, which), pick(m, which), pick(v, which), {},
                           pick(steps, which), lr, std::get<0>(o.betas()), std::get<1>(o.betas()),
                           o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false,
                           std::nullopt, skipF);
  }

  Tensor countedBad = bad.logical_and(active), counted = bad.logical_not().logical_and(active);
  lossSum.add_(torch::where(counted, loss.detach().to(torch::kFloat64) * batchExamples, 0.0));
  correct.add_(torch::where(counted, batchCorrect.to(torch::kInt64), 0));
  examples.add_(counted.to(torch::kInt64) * batchExamples);
  nonFinite.add_(countedBad.to(torch::kInt64));
  skipped.add_(countedBad.to(torch::kInt64));
  firstNonFinite = torch::where(countedBad.logical_and(firstNonFinite == 0), step + 1, firstNonFinite);
  nonFiniteRun = torch::where(active, torch::where(bad, nonFiniteRun + 1, 0), nonFiniteRun);
  Tensor diverges = active.logical_and(nonFiniteRun >= divergeAfter);
  divergedAt = torch::where(diverges, step + 1, divergedAt);
  if (lossScaling) {
    // The trainer's rules: a step whose loss was finite counts towards the 2000 clean steps
    // that double the scale unless its gradients overflowed; an overflow (or a non-finite norm,
    // after that count) halves it. A step with a non-finite loss leaves the scale alone.
    Tensor considered = active.logical_and(lossBad.logical_not());
    Tensor counts = considered.logical_and(overflow.logical_not());
    Tensor backOff = considered.logical_and(overflow.logical_or(normBad));
    Tensor next = goodSteps + 1;
    Tensor grow = counts.logical_and(next >= 2000);
    scale = scale * torch::where(grow, 2.0, 1.0) * torch::where(backOff, 0.5, 1.0);
    goodSteps = torch::where(backOff.logical_or(grow), 0, torch::where(counts, next, goodSteps));
  }
  haltedFlag = haltedFlag.logical_or(diverges);
}

StepWindow DeviceStep::read() {
  Tensor all = torch::stack({lossSum, correct.to(torch::kFloat64), examples.to(torch::kFloat64),
                             nonFinite.to(torch::kFloat64), firstNonFinite.to(torch::kFloat64),
                             skipped.to(torch::kFloat64), nonFiniteRun.to(torch::kFloat64),
                             divergedAt.to(torch::kFloat64), scale.to(torch::kFloat64),
                             goodSteps.to(torch::kFloat64)})
                   .cpu();
  const double *x = all.data_ptr<double>();
  StepWindow w;
  w.lossSum = x[0];
  w.correct = static_cast<int64_t>(x[1]);
  w.examples = static_cast<int64_t>(x[2]);
  w.nonFinite = static_cast<int64_t>(x[3]);
  w.firstNonFinite = static_cast<int64_t>(x[4]);
  w.counters.skipped = static_cast<int64_t>(x[5]);
  w.counters.nonFiniteRun = static_cast<int64_t>(x[6]);
  w.counters.divergedAt = static_cast<int64_t>(x[7]);
  w.counters.lossScale = x[8];
  w.counters.goodSteps = static_cast<int64_t>(x[9]);
  lossSum.zero_();
  correct.zero_();
  examples.zero_();
  nonFinite.zero_();
  firstNonFinite.zero_();
  return w;
}

bool DeviceStep::halted() const { return haltedFlag.item<bool>(); }

void DeviceStep::syncOptimizerState() {
  if (params.empty())
    return;
  Tensor counts = torch::stack(stepCounts).to(torch::kCPU, torch::kFloat64);
  for (size_t i = 0; i < params.size(); ++i)
    stateOf(optimizer, params[i]).step(static_cast<int64_t>(counts[i].item<double>()));
}

} // namespace spectra::models
