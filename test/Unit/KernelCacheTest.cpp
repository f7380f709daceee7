//===- KernelCacheTest.cpp - memory and disk caching of compiled kernels -===//

#include "runtime/FusedCpu.h"
#include "runtime/KernelCache.h"
#include "runtime/WeightFactory.h"

#include "test/Unit/TestFeatures.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <sys/stat.h>
#include <set>
#include <unistd.h>

using namespace spectra;

namespace {

// POSIX, not std::filesystem: libtorch.so exports std::filesystem symbols of
// its own build, which the dynamic linker may bind in place of libstdc++'s.
void removeTree(const std::string &path) { (void)std::system(("rm -rf '" + path + "'").c_str()); }
std::vector<std::string> listDirectory(const std::string &path) {
  std::vector<std::string> files;
  if (DIR *dir = opendir(path.c_str())) {
    while (dirent *e = readdir(dir))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        files.push_back(path + "/" + e->d_name);
    closedir(dir);
  }
  return files;
}
std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Points SPECTRA_CACHE_DIR at a fresh directory for one test and restores it after.
class CacheDir {
public:
  explicit CacheDir(const std::string &name) {
    const char *old = std::getenv("SPECTRA_CACHE_DIR");
    previous = old ? std::optional<std::string>(old) : std::nullopt;
    path = "/tmp/spectra-cache-test-" + name + "-" + std::to_string(getpid());
    removeTree(path);
    setenv("SPECTRA_CACHE_DIR", path.c_str(), 1);
    KernelCache::instance().clearMemory();
    KernelCache::instance().resetStats();
  }
  ~CacheDir() {
    removeTree(path);
    if (previous)
      setenv("SPECTRA_CACHE_DIR", previous->c_str(), 1);
    else
      unsetenv("SPECTRA_CACHE_DIR");
    KernelCache::instance().clearMemory();
  }
  std::vector<std::string> entries() const { return listDirectory(path); }
  std::string path;

private:
  std::optional<std::string> previous;
};

/// Runs the fused forward of `fused` on fixed inputs (value dimension dv).
torch::Tensor runOnce(const FusedCpuAttention &fused, int64_t dv = 8) {
  torch::manual_seed(3);
  torch::Tensor q = torch::randn({1, 2, 9, 8}), k = torch::randn({1, 2, 7, 8}),
                v = torch::randn({1, 2, 7, dv});
  const Descriptor &d = fused.descriptor();
  return fused.forward(q, k, v, WeightFactory(d).draw(d.seed, torch::kFloat32)).out;
}

VariantConfig small() {
  VariantConfig c;
  c.m = 16;
  c.d = 8;
  return c;
}

TEST(KernelCache, ACachedKernelWithoutABackwardRunsForwardAndKeepsTheReason) {
  // math.erf has no derivative rule: the kernel has a forward only; loaded from the disk it
  // still runs it, and still says why the backward is missing.
  const std::string ir = spectra::test::kUndifferentiableFeature;
  CacheDir dir("no-backward");
  KernelCache &cache = KernelCache::instance();
  FusedCpuAttention cold = FusedCpuAttention::fromIR(ir, "erfy.mlir");
  torch::Tensor expected = runOnce(cold);
  cache.clearMemory();
  FusedCpuAttention fromDisk = FusedCpuAttention::fromIR(ir, "erfy.mlir");
  EXPECT_EQ(cache.stats().diskHits, 1);
  EXPECT_EQ(cache.stats().corruptEntries, 0);
  EXPECT_TRUE(torch::equal(runOnce(fromDisk), expected));
  torch::Tensor q = torch::randn({1, 2, 9, 8}, torch::requires_grad()), k = torch::randn({1, 2, 7, 8}),
                v = torch::randn({1, 2, 7, 8});
  const Descriptor &d = fromDisk.descriptor();
  try {
    fromDisk.attention(q, k, v, WeightFactory(d).draw(d.seed, torch::kFloat32)).sum().backward();
    ADD_FAILURE() << "a backward ran without backward kernels";
  } catch (const c10::Error &e) {
    EXPECT_NE(std::string(e.what()).find("'math.erf' op cannot be differentiated"), std::string::npos)
        << e.what();
  }
}

TEST(KernelCache, ColdCompileThenMemoryHitThenDiskHit) {
  CacheDir dir("hits");
  KernelCache &cache = KernelCache::instance();
  FusedCpuAttention cold("posrf-orf", small());
  EXPECT_EQ(cache.stats().compiles, 1);
  EXPECT_EQ(cache.stats().diskWrites, 1);
  ASSERT_EQ(dir.entries().size(), 1u) << "one entry file, no temporary left behind";
  torch::Tensor expected = runOnce(cold);

  // Same component, other weights: the kernel depends on the component only.
  FusedCpuAttention warm("posrf-mm", small());
  EXPECT_EQ(cache.stats().compiles, 1);
  EXPECT_EQ(cache.stats().memoryHits, 1);

  cache.clearMemory();
  FusedCpuAttention fromDisk("posrf-orf", small());
  EXPECT_EQ(cache.stats().compiles, 1);
  EXPECT_EQ(cache.stats().diskHits, 1);
  EXPECT_TRUE(torch::equal(runOnce(fromDisk), expected)) << "the cached object computes the same";
  for (const char *stage : {"tiles", "vectors", "llvm"})
    EXPECT_NE(fromDisk.kernelIR(stage).find("posrf_orf_kv"), std::string::npos)
        << "the " << stage << " stage is stored with the object";
  EXPECT_NE(fromDisk.kernelIR("tiles").find("linalg.generic"), std::string::npos);
  EXPECT_NE(fromDisk.kernelIR("vectors").find("vector.fma"), std::string::npos);

  // A different component is a different key.
  FusedCpuAttention other("oprf-orf", small());
  EXPECT_EQ(cache.stats().compiles, 2);
  EXPECT_EQ(dir.entries().size(), 2u);
  // So is another value dimension (the kernels are specialised on it), compiled on first use.
  runOnce(fromDisk, 4);
  EXPECT_EQ(cache.stats().compiles, 3);
  EXPECT_EQ(dir.entries().size(), 3u);
}

TEST(KernelCache, CorruptOrTruncatedEntriesAreRecompiled) {
  CacheDir dir("corrupt");
  KernelCache &cache = KernelCache::instance();
  torch::Tensor expected = runOnce(FusedCpuAttention("saderf-orf", small()));
  ASSERT_EQ(dir.entries().size(), 1u);
  std::string entry = dir.entries()[0];
  size_t size = readAll(entry).size();
  for (int damage = 0; damage < 2; ++damage) {
    if (damage == 0) {
      ASSERT_EQ(truncate(entry.c_str(), static_cast<off_t>(size / 2)), 0);  // truncated
    } else {
      std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(size - 100));
      char byte = static_cast<char>(f.get());
      f.seekp(static_cast<std::streamoff>(size - 100));
      f.put(static_cast<char>(byte ^ 0x5a));  // one changed byte inside the object
    }
    cache.clearMemory();
    int64_t compiles = cache.stats().compiles, corrupt = cache.stats().corruptEntries;
    FusedCpuAttention again("saderf-orf", small());
    EXPECT_EQ(cache.stats().corruptEntries, corrupt + 1) << "damage " << damage;
    EXPECT_EQ(cache.stats().compiles, compiles + 1) << "damage " << damage;
    EXPECT_TRUE(torch::equal(runOnce(again), expected));
    std::string bytes = readAll(entry);
    CacheEntry rewritten;
    std::string why;
    EXPECT_TRUE(decodeCacheEntry(bytes, rewritten, why)) << "the entry was rewritten whole: " << why;
    size = bytes.size();
  }
}

