//===- ExportFeatureMap.cpp - feature map to a JSON descriptor -----------===//

#include "codegen/ExportFeatureMap.h"
#include "codegen/TileKernels.h"

#include "dialect/BuiltinLibrary.h"
#include "dialect/SpectraDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace mlir::spectra;
namespace json = llvm::json;

namespace {

/// Numbers the values of one program (block arguments and op results,
/// nested regions included) and writes its ops.
class ProgramWriter {
public:
  int64_t number(Value v) {
    auto [it, inserted] = ids.try_emplace(v, static_cast<int64_t>(ids.size()));
    return it->second;
  }

  /// Ops of `block` except its terminator, whose operands are returned.
  llvm::Expected<json::Array> writeBlock(Block &block, SmallVectorImpl<Value> &terminatorOperands) {
    json::Array ops;
    for (Operation &op : block) {
      if (&op == &block.back() && op.hasTrait<OpTrait::IsTerminator>()) {
        terminatorOperands.assign(op.operand_begin(), op.operand_end());
        break;
      }
      llvm::Expected<json::Object> written = writeOp(op);
      if (!written)
        return written.takeError();
      ops.push_back(std::move(*written));
    }
    return ops;
  }

  json::Array numbers(ValueRange values) {
    json::Array out;
    for (Value v : values)
      out.push_back(number(v));
    return out;
  }

private:
  llvm::Expected<json::Object> writeOp(Operation &op) {
    json::Object out;
    out["op"] = op.getName().getStringRef().str();
    out["operands"] = numbers(op.getOperands());
    out["results"] = numbers(op.getResults());
    json::Array types;
    for (Type t : op.getResultTypes()) {
      std::string s;
      llvm::raw_string_ostream os(s);
      os << t;
      types.push_back(s);
    }
    out["types"] = std::move(types);
    json::Object attrs;
    if (auto ld = llvm::dyn_cast<LowDiscrepancyOp>(op))
      attrs["sequence"] = stringifySequence(ld.getSequence()).str();
    if (auto cmp = llvm::dyn_cast<arith::CmpFOp>(op))
      attrs["predicate"] = arith::stringifyCmpFPredicate(cmp.getPredicate()).str();
    if (auto stat = llvm::dyn_cast<StatisticOp>(op)) {
      attrs["kind"] = stringifyStatisticKind(stat.getKind()).str();
      attrs["side"] = stringifySide(stat.getSide()).str();
    }
    for (NamedAttribute attr : op.getAttrs()) {
      StringRef name = attr.getName().getValue();
      if (attrs.find(name) != attrs.end())
        continue;
      Attribute value = attr.getValue();
      if (llvm::isa<UnitAttr>(value))
        attrs[name] = true;
      else if (auto b = llvm::dyn_cast<BoolAttr>(value))
        attrs[name] = b.getValue();
      else if (auto i = llvm::dyn_cast<IntegerAttr>(value))
        attrs[name] = i.getValue().getSExtValue();
      else if (auto f = llvm::dyn_cast<FloatAttr>(value))
        attrs[name] = f.getValueAsDouble();
      else if (auto s = llvm::dyn_cast<StringAttr>(value))
        attrs[name] = s.getValue().str();
      // Other attributes (fastmath flags, ...) do not change the math.
    }
    out["attrs"] = std::move(attrs);
    if (op.getNumRegions() > 0) {
      json::Array regions;
      for (Region &region : op.getRegions()) {
        if (region.empty())
          continue;
        SmallVector<Value> yielded;
        json::Object r;
        r["args"] = numbers(region.front().getArguments());
        llvm::Expected<json::Array> body = writeBlock(region.front(), yielded);
        if (!body)
          return body.takeError();
        r["ops"] = std::move(*body);
        r["yield"] = numbers(yielded);
        regions.push_back(std::move(r));
      }
      out["regions"] = std::move(regions);
    }
    return out;
  }

  llvm::DenseMap<Value, int64_t> ids;
};

llvm::Error exportError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

} // namespace

