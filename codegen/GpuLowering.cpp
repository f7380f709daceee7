//===- GpuLowering.cpp - the GPU kernels' NVVM lowering and PTX serialiser ===//

#include "codegen/GpuLowering.h"
#include "codegen/CpuKernel.h"

#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/IR/Threading.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Transforms/Passes.h"

#include <cstdlib>
#include <map>
#include <optional>

using namespace mlir;
using namespace mlir::spectra;

void mlir::spectra::registerGpuLoweringDialects(DialectRegistry &registry) {
  registerCpuLoweringDialects(registry);
  registry.insert<gpu::GPUDialect, NVVM::NVVMDialect>();
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerConvertNVVMToLLVMInterface(registry);
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
}

/// The CUDA toolkit whose libdevice resolves math calls (__nv_expf, ...).
static std::string cudaToolkit() {
  for (const char *var : {"SPECTRA_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"})
    if (const char *v = std::getenv(var); v && *v)
      return v;
  return "/usr/local/cuda";
}

static std::unique_ptr<Pass> createMinBlocksPerSmPass();
static std::unique_ptr<Pass> createExternDynamicSharedPass();
static std::unique_ptr<Pass> createAlignSharedBuffersPass();

void mlir::spectra::buildGpuLoweringPipeline(OpPassManager &pm, StringRef chip, bool toBinary) {
  GpuNVVMAttachTargetOptions target;
  target.chip = chip.str();
  // sm_90a needs PTX ISA 8.0; sm_80 accepts it too (ptxas 12+).
  target.features = "+ptx80";
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));
  // The cleanups run per kernel (gpu.func, then llvm.func), so the pass manager spreads the
  // kernels over the context's threads; the conversion itself is per gpu.module.
  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  OpPassManager &gpuFuncs = kernels.nest<gpu::GPUFuncOp>();
  gpuFuncs.addPass(createCanonicalizerPass());
  gpuFuncs.addPass(createCSEPass());
  // The mapped kernels' one-element linalg ops and windows.
  gpuFuncs.addPass(createConvertLinalgToLoopsPass());
  gpuFuncs.addPass(memref::createExpandStridedMetadataPass());
  gpuFuncs.addPass(createLowerAffinePass());
  gpuFuncs.addPass(createSCFToControlFlowPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.indexBitwidth = 64;
  kernels.addPass(createConvertGpuOpsToNVVMOps(nvvm));
  OpPassManager &llvmFuncs = kernels.nest<LLVM::LLVMFuncOp>();
  llvmFuncs.addPass(createCanonicalizerPass());
  llvmFuncs.addPass(createCSEPass());
  kernels.addPass(createReconcileUnrealizedCastsPass());
  kernels.addPass(createMinBlocksPerSmPass());
  kernels.addPass(createExternDynamicSharedPass());
  kernels.addPass(createAlignSharedBuffersPass());
  if (toBinary)
    pm.addPass(createSerializeKernelsToPtxPass());
}

