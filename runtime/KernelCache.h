//===- KernelCache.h - compiled kernels in memory and on disk -------------===//
//
// The JIT's cache, as Triton keeps one: a kernel is looked up in memory
// (per process), then on disk under $SPECTRA_CACHE_DIR (default
// $XDG_CACHE_HOME/spectra or ~/.cache/spectra), and compiled through
// libspectra-compiler only on a miss. Keys are sha256 over the compiler build
// id, the canonical feature-map text (the descriptor's component program and
// options), the target and the options. An entry holds every stage
// (tiles/vectors/llvm IR and the object for the CPU; the artifact with its PTX for
// GPUs) in checksummed sections; writes go to a temporary file renamed into
// place, so concurrent compilers of one kernel both succeed and a reader never
// sees half an entry. A truncated or corrupt entry is reported and rebuilt.
// An unusable cache directory falls back to memory with one warning.
// SPECTRA_DUMP_DIR, when set, receives every stage of every kernel compiled.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_KERNELCACHE_H
#define SPECTRA_RUNTIME_KERNELCACHE_H

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

struct spectra_cpu_kernel;

namespace spectra {

/// Counters of where kernels came from (process-wide).
struct CacheStats {
  int64_t compiles = 0;        ///< compiler invocations (misses)
  int64_t memoryHits = 0;
  int64_t diskHits = 0;
  int64_t corruptEntries = 0;  ///< disk entries found damaged and rebuilt
  int64_t diskWrites = 0;
};

/// The sections of one cache entry, by name.
using CacheEntry = std::map<std::string, std::string>;

/// Serialises an entry (magic line, then per section its name, size and
/// sha256, then the bytes, then an end line).
std::string encodeCacheEntry(const CacheEntry &entry);
/// Parses an entry; false when it is truncated, corrupt or of another version.
bool decodeCacheEntry(const std::string &bytes, CacheEntry &entry, std::string &why);

class KernelCache {
public:
  static KernelCache &instance();

  /// sha256 of the key material (each part length-prefixed, so parts cannot run together).
  static std::string key(const std::string &compilerId, const std::string &canonical,
                         const std::string &target, const std::string &options);

  /// The CPU kernels of feature map `name` for `canonical` with `options` (m, d, dv),
  /// compiled for this host; `compile` runs on a miss and must return a kernel or throw.
  /// The kernel stays alive as long as any holder (and the cache) keeps it.
  std::shared_ptr<spectra_cpu_kernel> cpu(const std::string &canonical, const std::string &name,
                                          const std::string &options,
                                          const std::function<spectra_cpu_kernel *()> &compile);

  /// The GPU artifact (JSON with PTX) for `canonical` on `target` with `options`.
  std::string gpu(const std::string &canonical, const std::string &name, const std::string &target,
                  const std::string &options, const std::function<std::string()> &compile);

  CacheStats stats() const;
  void resetStats();
  /// Forgets the in-memory kernels (the disk cache stays): the next lookup goes to disk.
  void clearMemory();
  /// The disk cache directory in use now, or "" when disk caching is off or unusable.
  std::string directory();

private:
  KernelCache() = default;
  bool readEntry(const std::string &path, CacheEntry &entry);
  void writeEntry(const std::string &path, const CacheEntry &entry);
  void dump(const std::string &name, const std::string &key, const CacheEntry &entry);

  mutable std::mutex mutex;
  CacheStats counters;
  std::map<std::string, std::shared_ptr<spectra_cpu_kernel>> cpuKernels;
  std::map<std::string, std::string> gpuArtifacts;
  std::string warnedDirectory;
};

} // namespace spectra

#endif // SPECTRA_RUNTIME_KERNELCACHE_H
