//===- WeightFactory.cpp - the weight-recipe interpreter ------------------===//

#include "runtime/WeightFactory.h"

#include <unordered_map>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace spectra {
namespace {

/// A recipe value: an index (sizes) or a tensor.
struct Value {
  bool isIndex = false;
  int64_t index = 0;
  torch::Tensor tensor;
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The first n primes (Halton bases).
std::vector<int64_t> primes(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t candidate = 2; static_cast<int64_t>(out.size()) < n; ++candidate) {
    bool prime = true;
    for (int64_t p : out) {
      if (p * p > candidate)
        break;
      if (candidate % p == 0) {
        prime = false;
        break;
      }
    }
    if (prime)
      out.push_back(candidate);
  }
  return out;
}

/// Sylvester's Walsh-Hadamard matrix of size n (a power of two), entries +-1.
torch::Tensor hadamard(int64_t n, const torch::TensorOptions &opts) {
  torch::Tensor h = torch::ones({1, 1}, opts);
  while (h.size(0) < n)
    h = torch::cat({torch::cat({h, h}, 1), torch::cat({h, -h}, 1)}, 0);
  return h;
}

bool isPowerOfTwo(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

class Interpreter {
public:
  Interpreter(const Descriptor &desc, int64_t seed, torch::TensorOptions opts,
              const std::map<std::string, torch::Tensor> *factors)
      : desc(desc), seed(seed), opts(opts), factors(factors) {}

  Weights run() {
    const Program &recipe = desc.recipe;
    values[recipe.args[0]] = Value{true, desc.m, {}};
    values[recipe.args[1]] = Value{true, desc.d, {}};
    runBlock(recipe, /*replica=*/"");
    Weights out;
    out.W = tensor(recipe.yields[0], "the recipe's W");
    if (out.W.dim() != 2 || out.W.size(0) != desc.m || out.W.size(1) != desc.d)
      fail("recipe '" + desc.recipeName + "' produced W of shape " + shape(out.W) + ", expected [" +
           std::to_string(desc.m) + ", " + std::to_string(desc.d) + "]");
    if (recipe.yields.size() == 2)
      out.rowWeights = tensor(recipe.yields[1], "the recipe's row weights");
    out.learnable = std::move(learnable);
    return out;
  }

private:
  [[noreturn]] void fail(const std::string &what) const {
    throw std::invalid_argument("weight recipe '" + desc.recipeName + "' of feature map '" +
                                desc.name + "': " + what);
  }

  static std::string shape(const torch::Tensor &t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.dim(); ++i)
      s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
  }

  int64_t index(int64_t id, const std::string &what) {
    auto it = values.find(id);
    if (it == values.end() || !it->second.isIndex)
      fail(what + " is not an index value");
    return it->second.index;
  }

  torch::Tensor tensor(int64_t id, const std::string &what) {
    auto it = values.find(id);
    if (it == values.end() || it->second.isIndex)
      fail(what + " is not a tensor value");
    return it->second.tensor;
  }

  std::vector<int64_t> sizes(const ProgramOp &op) {
    std::vector<int64_t> out;
    for (size_t i = 0; i < op.operands.size(); ++i) {
      int64_t n = index(op.operands[i], op.name + " size #" + std::to_string(i));
      if (n <= 0)
        fail(op.name + ": size #" + std::to_string(i) + " is " + std::to_string(n) +
             "; sizes must be positive");
      out.push_back(n);
    }
    return out;
  }

  /// An independent CPU generator per (op, replica): the same seed gives the
  /// same draws whatever else the recipe contains after it.
  at::Generator generator(size_t opIndex, const std::string &replica) {
    uint64_t h = splitmix64(static_cast<uint64_t>(seed));
    h = splitmix64(h ^ (opIndex + 1));
    for (char c : replica)
      h = splitmix64(h ^ static_cast<uint64_t>(c));
    return at::make_generator<at::CPUGeneratorImpl>(h);
  }

  /// Draw results are made in float64 on the CPU, then moved to the working options.
  torch::Tensor place(const torch::Tensor &t) { return t.to(opts); }

  /// A learnable draw: the given factor if any, else the fresh draw as a new leaf.
  torch::Tensor learn(const ProgramOp &op, const std::string &replica, torch::Tensor drawn) {
    std::string name = (replica.empty() ? "" : replica + ".") + op.mnemonic() +
                       std::to_string(op.results.at(0));
    torch::Tensor value;
    if (factors) {
      auto it = factors->find(name);
      if (it == factors->end())
        fail("no value given for the learnable factor '" + name + "'");
      if (it->second.sizes() != drawn.sizes())
        fail("learnable factor '" + name + "' has shape " + shape(it->second) + ", expected " +
             shape(drawn));
      value = it->second;
    } else {
      value = drawn.detach().clone().set_requires_grad(true);
    }
    learnable.emplace_back(name, value);
    return value;
  }

  void runBlock(const Program &block, const std::string &replica) {
    for (size_t i = 0; i < block.ops.size(); ++i)
      runOp(block.ops[i], opCounter++, replica);
  }

  void set(const ProgramOp &op, torch::Tensor t, size_t result = 0) {
    values[op.results.at(result)] = Value{false, 0, std::move(t)};
  }

  void runOp(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    const std::string m = op.mnemonic();
    if (op.name == "arith.constant") {
      if (!op.types.empty() && op.types[0] == "index")
        values[op.results[0]] = Value{true, static_cast<int64_t>(op.number("value")), {}};
      else
        set(op, torch::full({}, op.number("value"), opts));
      return;
    }
    if (op.name == "arith.addi" || op.name == "arith.muli") {
      int64_t a = index(op.operands.at(0), op.name + " operand"),
              b = index(op.operands.at(1), op.name + " operand");
      values[op.results[0]] = Value{true, op.name == "arith.addi" ? a + b : a * b, {}};
      return;
    }
    if (op.name.rfind("spectra.", 0) != 0)
      fail("op '" + op.name + "' is not a weight-recipe building block");

    using Handler = void (Interpreter::*)(const ProgramOp &, size_t, const std::string &);
    // One handler per building block, by mnemonic.
    static const std::unordered_map<std::string, Handler> handlers = {
        {"gaussian", &Interpreter::opGaussian},
        {"uniform", &Interpreter::opUniform},
        {"rademacher", &Interpreter::opRademacher},
        {"chi", &Interpreter::opChi},
        {"permutation", &Interpreter::opPermutation},
        {"low_discrepancy", &Interpreter::opLowDiscrepancy},
        {"inverse_normal_cdf", &Interpreter::opInverseNormalCdf},
        {"orthogonalize", &Interpreter::opOrthogonalize},
        {"scale_rows", &Interpreter::opScaleRows},
        {"scale", &Interpreter::opScale},
        {"next_pow2", &Interpreter::opNextPow2},
        {"hadamard_diagonal_chain", &Interpreter::opHadamardDiagonalChain},
        {"take_cols", &Interpreter::opTakeCols},
        {"moment_match", &Interpreter::opMomentMatch},
        {"sparse_grid", &Interpreter::opSparseGrid},
        {"spherical_radial", &Interpreter::opSphericalRadial},
        {"rotate", &Interpreter::opRotate},
        {"simplex", &Interpreter::opSimplex},
        {"norm_coupling", &Interpreter::opNormCoupling},
        {"circulant", &Interpreter::opCirculant},
        {"fastfood", &Interpreter::opFastfood},
        {"recipe_option", &Interpreter::opRecipeOption},
        {"ceil_div", &Interpreter::opCeilDiv},
        {"eye", &Interpreter::opEye},
        {"zeros", &Interpreter::opZeros},
        {"affine", &Interpreter::opAffine},
        {"glorot", &Interpreter::opGlorot},
        {"linear", &Interpreter::opLinear},
        {"batch_norm", &Interpreter::opBatchNorm},
        {"activation", &Interpreter::opActivation},
        {"stack_blocks", &Interpreter::opStackBlocks}};
    auto it = handlers.find(m);
    if (it == handlers.end())
      fail("op '" + op.name + "' is not supported by the weight factory");
    (this->*it->second)(op, opIndex, replica);
  }

  // --- the building blocks (spectra.* ops of weight recipes) ---------------------------------

  const torch::TensorOptions f64 = torch::TensorOptions().dtype(torch::kFloat64);

  void opGaussian(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    at::Generator gen = generator(opIndex, replica);
    torch::Tensor t = place(torch::randn(sizes(op), gen, f64));
    set(op, op.has("learnable") ? learn(op, replica, t) : t);
  }

  void opUniform(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    at::Generator gen = generator(opIndex, replica);
    torch::Tensor u = torch::rand(sizes(op), gen, f64);
    // Exclude 0 so that inverse_normal_cdf stays finite.
    set(op, place(torch::clamp_min(u, std::ldexp(1.0, -53))));
  }

  void opRademacher(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    at::Generator gen = generator(opIndex, replica);
    torch::Tensor t = place(torch::randint(0, 2, sizes(op), gen, f64) * 2 - 1);
    set(op, op.has("learnable") ? learn(op, replica, t) : t);
  }

  void opChi(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t n = index(op.operands.at(0), "chi size");
    int64_t dof = index(op.operands.at(1), "chi dof");
    if (n <= 0 || dof <= 0)
      fail("chi: size and degrees of freedom must be positive, got " + std::to_string(n) +
           " and " + std::to_string(dof));
    // Exactly chi_dof: the norm of a dof-dimensional standard normal.
    at::Generator gen = generator(opIndex, replica);
    torch::Tensor t = place(torch::randn({n, dof}, gen, f64).square().sum(1).sqrt());
    set(op, op.has("learnable") ? learn(op, replica, t) : t);
  }

  void opPermutation(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    at::Generator gen = generator(opIndex, replica);
    set(op, torch::randperm(sizes(op)[0], gen, torch::kLong));
  }

  void opLowDiscrepancy(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    std::vector<int64_t> rc = sizes(op);
    int64_t rows = rc[0], cols = rc[1];
    torch::Tensor t;
    if (op.string("sequence") == "sobol") {
      if (cols > 21201)
        fail("sobol supports at most 21201 dimensions, got " + std::to_string(cols));
      torch::Tensor state = torch::zeros({cols, 30}, torch::kLong);
      at::_sobol_engine_initialize_state_(state, cols);
      torch::Tensor quasi = torch::zeros({cols}, torch::kLong);
      // The first Sobol point is the origin; skip it (Phi^{-1}(0) = -inf).
      auto drawn = at::_sobol_engine_draw(quasi, rows + 1, state, cols, 0, torch::kFloat64);
      t = std::get<0>(drawn).slice(0, 1);
    } else {
      if (cols > 10000)
        fail("halton supports at most 10000 dimensions, got " + std::to_string(cols));
      std::vector<int64_t> bases = primes(cols);
      t = torch::empty({rows, cols}, f64);
      auto acc = t.accessor<double, 2>();
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t i = 0; i < rows; ++i) {
          // Radical inverse of i + 1 in base p_j (index 0 is the origin).
          double f = 1.0, r = 0.0;
          for (int64_t k = i + 1; k > 0; k /= bases[j]) {
            f /= static_cast<double>(bases[j]);
            r += f * static_cast<double>(k % bases[j]);
          }
          acc[i][j] = r;
        }
    }
    if (op.has("random_shift")) {
      at::Generator gen = generator(opIndex, replica);
      t = torch::frac(t + torch::rand({1, cols}, gen, f64));
    }
    // Keep the points strictly inside the cube.
    double eps = std::ldexp(1.0, -53);
    set(op, place(torch::clamp(t, eps, 1.0 - eps)));
  }

