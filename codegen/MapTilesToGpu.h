//===- MapTilesToGpu.h - the GPU schedule of the tile kernels -------------===//
//
// One kernel layer, two targets: the tile kernels (TileKernels.h) are mapped
// to blocks and threads (spectra-map-tiles-to-gpu), and that mapped IR feeds
// both the emulation on the CPU (gpu-emulated: the pipeline
// spectra-gpu-emulated) and the GPU lowering (spectra-gpu-pipeline:
// gpu.launch, outlining, NVVM, PTX). spectra-opt registers every stage, and
// the C API runs the same builders, so a dumped stage replays exactly:
//   mapped    spectra-input-pipeline, spectra-build-tile-kernels{tile-rows,
//             input-type}, spectra-keep-kernels, canonicalize, cse,
//             spectra-map-tiles-to-gpu, canonicalize, cse
//   emulated  + spectra-emulate-warp-mma (the tensor-core tiles lane by lane),
//             spectra-strip-workgroup-memory, scf-forall-to-for,
//             convert-linalg-to-loops, then the CPU pipeline's LLVM tail
//   ptx       + spectra-launch-mapped-kernels, gpu-launch-sink-index-computations,
//             gpu-kernel-outlining, spectra-describe-gpu-kernels (the launch
//             description, module attribute spectra.gpu_kernels), NVVM, PTX
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_MAPTILESTOGPU_H
#define SPECTRA_CODEGEN_MAPTILESTOGPU_H

#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "llvm/Support/Error.h"

#include <string>