llvm::Expected<std::string> mlir::spectra::exportFeatureMap(ModuleOp module,
                                                            StringRef featureMapName) {
  FeatureMapOp featureMap;
  for (FeatureMapOp fm : module.getOps<FeatureMapOp>()) {
    if (!featureMapName.empty() && fm.getSymName() != featureMapName)
      continue;
    if (featureMap)
      return exportError("the module defines several feature maps (" + featureMap.getSymName() +
                     ", " + fm.getSymName() + "); name the one to export");
    featureMap = fm;
  }
  if (!featureMap)
    return exportError(featureMapName.empty()
                       ? llvm::Twine("the module defines no spectra.feature_map")
                       : "no spectra.feature_map named '" + featureMapName + "'");
  if (failed(linkBuiltinLibrary(module)))
    return exportError("could not link the built-in library for '" + featureMap.getSymName() + "'");
  auto recipe = SymbolTable::lookupNearestSymbolFrom<WeightRecipeOp>(featureMap,
                                                                    featureMap.getWeightsAttr());
  auto component = SymbolTable::lookupNearestSymbolFrom<ComponentOp>(featureMap,
                                                                     featureMap.getComponentAttr());
  if (!recipe || !component)
    return exportError("feature map '" + featureMap.getSymName() +
                   "' does not resolve its recipe and component");

  json::Object root;
  root["version"] = kDescriptorVersion;
  root["name"] = featureMap.getSymName().str();
  root["m"] = featureMap.getMAttr().getInt();
  root["d"] = featureMap.getDAttr().getInt();
  root["seed"] = featureMap.getSeedAttr().getInt();
  json::Object options;
  if (std::optional<DictionaryAttr> dict = featureMap.getOptions()) {
    for (NamedAttribute option : *dict) {
      if (auto f = llvm::dyn_cast<FloatAttr>(option.getValue()))
        options[option.getName().getValue()] = f.getValueAsDouble();
      else if (auto i = llvm::dyn_cast<IntegerAttr>(option.getValue()))
        options[option.getName().getValue()] = i.getValue().getSExtValue(); // recipe options
    }
  }
  root["options"] = std::move(options);

  {
    ProgramWriter writer;
    json::Object r;
    r["name"] = recipe.getSymName().str();
    r["args"] = writer.numbers(recipe.getBody().front().getArguments());
    SmallVector<Value> yielded;
    llvm::Expected<json::Array> ops = writer.writeBlock(recipe.getBody().front(), yielded);
    if (!ops)
      return ops.takeError();
    r["ops"] = std::move(*ops);
    r["yield"] = writer.numbers(yielded);
    root["row_weights"] = yielded.size() == 2;
    root["recipe"] = std::move(r);
    // W's rows as antipodal blocks (a zero row, P, then -P): the CPU kernels contract P only,
    // so kernels compiled for this map are not another map's with the same component.
    if (int64_t pairs = antipodalPairs(featureMap))
      root["antipodal_pairs"] = pairs;
  }
  {
    json::Object c;
    c["name"] = component.getSymName().str();
    c["outputs"] = static_cast<int64_t>(component.getNumOutputs());
    json::Object defaults;
    for (OptionOp option : component.getParams().front().getOps<OptionOp>())
      defaults[option.getName()] = option.getDefaultValue().convertToDouble();
    c["option_defaults"] = std::move(defaults);

    ProgramWriter params;
    json::Object p;
    p["args"] = params.numbers(component.getParams().front().getArguments());
    SmallVector<Value> ignored;
    llvm::Expected<json::Array> paramOps = params.writeBlock(component.getParams().front(), ignored);
    if (!paramOps)
      return paramOps.takeError();
    p["ops"] = std::move(*paramOps);
    ParamsYieldOp py = component.getParamsYield();
    assert(py && "a verified component ends its params region in spectra.params_yield (C2)");
    p["scalars"] = params.numbers(py.getScalars());
    p["query_scale"] = py.getQueryScale() ? json::Value(params.number(py.getQueryScale())) : nullptr;
    p["key_scale"] = py.getKeyScale() ? json::Value(params.number(py.getKeyScale())) : nullptr;
    c["params"] = std::move(p);

    ProgramWriter features;
    json::Object f;
    f["args"] = features.numbers(component.getFeatures().front().getArguments());
    llvm::Expected<json::Array> featureOps =
        features.writeBlock(component.getFeatures().front(), ignored);
    if (!featureOps)
      return featureOps.takeError();
    f["ops"] = std::move(*featureOps);
    auto fy = llvm::cast<FeatureYieldOp>(component.getFeatures().front().getTerminator());
    f["logits"] = features.numbers(fy.getLogits());
    f["coeffs"] = features.numbers(fy.getCoeffs());
    c["features"] = std::move(f);

    // The derivatives the backward needs, derived from the features region.
    FeaturePartialsOp partials =
        SymbolTable::lookupNearestSymbolFrom<FeaturePartialsOp>(
            featureMap, StringAttr::get(module.getContext(), component.getSymName() + "_partials"));
    std::string partialsError;
    if (!partials) {
      // A feature that cannot be differentiated still runs forward; the
      // descriptor says why its backward is unavailable.
      ScopedDiagnosticHandler capture(module.getContext(), [&](Diagnostic &diag) {
        llvm::raw_string_ostream os(partialsError);
        os << diag;
        return success();
      });
      FailureOr<FeaturePartialsOp> derived = derivePartials(component);
      if (succeeded(derived))
        partials = *derived;
    }
    if (partials) {
      ProgramWriter partialWriter;
      json::Object d;
      d["args"] = partialWriter.numbers(partials.getBody().front().getArguments());
      llvm::Expected<json::Array> partialOps =
          partialWriter.writeBlock(partials.getBody().front(), ignored);
      if (!partialOps)
        return partialOps.takeError();
      d["ops"] = std::move(*partialOps);
      d["yield"] = partialWriter.numbers(ignored);
      c["partials"] = std::move(d);
    } else {
      c["partials_error"] = partialsError;
    }
    root["component"] = std::move(c);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << json::Value(std::move(root));
  return text;
}
