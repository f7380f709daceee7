//===- WeightOps.cpp - verifiers of the weight-recipe building blocks ----===//
//
// Sizes are `index` values; a recipe in the built-in library is generic in m
// and d, so most checks apply only where a size is known (a constant after
// instantiation, or next_pow2 of one). Each check is tagged with the
// constraint number of the op's description.
//
//===----------------------------------------------------------------------===//

#include "dialect/SpectraDialect.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/bit.h"

using namespace mlir;
using namespace mlir::spectra;

namespace {
/// A static dimension of a ranked tensor, or nullopt when dynamic.
std::optional<int64_t> staticDim(Type type, unsigned i) {
  auto tensor = llvm::cast<RankedTensorType>(type);
  if (i >= tensor.getRank() || tensor.isDynamicDim(i))
    return std::nullopt;
  return tensor.getDimSize(i);
}

/// The size of dimension `i`: static from the type, else known from `size`.
std::optional<int64_t> dimOf(Value tensor, unsigned i) { return staticDim(tensor.getType(), i); }

bool isPowerOfTwo(int64_t v) { return v > 0 && llvm::has_single_bit(static_cast<uint64_t>(v)); }

/// C1/C2 of every draw op: one size per result dimension; known sizes are
/// positive and agree with the static result type.
LogicalResult verifySizes(Operation *op, ValueRange sizes, Value result) {
  auto type = llvm::cast<RankedTensorType>(result.getType());
  if (static_cast<int64_t>(sizes.size()) != type.getRank())
    return constraintError(op, "C1") << "expects one size per result dimension: " << sizes.size()
                                     << " size(s) for a rank-" << type.getRank() << " result";
  for (auto [i, size] : llvm::enumerate(sizes)) {
    std::optional<int64_t> known = knownIndex(size);
    if (!known)
      continue;
    if (*known <= 0)
      return constraintError(op, "C2", size) << "size #" << i << " must be positive, got " << *known;
    if (!type.isDynamicDim(i) && type.getDimSize(i) != *known)
      return constraintError(op, "C2", size)
             << "size #" << i << " is " << *known << " but result dimension " << i << " is "
             << type.getDimSize(i);
  }
  return success();
}
} // namespace

//===----------------------------------------------------------------------===//
// spectra.weight_recipe
//===----------------------------------------------------------------------===//

void WeightRecipeOp::build(OpBuilder &builder, OperationState &state, StringRef name) {
  state.addAttribute(SymbolTable::getSymbolAttrName(), builder.getStringAttr(name));
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  block->addArgument(builder.getIndexType(), state.location);
  block->addArgument(builder.getIndexType(), state.location);
}

/// Prints the recipe arguments as %m and %d.
void WeightRecipeOp::getAsmBlockArgumentNames(Region &region, OpAsmSetValueNameFn setName) {
  Block &block = region.front();
  if (block.getNumArguments() == 2) {
    setName(block.getArgument(0), "m");
    setName(block.getArgument(1), "d");
  }
}

bool WeightRecipeOp::hasRowWeights() {
  auto yield = llvm::dyn_cast<YieldOp>(getBody().front().getTerminator());
  return yield && yield.getValues().size() == 2;
}

SmallVector<StringRef> WeightRecipeOp::getOptionNames() {
  SmallVector<StringRef> names;
  for (auto option : getBody().front().getOps<RecipeOptionOp>())
    names.push_back(option.getName());
  return names;
}

/// C1/C2 of recipes and stacked blocks: a rank-2 W, optionally a rank-1 weight vector.
static LogicalResult verifyRecipeYield(Operation *op, Block &block, StringRef id) {
  auto yield = llvm::dyn_cast_or_null<YieldOp>(block.empty() ? nullptr : &block.back());
  if (!yield)
    return constraintError(op, id) << "body must end in spectra.yield";
  ValueRange values = yield.getValues();
  auto rankOf = [](Value v) -> int64_t {
    auto t = llvm::dyn_cast<RankedTensorType>(v.getType());
    return t && llvm::isa<FloatType>(t.getElementType()) ? t.getRank() : -1;
  };
  if (values.empty() || values.size() > 2)
    return constraintError(op, id) << "body must yield W (rank 2) and optionally row weights "
                                      "(rank 1), got "
                                   << values.size() << " value(s)";
  if (rankOf(values[0]) != 2)
    return constraintError(op, id, values[0])
           << "first yielded value must be a rank-2 float tensor (W), got " << values[0].getType();
  if (values.size() == 2 && rankOf(values[1]) != 1)
    return constraintError(op, id, values[1])
           << "second yielded value must be a rank-1 float tensor (row weights), got "
           << values[1].getType();
  return success();
}

