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
#include "mlir/Dialect/AMX/Transforms.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/MC/MCInstrInfo.h"
#include "llvm/MC/MCSchedule.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/Triple.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

using namespace mlir;
using namespace mlir::spectra;

void mlir::spectra::registerCpuLoweringDialects(DialectRegistry &registry) {
  registry.insert<func::FuncDialect, scf::SCFDialect, memref::MemRefDialect, arith::ArithDialect,
                  math::MathDialect, cf::ControlFlowDialect, LLVM::LLVMDialect,
                  index::IndexDialect, ub::UBDialect, linalg::LinalgDialect,
                  vector::VectorDialect, amx::AMXDialect>();
  registerConvertAMXToLLVMInterface(registry);
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
  return hostHasAvx512() ? 16 : 8;
}

bool mlir::spectra::hostHasAvx512() {
  return llvm::sys::getHostCPUFeatures().lookup("avx512f");
}

bool mlir::spectra::hostHasAmx() {
  llvm::StringMap<bool> features = llvm::sys::getHostCPUFeatures();
  return features.lookup("amx-tile") && features.lookup("amx-bf16");
}

/// Whether this process may run AMX's bf16 tile products: the host has them, and Linux granted
/// the process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; without it
/// the first tile instruction faults).
static bool amxReady() {
  static const bool ready = [] {
    if (!hostHasAmx())
      return false;
#if defined(__linux__) && defined(__x86_64__)
    constexpr long requestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long tileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, requestPermission, tileData) == 0;
#else
    return false;
#endif
  }();
  return ready;
}

bool mlir::spectra::hostAmx() {
  const char *asked = std::getenv("SPECTRA_CPU_AMX");
  if (!asked || !*asked)
    return false;
  llvm::StringRef value(asked);
  if (value == "0" || value == "1") {
    if (value == "0" || amxReady())
      return value == "1";
    // Asked for and not to be had: said once, and the kernels stay on FMAs.
    static std::once_flag unavailable;
    std::call_once(unavailable, [] {
      llvm::errs() << "spectra: SPECTRA_CPU_AMX=1, but "
                   << (hostHasAmx() ? "Linux did not grant this process AMX's tile state "
                                      "(arch_prctl ARCH_REQ_XCOMP_PERM)"
                                    : "this CPU has no AMX bf16 tile products (amx-tile, "
                                      "amx-bf16)")
                   << "; the CPU kernels' contractions stay on vector FMAs\n";
    });
    return false;
  }
  static std::once_flag warned;
  std::call_once(warned, [&] {
    llvm::errs() << "spectra: ignoring SPECTRA_CPU_AMX='" << value << "' (takes 0 or 1)\n";
  });
  return false;
}

bool mlir::spectra::hostHasAvx2() {
  return llvm::sys::getHostCPUFeatures().lookup("avx2");
}

std::optional<CpuFmaTiming> mlir::spectra::cpuFmaTiming(llvm::StringRef cpu, int64_t vectorWidth) {
  const char *name = vectorWidth == 4    ? "VFMADD231PSr"
                     : vectorWidth == 8  ? "VFMADD231PSYr"
                     : vectorWidth == 16 ? "VFMADD231PSZr"
                                         : nullptr;
  llvm::Triple triple(llvm::sys::getProcessTriple());
  if (!name || !triple.isX86())
    return std::nullopt;
  static std::once_flag initialised;
  std::call_once(initialised, [] { llvm::InitializeNativeTarget(); });
  std::string error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return std::nullopt;
  std::unique_ptr<llvm::MCInstrInfo> instrs(target->createMCInstrInfo());
  // An unknown name is refused before the subtarget is made (which would warn on stderr).
  std::unique_ptr<llvm::MCSubtargetInfo> generic(target->createMCSubtargetInfo(triple, "", ""));
  if (!instrs || !generic || !generic->isCPUStringValid(cpu))
    return std::nullopt;
  std::unique_ptr<llvm::MCSubtargetInfo> subtarget(target->createMCSubtargetInfo(triple, cpu, ""));
  if (!subtarget)
    return std::nullopt;
  const llvm::MCSchedModel &model = subtarget->getSchedModel();
  if (!model.hasInstrSchedModel())
    return std::nullopt;
  for (unsigned opcode = 0; opcode < instrs->getNumOpcodes(); ++opcode) {
    if (instrs->getName(opcode) != name)
      continue;
    const llvm::MCSchedClassDesc *sched =
        model.getSchedClassDesc(instrs->get(opcode).getSchedClass());
    if (!sched || !sched->isValid() || sched->isVariant())
      return std::nullopt;
    CpuFmaTiming timing;
    timing.instruction = name;
    timing.latency = llvm::MCSchedModel::computeInstrLatency(*subtarget, *sched);
    timing.reciprocalThroughput = llvm::MCSchedModel::getReciprocalThroughput(*subtarget, *sched);
    if (timing.latency <= 0 || !(timing.reciprocalThroughput > 0))
      return std::nullopt;
    timing.chains =
        int64_t(std::ceil(double(timing.latency) / timing.reciprocalThroughput - 1e-9));
    return timing;
  }
  return std::nullopt;
}

