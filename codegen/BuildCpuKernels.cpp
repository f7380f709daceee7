//===- BuildCpuKernels.cpp - the spectra-build-cpu-kernels pass -----------===//

#include "codegen/CpuKernel.h"
#include "codegen/Passes.h"
#include "dialect/BuiltinLibrary.h"

#include "mlir/IR/SymbolTable.h"
#include "mlir/Pass/PassRegistry.h"

#define DEBUG_TYPE "spectra-build-cpu-kernels"

namespace mlir::spectra {
void registerGpuLoweringPipeline();

#define GEN_PASS_DEF_SPECTRABUILDCPUKERNELS
#include "codegen/Passes.h.inc"

namespace {
struct BuildCpuKernelsPass : impl::SpectraBuildCpuKernelsBase<BuildCpuKernelsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(linkBuiltinLibrary(module)))
      return signalPassFailure();
    for (FeatureMapOp map : llvm::to_vector(module.getOps<FeatureMapOp>())) {
      auto component = SymbolTable::lookupNearestSymbolFrom<ComponentOp>(map, map.getComponentAttr());
      if (!component) {
        map.emitOpError() << "component '" << map.getComponent() << "' is not defined";
        return signalPassFailure();
      }
      if (failed(buildCpuForwardKernel(module, component, (map.getSymName() + "_forward").str())) ||
          failed(buildCpuBackwardKernel(module, component, (map.getSymName() + "_backward").str())))
        return signalPassFailure();
    }
  }
};
} // namespace

void registerSpectraCodegenPassesAndPipelines() {
  registerSpectraCodegenPasses();
  PassPipelineRegistration<>("spectra-cpu-lowering",
                             "lower the CPU kernels to the LLVM dialect (the --emit=llvm stage)",
                             buildCpuLoweringPipeline);
  registerGpuLoweringPipeline();
}
} // namespace mlir::spectra
