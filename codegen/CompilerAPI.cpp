//===- CompilerAPI.cpp - libspectra-compiler's extern "C" surface --------===//

#include "codegen/spectra_compiler.h"

#include "codegen/CpuKernel.h"
#include "codegen/KernelWork.h"
#include "codegen/GpuLowering.h"
#include "frontend/OptionText.h"
#include "codegen/MapTilesToGpu.h"
#include "codegen/TileKernels.h"
#include "codegen/ExportFeatureMap.h"
#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"
#include "frontend/Variant.h"

#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SHA256.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SourceMgr.h"

#include <cstdlib>
#include <dlfcn.h>
#include <link.h>
#include <functional>
#include <thread>
#include <map>
#include <memory>
#include <mutex>
#include <cstring>

using namespace mlir;
namespace fe = ::spectra::frontend;

#ifndef SPECTRA_COMPILER_VERSION
#define SPECTRA_COMPILER_VERSION "dev"
#endif

static char *duplicate(const std::string &s) {
  char *p = static_cast<char *>(std::malloc(s.size() + 1));
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = 0;
  return p;
}

static char *fail(char **error, const std::string &message) {
  if (error)
    *error = duplicate(message);
  return nullptr;
}

namespace {
/// A context with the dialects spectra IR uses, collecting diagnostics as text.
struct Context {
  // Threading on: the CPU pipeline runs function passes in parallel, and the two JIT
  // threads translate their modules concurrently.
  MLIRContext context{MLIRContext::Threading::ENABLED};
  std::string diagnostics;
  Context() {
    DialectRegistry registry;
    mlir::spectra::registerLibraryDialects(registry);
    mlir::spectra::registerGpuLoweringDialects(registry);
    registerBuiltinDialectTranslation(registry);
    registerLLVMDialectTranslation(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    context.printOpOnDiagnostic(false);
    context.getDiagEngine().registerHandler([this](Diagnostic &diag) {
      llvm::raw_string_ostream os(diagnostics);
      os << diag.getLocation() << ": " << diag << "\n";
      for (Diagnostic &note : diag.getNotes())
        os << note.getLocation() << ": note: " << note << "\n";
    });
  }
};
} // namespace

/// The options of a named variant; "" or a message naming the malformed option.
static std::string variantOptions(int64_t m, int64_t d, int64_t seed, const char *options,
                                  fe::VariantOptions &opts) {
  opts.m = m;
  opts.d = d;
  opts.seed = seed;
  std::map<std::string, double> parsed;
  if (std::string error = ::spectra::parseOptionList(options ? options : "", parsed); !error.empty())
    return "option " + error;
  for (const auto &[key, value] : parsed)
    opts.componentOptions[key] = value;
  return "";
}

/// The GNU build-id note of this shared library: a hash the linker computes
/// over the output, so it changes whenever the compiler's code does (the git
/// revision alone misses uncommitted changes).
static std::string elfBuildId() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void *>(&elfBuildId), &info))
    return "";
  struct Search {
    const void *base;
    std::string id;
  } search{info.dli_fbase, ""};
  dl_iterate_phdr(
      [](dl_phdr_info *object, size_t, void *data) -> int {
        auto *s = static_cast<Search *>(data);
        if (reinterpret_cast<const void *>(object->dlpi_addr) != s->base)
          return 0;
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const ElfW(Phdr) &ph = object->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE)
            continue;
          const char *p = reinterpret_cast<const char *>(object->dlpi_addr + ph.p_vaddr);
          const char *end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            auto *note = reinterpret_cast<const ElfW(Nhdr) *>(p);
            const char *name = p + sizeof(ElfW(Nhdr));
            const char *desc = name + ((note->n_namesz + 3) & ~3u);
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
                std::memcmp(name, "GNU", 4) == 0)
              s->id = llvm::toHex(llvm::StringRef(desc, note->n_descsz), /*LowerCase=*/true);
            p = desc + ((note->n_descsz + 3) & ~3u);
          }
        }
        return 1;
      },
      &search);
  return search.id;
}

extern "C" const char *spectra_compiler_version(void) {
  static const std::string version = [] {
    std::string id = elfBuildId();
    return std::string(SPECTRA_COMPILER_VERSION) + (id.empty() ? "" : "+build." + id);
  }();
  return version.c_str();
}

extern "C" const char *spectra_variant_names(void) {
  static const std::string names = [] {
    std::string text;
    auto add = [&](const fe::Variant &v) { text += (text.empty() ? "" : ",") + v.name(); };
    for (const fe::Variant &v : fe::paperVariants())
      add(v);
    for (const fe::Variant &v : fe::allVariants())
      if (!v.isPaperVariant())
        add(v);
    return text;
  }();
  return names.c_str();
}

