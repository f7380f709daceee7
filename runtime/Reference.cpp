//===- Reference.cpp - interpreting components with LibTorch ------------===//

#include "runtime/Reference.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

namespace spectra {
namespace {

/// Evaluates arith/math ops elementwise on tensors (broadcasting); `custom`
/// handles the spectra ops of a program and returns false for unknown ones.
class Evaluator {
public:
  Evaluator(const Descriptor &desc, torch::TensorOptions opts) : desc(desc), opts(opts) {}

  void set(int64_t id, torch::Tensor t) { values[id] = std::move(t); }
  torch::Tensor get(int64_t id) const {
    auto it = values.find(id);
    if (it == values.end())
      throw std::invalid_argument("component '" + desc.component.name + "': value #" +
                                  std::to_string(id) + " is used before it is defined");
    return it->second;
  }

  void run(const Program &program, const std::function<bool(const ProgramOp &)> &custom) {
    for (const ProgramOp &op : program.ops) {
      if (custom(op))
        continue;
      const std::string &n = op.name;
      auto a = [&](size_t i) { return get(op.operands.at(i)); };
      torch::Tensor r;
      if (n == "arith.constant")
        r = torch::full({}, op.number("value"), opts);
      else if (n == "arith.addf")
        r = a(0) + a(1);
      else if (n == "arith.subf")
        r = a(0) - a(1);
      else if (n == "arith.mulf")
        r = a(0) * a(1);
      else if (n == "arith.divf")
        r = a(0) / a(1);
      else if (n == "arith.negf")
        r = -a(0);
      else if (n == "arith.select")
        r = torch::where(a(0).to(torch::kBool), a(1), a(2));
      else if (n == "arith.cmpf")
        r = compare(op.string("predicate"), a(0), a(1));
      else if (n == "math.copysign")
        r = torch::copysign(a(0), a(1));
      else if (n == "arith.maximumf")  // NaN-propagating
        r = torch::maximum(a(0), a(1));
      else if (n == "arith.minimumf")
        r = torch::minimum(a(0), a(1));
      else if (n == "arith.maxnumf")  // the non-NaN operand wins, as LLVM's maxnum
        r = torch::fmax(a(0), a(1));
      else if (n == "arith.minnumf")
        r = torch::fmin(a(0), a(1));
      else if (n == "math.sqrt")
        r = torch::sqrt(a(0));
      else if (n == "math.rsqrt")
        r = torch::rsqrt(a(0));
      else if (n == "math.exp")
        r = torch::exp(a(0));
      else if (n == "math.exp2")
        r = torch::exp2(a(0));
      else if (n == "math.expm1")
        r = torch::expm1(a(0));
      else if (n == "math.log")
        r = torch::log(a(0));
      else if (n == "math.log1p")
        r = torch::log1p(a(0));
      else if (n == "math.powf")
        r = torch::pow(a(0), a(1));
      else if (n == "math.cos")
        r = torch::cos(a(0));
      else if (n == "math.sin")
        r = torch::sin(a(0));
      else if (n == "math.tanh")
        r = torch::tanh(a(0));
      else if (n == "math.absf")
        r = torch::abs(a(0));
      else
        throw std::invalid_argument("component '" + desc.component.name + "': op '" + n +
                                    "' is not supported by the reference interpreter");
      set(op.results.at(0), r);
    }
  }

private:
  torch::Tensor compare(const std::string &predicate, const torch::Tensor &x,
                        const torch::Tensor &y) const {
    if (predicate == "oeq" || predicate == "ueq")
      return x == y;
    if (predicate == "one" || predicate == "une")
      return x != y;
    if (predicate == "olt" || predicate == "ult")
      return x < y;
    if (predicate == "ole" || predicate == "ule")
      return x <= y;
    if (predicate == "ogt" || predicate == "ugt")
      return x > y;
    if (predicate == "oge" || predicate == "uge")
      return x >= y;
    throw std::invalid_argument("component '" + desc.component.name +
                                "': unsupported arith.cmpf predicate '" + predicate + "'");
  }