  void opInverseNormalCdf(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    set(op, torch::special::ndtri(tensor(op.operands[0], "inverse_normal_cdf input")));
  }

  void opOrthogonalize(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor g = tensor(op.operands[0], "orthogonalize input");
    if (g.size(0) > g.size(1))
      fail("orthogonalize: a " + shape(g) + " block cannot have more orthonormal rows than "
           "columns");
    auto [q, r] = torch::linalg_qr(g.t(), "reduced");
    // Sign correction makes Q Haar-distributed.
    torch::Tensor signs = torch::sign(torch::diagonal(r));
    signs = torch::where(signs == 0, torch::ones_like(signs), signs);
    set(op, (q * signs.unsqueeze(0)).t());
  }

  void opScaleRows(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor x = tensor(op.operands[0], "scale_rows matrix");
    torch::Tensor v = tensor(op.operands[1], "scale_rows factors");
    if (v.size(0) != x.size(0))
      fail("scale_rows: " + std::to_string(v.size(0)) + " factors for " +
           std::to_string(x.size(0)) + " rows");
    set(op, x * v.unsqueeze(1));
  }

  void opScale(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t base = index(op.operands[1], "scale base");
    if (base <= 0)
      fail("scale: base must be positive, got " + std::to_string(base));
    set(op, tensor(op.operands[0], "scale input") *
                std::pow(static_cast<double>(base), op.number("exponent")));
  }

