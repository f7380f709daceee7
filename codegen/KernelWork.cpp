//===- KernelWork.cpp - the vector work of a CPU kernel per row tile -------===//

#include "codegen/KernelWork.h"
#include "codegen/KernelBuilder.h"
#include "codegen/CpuKernel.h"
#include "codegen/Passes.h"
#include "codegen/RowLoopNests.h"
#include "codegen/TileKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/Pass/PassManager.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

using namespace mlir;
using namespace mlir::spectra;

KernelWork::Counts &KernelWork::Counts::operator+=(const Counts &o) {
  fmas += o.fmas;
  exps += o.exps;
  other += o.other;
  loads += o.loads;
  stores += o.stores;
  return *this;
}

namespace {

/// A compare whose only use is a select of its own two operands: a minimum or maximum, one
/// instruction (vminps/vmaxps) with the select.
bool isExtremumCompare(Operation *op) {
  auto cmp = dyn_cast<arith::CmpFOp>(op);
  if (!cmp || !cmp->hasOneUse())
    return false;
  auto select = dyn_cast<arith::SelectOp>(*cmp->getUsers().begin());
  return select && select.getCondition() == cmp.getResult() &&
         llvm::is_contained(ValueRange{cmp.getLhs(), cmp.getRhs()}, select.getTrueValue()) &&
         llvm::is_contained(ValueRange{cmp.getLhs(), cmp.getRhs()}, select.getFalseValue());
}

/// The vector operations `op` issues, by class, added to `c` `times` times.
/// Whether `exp` takes a form that folds a coefficient multiply after it into its last step
/// (CpuKernel.cpp's ScalefExp at 16 lanes on AVX-512, BitsExp for a marked exp). TableExp (a
/// marked 8-lane exp with `expTable`, or 16-lane with `expTable` and `expScalef`) keeps the
/// multiply as an instruction of its own.
bool foldsScale(math::ExpOp exp, ExpForms forms) {
  auto v = dyn_cast<VectorType>(exp.getType());
  if (!v)
    return false;
  const bool marked = exp->hasAttr(kExpAtMostZeroAttr);
  const int64_t lanes = v.getNumElements();
  if (marked && forms.table && (lanes == 8 || (lanes == 16 && forms.scalef)))
    return false;
  if (forms.scalef && lanes == 16)
    return true;
  return marked;
}

void classify(Operation *op, double times, KernelWork::Counts &c, int64_t &width, ExpForms forms,
              int64_t unmarkedExtra) {
  auto vectorOf = [](Type t) { return dyn_cast<VectorType>(t); };
  for (Type t : op->getResultTypes())
    if (auto v = vectorOf(t))
      width = std::max<int64_t>(width, v.getNumElements());
  if (isa<vector::FMAOp>(op)) {
    c.fmas += times;
    return;
  }
  if (isa<vector::LoadOp, vector::TransferReadOp, vector::MaskedLoadOp, vector::GatherOp>(op)) {
    c.loads += times;
    return;
  }
  if (isa<vector::StoreOp, vector::TransferWriteOp, vector::MaskedStoreOp>(op)) {
    c.stores += times;
    return;
  }
  if (auto broadcast = dyn_cast<vector::BroadcastOp>(op)) {
    // A broadcast of a scalar from memory is one load (vbroadcastss from memory).
    Operation *source = broadcast.getSource().getDefiningOp();
    (isa_and_nonnull<memref::LoadOp>(source) ? c.loads : c.other) += times;
    return;
  }
  if (auto reduction = dyn_cast<vector::ReductionOp>(op)) {
    // A tree over the lanes: a shuffle and an operation per halving.
    int64_t lanes = reduction.getSourceVectorType().getNumElements();
    c.other += times * 2 * llvm::Log2_64_Ceil(std::max<int64_t>(lanes, 2));
    return;
  }
  if (op->getNumResults() != 1)
    return;
  Type type = op->getResult(0).getType();
  bool vector = vectorOf(type) != nullptr;
  if (isa<math::ExpOp>(op)) {
    (vector ? c.exps : c.other) += times;
    // exp_ops counts the form of a stabilised exp; one without that mark takes a longer one
    // (its overflow clamp; MLIR's generic form without vscalefps), counted here.
    if (vector && !op->hasAttr(kExpAtMostZeroAttr))
      c.other += times * double(unmarkedExtra);
    return;
  }
  if (auto shuffle = dyn_cast<vector::ShuffleOp>(op)) {
    // A shuffle of one narrower vector that keeps its lanes in place widens it (its lanes
    // are the low part of the wider register; the shuffle that reads it absorbs it).
    auto source = shuffle.getV1VectorType();
    bool widening = shuffle.getV1() == shuffle.getV2() && source.getRank() == 1 &&
                    source.getNumElements() < shuffle.getResultVectorType().getNumElements();
    for (auto [lane, from] : llvm::enumerate(shuffle.getMask()))
      widening = widening && (int64_t(lane) >= source.getNumElements() || from == int64_t(lane));
    if (!widening)
      c.other += times;
    return;
  }
  if (isa<vector::ExtractOp, vector::InsertOp>(op)) {
    c.other += times;
    return;
  }
  // Arithmetic, compares and selects on vectors or on scalar floats (the same ports); index
  // and integer scalars run on the integer units, constants are hoisted.
  if (!isa<arith::ArithDialect, math::MathDialect>(op->getDialect()) || isa<arith::ConstantOp>(op))
    return;
  Type element = getElementTypeOrSelf(type);
  bool floatLike = isa<FloatType>(element) ||
                   (element.isInteger(1) && isa<arith::CmpFOp>(op)) ||
                   (isa<arith::SelectOp>(op) && isa<FloatType>(element));
  if (!vector && !floatLike)
    return;
  if (isa<arith::BitcastOp>(op) || isExtremumCompare(op))
    return;
  // A negated fma operand is part of the fma's instruction (vfnmadd, vfmsub).
  if (isa<arith::NegFOp>(op) &&
      llvm::all_of(op->getUsers(), [](Operation *user) { return isa<math::FmaOp>(user); }))
    return;
  if (auto mul = dyn_cast<arith::MulFOp>(op))
    for (Value operand : mul->getOperands())
      if (auto exp = operand.getDefiningOp<math::ExpOp>())
        if (foldsScale(exp, forms) && expScaledBy(exp) == mul)
          return;
  c.other += times;
}

/// The trip count of `loop`: constant bounds, or an upper bound `min(x, C)` (the rows left
/// in a tile) taken as C; a loop over the rows past the end (from `min(x, C)` to C, in the
/// last tile only) runs 0 times in a full tile. Unknown: 1, and `exact` cleared.
double tripCount(scf::ForOp loop, bool &exact) {
  if (isRowsPastTheEnd(loop))
    return 0;
  std::optional<int64_t> lb = getConstantIntValue(loop.getLowerBound());
  std::optional<int64_t> step = getConstantIntValue(loop.getStep());
  std::optional<int64_t> ub = constantUpperBound(loop.getUpperBound());
  if (!lb || !step || !ub || *step <= 0) {
    exact = false;
    return 1;
  }
  return *ub > *lb ? double(llvm::divideCeil(*ub - *lb, *step)) : 0.0;
}

/// Whether `cond` tests the kernel's `wgrad` argument (whether W is learnable): a compare of
/// a value loaded from it.
bool testsWeightGradient(Value cond) {
  auto cmp = cond.getDefiningOp<arith::CmpFOp>();
  if (!cmp)
    return false;
  for (Value operand : cmp->getOperands()) {
    auto load = operand.getDefiningOp<memref::LoadOp>();
    auto arg = load ? dyn_cast<BlockArgument>(load.getMemRef()) : BlockArgument();
    auto fn = arg ? dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp()) : func::FuncOp();
    auto names = fn ? fn->getAttrOfType<ArrayAttr>(kKernelArgNamesAttr) : ArrayAttr();
    if (names && arg.getArgNumber() < names.size())
      if (auto name = dyn_cast<StringAttr>(names[arg.getArgNumber()]); name && name == "wgrad")
        return true;
  }
  return false;
}

