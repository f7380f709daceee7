//===- CpuKernel.h - the CPU pipeline: tiles -> vectors -> LLVM -----------===//
//
// The CPU target of the tile kernels (TileKernels.h). One registered pipeline,
// `spectra-cpu-pipeline`, takes spectra IR to the LLVM dialect; spectra-opt
// registers it, spectra-compile's --emit stages and the C API
// (libspectra-compiler's JIT) run prefixes of it, so a dumped stage replays
// exactly:
//   tiles    spectra-input-pipeline, spectra-build-tile-kernels,
//            spectra-keep-kernels, canonicalize, cse
//   vectors  + spectra-vectorize-tiles, canonicalize, cse
//   llvm     + spectra-polynomial-exp and the lowering to the LLVM dialect
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_CPUKERNEL_H
#define SPECTRA_CODEGEN_CPUKERNEL_H

#include "dialect/SpectraDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

#include <optional>

namespace mlir::spectra {

/// The options of spectra-cpu-pipeline.
struct CpuPipelineOptions : public PassPipelineOptions<CpuPipelineOptions> {
  Option<int64_t> valueDim{*this, "value-dim",
                           llvm::cl::desc("value head dimension (0: the feature map's d)"),
                           llvm::cl::init(0)};
  Option<int64_t> tileRows{*this, "tile-rows",
                           llvm::cl::desc("rows of q or k per tile (0: 32, or for the causal "
                                          "kernels 8 or 16 by the head: "
                                          "spectra_cpu_causal_tile_rows)"),
                           llvm::cl::init(0)};
  Option<bool> causal{*this, "causal", llvm::cl::desc("the causal kernels"), llvm::cl::init(false)};
  Option<int64_t> vectorWidth{*this, "vector-width",
                              llvm::cl::desc("f32 lanes per vector (8: AVX2, 16: AVX-512)"),
                              llvm::cl::init(8)};
  Option<int64_t> registerRows{
      *this, "register-rows",
      llvm::cl::desc("rows of a contraction's register tile (0: by the vector width, "
                     "cpuRegisterRows)"),
      llvm::cl::init(0)};
  Option<int64_t> registerVectors{*this, "register-vectors",
                                  llvm::cl::desc("vectors per row of a register tile"),
                                  llvm::cl::init(2)};
  Option<int64_t> fmaChains{
      *this, "fma-chains",
      llvm::cl::desc("vector FMAs a core must keep in flight to issue one on each of its FMA "
                     "ports every cycle (latency / reciprocal throughput: hostFmaChains); where "
                     "a register tile of register-rows 0 has fewer accumulators, the "
                     "bidirectional kernels' tiles take as many rows as the vector registers "
                     "hold (cpuRegisterTile). 0: the vector width's tile"),
      llvm::cl::init(0)};
  Option<bool> expScalef{*this, "exp-scalef",
                         llvm::cl::desc("16-lane exps with AVX-512's vscalefps "
                                        "(spectra-polynomial-exp's scalef; for avx512f hosts)"),
                         llvm::cl::init(false)};
  Option<bool> expTable{*this, "exp-table",
                        llvm::cl::desc("8-lane stabilised exps from an 8-entry table of 2^(j/8) "
                                       "with AVX2's vpermd (spectra-polynomial-exp's table; "
                                       "for avx2 hosts); with exp-scalef, 16-lane ones from "
                                       "a 16-entry table of 2^(j/16)"),
                        llvm::cl::init(false)};
  Option<bool> amx{*this, "amx",
                   llvm::cl::desc("contractions of f32 tiles on AMX tiles, each operand split in "
                                  "two bf16 parts (spectra-vectorize-tiles' amx; for amx-bf16 "
                                  "hosts)"),
                   llvm::cl::init(false)};
  Option<bool> stripFeatures{
      *this, "strip-features",
      llvm::cl::desc("chains parallel along the features one register tile's width of them at "
                     "a time (spectra-strip-tiles); off: measured neutral on a Zen 3 core, "
                     "docs/kernels-at-the-limit.md"),
      llvm::cl::init(false)};
  Option<bool> selectMaxima{*this, "select-maxima",
                            llvm::cl::desc("maxima as one compare-and-select (spectra-select-maxima); "
                                           "off where the GPU's max.NaN is emulated"),
                            llvm::cl::init(true)};
};

/// The register tile's rows at `vectorWidth` f32 lanes: 8 at 16 lanes (AVX-512's 32 vector
/// registers hold 8 x 2 accumulators, the operands and the broadcast: the four bidirectional
/// kernels measured 7% faster than with 4 rows on a 2-core Sapphire Rapids), 4 at 8 or fewer
/// (AVX2's 16 registers).
int64_t cpuRegisterRows(int64_t vectorWidth);

/// A contraction's register tile (rows of `vectors` vectors) and the kernels' row tile.
struct CpuRegisterTile {
  int64_t rows = 0;
  int64_t tileRows = 0;
};

/// The bidirectional kernels' register tile at `vectorWidth` f32 lanes, `vectors` vectors per
/// row, on a core that keeps `fmaChains` vector FMAs in flight (0: unknown):
/// cpuRegisterRows(vectorWidth) rows, or where their accumulators are fewer than `fmaChains`
/// (the contraction loops would wait on the FMA's latency), as many rows as the vector
/// registers hold beside B's vectors and A's broadcast: 6 x 2 in AVX2's 16, where Zen 2's
/// and Haswell's FMA takes 5 cycles at 2 a cycle (10 in flight; 4 x 2 holds 8). The row tile
/// is 32, or where the rows do not divide it the largest multiple of both the rows and
/// `vectorWidth` up to 32 (their least common multiple where that is larger): 24 for 6 rows
/// at 8 lanes, so no rows are left for a narrower tile.
CpuRegisterTile cpuRegisterTile(int64_t vectorWidth, int64_t vectors, int64_t fmaChains);

/// vfmadd231ps at one vector width in LLVM's scheduling model of a CPU.
struct CpuFmaTiming {
  const char *instruction = "";  // the x86 opcode: VFMADD231PS{r,Yr,Zr} at 4, 8, 16 lanes
  int latency = 0;               // cycles
  double reciprocalThroughput = 0;  // cycles per instruction (0.5: two FMA ports)
  int64_t chains = 0;            // ceil(latency / reciprocal throughput): FMAs in flight
};

/// The timing of vfmadd231ps at `vectorWidth` f32 lanes (4, 8 or 16) in LLVM's scheduling
/// model of the x86 CPU `cpu` (znver2, skylake, ...); none on another architecture, for an
/// unknown CPU or where the model has no figure for that width (a 512-bit FMA on a CPU without
/// AVX-512).
std::optional<CpuFmaTiming> cpuFmaTiming(llvm::StringRef cpu, int64_t vectorWidth);

/// The vector FMAs this host's cores keep in flight at `vectorWidth` f32 lanes: the latency
/// of vfmadd231ps on that register width over its reciprocal throughput, in LLVM's scheduling
/// model of the host CPU (cpuFmaTiming: znver2 and haswell 10 at 8 lanes, znver3 and skylake
/// 8), or SPECTRA_CPU_FMA_CHAINS when set (1-64; the tests choose a register tile with it). 0
/// where the model has no figure (another architecture, a width the CPU lacks). Part of the
/// kernel cache key (spectra_cpu_host_target).
int64_t hostFmaChains(int64_t vectorWidth);

/// The stages of the CPU pipeline (--emit=tiles|vectors|llvm).
enum class CpuStage { Tiles, Vectors, LLVM };

/// Adds the CPU pipeline up to and including `until` to `pm` (a module pass manager).
void buildCpuPipeline(OpPassManager &pm, const CpuPipelineOptions &options,
                      CpuStage until = CpuStage::LLVM);

/// The passes of one stage alone (the stage after `from`): what turns a dumped
/// `from` stage into the next. Applied in order, the stages are the pipeline.
void buildCpuStage(OpPassManager &pm, const CpuPipelineOptions &options, CpuStage stage);

/// The f32 lanes of the host's widest vector unit (16 with AVX-512F, else 8), or
/// SPECTRA_CPU_VECTOR_WIDTH (4, 8 or 16) when set. Part of the kernel cache key.
int64_t hostVectorWidth();

/// Whether the host has AVX-512F (whatever SPECTRA_CPU_VECTOR_WIDTH says): the kernels may
/// then use its instructions (spectra-polynomial-exp's scalef).
bool hostHasAvx512();

/// Whether the host has AMX's bf16 tile products (amx-tile and amx-bf16).
bool hostHasAmx();

/// Whether the CPU kernels' contractions run on AMX tiles (spectra-vectorize-tiles' amx):
/// SPECTRA_CPU_AMX=1 asks for it, and it holds where the host has AMX and Linux grants the
/// process the tile state. Off by default: docs/kernels-at-the-limit.md has why. Read at each
/// call; part of the kernel cache key.
bool hostAmx();

/// Whether the host has AVX2: 8-lane stabilised exps may then use vpermd
/// (spectra-polynomial-exp's table).
bool hostHasAvx2();

/// Sets spectra-cpu-pipeline's options for kernels run on this host (what the JIT compiles
/// with): its vector width, the exp forms its instructions allow and the FMAs its cores keep
/// in flight (the register tiles).
void setHostTarget(CpuPipelineOptions &options);

/// The multiply by a coefficient that spectra-polynomial-exp's vscalefps form folds into a
/// 16-lane exp (exp(x) * s as fma(p, s, s) 2^n): the exp's only use, a mulf whose other
/// operand is defined before the exp. Null otherwise.
arith::MulFOp expScaledBy(math::ExpOp exp);

/// Registers the dialects the CPU kernels use and their convert-to-llvm
/// interfaces; every tool that runs the CPU pipeline needs them.
void registerCpuLoweringDialects(DialectRegistry &registry);

/// Registers spectra-cpu-pipeline (and the spectra-cpu-lowering tail) with spectra-opt.
void registerCpuPipelines();

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_CPUKERNEL_H
