//===- BuildGpuKernels.cpp - the spectra-build-gpu-kernels pass -----------===//

#include "codegen/GpuKernel.h"
#include "codegen/Passes.h"
#include "dialect/BuiltinLibrary.h"
#include "passes/Passes.h"

#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

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
    // Each map's launch description travels with the module (the feature maps
    // are dropped before the lowering): spectra.gpu_artifacts = {map = "json"}.
    NamedAttrList artifacts;
    if (auto recorded = module->getAttrOfType<DictionaryAttr>(kGpuArtifactsAttr))
      artifacts.append(recorded.getValue());
    for (FeatureMapOp map : llvm::to_vector(module.getOps<FeatureMapOp>())) {
      if (failed(buildGpuKernels(module, map, options)))
        return signalPassFailure();
      // Compact JSON (one line in the printed module).
      llvm::Expected<llvm::json::Value> artifact = llvm::json::parse(describeGpuKernels(map, options));
      if (!artifact) {
        map.emitError() << "internal error: the launch description is not JSON: "
                        << llvm::toString(artifact.takeError());
        return signalPassFailure();
      }
      artifacts.set(map.getSymNameAttr(),
                    StringAttr::get(&getContext(), llvm::formatv("{0}", *artifact).str()));
    }
    module->setAttr(kGpuArtifactsAttr, artifacts.getDictionary(&getContext()));
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

void buildGpuPipeline(OpPassManager &pm, const GpuPipelineOptions &options, GpuStage until) {
  buildSpectraInputPipeline(pm);
  SpectraBuildGpuKernelsOptions kernels;
  kernels.dtype = options.dtype;
  kernels.valueDim = options.valueDim;
  pm.addPass(createSpectraBuildGpuKernels(kernels));
  pm.addPass(createSpectraKeepKernels());
  if (until == GpuStage::Kernels)
    return;
  buildGpuLoweringPipeline(pm, options.chip, /*toBinary=*/until == GpuStage::PTX);
}

std::string recordedGpuArtifact(ModuleOp module, StringRef featureMap) {
  auto artifacts = module->getAttrOfType<DictionaryAttr>(kGpuArtifactsAttr);
  if (!artifacts || artifacts.empty() || (featureMap.empty() && artifacts.size() > 1))
    return "";
  Attribute found = featureMap.empty() ? artifacts.getValue().front().getValue()
                                       : artifacts.get(featureMap);
  auto text = llvm::dyn_cast_or_null<StringAttr>(found);
  return text ? text.str() : "";
}

void registerGpuPipelines() {
  PassRegistration<Pass>([] { return createSerializeKernelsToPtxPass(); });
  // Upstream's one-module serialiser, to compare against (test/Codegen/serialize-kernels.test).
  registerGpuModuleToBinaryPass();
  PassPipelineRegistration<GpuPipelineOptions>(
      "spectra-gpu-pipeline",
      "spectra IR to PTX: GPU kernels, NVVM, gpu-module-to-binary (what the C API runs)",
      [](OpPassManager &pm, const GpuPipelineOptions &o) { buildGpuPipeline(pm, o); });
  PassPipelineRegistration<GpuLoweringOptions>(
      "spectra-gpu-lowering",
      "the GPU pipeline's tail: lower the kernels to NVVM and (binary=true) PTX",
      [](OpPassManager &pm, const GpuLoweringOptions &options) {
        buildGpuLoweringPipeline(pm, options.chip, options.binary);
      });
}
} // namespace mlir::spectra
