//===- AttentionOps.cpp - verifiers of feature maps and attention --------===//

#include "dialect/SpectraDialect.h"
#include "dialect/BuiltinLibrary.h"
#include "dialect/NearestName.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::spectra;

//===----------------------------------------------------------------------===//
// spectra.feature_map
//===----------------------------------------------------------------------===//

LogicalResult FeatureMapOp::verify() {
  int64_t m = getMAttr().getInt(), d = getDAttr().getInt(), seed = getSeedAttr().getInt();
  if (m < 1 || d < 1 || seed < 0)
    return constraintError(*this, "C3") << "needs m >= 1, d >= 1 and seed >= 0, got m = " << m
                                        << ", d = " << d << ", seed = " << seed;
  return success();
}

/// " (did you mean '@name'?)" for the recipe or component of `kind` nearest to `word`, among
/// the module's own and the built-in library's; "" when none is close.
template <typename OpT>
static std::string didYouMean(Operation *from, StringRef word, BuiltinSymbol::Kind kind) {
  std::vector<std::string> known;
  for (const auto &entry : getBuiltinSymbols())
    if (entry.second.kind == kind)
      known.push_back(entry.first().str());
  if (auto module = from->getParentOfType<ModuleOp>())
    for (auto op : module.getOps<OpT>())
      known.push_back(op.getSymName().str());
  std::string near = nearestName(word, known);
  return near.empty() ? "" : " (did you mean '@" + near + "'?)";
}

