//===- ListOps.h - the LRA ListOps generator ------------------------------===//
//
// LRA's algorithm (../shared/REFERENCE-NOTES.md): a node at depth t draws
// r ~ U[0,1) when t < 10 (else r = 1); r > 0.25 makes a leaf digit 0-9,
// otherwise k ~ U{2..10} children at depth t+1 under an operator uniform in
// {MIN, MAX, MED, SM}. A tree's length is 1 for a leaf and 2 + the children's
// lengths for an operator (its name and ']'). Trees with min < length < max
// are kept, duplicates dropped. Values: MIN, MAX, MED = the median truncated to
// an integer (mean of the two middle values when even), SM = sum mod 10.
// Rendering follows LRA: an operator with arguments a1..ak is the nested pairs
// "( ( ... ( [OP a1 ) a2 ) ... ak ) ] )". Deterministic for a seed.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_MODELS_LISTOPS_H
#define SPECTRA_MODELS_LISTOPS_H

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace spectra::data {

struct ListOpsExample {
  std::string source;  ///< rendered expression (LRA layout)
  int target = 0;      ///< its value, 0-9
  int64_t length = 0;  ///< the generator's length (operators, digits and ']')
};

struct ListOpsOptions {
  int64_t numTrain = 96000, numVal = 2000, numTest = 2000;
  int64_t minLength = 500, maxLength = 2000;  ///< kept when min < length < max
  int maxDepth = 10;
  uint64_t seed = 42;
};

struct ListOpsSplits {
  std::vector<ListOpsExample> train, val, test;
};

/// Generates the splits; `progress(done, total)` is called as trees are accepted.
ListOpsSplits generateListOps(const ListOpsOptions &options,
                              const std::function<void(int64_t, int64_t)> &progress = {});

/// Evaluates a rendered expression independently of the generator (a stack
/// machine over its tokens); throws std::invalid_argument on malformed input.
int evaluateListOps(const std::string &source);

/// Writes `examples` as LRA's TSV (header "Source<TAB>Target"), atomically.
void writeListOpsTsv(const std::string &path, const std::vector<ListOpsExample> &examples);

} // namespace spectra::data

#endif // SPECTRA_MODELS_LISTOPS_H