/// The module of a named variant with its options, or null and `why`.
static OwningOpRef<ModuleOp> variantModule(Context &ctx, const char *api, const char *variant,
                                           int64_t m, int64_t d, int64_t seed, const char *options,
                                           std::string &why) {
  if (!variant) {
    why = std::string(api) + ": variant is NULL";
    return nullptr;
  }
  llvm::Expected<fe::Variant> parsed = fe::parseVariantName(variant);
  if (!parsed) {
    why = llvm::toString(parsed.takeError());
    return nullptr;
  }
  fe::VariantOptions opts;
  if (why = variantOptions(m, d, seed, options, opts); !why.empty())
    return nullptr;
  auto module = fe::buildVariantModule(&ctx.context, *parsed, opts);
  if (!module) {
    why = llvm::toString(module.takeError());
    return nullptr;
  }
  return std::move(*module);
}

extern "C" char *spectra_describe_variant(const char *variant, int64_t m, int64_t d, int64_t seed,
                                          const char *options, char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module =
      variantModule(ctx, "spectra_describe_variant", variant, m, d, seed, options, why);
  if (!module)
    return fail(error, why);
  llvm::Expected<std::string> descriptor = mlir::spectra::exportFeatureMap(*module);
  if (!descriptor)
    return fail(error, llvm::toString(descriptor.takeError()));
  return duplicate(*descriptor);
}

/// Parses spectra IR text, or null and `why` (the parser's located diagnostics).
static OwningOpRef<ModuleOp> parseModule(Context &ctx, const char *api, const char *ir,
                                         const char *sourceName, std::string &why) {
  if (!ir) {
    why = std::string(api) + ": ir is NULL";
    return nullptr;
  }
  ParserConfig config(&ctx.context);
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(ir, config, sourceName ? sourceName : "<spectra-ir>");
  if (!module)
    why = ctx.diagnostics.empty() ? "the IR does not parse" : ctx.diagnostics;
  return module;
}

extern "C" char *spectra_describe_ir(const char *ir, const char *sourceName,
                                     const char *featureMap, char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module = parseModule(ctx, "spectra_describe_ir", ir, sourceName, why);
  if (!module)
    return fail(error, why);
  llvm::Expected<std::string> descriptor =
      mlir::spectra::exportFeatureMap(*module, featureMap ? featureMap : "");
  if (!descriptor)
    return fail(error, llvm::toString(descriptor.takeError()) +
                           (ctx.diagnostics.empty() ? "" : "\n" + ctx.diagnostics));
  return duplicate(*descriptor);
}

extern "C" void spectra_free(void *pointer) { std::free(pointer); }

//===----------------------------------------------------------------------===//
// CPU kernels
//===----------------------------------------------------------------------===//

namespace sp = mlir::spectra;

struct spectra_cpu_kernel {
  std::vector<std::unique_ptr<ExecutionEngine>> engines;  // compiled here, or
  std::unique_ptr<llvm::orc::LLJIT> jit;                  // loaded from cached objects
  std::string object;  // the relocatable objects, packed (packObjects; cacheable)
  std::map<std::string, void *> entries;    // by kind: kv, readout, query_backward, key_backward
  std::map<std::string, std::string> stages;  // tiles, vectors, llvm
  std::string backwardError;
  std::map<std::string, std::string> abi;  // by kind: the kernel ABI (spectra_cpu_kernel_abi)
};

/// Each kernel's ABI as text: "grid=<rule>;chunk_rows=<n>;" (then "chunks=", "tile_rows=",
/// "antipodal=<pairs>;" where set) then "name:role:rank:element;" per argument (element: f32,
/// bf16 or f16).
static void recordAbi(spectra_cpu_kernel &kernel, ModuleOp module) {
  for (auto fn : module.getOps<func::FuncOp>()) {
    auto kind = fn->getAttrOfType<StringAttr>(sp::kKernelKindAttr);
    auto names = fn->getAttrOfType<ArrayAttr>(sp::kKernelArgNamesAttr);
    auto roles = fn->getAttrOfType<ArrayAttr>(sp::kKernelArgRolesAttr);
    auto grid = fn->getAttrOfType<StringAttr>(sp::kKernelGridAttr);
    if (!kind || !names || !roles || !grid || names.size() != fn.getNumArguments() ||
        roles.size() != fn.getNumArguments())
      continue;
    std::string text = "grid=" + grid.getValue().str() + ";";
    if (auto chunk = fn->getAttrOfType<IntegerAttr>(sp::kKernelChunkRowsAttr))
      text += "chunk_rows=" + std::to_string(chunk.getInt()) + ";";
    if (auto chunks = fn->getAttrOfType<StringAttr>(sp::kKernelChunksAttr))
      text += "chunks=" + chunks.getValue().str() + ";";
    if (auto rows = fn->getAttrOfType<IntegerAttr>(sp::kKernelTileRowsAttr))
      text += "tile_rows=" + std::to_string(rows.getInt()) + ";";
    if (auto pairs = fn->getAttrOfType<IntegerAttr>(sp::kKernelAntipodalPairsAttr))
      text += "antipodal=" + std::to_string(pairs.getInt()) + ";";
    for (auto [i, type] : llvm::enumerate(fn.getArgumentTypes())) {
      auto memref = cast<MemRefType>(type);
      std::string element;
      llvm::raw_string_ostream(element) << memref.getElementType();
      text += cast<StringAttr>(names[i]).getValue().str() + ":" +
              cast<StringAttr>(roles[i]).getValue().str() + ":" +
              std::to_string(memref.getRank()) + ":" + element + ";";
    }
    kernel.abi[kind.getValue().str()] = text;
  }
}