/// Symbols resolve in the module first, then in the built-in library (which
/// spectra-link-library copies in later), so user IR may name built-ins.
LogicalResult FeatureMapOp::verifySymbolUses(SymbolTableCollection &symbols) {
  const llvm::StringMap<BuiltinSymbol> &builtins = getBuiltinSymbols();
  auto builtinOfKind = [&](StringRef name, BuiltinSymbol::Kind kind) -> const BuiltinSymbol * {
    auto it = builtins.find(name);
    return it != builtins.end() && it->second.kind == kind ? &it->second : nullptr;
  };

  Operation *recipe = symbols.lookupNearestSymbolFrom(*this, getWeightsAttr());
  const BuiltinSymbol *builtinRecipe =
      recipe ? nullptr : builtinOfKind(getWeights(), BuiltinSymbol::Kind::Recipe);
  if (recipe ? !llvm::isa<WeightRecipeOp>(recipe) : !builtinRecipe)
    return constraintError(*this, "C1")
           << "weights '" << getWeights()
           << "' does not name a spectra.weight_recipe (in this module or the built-in library)"
           << didYouMean<WeightRecipeOp>(*this, getWeights(), BuiltinSymbol::Kind::Recipe);
  SmallVector<std::string> recipeOptions;
  if (builtinRecipe)
    recipeOptions.assign(builtinRecipe->options.begin(), builtinRecipe->options.end());
  else
    for (StringRef name : llvm::cast<WeightRecipeOp>(recipe).getOptionNames())
      recipeOptions.push_back(name.str());

  SmallVector<std::string> declared;
  Operation *component = symbols.lookupNearestSymbolFrom(*this, getComponentAttr());
  if (auto local = llvm::dyn_cast_or_null<ComponentOp>(component)) {
    for (StringRef name : local.getOptionNames())
      declared.push_back(name.str());
  } else if (const BuiltinSymbol *builtin =
                 component ? nullptr : builtinOfKind(getComponent(), BuiltinSymbol::Kind::Component)) {
    declared.assign(builtin->options.begin(), builtin->options.end());
  } else {
    return constraintError(*this, "C2")
           << "component '" << getComponent()
           << "' does not name a spectra.component (in this module or the built-in library)"
           << didYouMean<ComponentOp>(*this, getComponent(), BuiltinSymbol::Kind::Component);
  }

  if (std::optional<DictionaryAttr> options = getOptions()) {
    for (NamedAttribute option : *options) {
      StringRef key = option.getName().getValue();
      if (llvm::is_contained(recipeOptions, key)) {
        auto count = llvm::dyn_cast<IntegerAttr>(option.getValue());
        if (!count || count.getType().isInteger(1) || count.getValue().getSExtValue() < 1)
          return constraintError(*this, "C5") << "weight recipe option \"" << key
                                              << "\" must be an integer >= 1, got "
                                              << option.getValue();
        continue;
      }
      if (!llvm::is_contained(declared, key)) {
        auto diag = constraintError(*this, "C4")
                    << "neither component '" << getComponent() << "' nor weights '"
                    << getWeights() << "' has an option \"" << key << "\"";
        SmallVector<std::string> all(declared.begin(), declared.end());
        all.append(recipeOptions.begin(), recipeOptions.end());
        if (all.empty())
          diag << " (they declare none)";
        else
          diag << " (declared: " << llvm::join(all, ", ") << ")";
        return diag;
      }
      if (!llvm::isa<FloatAttr>(option.getValue()))
        return constraintError(*this, "C4") << "option \"" << option.getName().getValue()
                                            << "\" must be a float, got " << option.getValue();
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// spectra.attention
//===----------------------------------------------------------------------===//


LogicalResult AttentionOp::verify() {
  auto q = llvm::cast<RankedTensorType>(getQuery().getType());
  auto k = llvm::cast<RankedTensorType>(getKey().getType());
  auto v = llvm::cast<RankedTensorType>(getValue().getType());
  auto out = llvm::cast<RankedTensorType>(getResult().getType());
  for (auto [name, value, type] :
       {std::tuple<StringRef, Value, RankedTensorType>{"key", getKey(), k},
        {"value", getValue(), v}})
    if (type.getElementType() != q.getElementType())
      return constraintError(*this, "C2", value)
             << name << " element type " << type.getElementType()
             << " differs from the query's " << q.getElementType();
  if (out.getElementType() != q.getElementType())
    return constraintError(*this, "C2") << "result element type " << out.getElementType()
                                        << " differs from the query's " << q.getElementType();

  // Two dims conflict only when both are static.
  auto conflict = [](int64_t a, int64_t b) {
    return !ShapedType::isDynamic(a) && !ShapedType::isDynamic(b) && a != b;
  };
  for (unsigned dim : {0u, 1u}) {
    StringRef what = dim == 0 ? "batch" : "head";
    for (auto [name, value, type] :
         {std::tuple<StringRef, Value, RankedTensorType>{"key", getKey(), k},
          {"value", getValue(), v}})
      if (conflict(q.getDimSize(dim), type.getDimSize(dim)))
        return constraintError(*this, "C3", value)
               << what << " size of " << name << " (" << type.getDimSize(dim)
               << ") differs from the query's (" << q.getDimSize(dim) << ")";
  }
  if (conflict(k.getDimSize(2), v.getDimSize(2)))
    return constraintError(*this, "C4", getValue())
           << "value sequence length " << v.getDimSize(2) << " differs from the key's "
           << k.getDimSize(2);
  if (conflict(q.getDimSize(3), k.getDimSize(3)))
    return constraintError(*this, "C4", getKey())
           << "key head dimension " << k.getDimSize(3) << " differs from the query's "
           << q.getDimSize(3);
  if (Value mask = getMask()) {
    auto m = llvm::cast<RankedTensorType>(mask.getType());
    if (conflict(m.getDimSize(0), q.getDimSize(0)) || conflict(m.getDimSize(1), k.getDimSize(2)))
      return constraintError(*this, "C6", mask)
             << "mask must be [batch, key length] = [" << q.getDimSize(0) << ", "
             << k.getDimSize(2) << "], got " << m;
  }
  if (Value mask = getQueryMask()) {
    auto m = llvm::cast<RankedTensorType>(mask.getType());
    if (conflict(m.getDimSize(0), q.getDimSize(0)) || conflict(m.getDimSize(1), q.getDimSize(2)))
      return constraintError(*this, "C9", mask)
             << "query mask must be [batch, query length] = [" << q.getDimSize(0) << ", "
             << q.getDimSize(2) << "], got " << m;
  }
  SmallVector<int64_t> expected = {q.getDimSize(0), q.getDimSize(1), q.getDimSize(2),
                                   v.getDimSize(3)};
  for (unsigned i = 0; i < 4; ++i)
    if (conflict(out.getDimSize(i), expected[i]))
      return constraintError(*this, "C7")
             << "result must be [B, H, Nq, Dv] = " << RankedTensorType::get(expected, q.getElementType())
             << ", got " << out;
  if (getCausal() && conflict(q.getDimSize(2), k.getDimSize(2)))
    return constraintError(*this, "C10")
           << "causal attention needs as many queries as keys, got " << q.getDimSize(2) << " and "
           << k.getDimSize(2);
  if (FloatAttr scale = getScaleAttr(); scale && !(scale.getValueAsDouble() > 0.0))
    return constraintError(*this, "C8") << "scale must be positive, got " << scale.getValueAsDouble();
  return success();
}

LogicalResult AttentionOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto featureMap = symbols.lookupNearestSymbolFrom<FeatureMapOp>(*this, getFeatureMapAttr());
  if (!featureMap)
    return constraintError(*this, "C1") << "'" << getFeatureMap()
                                        << "' does not name a spectra.feature_map";
  auto q = llvm::cast<RankedTensorType>(getQuery().getType());
  int64_t d = featureMap.getDAttr().getInt();
  if (!q.isDynamicDim(3) && q.getDimSize(3) != d)
    return constraintError(*this, "C5", getQuery())
           << "head dimension " << q.getDimSize(3) << " differs from feature map '"
           << getFeatureMap() << "' d = " << d;
  if (getCausal())
    if (auto component =
            symbols.lookupNearestSymbolFrom<ComponentOp>(featureMap, featureMap.getComponentAttr())) {
      StatisticOp statistic;
      component->walk([&](StatisticOp op) {
        if (!statistic)
          statistic = op;
      });
      if (statistic)
        return constraintError(*this, "C11")
               << "causal attention with component '" << component.getSymName()
               << "', whose parameters read data statistics over the whole sequence (a token "
                  "would see later tokens); use a component with fixed parameters (posrf; gerf "
                  "with the option a=VALUE for OPRF's family with A fixed)";
    }
  return success();
}