  void opNextPow2(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t v = index(op.operands[0], "next_pow2 operand");
    int64_t p = 1;
    while (p < v)
      p <<= 1;
    values[op.results[0]] = Value{true, p, {}};
  }

  void opHadamardDiagonalChain(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    std::vector<int64_t> s = sizes(op);
    int64_t n = s[0];
    if (!isPowerOfTwo(n) || s[1] != n)
      fail("hadamard_diagonal_chain: size must be a square power of two, got " +
           std::to_string(s[0]) + "x" + std::to_string(s[1]));
    int64_t length = static_cast<int64_t>(op.number("length"));
    torch::Tensor h = hadamard(n, f64);
    if (op.has("normalized"))
      h = h / std::sqrt(static_cast<double>(n));
    at::Generator gen = generator(opIndex, replica);
    torch::Tensor signs = torch::randint(0, 2, {length, n}, gen, f64) * 2 - 1;
    torch::Tensor result = torch::eye(n, f64);
    for (int64_t i = 0; i < length; ++i)
      result = result.matmul(h * signs[i].unsqueeze(0));
    set(op, place(result));
  }

  void opTakeCols(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor x = tensor(op.operands[0], "take_cols input");
    int64_t c = index(op.operands[1], "take_cols count");
    if (c <= 0 || c > x.size(1))
      fail("take_cols: cannot take " + std::to_string(c) + " columns of " + shape(x));
    set(op, x.slice(1, 0, c));
  }