int64_t mlir::spectra::hostFmaChains(int64_t vectorWidth) {
  if (const char *forced = std::getenv("SPECTRA_CPU_FMA_CHAINS"); forced && *forced) {
    char *end = nullptr;
    long chains = std::strtol(forced, &end, 10);
    if (*end == '\0' && chains >= 1 && chains <= 64)
      return chains;
    static std::once_flag warned;
    std::call_once(warned, [&] {
      llvm::errs() << "spectra: ignoring SPECTRA_CPU_FMA_CHAINS='" << forced
                   << "' (takes 1 to 64)\n";
    });
  }
  static std::mutex mutex;
  static llvm::DenseMap<int64_t, int64_t> chains;  // by vector width
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = chains.try_emplace(vectorWidth, 0);
  if (inserted)
    if (std::optional<CpuFmaTiming> timing = cpuFmaTiming(llvm::sys::getHostCPUName(), vectorWidth))
      it->second = timing->chains;
  return it->second;
}

CpuRegisterTile mlir::spectra::cpuRegisterTile(int64_t vectorWidth, int64_t vectors,
                                               int64_t fmaChains) {
  CpuRegisterTile tile{cpuRegisterRows(vectorWidth), 32};
  if (vectors >= 1 && fmaChains > tile.rows * vectors) {
    // The accumulators, B's vectors and A's broadcast in the register file (AVX-512's 32
    // registers at 16 lanes, 16 below).
    int64_t registers = vectorWidth >= 16 ? 32 : 16;
    tile.rows = std::max(tile.rows, (registers - vectors - 1) / vectors);
  }
  if (tile.tileRows % tile.rows != 0) {
    int64_t step = std::lcm(tile.rows, std::max<int64_t>(vectorWidth, 1));
    tile.tileRows = std::max(step, tile.tileRows / step * step);
  }
  return tile;
}

void mlir::spectra::setHostTarget(CpuPipelineOptions &options) {
  options.vectorWidth = hostVectorWidth();
  options.expScalef = hostHasAvx512();
  options.expTable = hostHasAvx2();
  options.fmaChains = hostFmaChains(options.vectorWidth);
  options.amx = hostAmx();
}

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAPOLYNOMIALEXP
#define GEN_PASS_DEF_SPECTRAKEEPKERNELS
#define GEN_PASS_DEF_SPECTRASELECTMAXIMA
#define GEN_PASS_DEF_SPECTRAFORMFMA
#define GEN_PASS_DEF_SPECTRASHORTENCHAINS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

/// Whether `v` is available before `op`: defined in an enclosing block, or earlier in op's.
static bool definedBefore(Value v, Operation *op) {
  Block *where = v.getParentBlock();
  if (where == op->getBlock()) {
    Operation *def = v.getDefiningOp();
    return !def || def->isBeforeInBlock(op);
  }
  return where->getParent()->isAncestor(op->getParentRegion());
}

arith::MulFOp mlir::spectra::expScaledBy(math::ExpOp exp) {
  if (!exp->hasOneUse())
    return {};
  auto mul = dyn_cast<arith::MulFOp>(*exp->getUsers().begin());
  // Both operands the exp (exp(x)^2) would need the product formed after it.
  if (!mul || mul.getLhs() == mul.getRhs() || mul.getType() != exp.getType())
    return {};
  // The coefficient must be available where the exp is expanded: defined before it, or by a
  // side-effect-free op of its block (a broadcast) whose operands are, which then moves up.
  Value s = mul.getLhs() == exp.getResult() ? mul.getRhs() : mul.getLhs();
  if (definedBefore(s, exp))
    return mul;
  Operation *def = s.getDefiningOp();
  if (def && def->getBlock() == exp->getBlock() && def->getNumRegions() == 0 &&
      isMemoryEffectFree(def) &&
      llvm::all_of(def->getOperands(), [&](Value o) { return definedBefore(o, exp); }))
    return mul;
  return {};
}

