//===- CpuKernel.cpp - the CPU pipeline and its LLVM tail -----------------===//

#include "codegen/CpuKernel.h"
#include "codegen/spectra_compiler.h"
#include "codegen/KernelBuilder.h"
#include "codegen/Passes.h"
#include "passes/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/TargetParser/Host.h"

#include <cstdlib>
#include <mutex>
#include <string>

using namespace mlir;
using namespace mlir::spectra;

void mlir::spectra::registerCpuLoweringDialects(DialectRegistry &registry) {
  registry.insert<func::FuncDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                  math::MathDialect, cf::ControlFlowDialect, LLVM::LLVMDialect,
                  index::IndexDialect, ub::UBDialect, linalg::LinalgDialect,
                  vector::VectorDialect>();
  arith::registerConvertArithToLLVMInterface(registry);
  cf::registerConvertControlFlowToLLVMInterface(registry);
  registerConvertFuncToLLVMInterface(registry);
  index::registerConvertIndexToLLVMInterface(registry);
  registerConvertMathToLLVMInterface(registry);
  registerConvertMemRefToLLVMInterface(registry);
  ub::registerConvertUBToLLVMInterface(registry);
  vector::registerConvertVectorToLLVMInterface(registry);
}

int64_t mlir::spectra::hostVectorWidth() {
  // SPECTRA_CPU_VECTOR_WIDTH=4|8|16 overrides the host's width: the tests run the 16-lane
  // (AVX-512-shaped) kernels on an AVX2 machine, where LLVM splits each vector in two.
  if (const char *forced = std::getenv("SPECTRA_CPU_VECTOR_WIDTH"); forced && *forced) {
    llvm::StringRef width(forced);
    if (width == "4" || width == "8" || width == "16")
      return std::stoll(width.str());
    static std::once_flag warned;
    std::call_once(warned, [&] {
      llvm::errs() << "spectra: ignoring SPECTRA_CPU_VECTOR_WIDTH='" << width
                   << "' (takes 4, 8 or 16)\n";
    });
  }
  llvm::StringMap<bool> features = llvm::sys::getHostCPUFeatures();
  return features.lookup("avx512f") ? 16 : 8;
}

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAPOLYNOMIALEXP
#define GEN_PASS_DEF_SPECTRAKEEPKERNELS
#define GEN_PASS_DEF_SPECTRASELECTMAXIMA
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

namespace {
struct PolynomialExpPass : spectra::impl::SpectraPolynomialExpBase<PolynomialExpPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateMathPolynomialApproximationPatterns(
        patterns, [](StringRef name) { return name == "exp" || name == "math.exp"; });
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

/// maximumf(a, b) -> select(a > b, a, b); minimumf with <. Passes.td says why.
template <typename Op, arith::CmpFPredicate Predicate>
struct SelectExtremum : OpRewritePattern<Op> {
  using OpRewritePattern<Op>::OpRewritePattern;
  LogicalResult matchAndRewrite(Op op, PatternRewriter &rewriter) const override {
    Value a = op.getLhs(), b = op.getRhs();
    Value pick = arith::CmpFOp::create(rewriter, op.getLoc(), Predicate, a, b);
    rewriter.replaceOpWithNewOp<arith::SelectOp>(op, pick, a, b);
    return success();
  }
};

struct SelectMaximaPass : spectra::impl::SpectraSelectMaximaBase<SelectMaximaPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<SelectExtremum<arith::MaximumFOp, arith::CmpFPredicate::OGT>,
                 SelectExtremum<arith::MinimumFOp, arith::CmpFPredicate::OLT>>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

struct KeepKernelsPass : spectra::impl::SpectraKeepKernelsBase<KeepKernelsPass> {
  void runOnOperation() override {
    for (Operation &op : llvm::make_early_inc_range(getOperation().getBody()->getOperations())) {
      auto fn = dyn_cast<func::FuncOp>(op);
      bool kernel = (fn && fn->hasAttr("llvm.emit_c_interface")) || isa<gpu::GPUModuleOp>(op);
      if (!kernel)
        op.erase();
    }
  }
};

} // namespace