namespace {

/// Joins the PTX of kernels compiled as separate modules into one module's text: the first
/// header (.version, .target, .address_size; every part must have the same), the module-level
/// declarations once each (libdevice's tables come with every kernel that uses them), then
/// every kernel. Returns nothing when the parts cannot be joined safely: module-level functions
/// (.func), a name declared two ways, or a part without a header.
std::optional<std::string> joinPtx(const std::vector<std::string> &parts) {
  std::string header, declarations, kernels;
  std::map<std::string, std::string> declared;  // name -> its declaration
  for (const std::string &part : parts) {
    StringRef text(part);
    size_t version = text.find(".version"), address = text.find(".address_size");
    if (version == StringRef::npos || address == StringRef::npos || address < version)
      return std::nullopt;
    size_t headerEnd = text.find('\n', address);
    if (headerEnd == StringRef::npos)
      return std::nullopt;
    StringRef partHeader = text.slice(version, headerEnd + 1);
    if (header.empty())
      header = text.take_front(headerEnd + 1).str();
    else if (!StringRef(header).ends_with(partHeader))
      return std::nullopt;
    StringRef body = text.drop_front(headerEnd + 1);
    size_t firstKernel = body.find(".visible .entry");
    if (firstKernel == StringRef::npos)
      return std::nullopt;
    StringRef prefix = body.take_front(firstKernel), rest = body.drop_front(firstKernel);
    for (StringRef line : llvm::split(rest, '\n'))
      if (line.starts_with(".func") || line.starts_with(".visible .func") ||
          line.starts_with(".weak") || line.starts_with(".global") || line.starts_with(".const"))
        return std::nullopt;
    // Module-level declarations: one statement per line, ending with ';'.
    for (StringRef line : llvm::split(prefix, '\n')) {
      StringRef statement = line.trim();
      if (statement.empty() || statement.starts_with("//"))
        continue;
      if (!statement.ends_with(";"))
        return std::nullopt;
      StringRef named = statement.take_until([](char c) { return c == '[' || c == '=' || c == ';'; }).rtrim();
      std::string name = named.substr(named.rfind(' ') + 1).str();
      auto [it, inserted] = declared.emplace(name, statement.str());
      if (!inserted) {
        if (it->second != statement.str())
          return std::nullopt;
        continue;
      }
      declarations += line.str() + "\n";
    }
    kernels += rest.str();
    if (!StringRef(kernels).ends_with("\n"))
      kernels += "\n";
  }
  return header + "\n" + declarations + "\n" + kernels;
}

/// gpu-module-to-binary (format isa) with the kernels serialised side by side: each gpu.module
/// is split into one detached copy per kernel (the kernel and the symbols it uses), the copies
/// go through the NVVM target's serialiser (LLVM's optimiser and the NVPTX back end, most of a
/// cold GPU compile) on the context's threads, and their PTX is joined into one text (one
/// header; the kernels share no module-level symbol). Each kernel's PTX is what the one-module
/// compile gives, since no kernel calls another.
/// The resident blocks per SM every kernel is compiled for.
constexpr int kMinBlocksPerSM = 2;

/// Asks for at least kMinBlocksPerSM resident blocks per SM on every kernel (nvvm.minctasm,
/// PTX .minnctapersm): ptxas then keeps each kernel's registers within that share of the
/// register file at its block size, and stops trading registers for local-memory spills on
/// its own (measured: PosRF's kv for sm_90a went from 64 registers and 24 spilled bytes to 98
/// registers and none).
struct MinBlocksPerSmPass
    : public PassWrapper<MinBlocksPerSmPass, OperationPass<gpu::GPUModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(MinBlocksPerSmPass)
  StringRef getArgument() const final { return "spectra-min-blocks-per-sm"; }
  StringRef getDescription() const final {
    return "ask ptxas for at least two resident blocks per SM on every kernel";
  }
  void runOnOperation() override {
    for (LLVM::LLVMFuncOp fn : getOperation().getOps<LLVM::LLVMFuncOp>())
      if (fn->hasAttr(NVVM::NVVMDialect::getKernelFuncAttrName()) &&
          !fn->hasAttr(NVVM::NVVMDialect::getMinctasmAttrName()))
        fn->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                    IntegerAttr::get(IntegerType::get(fn.getContext(), 32), kMinBlocksPerSM));
  }
};

} // namespace

static std::unique_ptr<Pass> createMinBlocksPerSmPass() {
  return std::make_unique<MinBlocksPerSmPass>();
}

