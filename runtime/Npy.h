//===- Npy.h - NumPy .npy files as torch tensors -------------------------===//

#ifndef SPECTRA_RUNTIME_NPY_H
#define SPECTRA_RUNTIME_NPY_H

#include <torch/torch.h>

#include <string>

namespace spectra {

/// Reads a C-ordered little-endian .npy (float16/32/64, int32/64, bool).
/// Throws std::runtime_error naming the file and what is wrong with it.
torch::Tensor readNpy(const std::string &path);

/// Writes a tensor as .npy (format 1.0); the file appears atomically.
void writeNpy(const std::string &path, const torch::Tensor &tensor);

} // namespace spectra

#endif // SPECTRA_RUNTIME_NPY_H