void countBlock(Block &block, double times, bool conditional, KernelWork &work, ExpForms forms,
                int64_t unmarkedExtra) {
  for (Operation &op : block) {
    if (auto loop = dyn_cast<scf::ForOp>(op)) {
      countBlock(*loop.getBody(), times * tripCount(loop, work.exact), conditional, work, forms,
                 unmarkedExtra);
      continue;
    }
    if (auto branch = dyn_cast<scf::IfOp>(op)) {
      // The weights' gradient: counted apart. A branch on the data (the causal kernels'
      // tests): its then-branch, taken, and the counts no longer exact.
      if (testsWeightGradient(branch.getCondition())) {
        countBlock(*branch.thenBlock(), times, /*conditional=*/true, work, forms, unmarkedExtra);
        if (branch.elseBlock())
          work.exact = false;
      } else {
        countBlock(*branch.thenBlock(), times, conditional, work, forms, unmarkedExtra);
        work.exact = false;
      }
      continue;
    }
    for (Region &region : op.getRegions())
      for (Block &inner : region)
        countBlock(inner, times, conditional, work, forms, unmarkedExtra);
    classify(&op, times, conditional ? work.conditional : work.always, work.width, forms,
             unmarkedExtra);
  }
}

} // namespace

std::vector<KernelWork> mlir::spectra::countKernelWork(ModuleOp vectors, ExpForms forms,
                                                       int64_t unmarkedExtra) {
  std::vector<KernelWork> result;
  for (auto fn : vectors.getOps<func::FuncOp>()) {
    auto kind = fn->getAttrOfType<StringAttr>(kKernelKindAttr);
    auto rows = fn->getAttrOfType<IntegerAttr>(kKernelTileRowsAttr);
    if (!kind || !rows || fn.isExternal())
      continue;
    KernelWork work;
    work.kind = kind.getValue().str();
    work.tileRows = rows.getInt();
    if (auto pairs = fn->getAttrOfType<IntegerAttr>(kKernelAntipodalPairsAttr))
      work.antipodalPairs = pairs.getInt();
    // The row-tile loops: over the rows (a dynamic bound) in steps of a tile. What runs
    // once per launch (fills, the final sums) is left out.
    bool found = false;
    for (auto loop : fn.getBody().front().getOps<scf::ForOp>()) {
      std::optional<int64_t> step = getConstantIntValue(loop.getStep());
      if (!step || *step != work.tileRows || getConstantIntValue(loop.getUpperBound()))
        continue;
      found = true;
      countBlock(*loop.getBody(), 1.0, /*conditional=*/false, work, forms, unmarkedExtra);
    }
    if (found)
      result.push_back(std::move(work));
  }
  return result;
}