  void opMomentMatch(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor p = tensor(op.operands[0], "moment_match points");
    if (p.size(0) <= p.size(1))
      fail("moment matching needs more points than dimensions, got " + shape(p) +
           " (m must exceed d)");
    torch::Tensor centred = p - p.mean(0, true);
    torch::Tensor cov = centred.t().matmul(centred) / static_cast<double>(p.size(0) - 1);
    torch::Tensor a = torch::linalg_cholesky(cov);
    set(op, torch::linalg_solve_triangular(a, centred.t(), /*upper=*/false).t());
  }

  void opSparseGrid(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t d = index(op.operands[0], "sparse_grid dimension");
    if (static_cast<int64_t>(op.number("degree")) != 3)
      fail("sparse_grid: only the degree-3 rule is provided");
    torch::Tensor eye = torch::eye(d, f64) * std::sqrt(3.0);
    torch::Tensor points = torch::cat({torch::zeros({1, d}, f64), eye, -eye}, 0);
    torch::Tensor weights = torch::full({2 * d + 1}, 1.0 / 6.0, f64);
    weights[0] = 1.0 - static_cast<double>(d) / 3.0;
    set(op, place(points), 0);
    set(op, place(weights), 1);
  }

  void opSphericalRadial(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t d = index(op.operands[0], "spherical_radial dimension");
    torch::Tensor rho = tensor(op.operands[1], "spherical_radial radius").to(f64).reshape({-1});
    if (rho.numel() != 1)
      fail("spherical_radial: the radius must hold one value, got " + shape(rho));
    // The d+1 vertices of a unit regular simplex in R^d: the regular simplex of R^{d+1}
    // (rows (e_i - 1/(d+1)) / sqrt(1 - 1/(d+1))) in an orthonormal basis of the hyperplane
    // orthogonal to the all-ones vector (Q of the QR of its first d columns).
    const double n = static_cast<double>(d + 1);
    torch::Tensor full = (torch::eye(d + 1, f64) - 1.0 / n) / std::sqrt(1.0 - 1.0 / n);
    torch::Tensor basis = std::get<0>(torch::linalg_qr(full.slice(1, 0, d)));  // (d+1) x d
    torch::Tensor v = full.matmul(basis);                                       // (d+1) x d
    torch::Tensor r = rho.reshape({1, 1});
    torch::Tensor points = torch::cat({torch::zeros({1, d}, f64), v * r, -v * r}, 0);
    torch::Tensor r2 = rho.square();
    torch::Tensor outer = (static_cast<double>(d) / (2.0 * n) / r2).expand({2 * (d + 1)});
    torch::Tensor weights = torch::cat({1.0 - static_cast<double>(d) / r2, outer}, 0);
    set(op, place(points), 0);
    set(op, place(weights), 1);
  }