namespace {
/// What the exp expansions build at the rewriter's insertion point: splat constants of the
/// exp's vector type and FMAs.
struct ExpBuilder {
  PatternRewriter &rewriter;
  Location loc;
  VectorType type;
  ExpBuilder(PatternRewriter &rewriter, math::ExpOp op)
      : rewriter(rewriter), loc(op.getLoc()), type(cast<VectorType>(op.getType())) {}
  Value c(float v) const {
    return arith::ConstantOp::create(rewriter, loc, DenseElementsAttr::get(type, v));
  }
  Value fma(Value a, Value b, Value d) const {
    return math::FmaOp::create(rewriter, loc, a, b, d);
  }
};
} // namespace

/// The coefficient s of `scale` (expScaledBy(op)), its definition moved above `op` where it
/// stood after it.
static Value hoistedCoefficient(PatternRewriter &rewriter, math::ExpOp op, arith::MulFOp scale) {
  Value s = scale.getLhs() == op.getResult() ? scale.getRhs() : scale.getLhs();
  if (Operation *def = s.getDefiningOp(); def && !definedBefore(s, op))
    rewriter.moveOpBefore(def, op);
  return s;
}

/// e^a s (or e^a without `scale`) for a = x - n ln2, |a| <= ln2/2: the reduction in two FMAs
/// (Cody and Waite's split of ln2), e^a = 1 + a + a^2 P(a) with P of degree 4 fitted to
/// e^a's relative error on that interval (3.1e-9 in exact arithmetic, so f32 rounding decides
/// the result), and the last step fma(p, s, s) where the exp's only use multiplies it by s
/// (`scale`, whose coefficient moves above the expansion; the insertion point moves past the
/// multiply, which the caller replaces).
static Value expMantissa(PatternRewriter &rewriter, math::ExpOp op, Value x, Value n,
                         arith::MulFOp scale) {
  ExpBuilder e(rewriter, op);
  auto c = [&](float v) { return e.c(v); };
  auto fma = [&](Value a, Value b, Value d) { return e.fma(a, b, d); };
  Value a = fma(c(-0.693359375f), n, x);
  a = fma(c(2.12194440e-4f), n, a);
  Value z = fma(a, c(1.38145988e-3f), c(8.36871658e-3f));
  for (float p : {4.16683890e-2f, 1.66665211e-1f, 4.99999940e-1f})
    z = fma(z, a, c(p));
  z = fma(z, arith::MulFOp::create(rewriter, op.getLoc(), a, a), a);
  if (!scale)
    return arith::AddFOp::create(rewriter, op.getLoc(), z, c(1.0f));
  Value s = hoistedCoefficient(rewriter, op, scale);
  z = fma(z, s, s);
  rewriter.setInsertionPointAfter(scale);
  return z;
}

namespace {
/// exp(x) on vector<16xf32> for AVX-512: x = n ln2 + a with n = floor(x log2e + 1/2) and
/// |a| <= ln2/2, e^a = 1 + a + a^2 P(a) with P of degree 4 fitted to e^a's relative error on
/// that interval (3.1e-9 in exact arithmetic, so f32 rounding decides the result: 8.2e-8 at
/// most, as with the Cephes degree-5 P of MLIR's approximation, one FMA more), and z 2^n by
/// vscalefps, whose zero mask flushes x < -87.336 (results below 2^-126) to 0, so no denormal
/// comes out. NaN passes through (the clamp and the mask's compare are unordered); +inf gives
/// +inf, -inf 0. The one clamp, at 2^14, only keeps the range reduction exact (n C1 needs
/// n < 2^15): vscalefps overflows to inf past 88.72 by itself, even after a coefficient below
/// folds in; an exp marked kExpAtMostZeroAttr (a stabilised argument, at most 0 or NaN) has no
/// use for it. No lower clamp: a lane the mask flushes is 0 whatever its polynomial holds.
/// 14 instructions (13 marked) where the generic form, which clamps n, converts it and builds
/// 2^n from its bits, takes 20.
///
/// exp(x) * s, the exp's only use (a feature's coefficient): (p + 1) s = fma(p, s, s) before
/// the scaling, one instruction less. A lane the mask flushes gives 0 even where s is
/// infinite or NaN (0 * s would be NaN); the kernels' coefficients are finite.
struct ScalefExp : OpRewritePattern<math::ExpOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(math::ExpOp op, PatternRewriter &rewriter) const override {
    auto type = dyn_cast<VectorType>(op.getType());
    if (!type || type.getRank() != 1 || type.getNumElements() != 16 || type.isScalable() ||
        !type.getElementType().isF32())
      return rewriter.notifyMatchFailure(op, "not a vector<16xf32>");
    Location loc = op.getLoc();
    ExpBuilder e(rewriter, op);
    auto c = [&](float v) { return e.c(v); };
    auto fma = [&](Value a, Value b, Value d) { return e.fma(a, b, d); };
    Value x = op.getOperand();
    if (!op->hasAttr(kExpAtMostZeroAttr)) {
      Value keep = arith::CmpFOp::create(rewriter, loc, arith::CmpFPredicate::ULE, x, c(16384.0f));
      x = arith::SelectOp::create(rewriter, loc, keep, x, c(16384.0f));
    }
    Value live = arith::CmpFOp::create(rewriter, loc, arith::CmpFPredicate::UGE, x, c(-87.336f));
    Value n = math::FloorOp::create(rewriter, loc, fma(x, c(1.44269504088896341f), c(0.5f)));
    arith::MulFOp scale = expScaledBy(op);
    Value z = expMantissa(rewriter, op, x, n, scale);
    Value mask = LLVM::BitcastOp::create(rewriter, loc, rewriter.getI16Type(), live);
    Value rounding = arith::ConstantOp::create(rewriter, loc, rewriter.getI32IntegerAttr(4));
    auto scaled = LLVM::CallIntrinsicOp::create(
        rewriter, loc, type, rewriter.getStringAttr("llvm.x86.avx512.mask.scalef.ps.512"),
        ValueRange{z, n, c(0.0f), mask, rounding});
    if (scale) {
      rewriter.replaceOp(scale, scaled.getResults());
      rewriter.eraseOp(op);
    } else {
      rewriter.replaceOp(op, scaled.getResults());
    }
    return success();
  }
};

