//===- Compiler.h - the runtime's view of libspectra-compiler ------------===//
//
// C++ wrappers over the C API (codegen/spectra_compiler.h): errors become
// exceptions with the compiler's message; nothing here includes MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_COMPILER_H
#define SPECTRA_RUNTIME_COMPILER_H

#include "runtime/Descriptor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

struct spectra_cpu_kernel;

namespace spectra {

/// Options of a named variant.
struct VariantConfig {
  int64_t m = 128;
  int64_t d = 32;
  int64_t seed = 0;
  std::map<std::string, double> options; ///< component options, e.g. {"a": -0.2}
};

/// The descriptor of `<component>-<weights>`; throws std::invalid_argument
/// with the compiler's message (e.g. the list of valid names).
Descriptor describeVariant(const std::string &variant, const VariantConfig &config = {});

/// The descriptor of a feature map declared in spectra IR text.
Descriptor describeIR(const std::string &ir, const std::string &sourceName = "<ir>",
                      const std::string &featureMap = "");

/// The GPU kernels' artifact (JSON with PTX) of a variant / of IR, for target
/// "sm_80" or "sm_90a" and q/k/v dtype "f32", "bf16" or "f16"; throws
/// std::invalid_argument with the compiler's message.
std::string compileGpuVariant(const std::string &variant, const VariantConfig &config,
                              const std::string &target, const std::string &dtype, int64_t dv,
                              bool causal = false);
std::string compileGpuIR(const std::string &ir, const std::string &sourceName,
                         const std::string &featureMap, const std::string &target,
                         const std::string &dtype, int64_t dv, bool causal = false);

/// Each CPU kernel's vector work per row tile and its FMA-port bound, by kind then field
/// ("fma", "exp", "exp_ops", "other", "bound", "if_fma", ...: spectra_cpu_work_variant,
/// codegen/KernelWork.h); throws std::invalid_argument.
using KernelWorkTable = std::map<std::string, std::map<std::string, double>>;
KernelWorkTable cpuKernelWork(const std::string &variant, const VariantConfig &config, bool causal);

/// The compiler build id (part of every cache key).
std::string compilerVersion();
/// Every named variant, the paper's 18 first (spectra_variant_names).
std::vector<std::string> variantNames();

/// A variant's component options as the C API takes them: "key=value,..." (17 digits).
std::string variantOptionsText(const VariantConfig &config);

/// `kernel`, or (when it is null) throws std::invalid_argument with the compiler's `error`
/// (freed either way).
spectra_cpu_kernel *kernelOrThrow(spectra_cpu_kernel *kernel, char *error);

} // namespace spectra

#endif // SPECTRA_RUNTIME_COMPILER_H
