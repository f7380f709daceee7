//===- GpuLowering.h - the GPU kernels' NVVM lowering and PTX serialiser --===//
//
// The thin tail below the mapped stage (MapTilesToGpu.h), the only part of
// the GPU path that never runs on the CPU: attach the NVVM target, lower each
// gpu.module to NVVM, serialise to PTX (the kernels compiled side by side and
// joined into one text). No kernel math lives here: the kernels come from the
// tile layer (TileKernels.h) through the GPU schedule.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_GPULOWERING_H
#define SPECTRA_CODEGEN_GPULOWERING_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"

#include <memory>
#include <string>

namespace mlir::spectra {

/// Registers the dialects, translations and target interfaces the GPU path needs.
void registerGpuLoweringDialects(DialectRegistry &registry);

/// The outlined gpu.module to NVVM and, when `toBinary`, to PTX: attach the NVVM
/// target (chip, PTX features, O3), lower each kernel (loops, strided metadata,
/// affine, control flow) and the module to NVVM, serialise.
void buildGpuLoweringPipeline(OpPassManager &pm, StringRef chip, bool toBinary = true);

/// gpu-module-to-binary (PTX) with each gpu.module's kernels serialised in parallel and joined
/// into one PTX text (spectra-serialize-kernels-to-ptx).
std::unique_ptr<Pass> createSerializeKernelsToPtxPass();

/// The PTX text of every gpu.binary in `module`, concatenated.
std::string extractPtx(ModuleOp module);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_GPULOWERING_H
