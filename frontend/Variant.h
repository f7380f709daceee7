//===- Variant.h - variant names <component>-<weights> and their IR ------===//
//
// A variant names a random feature: a component function and a weight
// matrix, e.g. `posrf-mm` or `posrf-hyp-orf`. The same grammar is used by the
// CLI, the C API, IR symbol names (with '-' spelled '_') and results tables.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_FRONTEND_VARIANT_H
#define SPECTRA_FRONTEND_VARIANT_H

#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mlir {
class MLIRContext;
class ModuleOp;
template <typename> class OwningOpRef;
} // namespace mlir

namespace spectra::frontend {

/// A parsed variant name.
struct Variant {
  std::string component; ///< e.g. "posrf-hyp"
  std::string weights;   ///< e.g. "orf"

  /// `<component>-<weights>`, the canonical spelling.
  std::string name() const { return component + "-" + weights; }
  /// The IR symbol of the feature map: the name with '-' spelled '_'.
  std::string symbol() const;
  /// One of the paper's 18 (PosRF/OPRF/SADERF x ORF/SORF/QMC/MM/SGQ/FastFoodL).
  bool isPaperVariant() const;
};

/// Component function names, in the order the library lists them.
const std::vector<std::string> &componentNames();
/// Weight matrix names.
const std::vector<std::string> &weightNames();
/// The 18 variants of the Spectraformer paper, in the order of its Table 2.
std::vector<Variant> paperVariants();
/// Every component x weights combination.
std::vector<Variant> allVariants();

/// Parses `<component>-<weights>` (case-insensitive). An unknown name gives an
/// error listing the valid components and weights (and a near match).
llvm::Expected<Variant> parseVariantName(llvm::StringRef name);

/// Options of an instantiation.
struct VariantOptions {
  int64_t m = 128;          ///< requested random features (rows of W)
  int64_t d = 32;           ///< head dimension
  int64_t seed = 0;         ///< seed of the weight draw
  std::string dtype = "f32"; ///< element type of q, k, v: f32, f64, f16, bf16
  /// Options of the component or the weight recipe, e.g. {"a": -0.2} for GERF,
  /// {"components": 4} for GMM (recipe options are integers).
  std::map<std::string, double> componentOptions;
};

/// Whether `key` is an option of the variant's weight recipe (an integer, e.g.
/// GMM's "components") rather than of its component function.
bool isRecipeOption(const Variant &variant, llvm::StringRef key);

/// What the frontend decided, besides the IR.
struct Instantiation {
  int64_t m = 0;               ///< rows of W actually used
  std::vector<std::string> notes; ///< adjustments worth telling the user (SGQ rounding)
};

/// Checks the options against the variant (m, d ranges; MM needs m > d; dtype)
/// and computes the effective m. Errors say which option and why.
llvm::Expected<Instantiation> planVariant(const Variant &variant, const VariantOptions &options);

/// Builds a verified module with the library definitions the variant uses, a
/// spectra.feature_map and `func.func @attention(q, k, v, mask)` calling
/// spectra.attention on [B, H, N, d] tensors (B, H, N dynamic).
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>>
buildVariantModule(mlir::MLIRContext *context, const Variant &variant,
                   const VariantOptions &options, Instantiation *plan = nullptr);

} // namespace spectra::frontend

#endif // SPECTRA_FRONTEND_VARIANT_H
