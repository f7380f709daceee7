//===- ComponentOps.cpp - verifiers of component functions and statistics ===//

#include "dialect/SpectraDialect.h"

#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::spectra;

//===----------------------------------------------------------------------===//
// spectra.component
//===----------------------------------------------------------------------===//

/// Prints the region arguments as %m, %d and %wx, %xx, %ww, %p0, %p1, ...
void ComponentOp::getAsmBlockArgumentNames(Region &region, OpAsmSetValueNameFn setName) {
  if (region.empty())
    return;
  Block &block = region.front();
  static const char *const paramsNames[] = {"m", "d"};
  static const char *const featureNames[] = {"wx", "xx", "ww"};
  bool isParams = &region == &getParams();
  for (auto [i, arg] : llvm::enumerate(block.getArguments())) {
    if (isParams && i < 2)
      setName(arg, paramsNames[i]);
    else if (!isParams && i < 3)
      setName(arg, featureNames[i]);
    else if (!isParams)
      setName(arg, "p" + std::to_string(i - 3));
  }
}

unsigned ComponentOp::getNumOutputs() {
  if (getFeatures().empty())
    return 0;
  auto yield = llvm::dyn_cast<FeatureYieldOp>(getFeatures().front().getTerminator());
  return yield ? yield.getLogits().size() : 0;
}

SmallVector<StringRef> ComponentOp::getOptionNames() {
  SmallVector<StringRef> names;
  if (!getParams().empty())
    for (auto option : getParams().front().getOps<OptionOp>())
      names.push_back(option.getName());
  return names;
}

ParamsYieldOp ComponentOp::getParamsYield() {
  if (getParams().empty() || getParams().front().empty())
    return {};
  return llvm::dyn_cast<ParamsYieldOp>(getParams().front().back());
}

bool ComponentOp::hasInputTransforms() {
  ParamsYieldOp yield = getParamsYield();
  return yield && yield.getQueryScale();
}

LogicalResult ComponentOp::verifyRegions() {
  Block &params = getParams().front();
  Block &features = getFeatures().front();
  if (params.getNumArguments() != 2 ||
      !llvm::all_of(params.getArgumentTypes(), [](Type t) { return t.isF32(); }))
    return constraintError(*this, "C1") << "params region must have exactly two f32 arguments "
                                           "(m, d), got "
                                        << params.getNumArguments() << " argument(s)";
  ParamsYieldOp paramsYield = getParamsYield();
  if (!paramsYield)
    return constraintError(*this, "C2") << "params region must end in spectra.params_yield";
  if (features.empty() || !llvm::isa<FeatureYieldOp>(features.back()))
    return constraintError(*this, "C2") << "features region must end in spectra.feature_yield";
  unsigned expected = 3 + paramsYield.getScalars().size();
  if (features.getNumArguments() != expected ||
      !llvm::all_of(features.getArgumentTypes(), [](Type t) { return t.isF32(); }))
    return constraintError(*this, "C3")
           << "features region must take (wx, xx, ww) and the " << paramsYield.getScalars().size()
           << " scalar parameter(s) as " << expected << " f32 arguments, got "
           << features.getNumArguments();
  llvm::StringSet<> seen;
  for (auto option : params.getOps<OptionOp>())
    if (!seen.insert(option.getName()).second)
      return constraintError(*this, "C4", option.getResult())
             << "option \"" << option.getName() << "\" is declared twice";
  return success();
}

//===----------------------------------------------------------------------===//
// Params-region ops
//===----------------------------------------------------------------------===//

LogicalResult StatisticOp::verify() {
  bool vectorKind = getKind() == StatisticKind::mean || getKind() == StatisticKind::mean_square ||
                    getKind() == StatisticKind::sum_square;
  Type type = getResult().getType();
  if (vectorKind) {
    auto tensor = llvm::dyn_cast<RankedTensorType>(type);
    if (!tensor || tensor.getRank() != 1 || !llvm::isa<FloatType>(tensor.getElementType()))
      return constraintError(*this, "C1")
             << "'" << stringifyStatisticKind(getKind())
             << "' is per dimension: result must be a rank-1 float tensor, got " << type;
  } else if (!type.isF32()) {
    return constraintError(*this, "C1") << "'" << stringifyStatisticKind(getKind())
                                        << "' is a scalar: result must be f32, got " << type;
  }
  return success();
}