  const Descriptor &desc;
  torch::TensorOptions opts;
  std::map<int64_t, torch::Tensor> values;
};

/// Binds (wx, xx, ww, params...) to the arguments of a features-shaped program.
void bindFeatureArgs(Evaluator &eval, const Program &program, const torch::Tensor &wx,
                     const torch::Tensor &xx, const torch::Tensor &ww,
                     const std::vector<torch::Tensor> &params) {
  if (program.args.size() != 3 + params.size())
    throw std::invalid_argument("features program takes " + std::to_string(program.args.size()) +
                                " arguments, given " + std::to_string(3 + params.size()));
  eval.set(program.args[0], wx);
  eval.set(program.args[1], xx);
  eval.set(program.args[2], ww);
  for (size_t i = 0; i < params.size(); ++i)
    eval.set(program.args[3 + i], params[i]);
}

void checkActivation(const torch::Tensor &t, const char *name, int64_t d) {
  TORCH_CHECK(t.defined(), "spectra attention: ", name, " is undefined");
  TORCH_CHECK(t.dim() == 4, "spectra attention: ", name, " must be [batch, heads, length, dim], got ",
              t.dim(), " dimension(s) ", t.sizes());
  TORCH_CHECK(t.is_floating_point(), "spectra attention: ", name,
              " must be a floating-point tensor, got ", t.scalar_type());
  if (d > 0)
    TORCH_CHECK(t.size(3) == d, "spectra attention: ", name, " has head dimension ", t.size(3),
                " but the feature map was built for d = ", d);
}

} // namespace

FeatureValues evaluateFeatures(const Descriptor &desc, const torch::Tensor &wx,
                               const torch::Tensor &xx, const torch::Tensor &ww,
                               const std::vector<torch::Tensor> &params) {
  Evaluator eval(desc, wx.options());
  bindFeatureArgs(eval, desc.component.features, wx, xx, ww, params);
  eval.run(desc.component.features, [](const ProgramOp &) { return false; });
  FeatureValues out;
  for (size_t o = 0; o < desc.component.logits.size(); ++o) {
    out.logits.push_back(eval.get(desc.component.logits[o]));
    out.coeffs.push_back(eval.get(desc.component.coeffs[o]));
  }
  return out;
}

std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>>
evaluatePartials(const Descriptor &desc, const torch::Tensor &wx, const torch::Tensor &xx,
                 const torch::Tensor &ww, const std::vector<torch::Tensor> &params) {
  if (!desc.component.partials)
    throw std::invalid_argument("feature map '" + desc.name + "' has no derived partials: " +
                                desc.component.partialsError);
  const Program &p = *desc.component.partials;
  Evaluator eval(desc, wx.options());
  bindFeatureArgs(eval, p, wx, xx, ww, params);
  eval.run(p, [](const ProgramOp &) { return false; });
  size_t outputs = desc.component.logits.size(), args = p.args.size();
  std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>> out(outputs);
  for (size_t o = 0; o < outputs; ++o)
    for (size_t v = 0; v < args; ++v)
      out[o].emplace_back(eval.get(p.yields[2 * (o * args + v)]),
                          eval.get(p.yields[2 * (o * args + v) + 1]));
  return out;
}

namespace {
thread_local DeferredInputChecks *innermostDeferred = nullptr;

/// Adds a bool flag to an accumulated one (on the flag's device: no synchronisation).
void accumulate(torch::Tensor &into, const torch::Tensor &flag) {
  into = into.defined() ? into.logical_or(flag.to(into.device(), /*non_blocking=*/true)) : flag;
}
} // namespace

DeferredInputChecks::DeferredInputChecks() : outer(innermostDeferred) { innermostDeferred = this; }
DeferredInputChecks::~DeferredInputChecks() { innermostDeferred = outer; }
DeferredInputChecks *DeferredInputChecks::active() { return innermostDeferred; }
void DeferredInputChecks::noteNonFinite(const torch::Tensor &flag) { accumulate(nonFiniteFlag, flag); }
void DeferredInputChecks::noteEmptyMask(const torch::Tensor &flag) { accumulate(emptyMaskFlag, flag); }

namespace {
/// A value check: `holds` (a bool scalar) is read now, or inside a DeferredInputChecks scope
/// its negation is noted there, without reading the device.
void checkValue(const torch::Tensor &holds, void (DeferredInputChecks::*note)(const torch::Tensor &),
                const std::string &message) {
  if (DeferredInputChecks *deferred = DeferredInputChecks::active())
    (deferred->*note)(holds.logical_not());
  else
    TORCH_CHECK(holds.item<bool>(), message);
}
} // namespace

void checkAttentionShapes(const Descriptor &desc, const torch::Tensor &q, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights) {
  checkActivation(q, "q", desc.d);
  checkActivation(k, "k", desc.d);
  checkActivation(v, "v", -1);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "spectra attention: q, k and v must have one dtype, got ", q.scalar_type(), ", ",
              k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(),
              "spectra attention: q, k and v must be on one device, got ", q.device(), ", ",
              k.device(), ", ", v.device());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  v.size(1) == q.size(1),
              "spectra attention: batch and heads must agree: q ", q.sizes(), ", k ", k.sizes(),
              ", v ", v.sizes());
  TORCH_CHECK(v.size(2) == k.size(2), "spectra attention: v has ", v.size(2),
              " positions but k has ", k.size(2));
  TORCH_CHECK(weights.W.device() == q.device(), "spectra attention: W is on ", weights.W.device(),
              " but the inputs are on ", q.device());
}

