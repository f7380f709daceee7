//===- CpuAmx.h - the CPU kernels' AMX contractions in a test ---------------===//

#ifndef SPECTRA_TEST_UNIT_CPUAMX_H
#define SPECTRA_TEST_UNIT_CPUAMX_H

#include "codegen/spectra_compiler.h"

#include <cstdlib>
#include <string>

namespace spectra::test {

/// Asks for the CPU kernels' contractions on AMX tiles (SPECTRA_CPU_AMX=1) while in scope:
/// the kernels compiled meanwhile use them where the host has AMX (the cache key follows).
/// The variable's earlier value comes back after.
class ScopedCpuAmx {
public:
  ScopedCpuAmx() {
    if (const char *value = std::getenv("SPECTRA_CPU_AMX"))
      saved_ = value, had_ = true;
    setenv("SPECTRA_CPU_AMX", "1", 1);
  }
  ~ScopedCpuAmx() { had_ ? setenv("SPECTRA_CPU_AMX", saved_.c_str(), 1) : unsetenv("SPECTRA_CPU_AMX"); }
  ScopedCpuAmx(const ScopedCpuAmx &) = delete;
  ScopedCpuAmx &operator=(const ScopedCpuAmx &) = delete;

  /// Whether the kernels compiled now run their contractions on AMX tiles, and if not, why.
  static bool on(std::string &why) {
    if (spectra_cpu_amx())
      return true;
    why = "this host (" + std::string(spectra_cpu_host_target()) + ") has no AMX bf16 tile products (amx-tile, amx-bf16), or " +
          "Linux did not grant the process their state: the AMX kernels are checked as IR and " +
          "assembly only (cpu-amx.test, spectra-vectorize-tiles-amx.mlir)";
    return false;
  }

private:
  std::string saved_;
  bool had_ = false;
};

} // namespace spectra::test

#endif // SPECTRA_TEST_UNIT_CPUAMX_H
