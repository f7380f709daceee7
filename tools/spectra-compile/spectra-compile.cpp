//===- spectra-compile.cpp - compile a variant and print a stage ---------===//
//
//   spectra-compile --variant posrf-mm [--m 128 --d 32 --seed 0] [--emit=spectra]
//   spectra-compile my_feature.mlir --emit=spectra
//   spectra-compile --list | --print-library
//
// Stages follow the lowering: spectra (the input IR, library linked),
// descriptor (the JSON the runtime reads), then per target:
//   cpu:           tiles (the kernels as linalg on static tiles), vectors
//                  (register-tiled vector code), llvm (lowered); each a prefix
//                  of spectra-cpu-pipeline, the pipeline the JIT runs
//   sm_80, sm_90a: gpu (the tile kernels mapped to blocks and threads), llvm (NVVM), ptx,
//                  artifact (launch description + PTX as JSON)
//
//===----------------------------------------------------------------------===//

#include "codegen/CpuKernel.h"
#include "codegen/KernelWork.h"
#include "codegen/GpuLowering.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/ExportFeatureMap.h"
#include "codegen/Passes.h"
#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"
#include "frontend/OptionText.h"
#include "frontend/Variant.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"
#include "llvm/TargetParser/Host.h"

#include <cstdlib>
#include <optional>

using namespace mlir;
namespace cl = llvm::cl;
namespace fe = ::spectra::frontend;

static cl::OptionCategory category("spectra-compile options");
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("[input.mlir]"), cl::init(""),
                                      cl::cat(category));
static cl::opt<std::string> variantName("variant",
                                        cl::desc("variant <component>-<weights>, e.g. posrf-mm"),
                                        cl::init(""), cl::cat(category));
static cl::opt<int64_t> numFeatures("m", cl::desc("random features (rows of W), default 128"),
                                    cl::init(128), cl::cat(category));
static cl::opt<int64_t> headDim("d", cl::desc("head dimension, default 32"), cl::init(32),
                                cl::cat(category));
static cl::opt<int64_t> seed("seed", cl::desc("seed of the weight draw, default 0"), cl::init(0),
                             cl::cat(category));
static cl::opt<std::string> dtype("dtype", cl::desc("q/k/v element type: f32 (default), f64, f16, bf16 "
                                                    "(GPU kernels: f32, bf16, f16)"),
                                  cl::init("f32"), cl::cat(category));
static cl::list<std::string> componentOptions(
    "option", cl::desc("component or weight-recipe option NAME=VALUE (repeatable), e.g. "
                       "--option a=-0.2 for gerf, --option components=4 for gmm"),
    cl::cat(category));
static cl::opt<std::string> featureMapName(
    "feature-map",
    cl::desc("in a file that declares several spectra.feature_map ops, compile only the one with "
             "this name (the others must be unused)"),
    cl::value_desc("name"), cl::init(""), cl::cat(category));
static cl::opt<std::string> emit("emit",
                                 cl::desc("stage to print: spectra (default), descriptor (the JSON "
                                          "the runtime reads); --target cpu: tiles (the kernels "
                                          "as linalg on tiles), vectors (register-tiled vector "
                                          "code), llvm (lowered), work (each kernel's vector work per row tile and its "
                                          "FMA-port bound); --target sm_80|sm_90a: gpu "
                                          "(the tile kernels mapped to blocks and threads), llvm (NVVM), ptx, artifact "
                                          "(launch description and PTX as JSON)"),
                                 cl::init("spectra"), cl::cat(category));
static cl::opt<std::string> target("target", cl::desc("cpu (default), sm_80 or sm_90a"),
                                   cl::init("cpu"), cl::cat(category));
static cl::opt<int64_t> valueDim("dv", cl::desc("value head dimension of the kernels (default: d)"),
                                 cl::init(0), cl::cat(category));
static cl::opt<bool> causal("causal",
                            cl::desc("the causal kernels (causal_prefix, causal_readout and the "
                                     "causal backward; CAUSAL-NOTES.md) instead of the "
                                     "bidirectional ones"),
                            cl::init(false), cl::cat(category));
static cl::opt<int64_t> tileRows("tile-rows",
                                 cl::desc("rows of q or k per tile (default on the CPU 32, 16 for --causal; on a GPU, "
                                          "where the tiles live in shared memory, 4, and with "
                                          "bf16/f16 inputs the most, up to 16 per kernel, whose "
                                          "tiles leave two blocks per SM (past the 48 KiB of "
                                          "static shared memory from dynamic shared memory); "
                                          "f32 tiles past 48 KiB take fewer rows; a "
                                          "value given here is taken as is, up to the block's "
                                          "opt-in maximum: 163 KiB on sm_80, 227 KiB on sm_90a)"),
                                 cl::init(0), cl::cat(category));