/// The arguments a vectorised kernel writes with streaming stores (VectorizeTiles), which its
/// caller must align: "aligned=BYTES:name,name;" appended to the kernel's ABI.
static void recordStreamedArgs(spectra_cpu_kernel &kernel, ModuleOp module) {
  for (auto fn : module.getOps<func::FuncOp>()) {
    auto kind = fn->getAttrOfType<StringAttr>(sp::kKernelKindAttr);
    auto names = fn->getAttrOfType<ArrayAttr>(sp::kKernelArgNamesAttr);
    auto streamed = fn->getAttrOfType<DenseI64ArrayAttr>(sp::kKernelStreamedArgsAttr);
    auto bytes = fn->getAttrOfType<IntegerAttr>(sp::kKernelAlignedBytesAttr);
    if (!kind || !names || !streamed || !bytes || !kernel.abi.count(kind.getValue().str()))
      continue;
    std::string text = "aligned=" + std::to_string(bytes.getInt()) + ":";
    for (auto [i, index] : llvm::enumerate(streamed.asArrayRef()))
      text += (i ? "," : "") + cast<StringAttr>(names[index]).getValue().str();
    kernel.abi[kind.getValue().str()] += text + ";";
  }
}

/// Several relocatable objects as one byte string: "spectra-objects\n", then per object
/// its size (8 bytes, little-endian) and its bytes.
static constexpr llvm::StringLiteral kObjectsMagic = "spectra-objects\n";
static std::string packObjects(llvm::ArrayRef<std::string> objects) {
  std::string out = kObjectsMagic.str();
  for (const std::string &object : objects) {
    uint64_t size = object.size();
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
    out += object;
  }
  return out;
}
/// The kernels' ABI as one more part of the pack (so a cached kernel keeps it):
/// "spectra-abi\n", then "<kind>=<abi>\n" per kernel.
static constexpr llvm::StringLiteral kAbiMagic = "spectra-abi\n";
static std::string packAbi(const std::map<std::string, std::string> &abi) {
  std::string out = kAbiMagic.str();
  for (const auto &[kind, text] : abi)
    out += kind + "=" + text + "\n";
  return out;
}
static bool unpackAbi(llvm::StringRef part, std::map<std::string, std::string> &abi) {
  if (!part.consume_front(kAbiMagic))
    return false;
  for (llvm::StringRef line : llvm::split(part, '\n')) {
    if (line.empty())
      continue;
    auto [kind, text] = line.split('=');
    abi[kind.str()] = text.str();
  }
  return true;
}
/// Why there is no backward, as one more part of the pack (a cached kernel keeps the reason).
static constexpr llvm::StringLiteral kBackwardErrorMagic = "spectra-backward-error\n";
static bool unpackBackwardError(llvm::StringRef part, std::string &why) {
  if (!part.consume_front(kBackwardErrorMagic))
    return false;
  why = part.str();
  return true;
}
static bool unpackObjects(llvm::StringRef packed, std::vector<llvm::StringRef> &objects) {
  if (!packed.consume_front(kObjectsMagic))
    return false;
  while (!packed.empty()) {
    if (packed.size() < 8)
      return false;
    uint64_t size = 0;
    for (int i = 0; i < 8; ++i)
      size |= static_cast<uint64_t>(static_cast<unsigned char>(packed[i])) << (8 * i);
    packed = packed.drop_front(8);
    if (size > packed.size())
      return false;
    objects.push_back(packed.take_front(size));
    packed = packed.drop_front(size);
  }
  return !objects.empty();
}

/// One feature map per compiled object: keeps `featureMap` (the first one when NULL) and
/// drops the others before a pipeline runs; its name, or "" and `why`.
static std::string keepOneFeatureMap(ModuleOp source, const char *featureMap, std::string &why) {
  sp::FeatureMapOp map;
  for (auto fm : source.getOps<sp::FeatureMapOp>())
    if (!map && (!featureMap || fm.getSymName() == featureMap))
      map = fm;
  if (!map) {
    why = featureMap ? "no spectra.feature_map named '" + std::string(featureMap) + "'"
                     : std::string("no spectra.feature_map to compile");
    return "";
  }
  for (auto fm : llvm::to_vector(source.getOps<sp::FeatureMapOp>()))
    if (fm != map)
      fm.erase();
  return map.getSymName().str();
}