int64_t mlir::spectra::expVectorOps(MLIRContext *context, int64_t width, ExpForms forms,
                                    bool atMostZero) {
  context->loadDialect<func::FuncDialect, math::MathDialect, arith::ArithDialect,
                       vector::VectorDialect, LLVM::LLVMDialect>();
  OpBuilder b(context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  auto type = VectorType::get({width}, b.getF32Type());
  b.setInsertionPointToEnd(module->getBody());
  auto fn = func::FuncOp::create(b, loc, "probe", b.getFunctionType({type}, {type}));
  b.setInsertionPointToStart(fn.addEntryBlock());
  auto e = math::ExpOp::create(b, loc, fn.getArgument(0));
  if (atMostZero)
    e->setAttr(kExpAtMostZeroAttr, b.getUnitAttr());
  func::ReturnOp::create(b, loc, e.getResult());
  PassManager pm(context);
  pm.addPass(createSpectraPolynomialExp({forms.scalef, forms.table}));
  if (failed(pm.run(*module)))
    return 0;
  int64_t ops = 0;
  fn.walk([&](Operation *op) {
    if (isa<LLVM::CallIntrinsicOp>(op)) {
      ++ops;
      return;
    }
    if (!isa<arith::ArithDialect, math::MathDialect>(op->getDialect()) ||
        isa<arith::ConstantOp, arith::BitcastOp>(op) || isExtremumCompare(op))
      return;
    ++ops;
  });
  return ops;
}

double mlir::spectra::fmaPortBound(const KernelWork::Counts &c, int64_t expOps) {
  double issued = c.fmas + c.exps * double(expOps) + c.other;
  return issued > 0 ? c.fmas / issued : 0.0;
}

std::string mlir::spectra::formatKernelWork(const std::vector<KernelWork> &work, int64_t expOps) {
  std::string text;
  llvm::raw_string_ostream os(text);
  auto n = [](double x) { return int64_t(std::llround(x)); };
  for (const KernelWork &w : work) {
    KernelWork::Counts both = w.always;
    both += w.conditional;
    os << w.kind << " tile_rows=" << w.tileRows << " width=" << w.width
       << " fma=" << n(w.always.fmas) << " exp=" << n(w.always.exps) << " exp_ops=" << expOps
       << " other=" << n(w.always.other) << " load=" << n(w.always.loads)
       << " store=" << n(w.always.stores) << " if_fma=" << n(w.conditional.fmas)
       << " if_exp=" << n(w.conditional.exps) << " if_other=" << n(w.conditional.other)
       << " if_load=" << n(w.conditional.loads) << " if_store=" << n(w.conditional.stores);
    os << llvm::format(" bound=%.3f if_bound=%.3f", fmaPortBound(w.always, expOps),
                       fmaPortBound(both, expOps))
       << " exact=" << (w.exact ? 1 : 0) << " antipodal=" << w.antipodalPairs << "\n";
  }
  return text;
}

std::string mlir::spectra::hostKernelWork(ModuleOp vectors, int64_t width) {
  // As setHostTarget sets spectra-polynomial-exp's options: the table form on every AVX2 host
  // (16 lanes too where vscalefps is there, AVX-512).
  ExpForms forms{width == 16 && hostHasAvx512(), hostHasAvx2()};
  int64_t expOps = expVectorOps(vectors->getContext(), width, forms, /*atMostZero=*/true);
  int64_t unmarked = expVectorOps(vectors->getContext(), width, forms, /*atMostZero=*/false);
  return formatKernelWork(countKernelWork(vectors, forms, unmarked - expOps), expOps);
}