void checkAttentionInputs(const Descriptor &desc, const torch::Tensor &q, const torch::Tensor &k,
                          const torch::Tensor &v, const Weights &weights,
                          const std::optional<torch::Tensor> &keyMask, bool valuesAfterKernels) {
  checkAttentionShapes(desc, q, k, v, weights);
  if (keyMask) {
    TORCH_CHECK(keyMask->scalar_type() == torch::kBool, "spectra attention: the key mask must be bool, got ",
                keyMask->scalar_type());
    TORCH_CHECK(keyMask->dim() == 2 && keyMask->size(0) == k.size(0) && keyMask->size(1) == k.size(2),
                "spectra attention: the key mask must be [batch, key length] = [", k.size(0), ", ",
                k.size(2), "], got ", keyMask->sizes());
    checkValue(keyMask->any(1).all(), &DeferredInputChecks::noteEmptyMask,
               std::string("spectra attention: ") + kEmptyKeyMask);
  }
  // Immediate checks: a finite sum means every element is finite (one inf or NaN makes the sum
  // inf or NaN), and a sum is about half the time of aminmax's pass; only a sum that comes out
  // non-finite (a bad element, or finite elements whose sum overflows) takes the exact test.
  if (!DeferredInputChecks::active()) {
    if (valuesAfterKernels)
      return;
    torch::Tensor sums = torch::stack({q.detach().sum(torch::kFloat32),
                                       k.detach().sum(torch::kFloat32),
                                       v.detach().sum(torch::kFloat32)});
    if (torch::isfinite(sums).all().item<bool>())
      return;
  }
  checkAttentionValues(q, k, v);
}

void checkAttentionValues(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v) {
  // One pass per tensor (min and max propagate NaN and show an inf) and one synchronisation.
  auto [qlo, qhi] = torch::aminmax(q.detach());
  auto [klo, khi] = torch::aminmax(k.detach());
  auto [vlo, vhi] = torch::aminmax(v.detach());
  checkValue(torch::isfinite(torch::stack({qlo, qhi, klo, khi, vlo, vhi}).to(torch::kFloat32)).all(),
             &DeferredInputChecks::noteNonFinite, std::string("spectra attention: ") + kNonFiniteInputs);

}

ReferenceFeatureMap::ReferenceFeatureMap(Descriptor descriptor) : desc(std::move(descriptor)) {}

torch::Tensor ReferenceFeatureMap::queryWeights(const std::optional<torch::Tensor> &queryMask,
                                               int64_t B, int64_t Nq, torch::TensorOptions opts) {
  if (!queryMask)
    return torch::ones({1, 1, Nq, 1}, opts);
  TORCH_CHECK(queryMask->scalar_type() == torch::kBool && queryMask->dim() == 2 &&
                  queryMask->size(0) == B && queryMask->size(1) == Nq,
              "spectra attention: the query mask must be bool [", B, ", ", Nq, "], got ",
              queryMask->scalar_type(), " ", queryMask->sizes());
  checkValue(queryMask->any(1).all(), &DeferredInputChecks::noteEmptyMask,
             c10::str("spectra attention: the query mask must be bool [", B, ", ", Nq,
                      "] keeping at least one query per batch; a row keeps none"));
  return queryMask->to(opts).view({B, 1, -1, 1});
}

torch::Tensor ReferenceFeatureMap::keyWeights(const std::optional<torch::Tensor> &keyMask,
                                             int64_t B, int64_t Nk, torch::TensorOptions opts) {
  return keyMask ? keyMask->to(opts).view({B, 1, -1, 1}) : torch::ones({1, 1, Nk, 1}, opts);
}

