//===- Descriptor.h - a feature map as the runtime sees it ---------------===//
//
// The parsed form of the JSON descriptor libspectra-compiler exports: the
// instantiation and three small programs (weight recipe, params, features)
// over numbered values. Plain C++; no MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_DESCRIPTOR_H
#define SPECTRA_RUNTIME_DESCRIPTOR_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spectra {

struct Program;

/// One op of a program: `results = op(operands) {attrs}`, possibly with regions.
struct ProgramOp {
  std::string name;                       ///< e.g. "spectra.gaussian", "arith.mulf"
  std::vector<int64_t> operands;
  std::vector<int64_t> results;
  std::vector<std::string> types;         ///< result types as MLIR prints them
  std::map<std::string, double> numbers;  ///< numeric and unit attributes (unit = 1)
  std::map<std::string, std::string> strings;
  std::vector<Program> regions;

  bool has(const std::string &attr) const { return numbers.count(attr) || strings.count(attr); }
  double number(const std::string &attr, double fallback = 0) const {
    auto it = numbers.find(attr);
    return it == numbers.end() ? fallback : it->second;
  }
  std::string string(const std::string &attr) const {
    auto it = strings.find(attr);
    return it == strings.end() ? std::string() : it->second;
  }
  /// The op name without its dialect prefix ("gaussian").
  std::string mnemonic() const { return name.substr(name.find('.') + 1); }
};

/// A block: arguments, ops, and what its terminator yields.
struct Program {
  std::vector<int64_t> args;
  std::vector<ProgramOp> ops;
  std::vector<int64_t> yields;
};

struct ComponentDescriptor {
  std::string name;
  int64_t outputs = 1;
  std::map<std::string, double> optionDefaults;
  Program params;                  ///< args (m, d); yields nothing directly, see below
  std::vector<int64_t> scalars;    ///< params values fed to the features program
  std::optional<int64_t> queryScale, keyScale;
  Program features;                ///< args (wx, xx, ww, scalars...)
  std::vector<int64_t> logits, coeffs;
  /// Compiler-derived derivatives: same args as features; yields, for each
  /// output o and argument v, (d logit_o / d v, d coeff_o / d v).
  std::optional<Program> partials;
  std::string partialsError;       ///< why partials are missing (an op that cannot be differentiated)
  /// The component as canonical JSON text: what the kernels depend on (cache keys).
  std::string canonical;
};

/// A feature map: the recipe, the component and their instantiation.
struct Descriptor {
  int version = 0;
  std::string name;  ///< IR symbol, e.g. "posrf_mm"
  int64_t m = 0, d = 0, seed = 0;
  std::map<std::string, double> options;
  bool rowWeights = false;
  /// The pairs per block where the recipe draws W's rows as blocks of a zero row, P, then -P
  /// ("antipodal_pairs", codegen/TileKernels.h antipodalPairs); 0: W dense. The CPU kernels
  /// of such a map contract P only, so it is part of their cache key.
  int64_t antipodalPairs = 0;
  std::string recipeName;
  Program recipe;    ///< args (m, d); yields W and optionally row weights
  ComponentDescriptor component;

  /// Features per input: outputs x m.
  int64_t numFeatures() const { return component.outputs * m; }
  /// The option value the component will see (the map's, else the default).
  double option(const std::string &name) const;

  /// Parses and checks a descriptor; throws std::invalid_argument saying
  /// which field is missing or malformed.
  static Descriptor fromJson(const std::string &text);
};

/// The version of the layout this runtime reads.
constexpr int kSupportedDescriptorVersion = 1;

} // namespace spectra

#endif // SPECTRA_RUNTIME_DESCRIPTOR_H