TEST(KernelCache, EntriesDetectEveryTruncation) {
  CacheEntry entry{{"object", std::string("\x7f" "ELF\0\1\2", 7)}, {"tiles.mlir", "func.func"}};
  std::string bytes = encodeCacheEntry(entry);
  CacheEntry back;
  std::string why;
  ASSERT_TRUE(decodeCacheEntry(bytes, back, why)) << why;
  EXPECT_EQ(back, entry);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_FALSE(decodeCacheEntry(bytes.substr(0, cut), back, why)) << "cut at " << cut;
  std::string flipped = bytes;
  flipped[flipped.find("ELF")] = 'X';
  EXPECT_FALSE(decodeCacheEntry(flipped, back, why));
  EXPECT_NE(why.find("checksum mismatch in section 'object'"), std::string::npos) << why;
}

TEST(KernelCache, KeyChangesWithCompilerIrTargetAndOptions) {
  std::string base = KernelCache::key("spectra-1", "{component}", "cpu", "");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, KernelCache::key("spectra-1", "{component}", "cpu", ""));
  EXPECT_NE(base, KernelCache::key("spectra-2", "{component}", "cpu", ""));
  EXPECT_NE(base, KernelCache::key("spectra-1", "{component2}", "cpu", ""));
  EXPECT_NE(base, KernelCache::key("spectra-1", "{component}", "sm_90a", ""));
  EXPECT_NE(base, KernelCache::key("spectra-1", "{component}", "cpu", "bf16"));
  // Parts are length-prefixed: moving a boundary changes the key.
  EXPECT_NE(KernelCache::key("ab", "c", "cpu", ""), KernelCache::key("a", "bc", "cpu", ""));
}

/// Collects torch warnings.
struct Collect : c10::WarningHandler {
  void process(const c10::Warning &w) override { messages.push_back(w.msg()); }
  std::vector<std::string> messages;
};

TEST(KernelCache, UnwritableDirectoryFallsBackToMemoryWithAWarning) {
  CacheDir dir("unwritable");
  std::ofstream(dir.path) << "a file where the directory should be";
  Collect collect;
  c10::WarningUtils::WarningHandlerGuard guard(&collect);
  KernelCache &cache = KernelCache::instance();
  FusedCpuAttention fused("trigrf-orf", small());
  EXPECT_EQ(cache.stats().compiles, 1);
  EXPECT_EQ(cache.stats().diskWrites, 0);
  ASSERT_FALSE(collect.messages.empty());
  EXPECT_NE(collect.messages[0].find("kernels are cached in memory only"), std::string::npos)
      << collect.messages[0];
  FusedCpuAttention again("trigrf-orf", small());
  EXPECT_EQ(cache.stats().memoryHits, 1);
}

TEST(KernelCache, DumpDirectoryReceivesEveryStage) {
  CacheDir dir("dump");
  std::string dump = dir.path + "-dump";
  setenv("SPECTRA_DUMP_DIR", dump.c_str(), 1);
  FusedCpuAttention fused("hcexp-orf", small());
  unsetenv("SPECTRA_DUMP_DIR");
  std::set<std::string> suffixes;
  std::vector<std::string> files = listDirectory(dump);
  for (const std::string &f : files)
    suffixes.insert(f.substr(f.rfind('.') + 1));
  EXPECT_EQ(suffixes, (std::set<std::string>{"mlir", "object", "txt"}));
  EXPECT_EQ(files.size(), 6u) << "tiles.mlir, vectors.mlir, llvm.mlir, object, map.txt, key.txt";
  removeTree(dump);
}

} // namespace