LogicalResult WeightRecipeOp::verify() {
  Block &block = getBody().front();
  if (block.getNumArguments() != 2 ||
      !llvm::all_of(block.getArgumentTypes(), [](Type t) { return t.isIndex(); }))
    return constraintError(*this, "C1")
           << "body must have exactly two index arguments (m, d), got "
           << block.getNumArguments() << " argument(s)";
  return verifyRecipeYield(*this, block, "C2");
}

LogicalResult WeightRecipeOp::verifyRegions() {
  // Follow each learnable draw forward through its users: a recipe yield of W ends the walk
  // (C3 holds), a stack_blocks yield continues from the stacked result, moment_match (which
  // needs a fixed input) stops it with C4.
  WalkResult walked = getBody().walk([&](Operation *draw) -> WalkResult {
    if (!draw->hasAttr("learnable"))
      return WalkResult::advance();
    bool reachesW = false;
    SmallVector<Value> work(draw->getResults().begin(), draw->getResults().end());
    llvm::SmallPtrSet<Operation *, 16> seen;
    while (!work.empty()) {
      Value value = work.pop_back_val();
      for (OpOperand &use : value.getUses()) {
        Operation *user = use.getOwner();
        if (isa<MomentMatchOp>(user)) {
          constraintError(*this, "C4", draw->getResult(0))
              << "'" << user->getName() << "' takes a value computed from the learnable '"
              << draw->getName() << "'; it needs a fixed input (it re-standardises its input, "
                 "undoing what is learned)";
          return WalkResult::interrupt();
        }
        if (isa<YieldOp>(user)) {
          Operation *parent = user->getParentOp();
          if (parent == getOperation() && use.getOperandNumber() == 0)
            reachesW = true;
          else if (isa<StackBlocksOp>(parent) && parent->getNumResults() > 0 &&
                   seen.insert(parent).second)
            work.push_back(parent->getResult(0));
          continue;
        }
        if (seen.insert(user).second)
          work.append(user->getResults().begin(), user->getResults().end());
      }
    }
    if (!reachesW) {
      constraintError(*this, "C3", draw->getResult(0))
          << "the learnable '" << draw->getName()
          << "' does not reach W (the recipe's first result), so it would never train; use it "
             "or drop `learnable`";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(walked.wasInterrupted());
}

//===----------------------------------------------------------------------===//
// Random draws
//===----------------------------------------------------------------------===//

LogicalResult GaussianOp::verify() { return verifySizes(*this, getSizes(), getResult()); }
LogicalResult UniformOp::verify() { return verifySizes(*this, getSizes(), getResult()); }
LogicalResult RademacherOp::verify() { return verifySizes(*this, getSizes(), getResult()); }
LogicalResult PermutationOp::verify() { return verifySizes(*this, getSizes(), getResult()); }

LogicalResult ChiOp::verify() {
  if (failed(verifySizes(*this, getSizes(), getResult())))
    return failure();
  if (std::optional<int64_t> dof = knownIndex(getDof()); dof && *dof <= 0)
    return constraintError(*this, "C3", getDof())
           << "degrees of freedom must be positive, got " << *dof;
  return success();
}

LogicalResult LowDiscrepancyOp::verify() {
  if (failed(verifySizes(*this, getSizes(), getResult())))
    return failure();
  std::optional<int64_t> cols = knownIndex(getSizes()[1]);
  if (!cols)
    cols = staticDim(getResult().getType(), 1);
  int64_t limit = getSequence() == Sequence::sobol ? 21201 : 10000;
  if (cols && *cols > limit)
    return constraintError(*this, "C3", getSizes()[1])
           << stringifySequence(getSequence()) << " supports at most " << limit
           << " dimensions, got " << *cols;
  return success();
}

LogicalResult HadamardDiagonalChainOp::verify() {
  if (failed(verifySizes(*this, getSizes(), getResult())))
    return failure();
  if (int64_t length = getLengthAttr().getInt(); length < 1)
    return constraintError(*this, "C3") << "length must be >= 1, got " << length;
  for (Value size : getSizes())
    if (std::optional<int64_t> n = knownIndex(size); n && !isPowerOfTwo(*n))
      return constraintError(*this, "C4", size)
             << "Hadamard size must be a power of two, got " << *n
             << " (use spectra.next_pow2 and spectra.take_cols)";
  if (getSizes()[0] != getSizes()[1]) {
    std::optional<int64_t> r = knownIndex(getSizes()[0]), c = knownIndex(getSizes()[1]);
    if (!r || !c || *r != *c)
      return constraintError(*this, "C4", getSizes()[1]) << "the chain is square: both sizes must be the same value";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Deterministic transforms
//===----------------------------------------------------------------------===//

LogicalResult InverseNormalCdfOp::verify() {
  Operation *def = getPoints().getDefiningOp();
  if (!def || !llvm::isa<LowDiscrepancyOp, UniformOp>(def))
    return constraintError(*this, "C1", getPoints())
           << "input must be a point set in the open unit cube (spectra.low_discrepancy or "
              "spectra.uniform)";
  return success();
}

LogicalResult OrthogonalizeOp::verify() {
  if (!getInput().getDefiningOp<GaussianOp>())
    return constraintError(*this, "C1", getInput())
           << "input must be a spectra.gaussian draw (sign-corrected QR is Haar only for "
              "Gaussian blocks)";
  auto gaussian = getInput().getDefiningOp<GaussianOp>();
  std::optional<int64_t> rows = knownIndex(gaussian.getSizes()[0]);
  std::optional<int64_t> cols =
      gaussian.getSizes().size() > 1 ? knownIndex(gaussian.getSizes()[1]) : std::nullopt;
  if (!rows)
    rows = dimOf(getInput(), 0);
  if (!cols)
    cols = dimOf(getInput(), 1);
  if (rows && cols && *rows > *cols)
    return constraintError(*this, "C2", getInput())
           << "a " << *rows << "x" << *cols << " block cannot have more orthonormal rows than "
           << "columns; stack d x d blocks with spectra.stack_blocks";
  return success();
}

LogicalResult ScaleRowsOp::verify() {
  if (getResult().getType() != getMatrix().getType())
    return constraintError(*this, "C1") << "result type " << getResult().getType()
                                        << " must equal the matrix type " << getMatrix().getType();
  std::optional<int64_t> rows = dimOf(getMatrix(), 0), len = dimOf(getFactors(), 0);
  if (rows && len && *rows != *len)
    return constraintError(*this, "C2", getFactors())
           << "vector of length " << *len << " cannot scale the " << *rows << " rows";
  return success();
}

LogicalResult ScaleOp::verify() {
  if (std::optional<int64_t> base = knownIndex(getBase()); base && *base <= 0)
    return constraintError(*this, "C1", getBase()) << "base must be positive, got " << *base;
  return success();
}

LogicalResult NextPowerOfTwoOp::verify() {
  if (std::optional<int64_t> v = knownIndex(getValue()); v && *v <= 0)
    return constraintError(*this, "C1", getValue()) << "operand must be positive, got " << *v;
  return success();
}

OpFoldResult NextPowerOfTwoOp::fold(FoldAdaptor adaptor) {
  auto in = llvm::dyn_cast_or_null<IntegerAttr>(adaptor.getValue());
  if (!in || in.getInt() <= 0)
    return {};
  return IntegerAttr::get(IndexType::get(getContext()),
                          static_cast<int64_t>(llvm::PowerOf2Ceil(in.getInt())));
}

LogicalResult TakeColumnsOp::verify() {
  std::optional<int64_t> count = knownIndex(getCount());
  if (!count)
    return success();
  if (*count <= 0)
    return constraintError(*this, "C1", getCount()) << "column count must be positive, got " << *count;
  std::optional<int64_t> cols = dimOf(getInput(), 1);
  if (!cols)
    if (auto chain = getInput().getDefiningOp<HadamardDiagonalChainOp>())
      cols = knownIndex(chain.getSizes()[1]);
  if (cols && *count > *cols)
    return constraintError(*this, "C1", getCount())
           << "cannot take " << *count << " columns of a matrix with " << *cols;
  return success();
}

LogicalResult NormCouplingOp::verify() {
  if (getSweeps() < 1)
    return constraintError(*this, "C1") << "sweeps must be at least 1, got " << getSweeps();
  if (std::optional<int64_t> rows = dimOf(getInput(), 0); rows && *rows < 2)
    return constraintError(*this, "C2", getInput())
           << "couples at least 2 rows, got " << *rows;
  return success();
}

LogicalResult MomentMatchOp::verify() {
  std::optional<int64_t> rows = dimOf(getPoints(), 0), cols = dimOf(getPoints(), 1);
  if (Operation *def = getPoints().getDefiningOp()) {
    // Points usually come as ndtri(draw [rows, cols]): look through it for the sizes.
    if (auto ndtri = llvm::dyn_cast<InverseNormalCdfOp>(def))
      def = ndtri.getPoints().getDefiningOp();
    ValueRange sizes;
    if (auto ld = llvm::dyn_cast_or_null<LowDiscrepancyOp>(def))
      sizes = ld.getSizes();
    else if (auto u = llvm::dyn_cast_or_null<UniformOp>(def))
      sizes = u.getSizes();
    else if (auto g = llvm::dyn_cast_or_null<GaussianOp>(def))
      sizes = g.getSizes();
    if (sizes.size() == 2) {
      if (!rows)
        rows = knownIndex(sizes[0]);
      if (!cols)
        cols = knownIndex(sizes[1]);
    }
  }
  if (rows && cols && *rows <= *cols)
    return constraintError(*this, "C1", getPoints())
           << "needs more points than dimensions (" << *rows << " <= " << *cols
           << "): the sample covariance would be singular";
  return success();
}

LogicalResult SparseGridOp::verify() {
  if (int64_t degree = getDegreeAttr().getInt(); degree != 3)
    return constraintError(*this, "C1")
           << "only the degree-3 rule (3-point Gauss-Hermite Smolyak) is provided, got degree "
           << degree;
  if (std::optional<int64_t> d = knownIndex(getDim())) {
    auto check = [&](Value v, unsigned i, int64_t expected) -> LogicalResult {
      std::optional<int64_t> s = dimOf(v, i);
      if (s && *s != expected)
        return constraintError(*this, "C2", getDim())
               << "with d = " << *d << " result dimension " << i << " must be " << expected
               << ", got " << *s;
      return success();
    };
    if (failed(check(getPoints(), 0, 2 * *d + 1)) || failed(check(getPoints(), 1, *d)) ||
        failed(check(getWeights(), 0, 2 * *d + 1)))
      return failure();
  }
  return success();
}

LogicalResult SphericalRadialOp::verify() {
  if (std::optional<int64_t> len = dimOf(getRadius(), 0); len && *len != 1)
    return constraintError(*this, "C1", getRadius())
           << "the radius must hold one value, got length " << *len;
  if (std::optional<int64_t> d = knownIndex(getDim())) {
    for (auto [v, i, expected] : {std::tuple<Value, unsigned, int64_t>{getPoints(), 0, 2 * *d + 3},
                                  {getPoints(), 1, *d},
                                  {getWeights(), 0, 2 * *d + 3}})
      if (std::optional<int64_t> s = dimOf(v, i); s && *s != expected)
        return constraintError(*this, "C2", getDim())
               << "with d = " << *d << " result dimension " << i << " must be " << expected
               << ", got " << *s;
  }
  return success();
}

LogicalResult RotateOp::verify() {
  std::optional<int64_t> qr = dimOf(getRotation(), 0), qc = dimOf(getRotation(), 1);
  if (qr && qc && *qr != *qc)
    return constraintError(*this, "C1", getRotation())
           << "rotation must be square, got " << *qr << "x" << *qc;
  std::optional<int64_t> pc = dimOf(getPoints(), 1);
  if (pc && qc && *pc != *qc)
    return constraintError(*this, "C2", getRotation())
           << "points have " << *pc << " columns but the rotation acts on " << *qc;
  return success();
}

LogicalResult SimplexOp::verify() {
  std::optional<int64_t> n = knownIndex(getSize());
  if (n && *n < 2)
    return constraintError(*this, "C1", getSize()) << "a simplex needs at least 2 vertices, got " << *n;
  for (unsigned dim = 0; dim < 2; ++dim)
    if (std::optional<int64_t> r = dimOf(getResult(), dim); n && r && *r != *n)
      return constraintError(*this, "C2") << "result dimension " << dim << " is " << *r
                                          << " but the simplex has " << *n << " vertices";
  std::optional<int64_t> rows = dimOf(getResult(), 0), cols = dimOf(getResult(), 1);
  if (rows && cols && *rows != *cols)
    return constraintError(*this, "C2") << "the result is square, got " << *rows << "x" << *cols;
  return success();
}

LogicalResult CirculantOp::verify() {
  std::optional<int64_t> n = dimOf(getVector(), 0);
  for (unsigned dim = 0; dim < 2; ++dim)
    if (std::optional<int64_t> r = dimOf(getResult(), dim); n && r && *r != *n)
      return constraintError(*this, "C1") << "result dimension " << dim << " is " << *r
                                          << " but the vector has length " << *n;
  std::optional<int64_t> rows = dimOf(getResult(), 0), cols = dimOf(getResult(), 1);
  if (rows && cols && *rows != *cols)
    return constraintError(*this, "C1") << "the result is square, got " << *rows << "x" << *cols;
  return success();
}

LogicalResult FastFoodOp::verify() {
  std::optional<int64_t> n;
  Value first;
  for (Value v : {getS(), getG(), getPerm(), getB()}) {
    std::optional<int64_t> len = dimOf(v, 0);
    if (!len)
      if (Operation *def = v.getDefiningOp())
        if (def->getNumOperands() > 0)
          len = knownIndex(def->getOperand(0));
    if (!len)
      continue;
    if (n && *len != *n)
      return constraintError(*this, "C1", v)
             << "factor of length " << *len << " does not match length " << *n;
    if (!n)
      first = v;
    n = len;
  }
  if (n && !isPowerOfTwo(*n))
    return constraintError(*this, "C2", first)
           << "FastFood blocks need a power-of-two length, got " << *n;
  if (n) {
    for (unsigned i = 0; i < 2; ++i)
      if (std::optional<int64_t> s = dimOf(getResult(), i); s && *s != *n)
        return constraintError(*this, "C3")
               << "result must be " << *n << "x" << *n << ", got " << getResult().getType();
  }
  return success();
}

LogicalResult StackBlocksOp::verify() {
  Block &block = getBody().front();
  if (block.getNumArguments() != 0)
    return constraintError(*this, "C1") << "body takes no arguments";
  if (failed(verifyRecipeYield(*this, block, "C1")))
    return failure();
  ValueRange yielded = llvm::cast<YieldOp>(block.back()).getValues();
  if (yielded.size() != getNumResults())
    return constraintError(*this, "C2") << "body yields " << yielded.size()
                                        << " value(s) but the op has " << getNumResults()
                                        << " result(s)";
  for (auto [y, r] : llvm::zip(yielded, getResults()))
    if (y.getType() != r.getType())
      return constraintError(*this, "C2", y)
             << "yielded " << y.getType() << " but the result is " << r.getType();
  if (getAverageWeights() && yielded.size() != 2)
    return constraintError(*this, "C3") << "average_weights needs a body that yields row weights";
  return success();
}

//===----------------------------------------------------------------------===//
// Options, learnable initialisers and the affine map
//===----------------------------------------------------------------------===//

LogicalResult RecipeOptionOp::verify() {
  if (getDefaultValue() < 1)
    return constraintError(*this, "C1") << "option \"" << getName()
                                        << "\" counts something: its default must be >= 1, got "
                                        << getDefaultValue();
  for (auto other : (*this)->getBlock()->getOps<RecipeOptionOp>())
    if (other != *this && other.getName() == getName() && other->isBeforeInBlock(*this))
      return constraintError(*this, "C2") << "option \"" << getName() << "\" is declared twice";
  return success();
}

LogicalResult CeilDivOp::verify() {
  if (std::optional<int64_t> b = knownIndex(getRhs()); b && *b <= 0)
    return constraintError(*this, "C1", getRhs()) << "divisor must be positive, got " << *b;
  return success();
}

LogicalResult EyeOp::verify() {
  std::optional<int64_t> n = knownIndex(getSize());
  if (n && *n <= 0)
    return constraintError(*this, "C1", getSize()) << "size must be positive, got " << *n;
  for (unsigned dim = 0; dim < 2; ++dim)
    if (std::optional<int64_t> r = dimOf(getResult(), dim); n && r && *r != *n)
      return constraintError(*this, "C1") << "result dimension " << dim << " is " << *r
                                          << " but the identity is " << *n << "x" << *n;
  return success();
}

LogicalResult ZerosOp::verify() { return verifySizes(*this, getSizes(), getResult()); }

LogicalResult AffineOp::verify() {
  std::optional<int64_t> rows = dimOf(getScale(), 0), cols = dimOf(getScale(), 1);
  if (rows && cols && *rows != *cols)
    return constraintError(*this, "C1", getScale()) << "A must be square, got " << *rows << "x" << *cols;
  if (std::optional<int64_t> p = dimOf(getPoints(), 1); p && cols && *p != *cols)
    return constraintError(*this, "C2", getPoints())
           << "points have " << *p << " columns but A has " << *cols;
  if (std::optional<int64_t> b = dimOf(getShift(), 0); b && rows && *b != *rows)
    return constraintError(*this, "C3", getShift())
           << "the shift has length " << *b << " but A has " << *rows << " rows";
  return success();
}

//===----------------------------------------------------------------------===//
// Generator networks
//===----------------------------------------------------------------------===//

LogicalResult GlorotOp::verify() { return verifySizes(*this, getSizes(), getResult()); }

LogicalResult LinearOp::verify() {
  std::optional<int64_t> outputs = dimOf(getWeight(), 0), inputs = dimOf(getWeight(), 1);
  if (std::optional<int64_t> x = dimOf(getInput(), 1); x && inputs && *x != *inputs)
    return constraintError(*this, "C1", getInput())
           << "the input has " << *x << " columns but the layer takes " << *inputs;
  if (std::optional<int64_t> b = dimOf(getBias(), 0); b && outputs && *b != *outputs)
    return constraintError(*this, "C2", getBias())
           << "the bias has length " << *b << " but the layer has " << *outputs << " outputs";
  if (std::optional<int64_t> r = dimOf(getResult(), 1); r && outputs && *r != *outputs)
    return constraintError(*this, "C3") << "result has " << *r << " columns but the layer has "
                                        << *outputs << " outputs";
  if (std::optional<int64_t> r = dimOf(getResult(), 0), x = dimOf(getInput(), 0); r && x && *r != *x)
    return constraintError(*this, "C3") << "result has " << *r << " rows but the input has " << *x;
  return success();
}

LogicalResult BatchNormOp::verify() {
  if (std::optional<int64_t> rows = dimOf(getInput(), 0); rows && *rows < 2)
    return constraintError(*this, "C1", getInput())
           << "batch normalisation needs at least 2 rows, got " << *rows;
  return success();
}

LogicalResult ActivationOp::verify() {
  if (getFunction() != "leaky_relu" && getFunction() != "tanh")
    return constraintError(*this, "C1") << "unknown activation \"" << getFunction()
                                        << "\" (known: leaky_relu, tanh)";
  return success();
}
