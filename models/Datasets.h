//===- Datasets.h - the LRA data layouts as token sequences ---------------===//
//
// Loaders for the official layouts (../shared/REFERENCE-NOTES.md): ListOps
// TSV (header "Source<TAB>Target", brackets kept as tokens, parentheses
// dropped), IMDb in the aclImdb directory layout, and AAN pairs TSV
// (label id1 id2 text1 text2, no header). Byte-level text: id = byte + 1,
// pad = 0, truncated to the maximum length. A malformed line or file stops
// loading with "file:line: what is wrong" (std::invalid_argument).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_DATASETS_H
#define SPECTRA_MODELS_DATASETS_H

#include <cstdint>
#include <string>
#include <vector>

namespace spectra::data {

struct Example {
  std::vector<int32_t> tokens, tokens2;  ///< tokens2: the second document of a retrieval pair
  int label = 0;
};

/// ListOps vocabulary: 0 = pad, then the digits, the operators and ']'.
const std::vector<std::string> &listOpsVocabulary();
/// Token ids of a ListOps source (parentheses dropped); throws on an unknown token.
std::vector<int32_t> tokenizeListOps(const std::string &source);
/// Byte-level ids (byte + 1) of at most `maxLength` bytes.
std::vector<int32_t> encodeBytes(const std::string &text, int64_t maxLength);

std::vector<Example> loadListOpsTsv(const std::string &path, int64_t maxLength);
/// `root`/`split`/{pos,neg}/*.txt, pos = 1, in a deterministic (sorted) order.
std::vector<Example> loadImdb(const std::string &root, const std::string &split, int64_t maxLength);
std::vector<Example> loadAanTsv(const std::string &path, int64_t maxLength);

/// The bytes of a text corpus for language modelling: a file, or every regular file under a
/// directory (recursively, in sorted path order) joined by '\n'. Throws std::invalid_argument
/// naming the path when there is nothing to read.
std::string readTextCorpus(const std::string &path);
/// Consecutive, non-overlapping windows of `window` + 1 byte ids (byte + 1) of `bytes`: each
/// example's tokens hold the inputs and, shifted by one, the next bytes to predict.
std::vector<Example> byteWindows(const std::string &bytes, int64_t window);

} // namespace spectra::data

#endif // SPECTRA_MODELS_DATASETS_H