namespace {

/// gpu.dynamic_shared_memory lowers to an internal zero-length shared global, which PTX
/// prints as a one-byte static variable: the block's dynamic shared memory then starts
/// after it, and the kernel's first buffer overlaps it. As an external declaration it is
/// PTX's `.extern .shared .align 16 .b8 name[]`, the dynamic region itself.
struct ExternDynamicSharedPass
    : public PassWrapper<ExternDynamicSharedPass, OperationPass<gpu::GPUModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(ExternDynamicSharedPass)
  StringRef getArgument() const final { return "spectra-extern-dynamic-shared"; }
  StringRef getDescription() const final {
    return "declare the dynamic shared memory base as PTX .extern .shared (not a static byte)";
  }
  void runOnOperation() override {
    for (LLVM::GlobalOp g : getOperation().getOps<LLVM::GlobalOp>()) {
      auto array = dyn_cast<LLVM::LLVMArrayType>(g.getGlobalType());
      if (g.getAddrSpace() == 3 && array && array.getNumElements() == 0 &&
          g.getSymName().starts_with("__dynamic_shmem__") && !g.getValueOrNull() &&
          g.getInitializerRegion().empty())
        g.setLinkage(LLVM::Linkage::External);
    }
  }
};

} // namespace

static std::unique_ptr<Pass> createExternDynamicSharedPass() {
  return std::make_unique<ExternDynamicSharedPass>();
}

namespace {

/// A workgroup buffer lowers to a shared global aligned to its element (4 bytes for f32),
/// while its vector<4xf32> accesses become ld/st.shared.v4, which need 16. ptxas packs the
/// buffers in order, so a buffer after one of 65 floats (SGQ's 2d+1 features) starts 4 bytes
/// off 16 and its v4 accesses fault ("misaligned address": found by the first GPU run, an
/// H200, on posrf-sgq's kv). Every static shared buffer is aligned to 16 bytes, as the
/// dynamic pool's views already are. The pipeline now makes none (the tiles and the warp
/// chains' partials are views of the pool): a safeguard for IR that declares its own.
struct AlignSharedBuffersPass
    : public PassWrapper<AlignSharedBuffersPass, OperationPass<gpu::GPUModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(AlignSharedBuffersPass)
  StringRef getArgument() const final { return "spectra-align-shared-buffers"; }
  StringRef getDescription() const final {
    return "align every shared-memory global to 16 bytes (the v4 accesses' alignment)";
  }
  void runOnOperation() override {
    for (LLVM::GlobalOp g : getOperation().getOps<LLVM::GlobalOp>())
      if (g.getAddrSpace() == 3 && g.getAlignment().value_or(0) < kSharedAlignment)
        g.setAlignment(kSharedAlignment);
  }
  static constexpr uint64_t kSharedAlignment = 16;
};

} // namespace

static std::unique_ptr<Pass> createAlignSharedBuffersPass() {
  return std::make_unique<AlignSharedBuffersPass>();
}

namespace {

struct SerializeKernelsToPtxPass
    : public PassWrapper<SerializeKernelsToPtxPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(SerializeKernelsToPtxPass)
  StringRef getArgument() const final { return "spectra-serialize-kernels-to-ptx"; }
  StringRef getDescription() const final {
    return "serialise each gpu.module to one PTX gpu.binary, its kernels compiled in parallel";
  }

  void runOnOperation() override {
    for (gpu::GPUModuleOp module : llvm::to_vector(getOperation().getOps<gpu::GPUModuleOp>()))
      if (failed(serialize(module)))
        return signalPassFailure();
  }