RowMoments ReferenceFeatureMap::moments(const torch::Tensor &x, const torch::Tensor &w) {
  return {(x * w).sum(2), (x.square() * w).sum(2),
          w.sum(2).expand({x.size(0), x.size(1), 1})};
}

bool ReferenceFeatureMap::usesStatistics() const {
  for (const ProgramOp &op : desc.component.params.ops)
    if (op.name == "spectra.statistic")
      return true;
  return false;
}

ComponentParams ReferenceFeatureMap::params(const torch::Tensor &q, const torch::Tensor &k,
                                            const std::optional<torch::Tensor> &keyMask,
                                            const std::optional<torch::Tensor> &queryMask,
                                            double inputScale) const {
  const int64_t B = q.size(0), H = q.size(1);
  torch::TensorOptions opts = q.options();
  // Statistics: the masks' weights (1 for every row without a mask).
  torch::Tensor queryWeight = queryWeights(queryMask, B, q.size(2), opts);
  RowMoments qm, km;
  if (usesStatistics()) {
    qm = moments(q, queryWeight);
    km = moments(k, keyWeights(keyMask, B, k.size(2), opts));
  }
  return paramsFromMoments(qm, km, B, H, inputScale, opts);
}

ComponentParams ReferenceFeatureMap::paramsFromMoments(const RowMoments &queries,
                                                       const RowMoments &keys, int64_t B,
                                                       int64_t H, double inputScale,
                                                       torch::TensorOptions opts) const {
  auto statistic = [&](const ProgramOp &op) {
    const RowMoments &m = op.string("side") == "keys" ? keys : queries;
    std::string kind = op.string("kind");
    const double s = inputScale, s2 = inputScale * inputScale;
    if (kind == "mean")
      return m.sum * s / m.count;
    if (kind == "mean_square")
      return m.sumsq * s2 / m.count;
    if (kind == "sum_square")
      return m.sumsq * s2;
    if (kind == "mean_sq_norm")
      return m.sumsq.sum(-1) * s2 / m.count.squeeze(-1);
    if (kind == "count")
      return m.count.squeeze(-1);
    throw std::invalid_argument("component '" + desc.component.name + "': unknown statistic '" +
                                kind + "'");
  };

  Evaluator eval(desc, opts);
  const Program &p = desc.component.params;
  eval.set(p.args.at(0), torch::full({}, static_cast<double>(desc.m), opts));
  eval.set(p.args.at(1), torch::full({}, static_cast<double>(desc.d), opts));
  eval.run(p, [&](const ProgramOp &op) {
    if (op.name == "spectra.statistic") {
      eval.set(op.results.at(0), statistic(op));
    } else if (op.name == "spectra.dot") {
      eval.set(op.results.at(0), (eval.get(op.operands[0]) * eval.get(op.operands[1])).sum(-1));
    } else if (op.name == "spectra.splat") {  // a scalar broadcasts against [B, H, d]
      eval.set(op.results.at(0), eval.get(op.operands[0]));
    } else if (op.name == "spectra.option") {
      eval.set(op.results.at(0), torch::full({}, desc.option(op.string("name")), opts));
    } else {
      return false;
    }
    return true;
  });

  ComponentParams out;
  for (int64_t id : desc.component.scalars)
    out.scalars.push_back(eval.get(id).expand({B, H}));
  if (desc.component.queryScale) {
    out.queryScale = eval.get(*desc.component.queryScale).expand({B, H, desc.d});
    out.keyScale = eval.get(*desc.component.keyScale).expand({B, H, desc.d});
  }
  return out;
}

