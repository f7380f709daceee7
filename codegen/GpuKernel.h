//===- GpuKernel.h - the fused GPU kernels (gpu dialect -> NVVM -> PTX) ---===//
//
// The same fusion as the CPU kernels, tiled for a GPU: the component's
// features region and its derived partials are inlined into the kernels, so
// phi(q) and phi(k) only ever live in registers or in a shared-memory tile.
// One gpu.module per feature map holds six kernels (T = the q/k/v element
// type: f32, bf16 or f16, always accumulated in f32; M, D, Dv are static):
//
//  forward (the stabiliser contract of spectra_compiler.h: a key constant per
//  feature, a constant per query, the denominator guard)
//   key_max       block per (256-key chunk, bh), thread per row of W: each
//                 feature's max logit over the chunk's kept keys, one atomic
//                 max per feature into shift[bh, f] (init -inf).
//   kv_summary    block per (256-key chunk, bh, feature chunk): tiles of 32
//                 keys (fewer for wide heads) and their values staged in shared memory, the phi tile
//                 [features x keys] computed in shared memory (exponent l - c_f),
//                 S += phi V, z += phi and zabs += |phi| summed in registers; one
//                 atomic add per entry per block combines the sequence chunks.
//   readout       thread per query: its constant M = max_f (l_f + c_f), then
//                 out = phi(q)^T S / phi(q)^T z with the guard (counted in guarded[bh]).
//  backward (from spectra-derive-partials; no hand-written derivative)
//   query_backward  thread per query: per-query stats (M, 1/den, g.out)
//                   to qstat, dq, and the query share of dW and dparams
//                   (warp sums, one atomic per warp).
//   dsummary      as kv_summary over queries: dS = sum phi(q)/den g^T,
//                 dz = -sum phi(q)/den (g.out).
//   key_backward  thread per key: dk, dv and the key share of dW, dparams.
//
// q and k arrive in their own dtype, unscaled: every kernel multiplies a loaded
// row by the slice's input scale (qscale/kscale [BH, D] f32: the d^-1/4
// normaliser times SADERF's Psi or HCEXP's A), so no scaled input is ever
// rounded to bf16/f16 (that rounding, amplified by TrigRF's cancelling
// normaliser, cost 0.2-0.4 relative error); dq and dk are gradients with
// respect to the scaled rows (the runtime applies the chain rule).
//
// Argument layout, sizes and launch geometry are described by
// describeGpuKernels (the KernelArtifact the runtime launches from).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_GPUKERNEL_H
#define SPECTRA_CODEGEN_GPUKERNEL_H

#include "dialect/SpectraDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir::spectra {

/// What the GPU kernels are specialised on besides the feature map.
struct GpuKernelOptions {
  /// Element type of q, k, v, out and dL/dout: "f32", "bf16" or "f16".
  std::string dtype = "f32";
  /// Value head dimension; 0 means the feature map's d.
  int64_t valueDim = 0;
};

/// Tiling constants the kernels are built with (also reported in the artifact).
struct GpuTiling {
  static constexpr int64_t rowThreads = 128;   // threads of the row kernels
  static constexpr int64_t sumThreads = 256;   // threads of the summary kernels
  static constexpr int64_t tileRows = 32;      // rows staged per tile
  static constexpr int64_t chunkRows = 256;    // rows per summary block
  static constexpr int64_t chunkFeatures = 128; // phi-tile features (outputs x rows of W)
};

/// Adds `gpu.module @<map>_kernels` with the six kernels of `map` to `module`
/// (marked gpu.container_module). Errors name the unsupported option.
LogicalResult buildGpuKernels(ModuleOp module, FeatureMapOp map, const GpuKernelOptions &options);

/// The artifact's launch description of the kernels built for `map` as JSON
/// (kernels with block, grid rule, shared bytes and arguments; buffers with
/// shapes and initial values).
std::string describeGpuKernels(FeatureMapOp map, const GpuKernelOptions &options);

/// Registers the dialects, translations and target interfaces the GPU path needs.
void registerGpuLoweringDialects(DialectRegistry &registry);

/// The module attribute in which spectra-build-gpu-kernels records each feature
/// map's launch description: {map name = "artifact JSON"}.
inline constexpr llvm::StringLiteral kGpuArtifactsAttr = "spectra.gpu_artifacts";

/// The options of spectra-gpu-pipeline.
struct GpuPipelineOptions : public PassPipelineOptions<GpuPipelineOptions> {
  Option<std::string> chip{*this, "chip", llvm::cl::desc("sm_80 or sm_90a"),
                           llvm::cl::init("sm_90a")};
  Option<std::string> dtype{*this, "dtype",
                            llvm::cl::desc("element type of q, k, v, out: f32, bf16 or f16"),
                            llvm::cl::init("f32")};
  Option<int64_t> valueDim{*this, "value-dim",
                           llvm::cl::desc("value head dimension (0: the feature map's d)"),
                           llvm::cl::init(0)};
};

/// The stages of the GPU pipeline (spectra-compile --emit=gpu|llvm|ptx):
///   gpu   spectra-input-pipeline, spectra-build-gpu-kernels (which records each
///         map's launch description in the module attribute
///         `spectra.gpu_artifacts`), spectra-keep-kernels
///   llvm  + the NVVM target and the lowering of each gpu.module to NVVM
///   ptx   + spectra-serialize-kernels-to-ptx (gpu-module-to-binary format=isa, the
///         kernels serialised in parallel)
enum class GpuStage { Kernels, NVVM, PTX };

/// Adds the GPU pipeline up to and including `until` to `pm` (a module pass manager).
/// spectra-opt registers it as spectra-gpu-pipeline; spectra-compile and the C API
/// run it, so a dumped stage replays exactly.
void buildGpuPipeline(OpPassManager &pm, const GpuPipelineOptions &options,
                      GpuStage until = GpuStage::PTX);

/// The lowering alone (the llvm and, when `toBinary`, ptx stages): attach the NVVM
/// target (chip, PTX features, O3), lower each gpu.module to NVVM, serialise to PTX.
/// Registered in spectra-opt as spectra-gpu-lowering.
void buildGpuLoweringPipeline(OpPassManager &pm, StringRef chip, bool toBinary = true);

/// gpu-module-to-binary (PTX) with each gpu.module's kernels serialised in parallel and joined
/// into one PTX text (spectra-serialize-kernels-to-ptx).
std::unique_ptr<Pass> createSerializeKernelsToPtxPass();

/// The launch description spectra-build-gpu-kernels recorded for `featureMap`
/// (the only one when empty) in `module`, or "" when there is none (or, with no
/// name, when there are several).
std::string recordedGpuArtifact(ModuleOp module, StringRef featureMap = "");

/// Registers spectra-gpu-pipeline and spectra-gpu-lowering with spectra-opt.
void registerGpuPipelines();

/// The PTX text of every gpu.binary in `module`, concatenated.
std::string extractPtx(ModuleOp module);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_GPUKERNEL_H