/// exp(x) for a stabilised argument (marked kExpAtMostZeroAttr: at most 0, or NaN) on any
/// f32 vector, without vscalefps (8-lane AVX2 code, or 16 lanes without AVX-512): the same
/// reduction and polynomial as ScalefExp, with n rounded by the magic constant 1.5 2^23 + 127
/// (t = x log2e + magic holds round(x log2e) + 127 in its low mantissa bits, so n = t - magic
/// and 2^n = bits(t) << 23, one shift), and 0 selected below -87.336 (results below 2^-126,
/// -inf included; n + 127 no longer fits the exponent there). NaN passes through (the
/// compare is unordered). As x <= 0, n <= 0 and 2^n never overflows, so no clamp: 15
/// instructions where MLIR's generic form takes 20. exp(x) s, the exp's only use, folds s
/// into the polynomial's last step as ScalefExp does.
struct BitsExp : OpRewritePattern<math::ExpOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(math::ExpOp op, PatternRewriter &rewriter) const override {
    auto type = dyn_cast<VectorType>(op.getType());
    if (!op->hasAttr(kExpAtMostZeroAttr))
      return rewriter.notifyMatchFailure(op, "not marked as a stabilised exp");
    if (!type || type.getRank() != 1 || type.isScalable() || !type.getElementType().isF32())
      return rewriter.notifyMatchFailure(op, "not a 1-D vector of f32");
    Location loc = op.getLoc();
    auto intType = VectorType::get(type.getShape(), rewriter.getI32Type());
    ExpBuilder e(rewriter, op);
    auto c = [&](float v) { return e.c(v); };
    auto fma = [&](Value a, Value b, Value d) { return e.fma(a, b, d); };
    Value x = op.getOperand();
    Value live = arith::CmpFOp::create(rewriter, loc, arith::CmpFPredicate::UGE, x, c(-87.336f));
    const float magic = 12583039.0f; // 1.5 2^23 + 127
    Value t = fma(x, c(1.44269504088896341f), c(magic));
    Value n = arith::SubFOp::create(rewriter, loc, t, c(magic));
    arith::MulFOp scale = expScaledBy(op);
    Value z = expMantissa(rewriter, op, x, n, scale);
    Value bits = arith::BitcastOp::create(rewriter, loc, intType, t);
    Value shift = arith::ConstantOp::create(rewriter, loc, DenseElementsAttr::get(intType, int32_t(23)));
    Value pow = arith::BitcastOp::create(rewriter, loc, type,
                                         arith::ShLIOp::create(rewriter, loc, bits, shift));
    Value result = arith::SelectOp::create(rewriter, loc, live,
                                           arith::MulFOp::create(rewriter, loc, z, pow), c(0.0f));
    rewriter.replaceOp(scale ? scale.getOperation() : op.getOperation(), result);
    if (scale)
      rewriter.eraseOp(op);
    return success();
  }
};