  void opRotate(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor p = tensor(op.operands[0], "rotate points");
    torch::Tensor q = tensor(op.operands[1], "rotate rotation");
    set(op, p.matmul(q.t()));
  }

  void opSimplex(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t n = index(op.operands.at(0), "simplex size");
    if (n < 2)
      fail("simplex: a simplex needs at least 2 vertices, got " + std::to_string(n));
    // Row i = (e_i - 1/n) / sqrt(1 - 1/n): unit rows, pairwise inner product -1/(n-1).
    torch::Tensor centred = torch::eye(n, f64) - 1.0 / static_cast<double>(n);
    set(op, place(centred / std::sqrt(1.0 - 1.0 / static_cast<double>(n))));
  }

  void opNormCoupling(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor x = tensor(op.operands[0], "norm_coupling input");
    int64_t sweeps = static_cast<int64_t>(op.number("sweeps"));
    if (x.size(0) < 2 || sweeps < 1)
      fail("norm_coupling: needs at least 2 rows and 1 sweep, got " + shape(x) + " and " +
           std::to_string(sweeps));
    // Row by row, out of place (so a learnable input keeps its gradient): w_i <- -|w_i| s_i/|s_i|.
    std::vector<torch::Tensor> rows = x.unbind(0);
    torch::Tensor total = x.sum(0);
    for (int64_t sweep = 0; sweep < sweeps; ++sweep)
      for (size_t i = 0; i < rows.size(); ++i) {
        torch::Tensor others = total - rows[i];
        torch::Tensor length = others.norm(), own = rows[i].norm();
        if (!(length.item<double>() > 1e-12 * (1 + own.item<double>())))
          continue;
        torch::Tensor turned = -own * others / length;
        total = others + turned;
        rows[i] = turned;
      }
    set(op, torch::stack(rows, 0));
  }

  void opCirculant(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor c = tensor(op.operands[0], "circulant vector");
    int64_t n = c.size(0);
    // C[i][j] = c[(j - i) mod n].
    torch::Tensor i = torch::arange(n, torch::kLong).unsqueeze(1), j = torch::arange(n, torch::kLong);
    set(op, c.index({torch::remainder(j - i, n)}));
  }

  void opFastfood(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor s = tensor(op.operands[0], "fastfood s");
    torch::Tensor g = tensor(op.operands[1], "fastfood g");
    torch::Tensor perm = tensor(op.operands[2], "fastfood permutation");
    torch::Tensor b = tensor(op.operands[3], "fastfood b");
    int64_t n = g.size(0);
    if (!isPowerOfTwo(n) || s.size(0) != n || b.size(0) != n || perm.size(0) != n)
      fail("fastfood: factors must share one power-of-two length");
    torch::Tensor h = hadamard(n, g.options().requires_grad(false));
    // V = n^{-1/2} diag(s / ||g||) H diag(g) Pi H diag(b); rows have norm s_i.
    torch::Tensor right = h.index_select(0, perm.to(g.device())) * b.unsqueeze(0);
    torch::Tensor v = (h * g.unsqueeze(0)).matmul(right);
    v = v * (s / g.norm()).unsqueeze(1) / std::sqrt(static_cast<double>(n));
    set(op, v);
  }