FeatureTerms ReferenceFeatureMap::featureTerms(const torch::Tensor &xIn, Side side,
                                              const ComponentParams &params,
                                              const Weights &weights) const {
  checkActivation(xIn, side == Side::Queries ? "queries" : "keys", desc.d);
  const int64_t B = xIn.size(0), H = xIn.size(1), N = xIn.size(2), m = desc.m;
  torch::Tensor x = xIn;
  torch::Tensor scale = side == Side::Queries ? params.queryScale : params.keyScale;
  if (scale.defined())
    x = x * scale.unsqueeze(2);
  torch::Tensor W = weights.W.to(x.options());
  TORCH_CHECK(W.dim() == 2 && W.size(0) == m && W.size(1) == desc.d,
              "spectra features: W must be [", m, ", ", desc.d, "], got ", W.sizes());

  std::vector<torch::Tensor> scalars;
  for (const torch::Tensor &p : params.scalars)
    scalars.push_back(p.to(x.options()).view({B, H, 1, 1}));
  FeatureValues values = evaluateFeatures(desc, x.matmul(W.t()),         // wx [B, H, N, m]
                                          x.square().sum(-1, true),      // xx [B, H, N, 1]
                                          W.square().sum(-1).view({1, 1, 1, m}), scalars);
  std::vector<torch::Tensor> logits, coeffs;
  for (size_t o = 0; o < values.logits.size(); ++o) {
    logits.push_back(values.logits[o].expand({B, H, N, m}));
    coeffs.push_back(values.coeffs[o].expand({B, H, N, m}));
  }
  FeatureTerms terms{torch::stack(logits, 3), torch::stack(coeffs, 3)};  // [B, H, N, K, m]
  if (side == Side::Keys && weights.rowWeights)  // quadrature weights relative to the uniform 1/m
    terms.coeffs = terms.coeffs * (weights.rowWeights->to(x.options()) * static_cast<double>(m))
                                      .view({1, 1, 1, 1, m});
  return terms;
}

torch::Tensor ReferenceFeatureMap::features(const torch::Tensor &x, Side side,
                                            const ComponentParams &params, const Weights &weights,
                                            const std::optional<torch::Tensor> &keyMask) const {
  FeatureTerms t = featureTerms(x, side, params, weights);
  torch::Tensor phi = t.coeffs * torch::exp(t.logits);
  if (side == Side::Keys && keyMask)  // padded keys contribute nothing: mask phi(k), not k
    phi = phi.masked_fill(keyMask->to(torch::kBool).view({x.size(0), 1, x.size(2), 1, 1})
                              .logical_not(),
                          0.0);
  return phi.reshape({x.size(0), x.size(1), x.size(2), desc.component.outputs * desc.m});
}