LogicalResult DotOp::verify() {
  if (getLhs().getType() != getRhs().getType())
    return constraintError(*this, "C1", getRhs())
           << "operands must have the same type, got " << getLhs().getType() << " and "
           << getRhs().getType();
  return success();
}

LogicalResult OptionOp::verify() {
  if (!getDefaultValue().isFinite())
    return constraintError(*this, "C1") << "default of option \"" << getName()
                                        << "\" must be finite";
  return success();
}

LogicalResult ParamsYieldOp::verify() {
  if (static_cast<bool>(getQueryScale()) != static_cast<bool>(getKeyScale()))
    return constraintError(*this, "C1")
           << "query_scale and key_scale transform a pair: give both or neither";
  if (getQueryScale() && getQueryScale().getType() != getKeyScale().getType())
    return constraintError(*this, "C2", getKeyScale())
           << "query_scale " << getQueryScale().getType() << " and key_scale "
           << getKeyScale().getType() << " must have the same type";
  auto component = llvm::cast<ComponentOp>((*this)->getParentOp());
  if ((*this)->getParentRegion() != &component.getParams())
    return constraintError(*this, "C3") << "must terminate the params region";
  return success();
}

LogicalResult FeatureYieldOp::verify() {
  if (getLogits().empty())
    return constraintError(*this, "C1") << "a component function yields at least one output";
  if (getLogits().size() != getCoeffs().size())
    return constraintError(*this, "C2") << getLogits().size() << " logit(s) but "
                                        << getCoeffs().size() << " coefficient(s)";
  auto component = llvm::cast<ComponentOp>((*this)->getParentOp());
  if ((*this)->getParentRegion() != &component.getFeatures())
    return constraintError(*this, "C3") << "must terminate the features region";
  return success();
}

//===----------------------------------------------------------------------===//
// spectra.feature_partials
//===----------------------------------------------------------------------===//

void FeaturePartialsOp::getAsmBlockArgumentNames(Region &region, OpAsmSetValueNameFn setName) {
  static const char *const names[] = {"wx", "xx", "ww"};
  for (auto [i, arg] : llvm::enumerate(region.front().getArguments()))
    setName(arg, i < 3 ? std::string(names[i]) : "p" + std::to_string(i - 3));
}

LogicalResult FeaturePartialsOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto component = symbols.lookupNearestSymbolFrom<ComponentOp>(*this, getComponentAttr());
  if (!component)
    return constraintError(*this, "C1") << "'" << getComponent()
                                        << "' does not name a spectra.component of this module";
  unsigned args = component.getFeatures().front().getNumArguments();
  Block &body = getBody().front();
  if (body.getNumArguments() != args)
    return constraintError(*this, "C2") << "body takes " << body.getNumArguments()
                                        << " argument(s) but the features region of '"
                                        << getComponent() << "' takes " << args;
  unsigned expected = 2 * component.getNumOutputs() * args;
  auto yield = llvm::dyn_cast<PartialsYieldOp>(body.getTerminator());
  if (!yield || yield.getValues().size() != expected)
    return constraintError(*this, "C3")
           << "body must yield 2 x " << component.getNumOutputs() << " output(s) x " << args
           << " argument(s) = " << expected << " partials, got "
           << (yield ? yield.getValues().size() : 0);
  return success();
}

LogicalResult FeaturePartialsOp::verifyRegions() {
  Block &body = getBody().front();
  if (!llvm::all_of(body.getArgumentTypes(), [](Type t) { return t.isF32(); }))
    return constraintError(*this, "C2") << "body arguments must all be f32";
  return success();
}