  void opRecipeOption(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    const std::string key = op.string("name");
    auto it = desc.options.find(key);
    double value = it != desc.options.end() ? it->second : op.number("default_value");
    if (!(value >= 1) || value != std::floor(value))
      fail("option '" + key + "' must be an integer >= 1, got " + std::to_string(value));
    values[op.results[0]] = Value{true, static_cast<int64_t>(value), {}};
  }

  void opCeilDiv(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t a = index(op.operands.at(0), "ceil_div dividend");
    int64_t b = index(op.operands.at(1), "ceil_div divisor");
    if (b <= 0)
      fail("ceil_div: the divisor must be positive, got " + std::to_string(b));
    values[op.results[0]] = Value{true, (a + b - 1) / b, {}};
  }

  void opEye(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    int64_t n = index(op.operands.at(0), "eye size");
    if (n <= 0)
      fail("eye: size must be positive, got " + std::to_string(n));
    torch::Tensor t = place(torch::eye(n, f64));
    set(op, op.has("learnable") ? learn(op, replica, t) : t);
  }

  void opZeros(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor t = place(torch::zeros(sizes(op), f64));
    set(op, op.has("learnable") ? learn(op, replica, t) : t);
  }

  void opAffine(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor p = tensor(op.operands[0], "affine points");
    torch::Tensor a = tensor(op.operands[1], "affine matrix");
    torch::Tensor b = tensor(op.operands[2], "affine shift");
    if (a.size(0) != a.size(1) || p.size(1) != a.size(1) || b.size(0) != a.size(0))
      fail("affine: points " + shape(p) + ", A " + shape(a) + " and shift " + shape(b) +
           " do not fit (A square, as many columns as the points, the shift as long)");
    set(op, torch::addmm(b.unsqueeze(0), p.to(a.options()), a.t()));
  }

  void opGlorot(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    std::vector<int64_t> rc = sizes(op);
    double a = std::sqrt(6.0 / static_cast<double>(rc.at(0) + rc.at(1)));
    at::Generator gen = generator(opIndex, replica);
    torch::Tensor t = place((torch::rand(rc, gen, f64) * 2 - 1) * a);
    set(op, op.has("learnable") ? learn(op, replica, t) : t);
  }

  void opLinear(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor x = tensor(op.operands[0], "linear input");
    torch::Tensor w = tensor(op.operands[1], "linear weight");
    torch::Tensor b = tensor(op.operands[2], "linear bias");
    if (x.size(1) != w.size(1) || b.size(0) != w.size(0))
      fail("linear: input " + shape(x) + ", weight " + shape(w) + " and bias " + shape(b) +
           " do not fit (the weight is outputs x inputs: the input has `inputs` columns, the "
           "bias `outputs` entries)");
    set(op, torch::addmm(b.unsqueeze(0), x.to(w.options()), w.t()));
  }

  void opBatchNorm(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor x = tensor(op.operands[0], "batch_norm input");
    if (x.size(0) < 2)
      fail("batch_norm: needs at least 2 rows, got " + shape(x));
    torch::Tensor centred = x - x.mean(0, true);
    set(op, centred * torch::rsqrt(centred.square().mean(0, true) + 1e-5));
  }

  void opActivation(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    torch::Tensor x = tensor(op.operands[0], "activation input");
    const std::string fn = op.string("function");
    if (fn == "leaky_relu")
      set(op, torch::leaky_relu(x, 0.01));
    else if (fn == "tanh")
      set(op, torch::tanh(x));
    else
      fail("activation: unknown function '" + fn + "' (known: leaky_relu, tanh)");
  }