namespace {

/// Causal attention of the feature terms ([B, H, N, K, m]; keys' coefficients with the row
/// weights), v [B, H, N, dv], keep [B, 1, N, 1, 1] or undefined (AttentionOptions::causal).
AttentionResult causalAttention(const FeatureTerms &tq, const FeatureTerms &tk,
                                const torch::Tensor &v, const torch::Tensor &keep,
                                Stabilizer stabilizer, torch::ScalarType outType) {
  const int64_t B = v.size(0), H = v.size(1), N = v.size(2);
  const double inf = std::numeric_limits<double>::infinity(), g = kDenominatorGuard;
  torch::Tensor Lq = tq.logits.reshape({B, H, N, -1}), cq = tq.coeffs.reshape({B, H, N, -1});
  torch::Tensor Lk = tk.logits.reshape({B, H, N, -1}), ck = tk.coeffs.reshape({B, H, N, -1});
  const int64_t F = Lq.size(3);
  if (keep.defined())
    Lk = Lk.masked_fill(keep.view({B, 1, N, 1}).logical_not(), -inf);
  // The guard and the 0 of a row no kept key reaches, as in the bidirectional readout.
  auto finish = [&](const torch::Tensor &num, torch::Tensor den, const torch::Tensor &total) {
    torch::Tensor fired = den.detach().abs() <= g * total;
    torch::Tensor reached = total > 0;
    den = torch::where(fired, den + 2 * g * total, den);
    den = torch::where(reached, den, torch::ones_like(den));
    return std::pair{num / den, (fired & reached).squeeze(-1).to(torch::kFloat32).sum(-1)};
  };
  // exp(x) where `live`, else 0, with no NaN in either direction of autograd.
  auto expWhere = [](const torch::Tensor &live, const torch::Tensor &x) {
    return torch::where(live, torch::exp(torch::where(live, x, torch::zeros_like(x))),
                        torch::zeros_like(x));
  };
  if (stabilizer == Stabilizer::None) {
    torch::Tensor phiQ = cq * torch::exp(Lq);
    torch::Tensor phiK = expWhere(Lk > -inf, Lk) * ck;
    torch::Tensor A = phiQ.matmul(phiK.transpose(2, 3)).tril();
    torch::Tensor T = phiQ.detach().abs().matmul(phiK.detach().abs().transpose(2, 3)).tril();
    auto [out, guarded] = finish(A.matmul(v), A.sum(-1, true), T.sum(-1, true));
    return {out.to(outType), guarded};
  }
  auto f32 = Lq.options();
  torch::Tensor S = torch::zeros({B, H, F, v.size(3)}, f32), z = torch::zeros({B, H, F, 1}, f32),
                zabs = torch::zeros({B, H, F, 1}, f32), c = torch::full({B, H, F}, -inf, f32);
  std::vector<torch::Tensor> outs;
  torch::Tensor guarded = torch::zeros({B, H}, torch::TensorOptions().dtype(torch::kFloat32));
  std::function<void(int64_t, int64_t)> chunk = [&](int64_t a, int64_t b) {
    torch::Tensor lq = Lq.narrow(2, a, b - a), lk = Lk.narrow(2, a, b - a);
    // The running maximum per feature down the chunk (constants for autograd), each row's
    // reference M_r, and the chunk-end reference of its keys.
    torch::Tensor cm = torch::maximum(std::get<0>(torch::cummax(lk.detach(), 2)), c.unsqueeze(2));
    torch::Tensor cend = cm.select(2, b - a - 1);
    torch::Tensor M = (lq.detach() + cm).amax(-1, true);
    M = torch::where(M == -inf, torch::zeros_like(M), M);
    if (b - a > 1 &&
        ((lq.detach() + cend.unsqueeze(2)).amax(-1, true) - M).max().item<double>() > 60) {
      chunk(a, (a + b) / 2);
      chunk((a + b) / 2, b);
      return;
    }
    torch::Tensor rr = torch::where(c == cend, torch::ones_like(c), torch::exp(c - cend)).unsqueeze(-1);
    S = S * rr;
    z = z * rr;
    zabs = zabs * rr;
    c = cend;
    torch::Tensor qa = cq.narrow(2, a, b - a) * torch::exp(lq + cend.unsqueeze(2) - M);
    torch::Tensor live = lk > -inf;
    torch::Tensor kf = ck.narrow(2, a, b - a) * expWhere(live, lk - cend.unsqueeze(2));
    torch::Tensor vc = v.narrow(2, a, b - a);
    torch::Tensor P = qa.matmul(kf.transpose(2, 3)).tril();
    torch::Tensor Pabs = qa.detach().abs().matmul(kf.detach().abs().transpose(2, 3)).tril();
    auto [out, fired] =
        finish(qa.matmul(S) + P.matmul(vc), qa.matmul(z) + P.sum(-1, true),
               qa.detach().abs().matmul(zabs) + Pabs.sum(-1, true));
    outs.push_back(out);
    guarded = guarded + fired.to(torch::kCPU);
    S = S + kf.transpose(2, 3).matmul(vc);
    z = z + kf.sum(2).unsqueeze(-1);
    zabs = zabs + kf.detach().abs().sum(2).unsqueeze(-1);
  };
  for (int64_t a = 0; a < N; a += kCausalChunk)
    chunk(a, std::min(N, a + kCausalChunk));
  return {torch::cat(outs, 2).to(outType), guarded.to(v.device())};
}

} // namespace