/// A kernel kind that only the backward needs (missing when the component has no backward).
static bool isBackwardKind(llvm::StringRef kind) {
  return kind.contains("backward") || kind.starts_with("causal_suffix") ||
         (kind.ends_with("_combine") && kind != "kv_combine" && kind != "moments_combine");
}

/// A kernel kind that only components with data statistics have (TileKernels.h).
static bool isStatisticsKind(llvm::StringRef kind) { return kind.starts_with("moments"); }

/// A kind of the other kernel set: the causal kinds in a bidirectional set, the
/// bidirectional readout in a causal one (TileKernels.h).
static bool isOtherSetKind(llvm::StringRef kind, bool causal) {
  if (!causal)
    return kind.starts_with("causal_");
  return kind == "readout";
}

static spectra_cpu_kernel *failKernel(char **error, const std::string &message) {
  fail(error, message);
  return nullptr;
}


extern "C" const char *spectra_gpu_mma_mode(void) {
  const char *value = std::getenv("SPECTRA_MMA");
  if (!value || !*value)
    return "bf16x3";
  for (const char *mode : {"bf16x3", "bf16", "f16", "none"})
    if (std::strcmp(value, mode) == 0)
      return mode;
  static std::once_flag warned;
  std::call_once(warned, [&] {
    llvm::errs() << "spectra: ignoring SPECTRA_MMA='" << value
                 << "' (takes bf16x3, bf16, f16 or none); using bf16x3\n";
  });
  return "bf16x3";
}

/// SPECTRA_EMULATED_OPT: the LLVM optimisation level (0-3) of the emulated GPU kernels;
/// 0 by default (they verify; compile time dominates their runs).
static unsigned emulatedOptLevel() {
  const char *value = std::getenv("SPECTRA_EMULATED_OPT");
  if (!value || !*value)
    return 0;
  if (value[1] == 0 && value[0] >= '0' && value[0] <= '3')
    return static_cast<unsigned>(value[0] - '0');
  static std::once_flag warned;
  std::call_once(warned, [&] {
    llvm::errs() << "spectra: ignoring SPECTRA_EMULATED_OPT='" << value
                 << "' (takes 0, 1, 2 or 3); using 0\n";
  });
  return 0;
}

extern "C" const char *spectra_cpu_host_target(void) {
  // The FMAs in flight choose the register tiles (SPECTRA_CPU_FMA_CHAINS may override them).
  static const std::string target =
      llvm::sys::getProcessTriple() + "-" + llvm::sys::getHostCPUName().str() + "-vl" +
      std::to_string(sp::hostVectorWidth()) + "-fma" +
      std::to_string(sp::hostFmaChains(sp::hostVectorWidth()));
  // SPECTRA_CPU_AMX is read at each call: a process may compile both kinds of kernels.
  static const std::string amx = target + "-amx";
  return (sp::hostAmx() ? amx : target).c_str();
}

extern "C" int spectra_cpu_amx(void) { return sp::hostAmx() ? 1 : 0; }

/// Looks the four kernels of `map` up in a JIT; the backward ones may be missing.
template <typename Lookup>
static std::string lookupEntries(spectra_cpu_kernel &kernel, llvm::StringRef map, Lookup lookup) {
  // A causal kernel set has causal_readout; the other set's kinds are absent, not missing.
  bool causal = lookup("_mlir_ciface_" + map.str() + "_causal_readout") != nullptr;
  for (llvm::StringRef kind : sp::tileKernelKinds()) {
    std::string symbol = "_mlir_ciface_" + map.str() + "_" + kind.str();
    if (void *address = lookup(symbol))
      kernel.entries[kind.str()] = address;
    else if (isBackwardKind(kind) || isStatisticsKind(kind) || isOtherSetKind(kind, causal))
      continue;
    else
      return "the compiled kernels lack " + symbol;
  }
  return "";
}