static cl::opt<std::string> mma(
    "mma",
    cl::desc("GPU, bf16/f16: the contractions on tensor cores: bf16x3 (default: each operand "
             "split in two bf16 parts, three mma.sync per step, f32-grade products), bf16 (one "
             "mma.sync, operands rounded to bf16), f16 (one mma.sync, operands rounded to f16: "
             "more precision, but intermediates past 65504 overflow) or none (FMA)"),
    cl::init("bf16x3"), cl::cat(category));
static cl::opt<bool> warpChains(
    "warp-chains",
    cl::desc("GPU, on tensor cores: keep the tiles between two contractions (logits, "
             "features, exponentials) in registers where a warp chain applies (default; "
             "--warp-chains=false: each contraction its own warp nest, the tiles in shared "
             "memory)"),
    cl::init(true), cl::cat(category));
static cl::opt<bool> rowNests(
    "row-nests",
    cl::desc("GPU: a partial tile's loops over independent rows (loads of q, k, v and the "
             "mask, stores of output rows) as one thread nest each (default; --row-nests=false: "
             "a thread nest and a barrier per row, the kernels before)"),
    cl::init(true), cl::cat(category));
static cl::opt<bool> mergeNests(
    "merge-nests",
    cl::desc("GPU: a block's nests in phases, each nest moved above those it is independent "
             "of, a phase's thread nests (the loads of a tile's q, k and v, the row sums of two "
             "tiles) as one nest and one barrier (default; --merge-nests=false: a barrier after "
             "every nest)"),
    cl::init(true), cl::cat(category));
static cl::opt<int64_t> vectorWidth("vector-width",
                                    cl::desc("CPU: f32 lanes per vector (default: the host's, 8 "
                                             "with AVX2, 16 with AVX-512)"),
                                    cl::init(0), cl::cat(category));
static cl::opt<int64_t> fmaChains(
    "fma-chains",
    cl::desc("CPU: vector FMAs a core keeps in flight, which size the register tiles (default: "
             "the host's at the vector width, from LLVM's scheduling model; 0: the width's "
             "default tile; --host prints them)"),
    cl::init(-1), cl::cat(category));
static cl::opt<bool> cpuAmx(
    "amx",
    cl::desc("CPU: the contractions of f32 tiles on AMX tiles where their shapes allow (16 x 16 "
             "blocks, k in steps of 32), each operand split in two bf16 parts, three TDPBF16PS "
             "per step, f32 accumulation (default: SPECTRA_CPU_AMX=1 on a host with amx-bf16, "
             "what the JIT does; --amx=false: vector FMAs). --emit=work counts the FMA "
             "schedule either way"),
    cl::init(false), cl::cat(category));
static cl::opt<bool> printHost(
    "host",
    cl::desc("print what the CPU kernels are compiled for on this host (vector width, exp "
             "forms, the FMA's latency and throughput, the register tile) and exit; with "
             "--cpu NAME, LLVM's model of that x86 CPU"),
    cl::init(false), cl::cat(category));
static cl::opt<std::string> cpuName("cpu",
                                    cl::desc("with --host: an x86 CPU of LLVM's (znver2, "
                                             "skylake, sapphirerapids, ...) in place of the host's"),
                                    cl::init(""), cl::cat(category));
static cl::opt<std::string> outputFile("o", cl::desc("output file (default: stdout)"),
                                       cl::value_desc("file"), cl::init("-"), cl::cat(category));
static cl::opt<bool> list("list", cl::desc("list the variants and exit"), cl::init(false),
                          cl::cat(category));
static cl::opt<bool> printLibrary("print-library",
                                  cl::desc("print the built-in library and exit"), cl::init(false),
                                  cl::cat(category));

static int fail(const llvm::Twine &message) {
  llvm::WithColor::error(llvm::errs(), "spectra-compile") << message << "\n";
  return 1;
}

static void printVariants(llvm::raw_ostream &os) {
  os << "The 18 variants of the Spectraformer paper:\n";
  for (const fe::Variant &v : fe::paperVariants())
    os << "  " << v.name() << "\n";
  os << "Components: " << llvm::join(fe::componentNames(), ", ") << "\n";
  os << "Weights:    " << llvm::join(fe::weightNames(), ", ") << "\n";
  os << "Any <component>-<weights> combination is valid (" << fe::allVariants().size()
     << " in all).\n";
}