int64_t mlir::spectra::cpuRegisterRows(int64_t vectorWidth) { return vectorWidth >= 16 ? 8 : 4; }

void mlir::spectra::buildCpuStage(OpPassManager &pm, const CpuPipelineOptions &o, CpuStage stage) {
  switch (stage) {
  case CpuStage::Tiles: {
    buildSpectraInputPipeline(pm);
    SpectraBuildTileKernelsOptions tiles;
    tiles.valueDim = o.valueDim;
    tiles.tileRows = o.tileRows != 0  ? o.tileRows  // < 0: the tile kernels' error
                     : o.causal       ? SPECTRA_CPU_CAUSAL_TILE_ROWS
                                      : 32;
    tiles.causal = o.causal;
    pm.addPass(createSpectraBuildTileKernels(tiles));
    pm.addPass(createSpectraKeepKernels());
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
    return;
  }
  case CpuStage::Vectors: {
    SpectraVectorizeTilesOptions vectors;
    vectors.vectorWidth = o.vectorWidth;
    vectors.registerRows = o.registerRows > 0 ? int64_t(o.registerRows) : cpuRegisterRows(o.vectorWidth);
    vectors.registerVectors = o.registerVectors;
    pm.addNestedPass<func::FuncOp>(createSpectraVectorizeTiles(vectors));
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
    return;
  }
  case CpuStage::LLVM:
    pm.addPass(createSpectraPolynomialExp());
    if (o.selectMaxima)
      pm.addPass(createSpectraSelectMaxima());
    pm.addPass(createSCFToControlFlowPass());
    // Ops with an LLVM intrinsic (fma, floor, sqrt, ...) become intrinsics: instructions the
    // vectoriser can widen (as libm calls, fmaf and floorf kept the polynomial exp scalar and
    // took a fifth of a training step). The rest (tanh, log1p, ...) become libm calls.
    pm.addPass(createConvertMathToLLVMPass());
    pm.addPass(createConvertMathToLibmPass());
    pm.addPass(memref::createExpandStridedMetadataPass());
    // The subviews' offsets (affine.apply) become index arithmetic.
    pm.addPass(createLowerAffinePass());
    pm.addPass(createConvertToLLVMPass());
    pm.addPass(createReconcileUnrealizedCastsPass());
    pm.addNestedPass<LLVM::LLVMFuncOp>(createSpectraPackTileBuffers());
    return;
  }
}

void mlir::spectra::buildCpuPipeline(OpPassManager &pm, const CpuPipelineOptions &options,
                                     CpuStage until) {
  for (CpuStage stage : {CpuStage::Tiles, CpuStage::Vectors, CpuStage::LLVM}) {
    buildCpuStage(pm, options, stage);
    if (stage == until)
      return;
  }
}

void mlir::spectra::registerCpuPipelines() {
  PassPipelineRegistration<CpuPipelineOptions>(
      "spectra-cpu-pipeline",
      "spectra IR to the LLVM dialect for the CPU: tile kernels, vectors, LLVM (what the JIT runs)",
      [](OpPassManager &pm, const CpuPipelineOptions &o) { buildCpuPipeline(pm, o); });
  PassPipelineRegistration<CpuPipelineOptions>(
      "spectra-cpu-lowering", "the CPU pipeline's last stage: vector kernels to the LLVM dialect",
      [](OpPassManager &pm, const CpuPipelineOptions &o) {
        buildCpuStage(pm, o, CpuStage::LLVM);
      });
}

FailureOr<FeaturePartialsOp> mlir::spectra::lookupOrDerivePartials(ComponentOp component) {
  if (auto existing = SymbolTable::lookupNearestSymbolFrom<FeaturePartialsOp>(
          component, StringAttr::get(component.getContext(), component.getSymName() + "_partials")))
    return existing;
  return derivePartials(component);
}