/// Runs spectra-cpu-pipeline on the module's feature map, stage by stage (keeping
/// each stage's IR), and JIT-compiles the result. With `emulatedDtype`, the GPU
/// kernels instead: the mapped stage (spectra-gpu-mapped, q/k/v of that type) lowered
/// for the CPU (gpu-emulated); stages "mapped" and "llvm".
static spectra_cpu_kernel *compileCpu(Context &ctx, ModuleOp source, const char *featureMap,
                                      int64_t dv, bool causal, char **error,
                                      const char *emulatedDtype = nullptr) {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  if (failed(sp::linkBuiltinLibrary(source)))
    return failKernel(error, "could not link the built-in library:\n" + ctx.diagnostics);
  std::string why;
  std::string mapName = keepOneFeatureMap(source, featureMap, why);
  if (mapName.empty())
    return failKernel(error, why);

  auto result = std::make_unique<spectra_cpu_kernel>();
  // spectra-cpu-pipeline's options: this host's vector width and exp forms, the requested
  // value dim.
  sp::CpuPipelineOptions options;
  sp::setHostTarget(options);
  options.valueDim = dv;
  options.causal = causal;
  sp::GpuScheduleOptions emulated;
  emulated.valueDim = dv;
  emulated.causal = causal;
  if (emulatedDtype)
    emulated.dtype = emulatedDtype;
  emulated.mma = spectra_gpu_mma_mode();
  using Stage = std::pair<std::function<void(OpPassManager &)>, const char *>;
  std::vector<Stage> stages;
  if (emulatedDtype) {
    stages.push_back({[&](OpPassManager &pm) { sp::buildGpuMappedPipeline(pm, emulated); }, "mapped"});
    stages.push_back({[&](OpPassManager &pm) { sp::buildGpuEmulationLowering(pm); }, "llvm"});
  } else {
    for (auto [stage, name] : {std::pair{sp::CpuStage::Tiles, "tiles"},
                               {sp::CpuStage::Vectors, "vectors"}, {sp::CpuStage::LLVM, "llvm"}})
      stages.push_back({[&options, stage = stage](OpPassManager &pm) {
                          sp::buildCpuStage(pm, options, stage);
                        },
                        name});
  }
  bool firstStage = true;
  for (auto &[build, name] : stages) {
    PassManager pm(&ctx.context);
    build(pm);
    if (failed(pm.run(source)))
      return failKernel(error, std::string(emulatedDtype ? "compiling the emulated GPU kernels"
                                                         : "compiling the CPU kernels") +
                                   " failed (stage " + name + "):\n" + ctx.diagnostics);
    // The tile stage records why a map has no backward kernels; the forward still works.
    if (auto errors = source->getAttrOfType<DictionaryAttr>(sp::kBackwardErrorsAttr))
      if (auto why = errors.getAs<StringAttr>(mapName); firstStage && why)
        result->backwardError = why.str();
    if (firstStage)
      recordAbi(*result, source);
    firstStage = false;
    if (llvm::StringRef(name) == "vectors")  // where VectorizeTiles marks them
      recordStreamedArgs(*result, source);
    llvm::raw_string_ostream os(result->stages[name]);
    source.print(os);
  }
  // The forward and the backward kernels are JIT-compiled as two modules on two threads
  // (LLVM's optimiser and code generator take most of a cold compile).
  OwningOpRef<ModuleOp> backward = source.clone();
  auto keepOnly = [&](ModuleOp module, bool forward) {
    for (auto fn : llvm::to_vector(module.getOps<LLVM::LLVMFuncOp>())) {
      llvm::StringRef name = fn.getSymName();
      bool isBackward = false, isForward = false;
      for (llvm::StringRef kind : sp::tileKernelKinds())
        if (name.ends_with("_" + kind.str()))
          (isBackwardKind(kind) ? isBackward : isForward) = true;
      if (!fn.isExternal() && (forward ? isBackward : isForward))
        fn.erase();
    }
  };
  keepOnly(source, /*forward=*/true);
  keepOnly(*backward, /*forward=*/false);
  std::string failure;
  std::mutex failureMutex;
  // The emulated GPU kernels check the mapped IR's semantics lane by lane on small inputs:
  // LLVM's optimiser took 90% of their time (a test of 11 kernel sets, 870 s on a Zen 1), so
  // they compile at -O0 unless SPECTRA_EMULATED_OPT asks for more (larger emulated runs).
  unsigned optLevel = emulatedDtype ? emulatedOptLevel() : 3;
  llvm::CodeGenOptLevel codegenLevel =
      optLevel == 0   ? llvm::CodeGenOptLevel::None
      : optLevel == 1 ? llvm::CodeGenOptLevel::Less
      : optLevel == 2 ? llvm::CodeGenOptLevel::Default
                      : llvm::CodeGenOptLevel::Aggressive;
  auto jit = [&](ModuleOp module, std::unique_ptr<ExecutionEngine> &engine, std::string &object) {
    auto setFailure = [&](const std::string &message) {
      std::lock_guard<std::mutex> lock(failureMutex);
      failure = message;
    };
    // The host's target machine gives the optimiser vector widths (loop vectorisation).
    std::unique_ptr<llvm::TargetMachine> host;
    if (auto builder = llvm::orc::JITTargetMachineBuilder::detectHost())
      if (auto tm = builder->createTargetMachine())
        host = std::move(*tm);
    // The module must name the host target before the optimiser runs: without a triple the
    // vectoriser's cost model sees no SIMD registers and keeps every loop scalar.
    std::function<llvm::Error(llvm::Module *)> optimise =
        makeOptimizingTransformer(optLevel, /*sizeLevel=*/0, host.get());
    auto transform = [&optimise, tm = host.get()](llvm::Module *m) {
      if (tm) {
        m->setTargetTriple(tm->getTargetTriple());
        m->setDataLayout(tm->createDataLayout());
      }
      // The tiles' copy loops (a row of q, k or v staged into its tile, 128 bytes at d = 32)
      // stay vector loads and stores: the loop-idiom pass would make each a call to memmove,
      // whose fixed cost is several times the row's four instructions (3.4% of posrf-orf's
      // forward+backward in memmove, perf, Zen 5).
      for (llvm::Function &f : *m)
        if (!f.isDeclaration())
          for (const char *name : {"no-builtin-memcpy", "no-builtin-memmove", "no-builtin-memset"})
            f.addFnAttr(name);
      return optimise(m);
    };
    ExecutionEngineOptions options;
    // A function_ref: `transform` must outlive ExecutionEngine::create below.
    options.transformer = transform;
    options.jitCodeGenOptLevel = codegenLevel;
    // Debian's LLVM writes jitdump files for every JIT unless told not to; SPECTRA_PERF=1 asks
    // for them (perf then names the kernels' symbols).
    const char *perf = std::getenv("SPECTRA_PERF");
    options.enablePerfNotificationListener = perf && std::string(perf) == "1";
    options.enableGDBNotificationListener = false;
    // Keep the object so the runtime can cache it on disk (spectra_cpu_kernel_object).
    options.enableObjectDump = true;
    // A module without kernels (the backward of a component with no derivative) is not
    // compiled: the engine would hold no object to dump.
    if (llvm::none_of(module.getOps<LLVM::LLVMFuncOp>(), [](LLVM::LLVMFuncOp fn) {
          return !fn.isExternal() && fn.getSymName().starts_with("_mlir_ciface_");
        }))
      return;
    auto created = ExecutionEngine::create(module, options);
    if (!created)
      return setFailure("JIT compilation failed: " + llvm::toString(created.takeError()));
    engine = std::move(*created);
    // Code generation happens on the first lookup.
    for (auto fn : module.getOps<LLVM::LLVMFuncOp>())
      if (!fn.isExternal() && fn.getSymName().starts_with("_mlir_ciface_")) {
        auto address = engine->lookup(fn.getSymName());
        if (!address)
          return setFailure("JIT lookup failed: " + llvm::toString(address.takeError()));
        break;
      }
    // ExecutionEngine writes its object only to a file: go through a temporary one.
    llvm::SmallString<128> path;
    if (!llvm::sys::fs::createTemporaryFile("spectra-kernel", "o", path)) {
      engine->dumpToObjectFile(path);
      if (auto buffer = llvm::MemoryBuffer::getFile(path))
        object = (*buffer)->getBuffer().str();
      llvm::sys::fs::remove(path);
    }
  };
  std::unique_ptr<ExecutionEngine> forwardEngine, backwardEngine;
  std::string forwardObject, backwardObject;
  {
    std::thread other([&] { jit(*backward, backwardEngine, backwardObject); });
    jit(source, forwardEngine, forwardObject);
    other.join();
  }
  if (!failure.empty())
    return failKernel(error, failure);
  std::string missing = lookupEntries(*result, mapName, [&](const std::string &symbol) -> void * {
    for (ExecutionEngine *engine : {forwardEngine.get(), backwardEngine.get()}) {
      if (!engine)
        continue;
      auto address = engine->lookup(symbol);
      if (address)
        return *address;
      llvm::consumeError(address.takeError());
    }
    return nullptr;
  });
  if (!missing.empty())
    return failKernel(error, missing);
  if (!result->entries.count("query_backward") && !result->entries.count("causal_query_backward") &&
      result->backwardError.empty())
    result->backwardError = "the backward kernels were not built";
  std::vector<std::string> parts;
  for (auto *engine : {&forwardEngine, &backwardEngine})
    if (*engine)
      result->engines.push_back(std::move(*engine));
  for (std::string *object : {&forwardObject, &backwardObject})
    if (!object->empty())
      parts.push_back(std::move(*object));
  parts.push_back(packAbi(result->abi));
  if (!result->backwardError.empty())
    parts.push_back(kBackwardErrorMagic.str() + result->backwardError);
  result->object = packObjects(parts);
  return result.release();
}