/// --host: the CPU target the JIT compiles for (or, with --cpu, LLVM's model of another CPU).
static int printHostTarget(llvm::raw_ostream &os) {
  namespace sp = mlir::spectra;
  sp::CpuPipelineOptions options;
  sp::setHostTarget(options);
  if (vectorWidth > 0)
    options.vectorWidth = vectorWidth;
  std::string cpu = cpuName.empty() ? llvm::sys::getHostCPUName().str() : cpuName.getValue();
  std::optional<sp::CpuFmaTiming> timing = sp::cpuFmaTiming(cpu, options.vectorWidth);
  if (!cpuName.empty() && !timing && llvm::sys::getProcessTriple().find("x86") == 0 &&
      !sp::cpuFmaTiming(cpu, 8))
    return fail("LLVM's scheduling models have no vfmadd231ps for x86 CPU '" + cpu +
                "' (not a CPU LLVM knows, or one without FMA; e.g. znver2, znver3, haswell, "
                "skylake, sapphirerapids)");
  int64_t chains = fmaChains >= 0        ? int64_t(fmaChains)
                   : !cpuName.empty()    ? (timing ? timing->chains : 0)
                   : vectorWidth > 0     ? sp::hostFmaChains(options.vectorWidth)
                                         : options.fmaChains.getValue();
  sp::CpuRegisterTile tile =
      sp::cpuRegisterTile(options.vectorWidth, options.registerVectors, chains);
  os << "cpu            " << cpu << (cpuName.empty() ? " (this host)" : " (LLVM's model)")
     << ", " << llvm::sys::getProcessTriple() << "\n";
  os << "vector width   " << options.vectorWidth << " f32 lanes"
     << (cpuName.empty()
             ? (options.expScalef && options.expTable
                    ? ", stabilised exps from a table of 2^(j/16) (vpermd), others with vscalefps"
                : options.expScalef ? ", exps with vscalefps"
                : options.expTable  ? ", exps from a table of 2^(j/8) (vpermd)"
                                    : "")
                         : "")
     << "\n";
  os << "fma            ";
  if (timing)
    os << timing->instruction << ": latency " << timing->latency << " cycles, "
       << llvm::formatv("{0}", timing->reciprocalThroughput).str() << " cycles each, so " << timing->chains
       << " in flight to keep the FMA ports busy";
  else
    os << "no figure in LLVM's scheduling model at this width";
  if (fmaChains >= 0 || (cpuName.empty() && std::getenv("SPECTRA_CPU_FMA_CHAINS")))
    os << " (taken as " << chains << ")";
  os << "\n";
  os << "register tile  " << tile.rows << " rows x " << options.registerVectors.getValue()
     << " vectors = " << tile.rows * options.registerVectors << " accumulators, "
     << tile.tileRows << "-row tiles (bidirectional kernels; the causal ones keep "
     << sp::cpuRegisterRows(options.vectorWidth) << " rows)\n";
  if (cpuName.empty())
    os << "amx            "
       << (sp::hostAmx()       ? "on (SPECTRA_CPU_AMX=1): contractions on AMX tiles, bf16x3"
           : sp::hostHasAmx() ? "off (this host has amx-bf16; SPECTRA_CPU_AMX=1 puts the "
                                "contractions on AMX tiles, bf16x3)"
                              : "not on this host")
       << "\n";
  return 0;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "Spectra compiler driver: compiles a random-feature attention variant (or a .mlir file)\n"
      "and prints the requested stage.\n\n"
      "  spectra-compile --variant posrf-mm\n"
      "  spectra-compile --variant gerf-orf --option a=-0.2 --m 256 --d 64\n"
      "  spectra-compile my_feature.mlir\n");

  if (list) {
    printVariants(llvm::outs());
    return 0;
  }
  if (printHost)
    return printHostTarget(llvm::outs());
  if (!cpuName.empty())
    return fail("--cpu names a CPU for --host only (the kernels are compiled for this host)");
  if (fmaChains < -1)
    return fail("--fma-chains takes 0 (the width's default tile) or more, got " +
                llvm::Twine(int64_t(fmaChains)));
  static const std::vector<std::string> stages = {"spectra", "descriptor", "tiles", "vectors", "work",
                                                  "gpu",     "llvm",       "ptx",   "artifact"};
  if (!llvm::is_contained(stages, emit.getValue()))
    return fail("unknown --emit stage '" + emit + "'; stages: " + llvm::join(stages, ", "));
  static const std::vector<std::string> targets = {"cpu", "sm_80", "sm_90a"};
  if (!llvm::is_contained(targets, target.getValue()))
    return fail("unknown --target '" + target + "'; targets: cpu, sm_80, sm_90a");
  bool gpuTarget = target != "cpu";
  bool cpuStage = !gpuTarget && (emit == "tiles" || emit == "vectors" || emit == "work" ||
                                 emit == "llvm");
  bool gpuStage = gpuTarget && (emit == "gpu" || emit == "llvm" || emit == "ptx" || emit == "artifact");
  if (!gpuTarget && (emit == "gpu" || emit == "ptx" || emit == "artifact"))
    return fail("--emit=" + emit + " is a GPU stage: add --target sm_80 or --target sm_90a");
  if (gpuTarget && (emit == "tiles" || emit == "vectors" || emit == "work"))
    return fail("--emit=" + emit + " is a CPU stage: use --target cpu (GPU stages: gpu, llvm, ptx, "
                "artifact)");
  if (gpuTarget && emit != "spectra" && emit != "descriptor" && !gpuStage)
    return fail("--emit=" + emit + " is not a stage of --target " + target);

  MLIRContext context;
  // Diagnostics name the op and where; the op's whole body is not printed after them.
  context.printOpOnDiagnostic(false);
  DialectRegistry registry;
  mlir::spectra::registerLibraryDialects(registry);
  registry.insert<func::FuncDialect>();
  if (cpuStage)
    mlir::spectra::registerCpuLoweringDialects(registry);
  if (gpuStage)
    mlir::spectra::registerGpuLoweringDialects(registry);
  context.appendDialectRegistry(registry);
  context.loadAllAvailableDialects();

  OwningOpRef<ModuleOp> module;
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);

  if (printLibrary) {
    module = mlir::spectra::parseBuiltinLibrary(&context);
    if (!module)
      return fail("the built-in library failed to parse");
  } else if (!variantName.empty()) {
    if (!inputFile.empty())
      return fail("give either --variant or an input file, not both");
    llvm::Expected<fe::Variant> variant = fe::parseVariantName(variantName);
    if (!variant)
      return fail(llvm::toString(variant.takeError()));
    fe::VariantOptions options;
    options.m = numFeatures;
    options.d = headDim;
    options.seed = seed;
    options.dtype = dtype;
    for (const std::string &kv : componentOptions) {
      std::map<std::string, double> parsed;
      if (std::string error = ::spectra::parseOption(kv, parsed); !error.empty())
        return fail("--option " + error);
      for (const auto &[key, value] : parsed)
        options.componentOptions[key] = value;
    }
    fe::Instantiation plan;
    auto built = fe::buildVariantModule(&context, *variant, options, &plan);
    if (!built)
      return fail(llvm::toString(built.takeError()));
    for (const std::string &note : plan.notes)
      llvm::WithColor::note(llvm::errs(), "spectra-compile") << note << "\n";
    module = std::move(*built);
  } else if (!inputFile.empty()) {
    std::string error;
    auto file = openInputFile(inputFile, &error);
    if (!file)
      return fail(error);
    sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
    module = parseSourceFile<ModuleOp>(sourceMgr, &context);
    if (!module)
      return 1; // the diagnostic handler printed where and why
  } else {
    llvm::errs() << "spectra-compile: nothing to compile: give --variant NAME or an input .mlir "
                    "file (--help for usage)\n\n";
    printVariants(llvm::errs());
    return 1;
  }

  if (!featureMapName.empty()) {
    // Keep one feature map: the stages and exports then describe that one alone.
    std::vector<std::string> names;
    mlir::spectra::FeatureMapOp kept;
    for (auto fm : module->getOps<mlir::spectra::FeatureMapOp>()) {
      names.push_back(fm.getSymName().str());
      if (fm.getSymName() == featureMapName)
        kept = fm;
    }
    if (!kept)
      return fail("no spectra.feature_map named '" + featureMapName + "'" +
                  (names.empty() ? std::string(" (the input declares none)")
                                 : "; the input declares: " + llvm::join(names, ", ")));
    for (auto fm : llvm::make_early_inc_range(module->getOps<mlir::spectra::FeatureMapOp>())) {
      if (fm == kept)
        continue;
      if (!SymbolTable::symbolKnownUseEmpty(fm, *module))
        return fail("--feature-map " + featureMapName + ": feature map '" + fm.getSymName() +
                    "' is used in the input, so it cannot be left out");
      fm.erase();
    }
  }

  // The feature map an artifact describes (the GPU pipeline drops the maps).
  std::vector<std::string> mapNames;
  for (auto fm : module->getOps<mlir::spectra::FeatureMapOp>())
    mapNames.push_back(fm.getSymName().str());
  if (emit == "artifact" && mapNames.size() != 1)
    return fail("--emit=artifact describes one feature map; the input declares " +
                (mapNames.empty() ? std::string("none") : llvm::join(mapNames, ", ")) +
                " (name one with --feature-map NAME, or use --emit=ptx)");
  mlir::spectra::GpuScheduleOptions gpuOptions;
  gpuOptions.chip = target.getValue();
  gpuOptions.dtype = dtype.getValue();
  gpuOptions.valueDim = valueDim;
  gpuOptions.causal = causal;
  if (tileRows > 0) {
    // Tiles of exactly the rows asked for (no growth on tensor cores, no shrinking where
    // they would not fit: the shared-memory limit's error instead).
    gpuOptions.tileRows = tileRows;
    gpuOptions.maxTileRows = tileRows;
    gpuOptions.minTileRows = tileRows;
  }
  if (mma != "bf16x3" && mma != "bf16" && mma != "f16" && mma != "none")
    return fail("--mma must be bf16x3, bf16, f16 or none, got '" + mma + "'");
  gpuOptions.mma = mma.getValue();
  gpuOptions.warpChains = warpChains.getValue();
  gpuOptions.rowNests = rowNests.getValue();
  gpuOptions.mergeNests = mergeNests.getValue();

  if (!printLibrary) {
    PassManager pm(&context);
    if (cpuStage) {
      // A prefix of spectra-cpu-pipeline, with the options the JIT uses.
      mlir::spectra::CpuPipelineOptions options;
      mlir::spectra::setHostTarget(options);
      options.valueDim = valueDim;
      options.causal = causal;
      options.tileRows = tileRows > 0 ? tileRows.getValue() : 0;
      if (vectorWidth > 0) {
        options.vectorWidth = vectorWidth;
        options.fmaChains = mlir::spectra::hostFmaChains(vectorWidth);
      }
      if (fmaChains >= 0)
        options.fmaChains = fmaChains;
      if (cpuAmx.getNumOccurrences())
        options.amx = cpuAmx.getValue();
      if (emit == "work")
        options.amx = false;
      mlir::spectra::buildCpuPipeline(pm, options,
                                      emit == "tiles"     ? mlir::spectra::CpuStage::Tiles
                                      : emit == "vectors" || emit == "work"
                                          ? mlir::spectra::CpuStage::Vectors
                                                          : mlir::spectra::CpuStage::LLVM);
    } else if (!gpuStage) {
      mlir::spectra::buildSpectraInputPipeline(pm);
    }
    if (gpuStage) {
      // A prefix of spectra-gpu-pipeline, with the options the C API uses.
      mlir::spectra::buildGpuPipeline(pm, gpuOptions,
                                      emit == "gpu"    ? mlir::spectra::GpuStage::Mapped
                                      : emit == "llvm" ? mlir::spectra::GpuStage::NVVM
                                                       : mlir::spectra::GpuStage::PTX);
    }
    if (failed(pm.run(*module)))
      return 1;
  }

  std::string error;
  auto output = openOutputFile(outputFile, &error);
  if (!output)
    return fail(error);
  if (emit == "ptx" || emit == "artifact") {
    std::string ptx = mlir::spectra::extractPtx(*module);
    if (ptx.empty())
      return fail("the GPU lowering produced no PTX");
    if (emit == "ptx") {
      output->os() << ptx;
    } else {
      // The launch description the pipeline generated, with the PTX.
      llvm::Expected<std::string> artifact =
          mlir::spectra::gpuArtifact(*module, mapNames.front(), gpuOptions, "spectra-compile");
      if (!artifact)
        return fail(llvm::toString(artifact.takeError()));
      output->os() << *artifact << "\n";
    }
    output->keep();
    return 0;
  }
  if (emit == "work") {
    int64_t width = vectorWidth > 0 ? vectorWidth : mlir::spectra::hostVectorWidth();
    output->os() << mlir::spectra::hostKernelWork(*module, width);
    output->keep();
    return 0;
  }
  if (emit == "descriptor") {
    llvm::Expected<std::string> descriptor = mlir::spectra::exportFeatureMap(*module);
    if (!descriptor) {
      std::string message = llvm::toString(descriptor.takeError());
      if (llvm::StringRef(message).contains("several feature maps"))
        message += " with --feature-map NAME";
      return fail(message);
    }
    output->os() << *descriptor << "\n";
    output->keep();
    return 0;
  }
  module->print(output->os());
  output->os() << "\n";
  output->keep();
  return 0;
}