/// exp(x) for a stabilised argument (kExpAtMostZeroAttr) on vector<8xf32> with AVX2's vpermd:
/// x = k ln2/8 + a with k = round(8 x log2e) and |a| <= ln2/16, so e^x = 2^(k/8) e^a where
/// 2^(k/8) = 2^n T_j (k = 8n + j, T_j = 2^(j/8) from an 8-entry table) and e^a - 1 = a +
/// a^2 (c2 + c3 a) on the interval a quarter as wide as BitsExp's: degree 3 where BitsExp
/// takes 6 (relative error 2.7e-8 in exact arithmetic). k is rounded by the magic constant
/// 1.5 2^23, so bits(t) holds k in its low bits: j = bits(t) & 7 is vpermd's own index
/// (it reads the low 3 bits), and bits(t) << 20 = (8n + j) << 20 modulo 2^32 (the
/// constant's bits shift out), so adding Tadj_j = bits(T_j) - (j << 20) gives the bits of
/// 2^n T_j: two integer operations and a permute where BitsExp evaluates three more FMAs.
/// 0 selected below -87.336 (n = -126 there: 2^n T_j stays normal above it); NaN passes
/// through (the compare is unordered); exp(0) is exactly 1.
///
/// 13 instructions where BitsExp takes 15, 8 of them multiplies or FMAs where BitsExp has
/// 11, and a dependency chain of 8 FP operations where BitsExp's is 12: on a Zen 3 core,
/// where the kernels' exp loops are held by their chains, 25% fewer cycles per exp in a loop
/// over a tile's logits, and kv and query_backward 4-5% faster (docs/kernels-at-the-limit.md).
/// Largest relative error against float64 exp over [-87.3, 0]: 1.06e-7, where BitsExp's is
/// 7.9e-8 (T_j rounds once more); test/Codegen/spectra-polynomial-exp-avx2.mlir.
///
/// With `wide` (AVX-512 hosts) a marked vector<16xf32> takes the same form with 16 entries:
/// k = round(16 x log2e), |a| <= ln2/32, j = bits(t) & 15 (the zmm vpermd reads the low 4
/// bits) and bits(t) << 19; the same degree 3, refitted to the narrower interval (1.6e-9 of
/// the error is the polynomial's, the rest rounding: 1.06e-7 over [-87.3, 0] on a Zen 4,
/// test/Codegen/spectra-polynomial-exp-avx512.mlir). It replaces ScalefExp for marked exps
/// there: 12 instructions once LLVM folds the select into the last fma's zero mask, 7 of them
/// FMAs or multiplies (13 and 8 with a coefficient's multiply), where ScalefExp has 9 (13 and
/// 10 with the coefficient folded) plus vrndscaleps and vscalefps on the same two pipes of a
/// Zen 4; the shift, the integer add, the subtract and the permute go to the others. Measured
/// on posrf-mm (B=8 H=2 N=4096, one thread, three alternating runs each): the four kernels
/// 76.7 ms before, 75.1 after (docs/kernels-at-the-limit.md).
///
/// exp(x) s, the exp's only use (a feature's coefficient): s T_j 2^n is formed off the
/// polynomial's chain and the last step is fma(p, s T_j 2^n, s T_j 2^n), 14 instructions
/// (the multiply stays one; KernelWork counts it); 3.0e-7 against exp(x) s (T_j, s T_j 2^n
/// and the fma each round), where BitsExp's fma(p, s, s) 2^n gives 1.9e-7.
struct TableExp : OpRewritePattern<math::ExpOp> {
  /// `wide`: 16-lane exps too, from a 16-entry table with AVX-512's vpermd (a zmm permute).
  TableExp(MLIRContext *context, PatternBenefit benefit, bool wide)
      : OpRewritePattern(context, benefit), wide(wide) {}
  bool wide;