extern "C" spectra_cpu_kernel *spectra_cpu_compile_variant(const char *variant, int64_t m,
                                                           int64_t d, int64_t seed,
                                                           const char *options, int64_t dv, int causal,
                                                           char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module =
      variantModule(ctx, "spectra_cpu_compile_variant", variant, m, d, seed, options, why);
  if (!module)
    return failKernel(error, why);
  return compileCpu(ctx, *module, nullptr, dv, causal != 0, error);
}

extern "C" char *spectra_cpu_work_variant(const char *variant, int64_t m, int64_t d,
                                          int64_t seed, const char *options, int64_t dv,
                                          int causal, char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module =
      variantModule(ctx, "spectra_cpu_work_variant", variant, m, d, seed, options, why);
  if (!module)
    return fail(error, why);
  if (failed(sp::linkBuiltinLibrary(*module)))
    return fail(error, "could not link the built-in library:\n" + ctx.diagnostics);
  // The JIT's options up to the vector stage; the work model counts the FMA schedule, so its
  // contractions stay vector FMAs where SPECTRA_CPU_AMX puts the JIT's on AMX tiles.
  sp::CpuPipelineOptions pipeline;
  sp::setHostTarget(pipeline);
  pipeline.amx = false;
  pipeline.valueDim = dv;
  pipeline.causal = causal != 0;
  PassManager pm(&ctx.context);
  sp::buildCpuPipeline(pm, pipeline, sp::CpuStage::Vectors);
  if (failed(pm.run(*module)))
    return fail(error, "spectra-cpu-pipeline failed:\n" + ctx.diagnostics);
  return duplicate(sp::hostKernelWork(*module, pipeline.vectorWidth));
}