AttentionResult ReferenceFeatureMap::attentionWithStats(const torch::Tensor &q,
                                                        const torch::Tensor &k,
                                                        const torch::Tensor &v,
                                                        const Weights &weights,
                                                        const std::optional<torch::Tensor> &keyMask,
                                                        const AttentionOptions &options) const {
  checkAttentionInputs(desc, q, k, v, weights, keyMask);

  // Half precisions are computed in float32 and cast back.
  auto work = [](const torch::Tensor &t) {
    return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16
               ? t.to(torch::kFloat32)
               : t;
  };
  double s = options.scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  torch::Tensor qs = work(q) * s, ks = work(k) * s, vs = work(v);
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), Nk = k.size(2);
  TORCH_CHECK(!options.causal || !usesStatistics(), "spectra causal attention: component '",
              desc.component.name, "' ", kCausalStatistics);
  TORCH_CHECK(!options.causal || Nq == Nk, "spectra causal attention: q and k must have one "
              "length, got ", Nq, " queries and ", Nk, " keys");
  ComponentParams p = params(qs, ks, keyMask, options.queryMask);
  FeatureTerms tq = featureTerms(qs, Side::Queries, p, weights);
  FeatureTerms tk = featureTerms(ks, Side::Keys, p, weights);
  torch::Tensor Lq = tq.logits, Lk = tk.logits;  // [B, H, N, K, m]

  const double inf = std::numeric_limits<double>::infinity();
  torch::Tensor keep;  // [B, 1, Nk, 1, 1]
  if (keyMask)
    keep = keyMask->to(torch::kBool).view({B, 1, Nk, 1, 1});
  // The stabiliser's constants are held constant for autograd: the output does not depend on them.
  if (options.stabilizer != Stabilizer::None) {
    torch::Tensor l = Lk.detach();
    if (keep.defined())  // padded keys do not set the constants
      l = l.masked_fill(keep.logical_not(), -inf);
    torch::Tensor c = options.stabilizer == Stabilizer::Exact ? l.amax({2}, true)          // per feature
                                                              : l.amax({2, 3, 4}, true);  // per slice
    c = torch::where(torch::isfinite(c), c, torch::zeros_like(c));
    Lk = Lk - c;
    if (options.stabilizer == Stabilizer::Exact)
      Lq = Lq + c;  // the query side carries each feature's key constant
    Lq = Lq - Lq.detach().amax({3, 4}, true);  // one constant per query
  }
  if (options.causal)
    return causalAttention(tq, tk, vs, keep, options.stabilizer, q.scalar_type());
  torch::Tensor phiQ = (tq.coeffs * torch::exp(Lq)).reshape({B, H, Nq, -1});
  // Padded keys contribute nothing: mask phi(k), not k. Their logits are masked before exp
  // too: exp may overflow there (the constants cover kept keys only), and inf * 0 would
  // reach the gradient as NaN.
  if (keep.defined())
    Lk = Lk.masked_fill(keep.logical_not(), -inf);
  torch::Tensor phiK = tk.coeffs * torch::exp(Lk);
  if (keep.defined())
    phiK = phiK.masked_fill(keep.logical_not(), 0.0);
  phiK = phiK.reshape({B, H, Nk, -1});
  torch::Tensor S = phiK.transpose(2, 3).matmul(vs);      // [B, H, F, dv]
  torch::Tensor z = phiK.sum(2).unsqueeze(-1);            // [B, H, F, 1]
  torch::Tensor den = phiQ.matmul(z);                     // [B, H, Nq, 1]
  // The guard on signed estimators (kDenominatorGuard); T is held constant for autograd.
  torch::Tensor T = phiQ.detach().abs().matmul(phiK.detach().abs().sum(2).unsqueeze(-1));
  torch::Tensor fired = den.detach().abs() <= kDenominatorGuard * T;
  den = torch::where(fired, den + 2 * kDenominatorGuard * T, den);
  torch::Tensor out = phiQ.matmul(S) / den;
  return {out.to(q.scalar_type()), fired.squeeze(-1).to(torch::kFloat32).sum(-1)};
}

namespace {
/// Decoding computes in float32, or float64 for float64 inputs.
torch::ScalarType decodeType(const torch::Tensor &t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}
} // namespace

DecodeState ReferenceFeatureMap::prefill(const torch::Tensor &k, const torch::Tensor &v,
                                         const Weights &weights,
                                         const std::optional<torch::Tensor> &keyMask,
                                         std::optional<double> scale) const {
  TORCH_CHECK(!usesStatistics(), "spectra causal decoding: component '", desc.component.name,
              "' ", kCausalStatistics);
  checkAttentionInputs(desc, k, k, v, weights, keyMask);
  torch::NoGradGuard noGrad;
  const int64_t B = k.size(0), H = k.size(1), N = k.size(2), F = desc.numFeatures();
  torch::ScalarType type = decodeType(k);
  double s = scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  torch::Tensor ks = k.to(type) * s, vs = v.to(type);
  Weights w = weights;
  w.W = weights.W.to(type);
  ComponentParams p = params(ks, ks, std::nullopt, std::nullopt);
  FeatureTerms tk = featureTerms(ks, Side::Keys, p, w);
  torch::Tensor Lk = tk.logits.reshape({B, H, N, F}), ck = tk.coeffs.reshape({B, H, N, F});
  const double inf = std::numeric_limits<double>::infinity();
  if (keyMask)
    Lk = Lk.masked_fill(keyMask->to(torch::kBool).view({B, 1, N, 1}).logical_not(), -inf);
  DecodeState st;
  st.c = N > 0 ? Lk.amax(2) : torch::full({B, H, F}, -inf, Lk.options());
  torch::Tensor live = Lk > -inf;
  torch::Tensor e = torch::where(live, torch::exp(torch::where(live, Lk - st.c.unsqueeze(2),
                                                               torch::zeros_like(Lk))),
                                 torch::zeros_like(Lk)) *
                    ck;
  st.S = e.transpose(2, 3).matmul(vs);
  st.z = e.sum(2);
  st.zabs = e.abs().sum(2);
  st.length = N;
  return st;
}

