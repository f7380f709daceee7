//===- Compiler.cpp - calling libspectra-compiler ------------------------===//

#include "runtime/Compiler.h"

#include "codegen/spectra_compiler.h"
#include "frontend/OptionText.h"

#include <memory>
#include <sstream>
#include <stdexcept>

namespace spectra {
namespace {
using CString = std::unique_ptr<char, void (*)(void *)>;

std::string take(char *text, char *error) {
  CString owned(text, spectra_free), message(error, spectra_free);
  if (!text)
    throw std::invalid_argument(error ? error : "libspectra-compiler failed without a message");
  return text;
}

Descriptor finish(char *text, char *error) { return Descriptor::fromJson(take(text, error)); }

} // namespace

std::string variantOptionsText(const VariantConfig &config) {
  return formatOptionList(config.options);
}

spectra_cpu_kernel *kernelOrThrow(spectra_cpu_kernel *kernel, char *error) {
  CString message(error, spectra_free);
  if (!kernel)
    throw std::invalid_argument(error ? error : "libspectra-compiler failed without a message");
  return kernel;
}

Descriptor describeVariant(const std::string &variant, const VariantConfig &config) {
  char *error = nullptr;
  char *text = spectra_describe_variant(variant.c_str(), config.m, config.d, config.seed,
                                        variantOptionsText(config).c_str(), &error);
  return finish(text, error);
}

std::string compileGpuVariant(const std::string &variant, const VariantConfig &config,
                              const std::string &target, const std::string &dtype, int64_t dv,
                              bool causal) {
  char *error = nullptr;
  char *text = spectra_gpu_compile_variant(variant.c_str(), config.m, config.d, config.seed,
                                           variantOptionsText(config).c_str(), target.c_str(),
                                           dtype.c_str(), dv, causal, &error);
  return take(text, error);
}

KernelWorkTable cpuKernelWork(const std::string &variant, const VariantConfig &config, bool causal) {
  char *error = nullptr;
  char *text = spectra_cpu_work_variant(variant.c_str(), config.m, config.d, config.seed,
                                        variantOptionsText(config).c_str(), 0, causal, &error);
  KernelWorkTable table;
  std::istringstream lines(take(text, error));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string kind, word;
    words >> kind;
    while (words >> word)
      if (auto eq = word.find('='); eq != std::string::npos)
        table[kind][word.substr(0, eq)] = std::stod(word.substr(eq + 1));
  }
  return table;
}

std::string compileGpuIR(const std::string &ir, const std::string &sourceName,
                         const std::string &featureMap, const std::string &target,
                         const std::string &dtype, int64_t dv, bool causal) {
  char *error = nullptr;
  char *text = spectra_gpu_compile_ir(ir.c_str(), sourceName.c_str(),
                                      featureMap.empty() ? nullptr : featureMap.c_str(),
                                      target.c_str(), dtype.c_str(), dv, causal, &error);
  return take(text, error);
}

Descriptor describeIR(const std::string &ir, const std::string &sourceName,
                      const std::string &featureMap) {
  char *error = nullptr;
  char *text = spectra_describe_ir(ir.c_str(), sourceName.c_str(),
                                   featureMap.empty() ? nullptr : featureMap.c_str(), &error);
  return finish(text, error);
}

std::string compilerVersion() { return spectra_compiler_version(); }

std::vector<std::string> variantNames() {
  std::vector<std::string> names;
  std::string text = spectra_variant_names();
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find(',', start), text.size());
    names.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

} // namespace spectra
