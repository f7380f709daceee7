//===- BuildGpuKernels.cpp - the spectra-build-gpu-kernels pass -----------===//

#include "codegen/GpuKernel.h"
#include "codegen/Passes.h"
#include "dialect/BuiltinLibrary.h"

#include "mlir/Pass/PassRegistry.h"

#define DEBUG_TYPE "spectra-build-gpu-kernels"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRABUILDGPUKERNELS
#include "codegen/Passes.h.inc"

namespace {
struct BuildGpuKernelsPass : impl::SpectraBuildGpuKernelsBase<BuildGpuKernelsPass> {
  using Base::Base;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(linkBuiltinLibrary(module)))
      return signalPassFailure();
    GpuKernelOptions options;
    options.dtype = dtype;
    options.valueDim = valueDim;
    for (FeatureMapOp map : llvm::to_vector(module.getOps<FeatureMapOp>()))
      if (failed(buildGpuKernels(module, map, options)))
        return signalPassFailure();
  }
};

/// Options of the spectra-gpu-lowering pipeline.
struct GpuLoweringOptions : public PassPipelineOptions<GpuLoweringOptions> {
  Option<std::string> chip{*this, "chip", llvm::cl::desc("sm_80 or sm_90a"),
                           llvm::cl::init("sm_90a")};
  Option<bool> binary{*this, "binary",
                      llvm::cl::desc("serialise to PTX (gpu-module-to-binary format=isa)"),
                      llvm::cl::init(true)};
};
} // namespace

void registerGpuLoweringPipeline() {
  PassPipelineRegistration<GpuLoweringOptions>(
      "spectra-gpu-lowering",
      "lower the GPU kernels to NVVM and (binary=true) PTX: the gpu, llvm and ptx stages",
      [](OpPassManager &pm, const GpuLoweringOptions &options) {
        buildGpuLoweringPipeline(pm, options.chip, options.binary);
      });
}
} // namespace mlir::spectra