  void opStackBlocks(const ProgramOp &op, size_t opIndex, const std::string &replica) {
    runStack(op, replica);
  }

  void runStack(const ProgramOp &op, const std::string &replica) {
    int64_t rows = index(op.operands[0], "stack_blocks rows");
    if (op.regions.size() != 1)
      fail("stack_blocks needs one body");
    const Program &body = op.regions[0];
    std::vector<torch::Tensor> blocks, weights;
    int64_t total = 0, copies = 0, blockRows = 0;
    size_t counterAtStart = opCounter;
    while (total < rows) {
      // Every replica numbers its ops the same way; the replica tag separates the streams.
      opCounter = counterAtStart;
      std::string tag = (replica.empty() ? "" : replica + ".") + "b" + std::to_string(copies);
      runBlock(body, tag);
      torch::Tensor block = tensor(body.yields[0], "a stacked block");
      if (block.size(0) == 0)
        fail("stack_blocks: the body yields an empty block");
      blockRows = block.size(0);
      blocks.push_back(block);
      if (body.yields.size() == 2)
        weights.push_back(tensor(body.yields[1], "a stacked block's row weights"));
      total += block.size(0);
      ++copies;
    }
    torch::Tensor w = torch::cat(blocks, 0).slice(0, 0, rows);
    set(op, w, 0);
    if (!weights.empty()) {
      if (total != rows)
        fail("stacking weighted blocks of " + std::to_string(blockRows) + " rows cannot give " +
             std::to_string(rows) + " rows: truncating a quadrature rule breaks its weights; "
             "use a multiple of " + std::to_string(blockRows));
      torch::Tensor a = torch::cat(weights, 0);
      if (op.has("average_weights"))
        a = a / static_cast<double>(copies);
      set(op, a, 1);
    }
  }

  const Descriptor &desc;
  int64_t seed;
  torch::TensorOptions opts;
  const std::map<std::string, torch::Tensor> *factors;
  std::map<int64_t, Value> values;
  std::vector<std::pair<std::string, torch::Tensor>> learnable;
  size_t opCounter = 0;
};

} // namespace

WeightFactory::WeightFactory(Descriptor descriptor) : desc(std::move(descriptor)) {}

bool WeightFactory::hasLearnable() const {
  std::function<bool(const Program &)> scan = [&](const Program &p) {
    for (const ProgramOp &op : p.ops) {
      if (op.has("learnable"))
        return true;
      for (const Program &r : op.regions)
        if (scan(r))
          return true;
    }
    return false;
  };
  return scan(desc.recipe);
}

Weights WeightFactory::draw(int64_t seed, const torch::TensorOptions &options) const {
  TORCH_CHECK(seed >= 0, "weight seed must be >= 0, got ", seed);
  Weights w = Interpreter(desc, seed, torch::TensorOptions().dtype(torch::kFloat64), nullptr).run();
  auto convert = [&](const torch::Tensor &t) { return t.to(options.device(), options.dtype()); };
  if (w.learnable.empty()) {
    w.W = convert(w.W);
    if (w.rowWeights)
      w.rowWeights = convert(*w.rowWeights);
    return w;
  }
  // Learnable: move the factors and rebuild W from them on the target, so W
  // depends on the leaves the caller will train.
  std::vector<std::pair<std::string, torch::Tensor>> factors;
  for (auto &[name, t] : w.learnable)
    factors.emplace_back(name, convert(t.detach()).set_requires_grad(true));
  return rebuild(seed, factors);
}

Weights WeightFactory::rebuild(
    int64_t seed, const std::vector<std::pair<std::string, torch::Tensor>> &factors) const {
  TORCH_CHECK(!factors.empty(), "rebuild needs the learnable factors of '", desc.name, "'");
  std::map<std::string, torch::Tensor> byName(factors.begin(), factors.end());
  torch::TensorOptions opts = factors.front().second.options().requires_grad(false);
  return Interpreter(desc, seed, opts, &byName).run();
}

} // namespace spectra