torch::Tensor ReferenceFeatureMap::decode(const torch::Tensor &q, const torch::Tensor &k,
                                          const torch::Tensor &v, const Weights &weights,
                                          DecodeState &state, std::optional<double> scale) const {
  TORCH_CHECK(!usesStatistics(), "spectra causal decoding: component '", desc.component.name,
              "' ", kCausalStatistics);
  checkAttentionInputs(desc, q, k, v, weights, std::nullopt);
  TORCH_CHECK(q.size(2) == 1 && k.size(2) == 1, "spectra causal decoding: one token per step, "
              "got q ", q.sizes(), " and k ", k.sizes());
  torch::NoGradGuard noGrad;
  const int64_t B = q.size(0), H = q.size(1), F = desc.numFeatures(), dv = v.size(3);
  torch::ScalarType type = decodeType(q);
  const double inf = std::numeric_limits<double>::infinity(), g = kDenominatorGuard;
  auto opts = q.options().dtype(type);
  if (!state.c.defined()) {  // the empty state
    state.S = torch::zeros({B, H, F, dv}, opts);
    state.z = torch::zeros({B, H, F}, opts);
    state.zabs = torch::zeros({B, H, F}, opts);
    state.c = torch::full({B, H, F}, -inf, opts);
    state.length = 0;
  }
  TORCH_CHECK(state.S.sizes() == torch::IntArrayRef({B, H, F, dv}) &&
                  state.S.device() == q.device() && state.S.scalar_type() == type,
              "spectra causal decoding: the state is ", state.S.sizes(), " ",
              state.S.scalar_type(), " on ", state.S.device(), "; this step needs [", B, ", ", H,
              ", ", F, ", ", dv, "] ", type, " on ", q.device());
  double s = scale.value_or(std::pow(static_cast<double>(desc.d), -0.25));
  torch::Tensor qs = q.to(type) * s, ks = k.to(type) * s, vs = v.to(type).squeeze(2);
  Weights w = weights;
  w.W = weights.W.to(type);
  ComponentParams p = params(qs, ks, std::nullopt, std::nullopt);
  FeatureTerms tq = featureTerms(qs, Side::Queries, p, w), tk = featureTerms(ks, Side::Keys, p, w);
  torch::Tensor Lq = tq.logits.reshape({B, H, F}), cq = tq.coeffs.reshape({B, H, F});
  torch::Tensor Lk = tk.logits.reshape({B, H, F}), ck = tk.coeffs.reshape({B, H, F});
  // The key enters: the running maximum rises, the state is rescaled by alpha <= 1.
  torch::Tensor c = torch::maximum(state.c, Lk);
  torch::Tensor alpha = torch::where(state.c == c, torch::ones_like(c), torch::exp(state.c - c));
  torch::Tensor beta = torch::exp(Lk - c) * ck;
  state.S = alpha.unsqueeze(-1) * state.S + beta.unsqueeze(-1) * vs.unsqueeze(2);
  state.z = alpha * state.z + beta;
  state.zabs = alpha * state.zabs + beta.abs();
  state.c = c;
  state.length += 1;
  // The query reads it, referenced to its own maximum.
  torch::Tensor t = Lq + c;
  torch::Tensor qh = cq * torch::exp(t - t.amax(-1, true));
  torch::Tensor num = qh.unsqueeze(2).matmul(state.S).squeeze(2);  // [B, H, dv]
  torch::Tensor den = (qh * state.z).sum(-1, true), total = (qh.abs() * state.zabs).sum(-1, true);
  torch::Tensor fired = den.abs() <= g * total;
  den = torch::where(fired, den + 2 * g * total, den);
  den = torch::where(total > 0, den, torch::ones_like(den));
  return (num / den).unsqueeze(2).to(q.scalar_type());
}

} // namespace spectra