  LogicalResult matchAndRewrite(math::ExpOp op, PatternRewriter &rewriter) const override {
    auto type = dyn_cast<VectorType>(op.getType());
    if (!op->hasAttr(kExpAtMostZeroAttr))
      return rewriter.notifyMatchFailure(op, "not marked as a stabilised exp");
    if (!type || type.getRank() != 1 || type.isScalable() || !type.getElementType().isF32())
      return rewriter.notifyMatchFailure(op, "not a 1-D vector of f32");
    const int64_t lanes = type.getNumElements();
    if (lanes != 8 && !(wide && lanes == 16))
      return rewriter.notifyMatchFailure(op, "not a vector<8xf32> (or vector<16xf32> on AVX-512)");
    // A table of `lanes` entries 2^(j/lanes): k = round(lanes x log2e) = lanes n + j.
    const int shift = lanes == 8 ? 20 : 19; // 23 - log2(lanes)
    const float steps = static_cast<float>(lanes);
    Location loc = op.getLoc();
    auto intType = VectorType::get(type.getShape(), rewriter.getI32Type());
    ExpBuilder e(rewriter, op);
    auto c = [&](float v) { return e.c(v); };
    auto ci = [&](int32_t v) -> Value {
      return arith::ConstantOp::create(rewriter, loc, DenseElementsAttr::get(intType, v));
    };
    auto fma = [&](Value a, Value b, Value d) { return e.fma(a, b, d); };
    Value x = op.getOperand();
    Value live = arith::CmpFOp::create(rewriter, loc, arith::CmpFPredicate::UGE, x, c(-87.336f));
    const float magic = 12582912.0f; // 1.5 2^23
    Value t = fma(x, c(static_cast<float>(steps * 1.44269504088896341)), c(magic));
    Value k = arith::SubFOp::create(rewriter, loc, t, c(magic));
    // ln2/lanes in two parts (Cody and Waite): k C1 is exact for |k| < 2^15.
    Value a = fma(c(-0.693359375f / steps), k, x);
    a = fma(c(2.12194440e-4f / steps), k, a);
    // e^a - 1 = a + a^2 (c2 + c3 a), fitted to the relative error on |a| <= ln2/(2 lanes).
    Value q = lanes == 8 ? fma(a, c(0.166668624f), c(0.500065744f))
                         : fma(a, c(0.16666771f), c(0.50001615f));
    Value p = fma(q, arith::MulFOp::create(rewriter, loc, a, a), a);
    SmallVector<int32_t> adjusted;
    for (int j = 0; j < lanes; ++j) {
      float tj = static_cast<float>(std::exp2(j / double(lanes)));
      int32_t bits;
      std::memcpy(&bits, &tj, sizeof bits);
      adjusted.push_back(bits - (j << shift));
    }
    Value table = arith::ConstantOp::create(rewriter, loc,
                                            DenseElementsAttr::get(intType, ArrayRef(adjusted)));
    Value bits = arith::BitcastOp::create(rewriter, loc, intType, t);
    auto picked = LLVM::CallIntrinsicOp::create(
        rewriter, loc, intType,
        rewriter.getStringAttr(lanes == 8 ? "llvm.x86.avx2.permd" : "llvm.x86.avx512.permvar.si.512"),
        ValueRange{table, bits});
    Value shifted = arith::ShLIOp::create(rewriter, loc, bits, ci(shift));
    Value pow = arith::BitcastOp::create(
        rewriter, loc, type, arith::AddIOp::create(rewriter, loc, shifted, picked.getResult(0)));
    arith::MulFOp scale = expScaledBy(op);
    if (scale) {
      pow = arith::MulFOp::create(rewriter, loc, pow, hoistedCoefficient(rewriter, op, scale));
      rewriter.setInsertionPointAfter(scale);
    }
    Value result = arith::SelectOp::create(rewriter, loc, live, fma(p, pow, pow), c(0.0f));
    rewriter.replaceOp(scale ? scale.getOperation() : op.getOperation(), result);
    if (scale)
      rewriter.eraseOp(op);
    return success();
  }
};

struct PolynomialExpPass : spectra::impl::SpectraPolynomialExpBase<PolynomialExpPass> {
  using SpectraPolynomialExpBase::SpectraPolynomialExpBase;
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    if (scalef)
      patterns.add<ScalefExp>(&getContext(), /*benefit=*/4);
    if (table)
      patterns.add<TableExp>(&getContext(), /*benefit=*/5, /*wide=*/scalef);
    patterns.add<BitsExp>(&getContext(), /*benefit=*/2);
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

/// The product of a vector mulf whose only use is `user`, or null. A product with more uses
/// stays: each use's fma would save the multiply once, but the product is often a row's
/// term hoisted off the exps' dependence chains, where an fma (4 cycles on Zen 3) would sit
/// in place of an add (3): fusing the logits' shared norm term made kv and query_backward
/// 1% slower on a Zen 3 core (docs/kernels-at-the-limit.md).
arith::MulFOp productFeeding(Value v, Operation *user) {
  auto mul = v.getDefiningOp<arith::MulFOp>();
  if (!mul || !isa<VectorType>(mul.getType()) || !mul->hasOneUse() || *mul->user_begin() != user)
    return {};
  return mul;
}

/// A negated constant operand (a splat or dense float constant), or null.
Value negatedConstant(PatternRewriter &rewriter, Value v) {
  DenseElementsAttr dense;
  if (!matchPattern(v, m_Constant(&dense)) || !isa<FloatType>(dense.getElementType()))
    return {};
  auto negated = dense.mapValues(dense.getElementType(), [](const APFloat &x) {
    APFloat y = x;
    y.changeSign();
    return y.bitcastToAPInt();
  });
  return arith::ConstantOp::create(rewriter, v.getLoc(), cast<TypedAttr>(negated));
}

/// a * b + c and c + a * b -> fma(a, b, c).
struct FuseAdd : OpRewritePattern<arith::AddFOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(arith::AddFOp op, PatternRewriter &rewriter) const override {
    for (auto [product, addend] : {std::pair{op.getLhs(), op.getRhs()}, {op.getRhs(), op.getLhs()}})
      if (arith::MulFOp mul = productFeeding(product, op)) {
        rewriter.replaceOpWithNewOp<math::FmaOp>(op, mul.getLhs(), mul.getRhs(), addend);
        rewriter.eraseOp(mul);
        return success();
      }
    return rewriter.notifyMatchFailure(op, "no single-use vector product");
  }
};

