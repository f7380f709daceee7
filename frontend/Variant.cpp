//===- Variant.cpp - parsing variant names --------------------------------===//
//
// Kept free of MLIR so the name grammar is cheap to test and to reuse.
//
//===----------------------------------------------------------------------===//

#include "frontend/Variant.h"
#include "dialect/NearestName.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace spectra::frontend;

const std::vector<std::string> &spectra::frontend::componentNames() {
  static const std::vector<std::string> names = {"posrf", "oprf",      "saderf", "trigrf",
                                                 "posrf-hyp", "gerf", "hcexp"};
  return names;
}

const std::vector<std::string> &spectra::frontend::weightNames() {
  static const std::vector<std::string> names = {"base", "orf", "sorf",     "qmc",     "qmc-sobol",
                                                 "mm",   "sgq", "fastfood", "fastfoodl",
                                                 "simrf", "simrf-plus", "scrf", "ssr", "gmm", "generative"};
  return names;
}

static const char *const kPaperComponents[] = {"posrf", "oprf", "saderf"};
static const char *const kPaperWeights[] = {"orf", "sorf", "qmc", "mm", "sgq", "fastfoodl"};

std::string Variant::symbol() const {
  std::string s = name();
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

bool Variant::isPaperVariant() const {
  return llvm::is_contained(kPaperComponents, llvm::StringRef(component)) &&
         llvm::is_contained(kPaperWeights, llvm::StringRef(weights));
}

std::vector<Variant> spectra::frontend::paperVariants() {
  std::vector<Variant> out;
  for (const char *c : kPaperComponents)
    for (const char *w : kPaperWeights)
      out.push_back({c, w});
  return out;
}

std::vector<Variant> spectra::frontend::allVariants() {
  std::vector<Variant> out;
  for (const std::string &c : componentNames())
    for (const std::string &w : weightNames())
      out.push_back({c, w});
  return out;
}

static std::string nearest(llvm::StringRef word, const std::vector<std::string> &known) {
  return mlir::spectra::nearestName(word, known);
}

llvm::Expected<Variant> spectra::frontend::parseVariantName(llvm::StringRef raw) {
  std::string lowered = raw.trim().lower();
  llvm::StringRef name(lowered);
  std::string valid = "valid components: " + llvm::join(componentNames(), ", ") +
                      "; valid weights: " + llvm::join(weightNames(), ", ") +
                      " (e.g. posrf-mm, saderf-orf, posrf-hyp-qmc)";
  if (name.empty())
    return llvm::createStringError("empty variant name; expected <component>-<weights>; " + valid);

  // Component names may contain '-' (posrf-hyp), so try the longest first.
  std::vector<std::string> components = componentNames();
  std::sort(components.begin(), components.end(),
            [](const std::string &a, const std::string &b) { return a.size() > b.size(); });
  for (const std::string &component : components) {
    if (!name.starts_with(component + "-"))
      continue;
    llvm::StringRef weights = name.drop_front(component.size() + 1);
    if (llvm::is_contained(weightNames(), weights))
      return Variant{component, weights.str()};
    std::string msg = "unknown weight matrix '" + weights.str() + "' in variant '" + raw.str() + "'";
    if (std::string near = nearest(weights, weightNames()); !near.empty())
      msg += " (did you mean '" + component + "-" + near + "'?)";
    return llvm::createStringError(msg + "; " + valid);
  }
  llvm::StringRef head = name.split('-').first;
  std::string msg = "unknown component function in variant '" + raw.str() + "'";
  if (!name.contains('-'))
    msg = "variant '" + raw.str() + "' is not of the form <component>-<weights>";
  else if (std::string near = nearest(head, componentNames()); !near.empty())
    msg += " (did you mean '" + near + "'?)";
  return llvm::createStringError(msg + "; " + valid);
}

bool spectra::frontend::isRecipeOption(const Variant &variant, llvm::StringRef key) {
  return (variant.weights == "gmm" && key == "components") ||
         (variant.weights == "generative" && key == "hidden");
}

static std::string formatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

llvm::Expected<Instantiation> spectra::frontend::planVariant(const Variant &variant,
                                                             const VariantOptions &options) {
  auto fail = [&](const std::string &msg) {
    return llvm::createStringError("variant '" + variant.name() + "': " + msg);
  };
  if (options.d < 1 || options.d > 4096)
    return fail("head dimension d must be in [1, 4096], got " + std::to_string(options.d));
  if (options.m < 1 || options.m > (1 << 20))
    return fail("feature count m must be in [1, 1048576], got " + std::to_string(options.m));
  if (options.seed < 0)
    return fail("seed must be >= 0, got " + std::to_string(options.seed));
  static const char *const dtypes[] = {"f32", "f64", "f16", "bf16"};
  if (!llvm::is_contained(dtypes, llvm::StringRef(options.dtype)))
    return fail("dtype must be one of f32, f64, f16, bf16, got '" + options.dtype + "'");
  if (variant.weights == "generative" && options.m < 2)
    return fail("the generator batch-normalises its m rows: m must be at least 2, got " +
                std::to_string(options.m));
  if (variant.weights == "mm" && options.m <= options.d)
    return fail("moment matching needs more points than dimensions (m > d), got m = " +
                std::to_string(options.m) + ", d = " + std::to_string(options.d));
  for (const auto &[key, value] : options.componentOptions) {
    if (key == "components" && isRecipeOption(variant, key)) {
      // GMM's mixture count: a whole number of components, each with at least one row.
      if (value != std::floor(value) || value < 1 || value > static_cast<double>(options.m))
        return fail("option components (the mixture count) must be an integer in [1, m = " +
                    std::to_string(options.m) + "], got " + formatNumber(value));
      continue;
    }
    if (key == "hidden" && isRecipeOption(variant, key)) {
      if (value != std::floor(value) || value < 1 || value > 4096)
        return fail("option hidden (the generator's width) must be an integer in [1, 4096], got " +
                    formatNumber(value));
      continue;
    }
    if (variant.component != "gerf")
      return fail("unknown option '" + key + "': component '" + variant.component +
                  "' takes none (gerf has a)" +
                  (variant.weights == "gmm"          ? ", weights gmm has components"
                   : variant.weights == "generative" ? ", weights generative has hidden"
                                                     : ""));
    if (key != "a")
      return fail("gerf has no option '" + key + "' (it has: a)");
    if (!(value < 0.25))
      return fail("gerf needs a < 1/4, got a = " + std::to_string(value));
  }

  Instantiation plan;
  plan.m = options.m;
  if (variant.weights == "sgq" || variant.weights == "ssr") {
    // Whole copies of the (2d+1)-point (SGQ) or (2d+3)-point (SSR) rule only: truncating one
    // breaks its weights.
    int64_t block = 2 * options.d + (variant.weights == "sgq" ? 1 : 3);
    int64_t copies = std::max<int64_t>(1, options.m / block);
    plan.m = copies * block;
    if (plan.m != options.m)
      plan.notes.push_back(variant.weights + " uses m = " + std::to_string(plan.m) + " (" +
                           std::to_string(copies) + " rotated cop" + (copies == 1 ? "y" : "ies") +
                           " of the " + std::to_string(block) + "-point rule for d = " +
                           std::to_string(options.d) + "), not the requested " +
                           std::to_string(options.m));
  }
  return plan;
}