extern "C" spectra_cpu_kernel *spectra_cpu_compile_ir(const char *ir, const char *sourceName,
                                                      const char *featureMap, int64_t dv, int causal,
                                                      char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module = parseModule(ctx, "spectra_cpu_compile_ir", ir, sourceName, why);
  if (!module)
    return failKernel(error, why);
  return compileCpu(ctx, *module, featureMap, dv, causal != 0, error);
}

extern "C" spectra_cpu_kernel *spectra_emulated_compile_variant(const char *variant, int64_t m,
                                                                int64_t d, int64_t seed,
                                                                const char *options,
                                                                const char *dtype, int64_t dv, int causal,
                                                                char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module =
      variantModule(ctx, "spectra_emulated_compile_variant", variant, m, d, seed, options, why);
  if (!module)
    return failKernel(error, why);
  return compileCpu(ctx, *module, nullptr, dv, causal != 0, error, dtype ? dtype : "f32");
}

extern "C" spectra_cpu_kernel *spectra_emulated_compile_ir(const char *ir, const char *sourceName,
                                                           const char *featureMap,
                                                           const char *dtype, int64_t dv, int causal,
                                                           char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module =
      parseModule(ctx, "spectra_emulated_compile_ir", ir, sourceName, why);
  if (!module)
    return failKernel(error, why);
  return compileCpu(ctx, *module, featureMap, dv, causal != 0, error, dtype ? dtype : "f32");
}

extern "C" void *spectra_cpu_kernel_entry(spectra_cpu_kernel *kernel, const char *kind,
                                          const char **why) {
  if (why)
    *why = kernel ? kernel->backwardError.c_str() : "no kernel";
  if (!kernel || !kind)
    return nullptr;
  auto it = kernel->entries.find(kind);
  return it == kernel->entries.end() ? nullptr : it->second;
}

extern "C" const char *spectra_cpu_kernel_abi(spectra_cpu_kernel *kernel, const char *kind) {
  if (!kernel || !kind)
    return "";
  auto it = kernel->abi.find(kind);
  return it == kernel->abi.end() ? "" : it->second.c_str();
}

extern "C" const char *spectra_cpu_kernel_ir(spectra_cpu_kernel *kernel, const char *stage) {
  if (!kernel || !stage)
    return "";
  auto it = kernel->stages.find(stage);
  return it == kernel->stages.end() ? "" : it->second.c_str();
}

extern "C" void spectra_cpu_kernel_free(spectra_cpu_kernel *kernel) { delete kernel; }

extern "C" const char *spectra_cpu_kernel_object(spectra_cpu_kernel *kernel, size_t *size) {
  if (size)
    *size = kernel ? kernel->object.size() : 0;
  return kernel ? kernel->object.data() : nullptr;
}

