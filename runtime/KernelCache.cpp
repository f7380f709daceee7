//===- KernelCache.cpp - compiled kernels in memory and on disk -----------===//

#include "runtime/KernelCache.h"
#include "runtime/Paths.h"

#include "codegen/spectra_compiler.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace spectra {
namespace {

constexpr const char *kMagic = "spectra-kernel-cache 1\n";

std::string sha256(const std::string &bytes) {
  char *hex = spectra_sha256_hex(bytes.data(), bytes.size());
  std::string out = hex ? hex : "";
  spectra_free(hex);
  return out;
}

/// mkdir -p; false when the directory cannot be made or is not writable.
bool makeWritableDirectory(const std::string &path) {
  return spectra::makeDirectories(path) && access(path.c_str(), W_OK | X_OK) == 0;
}

std::string readFile(const std::string &path, bool &ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string cacheDirectoryFromEnvironment() {
  if (const char *dir = std::getenv("SPECTRA_CACHE_DIR"))
    return dir;
  if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/spectra";
  if (const char *home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/spectra";
  return "";
}

/// A kernel name safe for file names.
std::string fileSafe(const std::string &name) {
  std::string out;
  for (char c : name)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  return out.empty() ? "kernel" : out;
}

} // namespace

std::string encodeCacheEntry(const CacheEntry &entry) {
  std::string out = kMagic;
  for (const auto &[name, bytes] : entry) {
    out += "section " + name + " " + std::to_string(bytes.size()) + " " + sha256(bytes) + "\n";
    out += bytes;
    out += "\n";
  }
  out += "end\n";
  return out;
}

bool decodeCacheEntry(const std::string &bytes, CacheEntry &entry, std::string &why) {
  entry.clear();
  size_t at = std::strlen(kMagic);
  if (bytes.compare(0, at, kMagic) != 0) {
    why = "not a spectra cache entry of this version";
    return false;
  }
  while (true) {
    size_t eol = bytes.find('\n', at);
    if (eol == std::string::npos) {
      why = "truncated (no end marker)";
      return false;
    }
    std::string header = bytes.substr(at, eol - at);
    at = eol + 1;
    if (header == "end")
      return at == bytes.size() || (why = "trailing bytes after the end marker", false);
    std::istringstream fields(header);
    std::string word, name, digest;
    size_t size = 0;
    if (!(fields >> word >> name >> size >> digest) || word != "section") {
      why = "malformed section header '" + header.substr(0, 80) + "'";
      return false;
    }
    if (at + size + 1 > bytes.size()) {
      why = "truncated in section '" + name + "'";
      return false;
    }
    std::string payload = bytes.substr(at, size);
    if (sha256(payload) != digest) {
      why = "checksum mismatch in section '" + name + "'";
      return false;
    }
    entry[name] = std::move(payload);
    at += size + 1;
  }
}

KernelCache &KernelCache::instance() {
  // Never destroyed: an ExecutionEngine torn down during static destruction
  // runs its deinitialisers through LLVM objects that may already be gone
  // (valgrind showed the use after free). The OS reclaims the kernels at exit.
  static KernelCache *cache = new KernelCache();
  return *cache;
}

std::string KernelCache::key(const std::string &compilerId, const std::string &canonical,
                             const std::string &target, const std::string &options) {
  std::string material;
  for (const std::string *part : {&compilerId, &canonical, &target, &options})
    material += std::to_string(part->size()) + ":" + *part + ";";
  return sha256(material);
}

std::string KernelCache::directory() {
  std::string dir = cacheDirectoryFromEnvironment();
  if (dir.empty())
    return "";
  if (!makeWritableDirectory(dir)) {
    if (warnedDirectory != dir) {
      warnedDirectory = dir;
      TORCH_WARN("spectra: the kernel cache directory '", dir,
                 "' cannot be created or written (", std::strerror(errno),
                 "); kernels are cached in memory only. Set SPECTRA_CACHE_DIR to a writable "
                 "directory.");
    }
    return "";
  }
  return dir;
}

bool KernelCache::readEntry(const std::string &path, CacheEntry &entry) {
  bool exists = false;
  std::string bytes = readFile(path, exists);
  if (!exists)
    return false;
  std::string why;
  if (decodeCacheEntry(bytes, entry, why))
    return true;
  ++counters.corruptEntries;
  TORCH_WARN("spectra: the cached kernel '", path, "' is damaged (", why, "); recompiling it.");
  return false;
}

void KernelCache::writeEntry(const std::string &path, const CacheEntry &entry) {
  if (writeFileAtomically(path, encodeCacheEntry(entry)))
    ++counters.diskWrites;
  else
    TORCH_WARN("spectra: could not write the cache entry '", path, "' (", std::strerror(errno),
               "); the kernel stays cached in memory.");
}

void KernelCache::dump(const std::string &name, const std::string &key, const CacheEntry &entry) {
  const char *dir = std::getenv("SPECTRA_DUMP_DIR");
  if (!dir || !*dir)
    return;
  if (!makeWritableDirectory(dir)) {
    TORCH_WARN("spectra: SPECTRA_DUMP_DIR '", dir, "' is not a writable directory; nothing dumped.");
    return;
  }
  std::string base = std::string(dir) + "/" + fileSafe(name) + "." + key.substr(0, 12) + ".";
  for (const auto &[section, bytes] : entry)
    writeFileAtomically(base + section, bytes);
}

std::shared_ptr<spectra_cpu_kernel>
KernelCache::cpu(const std::string &canonical, const std::string &name, const std::string &options,
                 const std::function<spectra_cpu_kernel *()> &compile) {
  std::lock_guard<std::mutex> lock(mutex);
  // The object is native code for this host: its CPU and vector width are part of the key.
  std::string target = std::string("cpu ") + spectra_cpu_host_target();
  std::string k = key(spectra_compiler_version(), canonical, target, options);
  if (auto it = cpuKernels.find(k); it != cpuKernels.end()) {
    ++counters.memoryHits;
    return it->second;
  }
  std::string dir = directory();
  std::string path = dir.empty() ? "" : dir + "/" + k + ".cpu";
  CacheEntry entry;
  if (!path.empty() && readEntry(path, entry)) {
    const std::string &object = entry["object"];
    char *error = nullptr;
    // The object's symbols carry the name of the feature map it was compiled for; any map
    // with this component and these sizes shares it.
    std::string compiledFor = entry.count("map.txt") ? entry["map.txt"] : name;
    spectra_cpu_kernel *loaded = spectra_cpu_load_object(
        object.data(), object.size(), compiledFor.c_str(), entry["tiles.mlir"].c_str(),
        entry["vectors.mlir"].c_str(), entry["llvm.mlir"].c_str(), &error);
    if (loaded) {
      ++counters.diskHits;
      auto kernel = std::shared_ptr<spectra_cpu_kernel>(loaded, spectra_cpu_kernel_free);
      cpuKernels[k] = kernel;
      return kernel;
    }
    ++counters.corruptEntries;
    TORCH_WARN("spectra: the cached kernel '", path, "' does not load (", error ? error : "",
               "); recompiling it.");
    spectra_free(error);
  }
  ++counters.compiles;
  auto kernel = std::shared_ptr<spectra_cpu_kernel>(compile(), spectra_cpu_kernel_free);
  size_t size = 0;
  const char *object = spectra_cpu_kernel_object(kernel.get(), &size);
  entry = {{"object", std::string(object ? object : "", size)},
           {"tiles.mlir", spectra_cpu_kernel_ir(kernel.get(), "tiles")},
           {"vectors.mlir", spectra_cpu_kernel_ir(kernel.get(), "vectors")},
           {"llvm.mlir", spectra_cpu_kernel_ir(kernel.get(), "llvm")},
           {"map.txt", name},
           {"key.txt", canonical + "\n" + target + " " + options}};
  if (!path.empty() && size > 0)
    writeEntry(path, entry);
  dump(name, k, entry);
  cpuKernels[k] = kernel;
  return kernel;
}

std::string KernelCache::gpu(const std::string &canonical, const std::string &name,
                             const std::string &target, const std::string &options,
                             const std::function<std::string()> &compile) {
  std::lock_guard<std::mutex> lock(mutex);
  std::string k = key(spectra_compiler_version(), canonical, target, options);
  if (auto it = gpuArtifacts.find(k); it != gpuArtifacts.end()) {
    ++counters.memoryHits;
    return it->second;
  }
  std::string dir = directory();
  std::string path = dir.empty() ? "" : dir + "/" + k + "." + target;
  CacheEntry entry;
  if (!path.empty() && readEntry(path, entry) && !entry["artifact.json"].empty()) {
    ++counters.diskHits;
    return gpuArtifacts[k] = entry["artifact.json"];
  }
  ++counters.compiles;
  std::string artifact = compile();
  entry = {{"artifact.json", artifact}, {"key.txt", canonical + "\n" + target + " " + options}};
  if (!path.empty())
    writeEntry(path, entry);
  dump(name + "." + target, k, entry);
  return gpuArtifacts[k] = artifact;
}

CacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex);
  return counters;
}

void KernelCache::resetStats() {
  std::lock_guard<std::mutex> lock(mutex);
  counters = CacheStats();
}

void KernelCache::clearMemory() {
  std::lock_guard<std::mutex> lock(mutex);
  cpuKernels.clear();
  gpuArtifacts.clear();
}

} // namespace spectra
