//===- BuildTileKernels.cpp - the spectra-build-tile-kernels pass ---------===//

#include "codegen/CpuKernel.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/Passes.h"
#include "codegen/TileKernels.h"
#include "codegen/WarpChains.h"
#include "dialect/BuiltinLibrary.h"

#include "mlir/IR/SymbolTable.h"
#include "mlir/Pass/PassRegistry.h"

#define DEBUG_TYPE "spectra-build-tile-kernels"

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRABUILDTILEKERNELS
#include "codegen/Passes.h.inc"

namespace {
struct BuildTileKernelsPass : impl::SpectraBuildTileKernelsBase<BuildTileKernelsPass> {
  using SpectraBuildTileKernelsBase::SpectraBuildTileKernelsBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(linkBuiltinLibrary(module)))
      return signalPassFailure();
    TileKernelOptions options;
    options.valueDim = valueDim;
    options.tileRows = tileRows;
    options.maxTileRows = maxTileRows;
    options.sharedLimit = sharedLimit;
    options.minTileRows = minTileRows;
    options.dynamicSharedLimit = dynamicSharedLimit;
    options.inputType = inputType;
    options.causal = causal;
    options.paramsKernels = paramsKernels;
    options.antipodalWeights = antipodalWeights;
    if (warpChainThreads > 0) {
      if (warpChainMma != "f16" && warpChainMma != "bf16" && warpChainMma != "bf16x3") {
        getOperation().emitError() << "spectra-build-tile-kernels: warp-chain-mma takes bf16, "
                                      "bf16x3 or f16, got '" << warpChainMma << "'";
        return signalPassFailure();
      }
      Builder b(&getContext());
      Type mma = warpChainMma == "f16" ? Type(b.getF16Type()) : Type(b.getBF16Type());
      options.sharedBytes = [threads = int64_t(warpChainThreads), mma](func::FuncOp fn) {
        return warpChainSharedBytes(fn, threads, mma, kStaticSharedBytes);
      };
    }
    NamedAttrList missing;
    for (FeatureMapOp map : llvm::to_vector(module.getOps<FeatureMapOp>())) {
      std::string backwardError;
      if (failed(buildTileKernels(module, map, options, &backwardError)))
        return signalPassFailure();
      if (!backwardError.empty()) {
        map.emitWarning() << "no backward kernels: " << backwardError;
        missing.set(map.getSymNameAttr(), StringAttr::get(&getContext(), backwardError));
      }
    }
    // Why a map has no backward kernels travels with the module (the maps are dropped
    // before the lowering): spectra.backward_errors = {map = "reason"}.
    if (!missing.empty())
      module->setAttr(kBackwardErrorsAttr, missing.getDictionary(&getContext()));
  }
};
} // namespace

void registerSpectraCodegenPassesAndPipelines() {
  registerSpectraCodegenPasses();
  registerCpuPipelines();
  registerGpuPipelines();
}
} // namespace mlir::spectra