extern "C" spectra_cpu_kernel *spectra_cpu_load_object(const char *data, size_t size,
                                                       const char *featureMap,
                                                       const char *tilesIR, const char *vectorsIR,
                                                       const char *llvmIR, char **error) {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  if (!data || size == 0 || !featureMap)
    return failKernel(error, "spectra_cpu_load_object: no object or feature map name");
  auto jit = llvm::orc::LLJITBuilder().create();
  if (!jit)
    return failKernel(error, "creating the JIT failed: " + llvm::toString(jit.takeError()));
  // libm (tanhf, log1pf, ...) and libc come from the process.
  auto process = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!process)
    return failKernel(error, llvm::toString(process.takeError()));
  (*jit)->getMainJITDylib().addGenerator(std::move(*process));
  auto result = std::make_unique<spectra_cpu_kernel>();
  result->object.assign(data, size);
  std::vector<llvm::StringRef> objects;
  if (!unpackObjects(result->object, objects))
    return failKernel(error, "the cached objects are not a spectra object pack");
  for (llvm::StringRef object : objects)
    if (unpackAbi(object, result->abi) || unpackBackwardError(object, result->backwardError))
      continue;
    else if (llvm::Error e = (*jit)->addObjectFile(llvm::MemoryBuffer::getMemBuffer(
            object, "spectra-cached-kernel", /*RequiresNullTerminator=*/false)))
      return failKernel(error, "the cached object does not load: " + llvm::toString(std::move(e)));
  if (result->abi.empty())
    return failKernel(error, "the cached objects carry no kernel ABI");
  std::string missing = lookupEntries(*result, featureMap, [&](const std::string &symbol) -> void * {
    auto address = (*jit)->lookup(symbol);
    if (!address) {
      llvm::consumeError(address.takeError());
      return nullptr;
    }
    return address->toPtr<void *>();
  });
  if (!missing.empty())
    return failKernel(error, "the cached object is incomplete: " + missing);
  if (!result->entries.count("query_backward") && !result->entries.count("causal_query_backward") &&
      result->backwardError.empty())
    result->backwardError = "the cached kernel has no backward";
  result->stages = {{"tiles", tilesIR ? tilesIR : ""},
                    {"vectors", vectorsIR ? vectorsIR : ""},
                    {"llvm", llvmIR ? llvmIR : ""}};
  result->jit = std::move(*jit);
  return result.release();
}

extern "C" char *spectra_sha256_hex(const void *data, size_t size) {
  std::array<uint8_t, 32> digest = llvm::SHA256::hash(
      llvm::ArrayRef<uint8_t>(static_cast<const uint8_t *>(data), size));
  return duplicate(llvm::toHex(digest, /*LowerCase=*/true));
}

//===----------------------------------------------------------------------===//
// GPU kernels
//===----------------------------------------------------------------------===//

/// The GPU kernels of the module's feature map through spectra-gpu-pipeline (the tile
/// layer, the GPU schedule, NVVM, PTX); the artifact JSON (the launch description
/// generated from the outlined kernels, and the PTX), or NULL and *error.
static char *compileGpu(Context &ctx, ModuleOp source, const char *featureMap, const char *target,
                        const char *dtype, int64_t dv, int causal, char **error) {
  std::string chip = target ? target : "sm_90a";
  if (chip != "sm_80" && chip != "sm_90a")
    return fail(error, "unknown GPU target '" + chip + "'; targets: sm_80, sm_90a");
  std::string why;
  std::string mapName = keepOneFeatureMap(source, featureMap, why);
  if (mapName.empty())
    return fail(error, why);
  sp::GpuScheduleOptions options;
  options.chip = chip;
  options.dtype = dtype ? dtype : "f32";
  options.valueDim = dv;
  options.causal = causal;
  options.mma = spectra_gpu_mma_mode();
  PassManager pm(&ctx.context);
  sp::buildGpuPipeline(pm, options);
  if (failed(pm.run(source)))
    return fail(error, "compiling the GPU kernels failed:\n" + ctx.diagnostics);
  llvm::Expected<std::string> artifact =
      sp::gpuArtifact(source, mapName, options, spectra_compiler_version());
  if (!artifact)
    return fail(error, llvm::toString(artifact.takeError()));
  return duplicate(*artifact);
}

extern "C" char *spectra_gpu_compile_variant(const char *variant, int64_t m, int64_t d,
                                             int64_t seed, const char *options, const char *target,
                                             const char *dtype, int64_t dv, int causal, char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module =
      variantModule(ctx, "spectra_gpu_compile_variant", variant, m, d, seed, options, why);
  if (!module)
    return fail(error, why);
  return compileGpu(ctx, *module, nullptr, target, dtype, dv, causal != 0, error);
}

extern "C" char *spectra_gpu_compile_ir(const char *ir, const char *sourceName,
                                        const char *featureMap, const char *target,
                                        const char *dtype, int64_t dv, int causal, char **error) {
  Context ctx;
  std::string why;
  OwningOpRef<ModuleOp> module = parseModule(ctx, "spectra_gpu_compile_ir", ir, sourceName, why);
  if (!module)
    return fail(error, why);
  return compileGpu(ctx, *module, featureMap, target, dtype, dv, causal != 0, error);
}
