//===- Descriptor.cpp - parsing the JSON feature-map descriptor ----------===//

#include "runtime/Descriptor.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

using json = nlohmann::json;

namespace spectra {
namespace {

[[noreturn]] void bad(const std::string &where, const std::string &what) {
  throw std::invalid_argument("feature-map descriptor: " + where + ": " + what);
}

const json &field(const json &object, const char *key, const std::string &where) {
  if (!object.is_object() || !object.contains(key))
    bad(where, std::string("missing field '") + key + "'");
  return object.at(key);
}

std::vector<int64_t> ids(const json &value, const std::string &where) {
  if (!value.is_array())
    bad(where, "expected an array of value numbers");
  std::vector<int64_t> out;
  for (const json &v : value) {
    if (!v.is_number_integer())
      bad(where, "expected an integer value number, got " + v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

Program program(const json &value, const std::string &where);

ProgramOp op(const json &value, const std::string &where) {
  ProgramOp out;
  out.name = field(value, "op", where).get<std::string>();
  std::string here = where + " op '" + out.name + "'";
  out.operands = ids(field(value, "operands", here), here + " operands");
  out.results = ids(field(value, "results", here), here + " results");
  if (value.contains("types"))
    for (const json &t : value.at("types"))
      out.types.push_back(t.get<std::string>());
  if (value.contains("attrs"))
    for (auto it = value.at("attrs").begin(); it != value.at("attrs").end(); ++it) {
      if (it->is_boolean())
        out.numbers[it.key()] = it->get<bool>() ? 1.0 : 0.0;
      else if (it->is_number())
        out.numbers[it.key()] = it->get<double>();
      else if (it->is_string())
        out.strings[it.key()] = it->get<std::string>();
    }
  if (value.contains("regions"))
    for (const json &r : value.at("regions"))
      out.regions.push_back(program(r, here + " region"));
  return out;
}

Program program(const json &value, const std::string &where) {
  Program out;
  out.args = ids(field(value, "args", where), where + " args");
  for (const json &o : field(value, "ops", where))
    out.ops.push_back(op(o, where));
  if (value.contains("yield"))
    out.yields = ids(value.at("yield"), where + " yield");
  return out;
}

std::optional<int64_t> optionalId(const json &value) {
  if (value.is_null())
    return std::nullopt;
  return value.get<int64_t>();
}

} // namespace

double Descriptor::option(const std::string &key) const {
  auto it = options.find(key);
  if (it != options.end())
    return it->second;
  auto def = component.optionDefaults.find(key);
  if (def != component.optionDefaults.end())
    return def->second;
  throw std::invalid_argument("feature map '" + name + "' has no option '" + key + "'");
}

Descriptor Descriptor::fromJson(const std::string &text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error &e) {
    bad("text", std::string("not valid JSON (") + e.what() + ")");
  }
  try {
    Descriptor d;
    d.version = field(root, "version", "root").get<int>();
    if (d.version != kSupportedDescriptorVersion)
      bad("root", "version " + std::to_string(d.version) + " is not the supported version " +
                      std::to_string(kSupportedDescriptorVersion) +
                      " (runtime and compiler library do not match)");
    d.name = field(root, "name", "root").get<std::string>();
    d.m = field(root, "m", "root").get<int64_t>();
    d.d = field(root, "d", "root").get<int64_t>();
    d.seed = field(root, "seed", "root").get<int64_t>();
    if (d.m < 1 || d.d < 1)
      bad("root", "m and d must be positive");
    if (root.contains("options"))
      for (auto it = root.at("options").begin(); it != root.at("options").end(); ++it)
        d.options[it.key()] = it->get<double>();
    d.rowWeights = root.value("row_weights", false);
    d.antipodalPairs = root.value("antipodal_pairs", int64_t(0));
    const json &recipe = field(root, "recipe", "root");
    d.recipeName = field(recipe, "name", "recipe").get<std::string>();
    d.recipe = program(recipe, "recipe '" + d.recipeName + "'");
    if (d.recipe.args.size() != 2 || d.recipe.yields.empty() || d.recipe.yields.size() > 2)
      bad("recipe", "expects arguments (m, d) and yields W [, row weights]");

    const json &component = field(root, "component", "root");
    ComponentDescriptor &c = d.component;
    c.canonical = component.dump();
    c.name = field(component, "name", "component").get<std::string>();
    std::string where = "component '" + c.name + "'";
    c.outputs = field(component, "outputs", where).get<int64_t>();
    if (component.contains("option_defaults"))
      for (auto it = component.at("option_defaults").begin();
           it != component.at("option_defaults").end(); ++it)
        c.optionDefaults[it.key()] = it->get<double>();
    const json &params = field(component, "params", where);
    c.params = program(params, where + " params");
    c.scalars = ids(field(params, "scalars", where + " params"), where + " params scalars");
    c.queryScale = optionalId(params.value("query_scale", json()));
    c.keyScale = optionalId(params.value("key_scale", json()));
    const json &features = field(component, "features", where);
    c.features = program(features, where + " features");
    c.logits = ids(field(features, "logits", where + " features"), where + " logits");
    c.coeffs = ids(field(features, "coeffs", where + " features"), where + " coeffs");
    if (c.logits.empty() || c.logits.size() != c.coeffs.size() ||
        static_cast<int64_t>(c.logits.size()) != c.outputs)
      bad(where, "features must yield one (logit, coeff) pair per output");
    c.partialsError = component.value("partials_error", std::string());
    if (component.contains("partials")) {
      c.partials = program(component.at("partials"), where + " partials");
      if (c.partials->yields.size() != 2 * c.logits.size() * c.features.args.size())
        bad(where, "partials must yield 2 x outputs x arguments values");
    }
    if (c.features.args.size() != 3 + c.scalars.size())
      bad(where, "features arguments must be (wx, xx, ww) and the scalar parameters");
    return d;
  } catch (const json::exception &e) {
    bad("structure", e.what());
  }
}

} // namespace spectra