  LogicalResult serialize(gpu::GPUModuleOp module) {
    ArrayAttr targets = module.getTargetsAttr();
    if (!targets || targets.size() != 1)
      return module.emitError("expected exactly one GPU target (spectra attaches #nvvm.target)");
    auto target = dyn_cast<gpu::TargetAttrInterface>(targets[0]);
    if (!target)
      return module.emitError("the GPU target does not implement serialisation");
    SmallVector<OwningOpRef<gpu::GPUModuleOp>> parts;
    auto isKernel = [](LLVM::LLVMFuncOp fn) {
      return fn->hasAttr(NVVM::NVVMDialect::getKernelFuncAttrName()) ||
             fn->hasAttr("gpu.kernel");
    };
    SmallVector<std::string> kernels;
    for (LLVM::LLVMFuncOp fn : module.getOps<LLVM::LLVMFuncOp>())
      if (isKernel(fn))
        kernels.push_back(fn.getSymName().str());
    if (kernels.size() <= 1) {
      parts.push_back(module.clone());
    } else {
      for (const std::string &name : kernels) {
        OwningOpRef<gpu::GPUModuleOp> part = module.clone();
        for (LLVM::LLVMFuncOp fn : llvm::to_vector(part->getOps<LLVM::LLVMFuncOp>()))
          if (isKernel(fn) && fn.getSymName() != name)
            fn.erase();
        // Drop what only the other kernels used (their shared-memory globals, declarations).
        // One walk per round collects the names still referenced (asking each symbol for its
        // uses walked the whole part once per symbol: most of a cold compile's serial time);
        // a further round only when an erased symbol held the last reference to another.
        for (bool erased = true; erased;) {
          erased = false;
          // An op whose symbol uses are unknown: keep everything, as the per-symbol query did.
          std::optional<SymbolTable::UseRange> uses =
              SymbolTable::getSymbolUses(&part->getBodyRegion());
          if (!uses)
            break;
          llvm::DenseSet<StringAttr> used;
          for (const SymbolTable::SymbolUse &use : *uses)
            used.insert(use.getSymbolRef().getRootReference());
          for (Operation &op : llvm::make_early_inc_range(part->getBody()->getOperations())) {
            auto symbol = dyn_cast<SymbolOpInterface>(&op);
            auto fn = dyn_cast<LLVM::LLVMFuncOp>(&op);
            if (symbol && !(fn && isKernel(fn)) && !used.contains(symbol.getNameAttr())) {
              op.erase();
              erased = true;
            }
          }
        }
        parts.push_back(std::move(part));
      }
    }
    gpu::TargetOptions options(cudaToolkit(), {}, {}, {}, gpu::CompilationTarget::Assembly);
    std::vector<std::optional<SmallVector<char, 0>>> objects(parts.size());
    ParallelDiagnosticHandler diagnostics(&getContext());
    LogicalResult compiled = failableParallelForEachN(
        &getContext(), 0, parts.size(), [&](size_t i) -> LogicalResult {
          diagnostics.setOrderIDForThread(i);
          objects[i] = target.serializeToObject(parts[i].get(), options);
          diagnostics.eraseOrderIDForThread();
          return success(objects[i].has_value());
        });
    if (failed(compiled))
      return module.emitError("serialising the kernels of '") << module.getName() << "' to PTX failed";
    std::vector<std::string> texts;
    for (auto &object : objects)
      texts.push_back(StringRef(object->data(), object->size()).rtrim(StringRef("\0", 1)).str());
    std::optional<std::string> joined = joinPtx(texts);
    if (!joined) {
      // Parts that cannot be joined safely (module-level functions, or one name declared two
      // ways): the whole module at once, as gpu-module-to-binary would.
      std::optional<SmallVector<char, 0>> whole = target.serializeToObject(module, options);
      if (!whole)
        return module.emitError("serialising '") << module.getName() << "' to PTX failed";
      joined = StringRef(whole->data(), whole->size()).rtrim(StringRef("\0", 1)).str();
    }
    std::string merged = *joined;
    SmallVector<char, 0> bytes(merged.begin(), merged.end());
    Attribute object = target.createObject(module, bytes, options);
    if (!object)
      return module.emitError("could not create the GPU object");
    OpBuilder builder(module);
    gpu::BinaryOp::create(builder, module.getLoc(), module.getName(), nullptr,
                          builder.getArrayAttr({object}));
    module.erase();
    return success();
  }
};

} // namespace

std::unique_ptr<Pass> mlir::spectra::createSerializeKernelsToPtxPass() {
  return std::make_unique<SerializeKernelsToPtxPass>();
}

std::string mlir::spectra::extractPtx(ModuleOp module) {
  std::string ptx;
  module->walk([&](gpu::BinaryOp binary) {
    for (Attribute a : binary.getObjects()) {
      StringRef text = llvm::cast<gpu::ObjectAttr>(a).getObject().getValue();
      while (!text.empty() && text.back() == '\0')
        text = text.drop_back();
      ptx += text.str();
    }
  });
  return ptx;
}
