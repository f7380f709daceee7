//===- ExportFeatureMap.h - a feature map as plain data for the runtime --===//
//
// The runtime (LibTorch only) never sees MLIR: it receives a feature map as a
// versioned JSON descriptor holding the instantiation (m, d, seed, options),
// the weight recipe and the component's params/features programs as flat op
// lists over numbered values. The WeightFactory and the eager reference
// interpret these programs; the kernels of the codegen issue carry the same
// descriptor in their KernelArtifact.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_EXPORTFEATUREMAP_H
#define SPECTRA_CODEGEN_EXPORTFEATUREMAP_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <string>

namespace mlir::spectra {

/// Version of the descriptor layout; bump on any incompatible change.
constexpr int kDescriptorVersion = 1;

/// Serialises the feature map named `featureMap` (or the module's only one
/// when empty) with its recipe and component, which must be defined or
/// linkable from the built-in library. Fails with a message naming the op
/// that the runtime interpreter could not express.
llvm::Expected<std::string> exportFeatureMap(ModuleOp module, llvm::StringRef featureMap = "");

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_EXPORTFEATUREMAP_H