/// The negation of `v` for an fma operand: a negated constant where `v` is one, else an
/// arith.negf, which the fma absorbs (x86's vfnmadd/vfmsub, AArch64's fmls/fnmla: the same
/// one instruction, no rounding of its own).
Value negatedOperand(PatternRewriter &rewriter, Value v) {
  if (Value c = negatedConstant(rewriter, v))
    return c;
  return arith::NegFOp::create(rewriter, v.getLoc(), v);
}

/// a * b - c -> fma(a, b, -c); c - a * b -> fma(-a, b, c), negating a constant factor where
/// the product has one. The negation is free: an fma with a negated operand is one
/// instruction (negatedOperand).
struct FuseSub : OpRewritePattern<arith::SubFOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(arith::SubFOp op, PatternRewriter &rewriter) const override {
    if (arith::MulFOp mul = productFeeding(op.getLhs(), op)) {
      Value negC = negatedOperand(rewriter, op.getRhs());
      rewriter.replaceOpWithNewOp<math::FmaOp>(op, mul.getLhs(), mul.getRhs(), negC);
      rewriter.eraseOp(mul);
      return success();
    }
    if (arith::MulFOp mul = productFeeding(op.getRhs(), op)) {
      Value k = mul.getLhs(), x = mul.getRhs();
      if (matchPattern(x, m_Constant()))
        std::swap(k, x);
      rewriter.replaceOpWithNewOp<math::FmaOp>(op, negatedOperand(rewriter, k), x, op.getLhs());
      rewriter.eraseOp(mul);
      return success();
    }
    return rewriter.notifyMatchFailure(op, "no single-use vector product");
  }
};

/// How many of a tile's axes a vector varies along, as far as its definition shows: 0 for a
/// broadcast scalar or a splat constant (a row's term), 1 for a vector from a rank-1 buffer
/// (a column's term), 2 for the rest (a tile's elements, a contraction's accumulator), and
/// the largest of the operands' for arithmetic on such.
int termLevel(Value v, int depth = 0) {
  Operation *def = v.getDefiningOp();
  if (!def || depth > 4)
    return 2;
  if (auto broadcast = dyn_cast<vector::BroadcastOp>(def))
    return isa<VectorType>(broadcast.getSourceType()) ? 2 : 0;
  if (matchPattern(v, m_Constant()))
    return 0;
  if (auto load = dyn_cast<vector::LoadOp>(def))
    return load.getMemRefType().getRank() == 1 ? 1 : 2;
  if (!isa<arith::AddFOp, arith::SubFOp, arith::MulFOp, arith::NegFOp>(def))
    return 2;
  int level = 0;
  for (Value operand : def->getOperands())
    level = std::max(level, termLevel(operand, depth + 1));
  return level;
}

/// The signs of an add's or a subtract's operands, or none.
std::optional<std::pair<int, int>> operandSigns(Operation *op) {
  if (isa<arith::AddFOp>(op))
    return std::pair{1, 1};
  if (isa<arith::SubFOp>(op))
    return std::pair{1, -1};
  return std::nullopt;
}

