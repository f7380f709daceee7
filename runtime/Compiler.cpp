//===- Compiler.cpp - calling libspectra-compiler ------------------------===//

#include "runtime/Compiler.h"

#include "codegen/spectra_compiler.h"

#include <memory>
#include <sstream>
#include <stdexcept>

namespace spectra {
namespace {
using CString = std::unique_ptr<char, void (*)(void *)>;

Descriptor finish(char *text, char *error) {
  CString owned(text, spectra_free), message(error, spectra_free);
  if (!text)
    throw std::invalid_argument(error ? error : "libspectra-compiler failed without a message");
  return Descriptor::fromJson(text);
}
} // namespace

Descriptor describeVariant(const std::string &variant, const VariantConfig &config) {
  std::ostringstream options;
  options.precision(17);
  for (const auto &[key, value] : config.options)
    options << (options.tellp() > 0 ? "," : "") << key << "=" << value;
  char *error = nullptr;
  char *text = spectra_describe_variant(variant.c_str(), config.m, config.d, config.seed,
                                        options.str().c_str(), &error);
  return finish(text, error);
}

Descriptor describeIR(const std::string &ir, const std::string &sourceName,
                      const std::string &featureMap) {
  char *error = nullptr;
  char *text = spectra_describe_ir(ir.c_str(), sourceName.c_str(),
                                   featureMap.empty() ? nullptr : featureMap.c_str(), &error);
  return finish(text, error);
}

std::string compilerVersion() { return spectra_compiler_version(); }

} // namespace spectra
