//===- NearestName.h - "did you mean" for mistyped names -------------------===//
//
// Header-only (LLVM Support alone), so the variant-name grammar, which has no
// MLIR dependency, and the dialect's verifiers suggest names the same way.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_NEARESTNAME_H
#define SPECTRA_DIALECT_NEARESTNAME_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace mlir::spectra {

/// The name of `known` closest to `word` by edit distance when it is close enough to be a
/// typo (at most two edits), else "".
inline std::string nearestName(llvm::StringRef word, llvm::ArrayRef<std::string> known) {
  std::string best;
  unsigned bestDistance = 3; // more than two edits is not a typo
  for (const std::string &k : known) {
    unsigned dist = word.edit_distance(k, /*AllowReplacements=*/true, bestDistance);
    if (dist < bestDistance) {
      bestDistance = dist;
      best = k;
    }
  }
  return best;
}

} // namespace mlir::spectra

#endif // SPECTRA_DIALECT_NEARESTNAME_H