/// (x +- a) +- b -> x +- (a +- b) where a and b vary along fewer of a tile's axes than x
/// (termLevel): the row and column terms are combined off x's chain, x is added last.
template <typename OpTy> struct AddTermsFirst : OpRewritePattern<OpTy> {
  using OpRewritePattern<OpTy>::OpRewritePattern;
  LogicalResult matchAndRewrite(OpTy outer, PatternRewriter &rewriter) const override {
    if (!isa<VectorType>(outer.getType()))
      return rewriter.notifyMatchFailure(outer, "not a vector");
    auto [o0, o1] = *operandSigns(outer);
    for (int i = 0; i < 2; ++i) {
      Value u = outer->getOperand(i), b = outer->getOperand(1 - i);
      int su = i == 0 ? o0 : o1, sb = i == 0 ? o1 : o0;
      Operation *inner = u.getDefiningOp();
      if (!inner || !operandSigns(inner) || !inner->hasOneUse())
        continue;
      auto [i0, i1] = *operandSigns(inner);
      for (int j = 0; j < 2; ++j) {
        Value x = inner->getOperand(j), a = inner->getOperand(1 - j);
        int sx = su * (j == 0 ? i0 : i1), sa = su * (j == 0 ? i1 : i0);
        int level = termLevel(x);
        if (termLevel(a) >= level || termLevel(b) >= level)
          continue;
        // outer = sx x + sa a + sb b; t = st (sa a + sb b), st pulled out where both are -.
        Location loc = outer.getLoc();
        Value t;
        int st = 1;
        if (sa > 0 && sb > 0)
          t = arith::AddFOp::create(rewriter, loc, a, b);
        else if (sa > 0)
          t = arith::SubFOp::create(rewriter, loc, a, b);
        else if (sb > 0)
          t = arith::SubFOp::create(rewriter, loc, b, a);
        else { // x - a - b: sx is + (a and x are both - only in b - (x + a))
          t = arith::AddFOp::create(rewriter, loc, a, b);
          st = -1;
        }
        Value result = sx > 0 && st > 0 ? Value(arith::AddFOp::create(rewriter, loc, x, t))
                       : sx > 0         ? Value(arith::SubFOp::create(rewriter, loc, x, t))
                                        : Value(arith::SubFOp::create(rewriter, loc, t, x));
        rewriter.replaceOp(outer, result);
        return success();
      }
    }
    return rewriter.notifyMatchFailure(outer, "no (x +- a) +- b with a, b terms of fewer axes");
  }
};

struct ShortenChainsPass : spectra::impl::SpectraShortenChainsBase<ShortenChainsPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<AddTermsFirst<arith::AddFOp>, AddTermsFirst<arith::SubFOp>>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

struct FormFmaPass : spectra::impl::SpectraFormFmaBase<FormFmaPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseAdd, FuseSub>(&getContext());
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
    // Causal: 0, the pass's choice by the head (spectra_cpu_causal_tile_rows).
    tiles.tileRows = o.tileRows != 0 ? o.tileRows  // < 0: the tile kernels' error
                     : o.causal      ? 0
                                     : cpuRegisterTile(o.vectorWidth, o.registerVectors,
                                                       o.fmaChains)
                                      .tileRows;
    tiles.causal = o.causal;
    tiles.paramsKernels = true;
    tiles.antipodalWeights = true;
    pm.addPass(createSpectraBuildTileKernels(tiles));
    pm.addPass(createSpectraKeepKernels());
    // The full tiles of the kernels without a contraction (the moments) unstaged: their
    // copies were most of their work.
    pm.addNestedPass<func::FuncOp>(createSpectraFullTilesInPlace());
    // A tile whose last reader is an elementwise op takes that op's output (kv's features
    // over its logits): one [T x m] tile less in L1.
    pm.addNestedPass<func::FuncOp>(createSpectraReuseTileBuffers());
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
    // The column-only terms of a tile op's sums (OPRF's a0 ||w||^2 and a2, the stabiliser's
    // constant) summed once per kernel, not per element: on the canonical IR, where the
    // parameters' loads stand above the tile loop.
    pm.addNestedPass<func::FuncOp>(createSpectraHoistColumnTerms());
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
    return;
  }
  case CpuStage::Vectors: {
    SpectraVectorizeTilesOptions vectors;
    vectors.vectorWidth = o.vectorWidth;
    // The causal kernels' 8- and 16-row tiles keep the width's register tile (6 rows there
    // leave a narrow remainder: 10% slower on a Zen 2 core).
    vectors.registerRows =
        o.registerRows > 0 ? int64_t(o.registerRows)
        : o.causal         ? cpuRegisterRows(o.vectorWidth)
                           : cpuRegisterTile(o.vectorWidth, o.registerVectors, o.fmaChains).rows;
    vectors.registerVectors = o.registerVectors;
    vectors.amx = o.amx;
    // One strip of features at a time (a register tile's width): the chain's tiles in L1.
    if (o.stripFeatures) {
      SpectraStripTilesOptions strips;
      strips.strip = vectors.registerVectors * o.vectorWidth;
      pm.addNestedPass<func::FuncOp>(createSpectraStripTiles(strips));
    }
    pm.addNestedPass<func::FuncOp>(createSpectraVectorizeTiles(vectors));
    pm.addNestedPass<func::FuncOp>(createSpectraShortenChains());
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
    // After the canonicalizer (whose folds would not see through an fma).
    pm.addNestedPass<func::FuncOp>(createSpectraFormFma());
    return;
  }
  case CpuStage::LLVM:
    pm.addPass(createSpectraPolynomialExp({o.expScalef, o.expTable}));
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
