//===- Pipelines.cpp - pipeline builders shared by spectra-opt and tools -===//

#include "passes/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void mlir::spectra::buildSpectraInputPipeline(OpPassManager &pm) {
  pm.addPass(createSpectraLinkLibrary());
  pm.addPass(createCanonicalizerPass());
}

void mlir::spectra::registerSpectraPassesAndPipelines() {
  registerSpectraPasses();
  PassPipelineRegistration<>("spectra-input-pipeline",
                             "link the built-in library and canonicalise (the --emit=spectra stage)",
                             buildSpectraInputPipeline);
}
