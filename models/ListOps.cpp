//===- ListOps.cpp - the LRA ListOps generator ----------------------------===//

#include "models/ListOps.h"
#include "runtime/Paths.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <cctype>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace spectra::data {
namespace {

const char *const kOperators[] = {"[MIN", "[MAX", "[MED", "[SM"};

/// One generated tree, rendered as it is built.
struct Tree {
  std::string text;
  int value = 0;
  int64_t length = 0;
};

int applyOperator(int op, const std::vector<int> &args) {
  switch (op) {
  case 0: return *std::min_element(args.begin(), args.end());
  case 1: return *std::max_element(args.begin(), args.end());
  case 2: {
    std::vector<int> sorted = args;
    std::sort(sorted.begin(), sorted.end());
    size_t n = sorted.size();
    // int(median): the mean of the two middle values when even, truncated.
    return n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  }
  default: return std::accumulate(args.begin(), args.end(), 0) % 10;
  }
}

class Generator {
public:
  Generator(uint64_t seed, int maxDepth) : rng(seed), maxDepth(maxDepth) {}

  Tree node(int depth) {
    double r = depth < maxDepth ? unit(rng) : 1.0;
    Tree t;
    if (r > 0.25) {
      t.value = static_cast<int>(digit(rng));
      t.text = std::to_string(t.value);
      t.length = 1;
      return t;
    }
    int children = static_cast<int>(arity(rng));
    std::vector<Tree> args;
    for (int i = 0; i < children; ++i)
      args.push_back(node(depth + 1));
    int op = static_cast<int>(opDist(rng));
    std::vector<int> values;
    t.length = 2;
    for (const Tree &a : args) {
      values.push_back(a.value);
      t.length += a.length;
    }
    t.value = applyOperator(op, values);
    for (int i = 0; i <= children; ++i)
      t.text += "( ";
    t.text += kOperators[op];
    for (const Tree &a : args)
      t.text += " " + a.text + " )";
    t.text += " ] )";
    return t;
  }

private:
  std::mt19937_64 rng;
  int maxDepth;
  std::uniform_real_distribution<double> unit{0.0, 1.0};
  std::uniform_int_distribution<int> digit{0, 9}, arity{2, 10}, opDist{0, 3};
};

} // namespace

ListOpsSplits generateListOps(const ListOpsOptions &o,
                              const std::function<void(int64_t, int64_t)> &progress) {
  if (o.numTrain < 0 || o.numVal < 0 || o.numTest < 0)
    throw std::invalid_argument("ListOps: split sizes must not be negative");
  if (o.minLength + 1 >= o.maxLength)
    throw std::invalid_argument("ListOps: no length fits " + std::to_string(o.minLength) +
                                " < length < " + std::to_string(o.maxLength));
  const int64_t total = o.numTrain + o.numVal + o.numTest;
  Generator gen(o.seed, o.maxDepth);
  std::unordered_set<std::string> seen;
  std::vector<ListOpsExample> all;
  // Acceptance is ~8% at LRA's bounds; a bound on tries keeps impossible settings finite.
  const int64_t maxTries = 1000 * (total + 10);
  for (int64_t tries = 0; static_cast<int64_t>(all.size()) < total; ++tries) {
    if (tries >= maxTries)
      throw std::runtime_error("ListOps: only " + std::to_string(all.size()) + " of " +
                               std::to_string(total) + " trees with " +
                               std::to_string(o.minLength) + " < length < " +
                               std::to_string(o.maxLength) + " after " + std::to_string(tries) +
                               " tries; widen the length bounds");
    Tree t = gen.node(1);
    if (t.length <= o.minLength || t.length >= o.maxLength || !seen.insert(t.text).second)
      continue;
    all.push_back({std::move(t.text), t.value, t.length});
    if (progress)
      progress(static_cast<int64_t>(all.size()), total);
  }
  ListOpsSplits s;
  s.train.assign(all.begin(), all.begin() + o.numTrain);
  s.val.assign(all.begin() + o.numTrain, all.begin() + o.numTrain + o.numVal);
  s.test.assign(all.begin() + o.numTrain + o.numVal, all.end());
  return s;
}

int evaluateListOps(const std::string &source) {
  // Parentheses only group pairs; the value follows from the operator tokens,
  // the digits and ']' in order: a stack of open operators with their arguments.
  struct Frame {
    int op;
    std::vector<int> args;
  };
  std::vector<Frame> stack;
  std::istringstream in(source);
  std::string token;
  std::optional<int> result;
  auto push = [&](int v) {
    if (stack.empty()) {
      if (result)
        throw std::invalid_argument("ListOps: more than one top-level value");
      result = v;
    } else {
      stack.back().args.push_back(v);
    }
  };
  while (in >> token) {
    if (token == "(" || token == ")")
      continue;
    if (token == "]") {
      if (stack.empty() || stack.back().args.empty())
        throw std::invalid_argument("ListOps: ']' closes no operator with arguments");
      Frame f = std::move(stack.back());
      stack.pop_back();
      push(applyOperator(f.op, f.args));
      continue;
    }
    auto op = std::find(std::begin(kOperators), std::end(kOperators), token);
    if (op != std::end(kOperators)) {
      stack.push_back({static_cast<int>(op - std::begin(kOperators)), {}});
      continue;
    }
    if (token.size() == 1 && std::isdigit(static_cast<unsigned char>(token[0]))) {
      push(token[0] - '0');
      continue;
    }
    throw std::invalid_argument("ListOps: unknown token '" + token + "'");
  }
  if (!stack.empty() || !result)
    throw std::invalid_argument("ListOps: unterminated expression");
  return *result;
}

void writeListOpsTsv(const std::string &path, const std::vector<ListOpsExample> &examples) {
  std::string text = "Source\tTarget\n";
  for (const ListOpsExample &e : examples)
    text += e.source + "\t" + std::to_string(e.target) + "\n";
  if (std::string error; !writeFileAtomically(path, text, &error))
    throw std::runtime_error(error);
}

} // namespace spectra::data