namespace mlir::spectra {

/// The options of spectra-map-tiles-to-gpu.
struct MapTilesOptions {
  int64_t threads = 256;
  int64_t chunkRows = 256;
  /// Row kernels with partial sums size their chunks from them (spectra-map-tiles-to-gpu's
  /// partial-chunks): the host picks the chunk count (KernelLaunch.h, rowChunks).
  bool partialChunks = false;
  int64_t sharedLimit = 48 * 1024;
  /// The operand type of the contractions on tensor cores (bf16 or f16); empty: none.
  std::string mmaType;
  /// With mmaType: warp chains (WarpChains.h) where they apply.
  bool warpChains = true;
  /// A partial tile's row loops over independent rows as one thread nest each
  /// (RowLoopNests.h); false: a nest (and a barrier) per row.
  bool rowNests = true;
  /// A block's nests in phases of independent nests, a phase's thread nests as one nest,
  /// one barrier (MergeNests.h); false: a barrier after every nest.
  bool mergeNests = true;
};

/// The mark of a thread nest (an scf.forall over a block's threads) in the mapped IR.
inline constexpr llvm::StringLiteral kThreadNestAttr = "spectra.thread_nest";

/// `scf.forall (%t) in (n)` mapped to #gpu.thread<x>, marked `mark` (a thread nest), at
/// `b`'s insertion point.
scf::ForallOp createThreadNest(OpBuilder &b, Location loc, int64_t n,
                               llvm::StringRef mark = kThreadNestAttr);

/// Attributes a mapped kernel carries besides the ABI (TileKernels.h).
inline constexpr llvm::StringLiteral kKernelSharedBytesAttr = "spectra.shared_bytes";
inline constexpr llvm::StringLiteral kKernelThreadsAttr = "spectra.threads";
inline constexpr llvm::StringLiteral kKernelChunkRowsAttr = "spectra.chunk_rows";
/// "partials" on a row kernel whose chunk count is its partial sums' second dimension (the
/// chunk rows then ceil(N / C) rounded up to the tile rows; chunk_rows the host's smallest).
inline constexpr llvm::StringLiteral kKernelChunksAttr = "spectra.chunks";
/// On a per-slice kernel whose blocks split its rows (the combines): the blocks per slice,
/// the grid's first dimension (the slices its second); on a one-block kernel (dW's merge
/// over the slices), its blocks.
inline constexpr llvm::StringLiteral kKernelSliceBlocksAttr = "spectra.slice_blocks";
/// The module attribute holding the launch description (JSON) of the outlined kernels.
inline constexpr llvm::StringLiteral kGpuKernelsAttr = "spectra.gpu_kernels";

/// A block's static shared memory (48 KiB on every chip): a kernel whose buffers need more
/// needs the runtime's opt-in (its buffers are one dynamic pool either way:
/// spectra-launch-mapped-kernels).
inline constexpr int64_t kStaticSharedBytes = 48 * 1024;
/// The bytes of static shared memory one block may use on `chip` (sm_80, sm_90a: 48 KiB).
int64_t staticSharedLimit(llvm::StringRef chip);
/// The most shared memory one block may opt into on `chip` (sm_80: 163 KiB, sm_90a: 227 KiB).
int64_t blockSharedLimit(llvm::StringRef chip);
/// The shared memory per block that keeps two blocks resident per SM on `chip` (sm_80:
/// 81 KiB, sm_90a: 113 KiB).
int64_t twoBlockSharedLimit(llvm::StringRef chip);

/// The options of the mapped GPU pipelines.
struct GpuScheduleOptions : public PassPipelineOptions<GpuScheduleOptions> {
  Option<std::string> chip{*this, "chip", llvm::cl::desc("sm_80 or sm_90a"),
                           llvm::cl::init("sm_90a")};
  Option<std::string> dtype{*this, "dtype",
                            llvm::cl::desc("element type of q, k, v, out: f32, bf16 or f16"),
                            llvm::cl::init("f32")};
  Option<int64_t> valueDim{*this, "value-dim",
                           llvm::cl::desc("value head dimension (0: the feature map's d)"),
                           llvm::cl::init(0)};
  // 4 rows keep every paper variant's tiles (m = 128, d = 32, backward included) within
  // the 48 KiB of static shared memory; a row kernel of a larger head whose tiles would not
  // fit takes dynamic shared memory (dynamic-shared) or fewer rows (min-tile-rows), and past
  // the block's opt-in maximum is refused with the limit named.
  Option<int64_t> tileRows{*this, "tile-rows",
                           llvm::cl::desc("rows of q or k per tile (workgroup memory)"),
                           llvm::cl::init(4)};
  Option<int64_t> minTileRows{
      *this, "min-tile-rows",
      llvm::cl::desc("a row kernel whose tiles at tile-rows rows would not fit the shared "
                     "memory keeps halving its rows down to this many (at least tile-rows: "
                     "exactly tile-rows, or the limit's error)"),
      llvm::cl::init(1)};
  Option<int64_t> maxTileRows{
      *this, "max-tile-rows",
      llvm::cl::desc("on tensor cores (bf16/f16): the bidirectional row kernels take up to this "
                     "many rows per tile, halving to tile-rows where the tiles would not fit "
                     "the shared memory (at most tile-rows: no growth)"),
      llvm::cl::init(16)};
  Option<bool> dynamicShared{
      *this, "dynamic-shared",
      llvm::cl::desc("on tensor cores, a row kernel (the causal kernels as a group) takes the "
                     "most rows (up to max-tile-rows) whose tiles fit two blocks per SM, past "
                     "the 48 KiB of static shared memory from dynamic shared memory, before "
                     "fewer rows; on every schedule, tiles that exceed 48 KiB at min-tile-rows may use "
                     "dynamic shared memory up to the block's opt-in maximum (sm_80: 163 KiB, "
                     "sm_90a: 227 KiB); false: at most 48 KiB (no opt-in)"),
      llvm::cl::init(true)};
  Option<bool> causal{*this, "causal",
                      llvm::cl::desc("the causal kernels (with at most 2 tile rows)"),
                      llvm::cl::init(false)};
  Option<std::string> mma{
      *this, "mma",
      llvm::cl::desc("bf16/f16 inputs: the tile contractions on tensor cores (mma.sync, f32 "
                     "sums): bf16x3 (default: each f32 tile operand split into two bf16 parts, "
                     "three mma per step, products within 2^-16), bf16 (one mma, operands "
                     "rounded to bf16), f16 (one mma, operands rounded to f16) or none (FMA)"),
      llvm::cl::init("bf16x3")};
  Option<bool> warpChains{
      *this, "warp-chains",
      llvm::cl::desc("on tensor cores: a contraction, its epilogue and the ops reading the "
                     "tiles it forms (features, maxima, exponentials, the next contraction) "
                     "as one warp nest with those tiles in registers (WarpChains.h)"),
      llvm::cl::init(true)};
  Option<bool> rowNests{
      *this, "row-nests",
      llvm::cl::desc("a partial tile's loops over independent rows (the loads of q, k, v and "
                     "the mask, the stores of output rows) as one thread nest each, where the "
                     "kernels took a nest and a barrier per row (RowLoopNests.h)"),
      llvm::cl::init(true)};
  Option<bool> mergeNests{
      *this, "merge-nests",
      llvm::cl::desc("a block's nests in phases of independent nests, a phase's thread "
                     "nests (the loads of a tile's q, k and v; the row sums of two tiles) as "
                     "one nest and one barrier (MergeNests.h)"),
      llvm::cl::init(true)};
  Option<int64_t> threads{*this, "threads", llvm::cl::desc("threads per block"),
                          llvm::cl::init(256)};
  Option<int64_t> chunkRows{*this, "chunk-rows",
                            llvm::cl::desc("rows of q or k per block (a chunk of the split sums)"),
                            llvm::cl::init(256)};
};

/// The stages of spectra-gpu-pipeline (spectra-compile --emit=gpu|llvm|ptx): the
/// mapped kernels, their NVVM lowering, PTX.
enum class GpuStage { Mapped, NVVM, PTX };

/// The mapped stage: tile kernels scheduled for the GPU (what both paths start from).
void buildGpuMappedPipeline(OpPassManager &pm, const GpuScheduleOptions &options);
/// From the mapped stage to the LLVM dialect for the CPU (gpu-emulated).
void buildGpuEmulationLowering(OpPassManager &pm);
/// From the mapped stage to PTX (`toBinary`) or to the NVVM dialect: gpu.launch,
/// outlining, the launch description (spectra.gpu_kernels), GpuLowering.h.
void buildMappedGpuLowering(OpPassManager &pm, StringRef chip, bool toBinary = true);
/// spectra-gpu-pipeline up to and including `until` (what spectra-compile and the C API run).
void buildGpuPipeline(OpPassManager &pm, const GpuScheduleOptions &options,
                      GpuStage until = GpuStage::PTX);

/// The KernelArtifact (version 3) of a module through spectra-gpu-pipeline: the launch
/// description it recorded (spectra.gpu_kernels), the PTX, the feature map, target,
/// dtype and value dimension. Fails with a message when the module has no PTX or no
/// description.
llvm::Expected<std::string> gpuArtifact(ModuleOp module, StringRef featureMap,
                                        const GpuScheduleOptions &options,
                                        StringRef compilerVersion);

/// Registers spectra-gpu-mapped, spectra-gpu-emulated, spectra-gpu-emulation-lowering,
/// spectra-gpu-pipeline, spectra-gpu-lowering and spectra-serialize-kernels-to-ptx
/// with spectra-opt.
void registerGpuPipelines();

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_MAPTILESTOGPU_H
