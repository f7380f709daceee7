//===- BufferCacheTest.cpp - the fused kernels' CPU buffers, kept for reuse ===//

#include "runtime/BufferCache.h"
#include "runtime/FusedCpu.h"
#include "runtime/Reference.h"
#include "runtime/WeightFactory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

using namespace spectra;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
const torch::TensorOptions kF32 = torch::TensorOptions().dtype(torch::kFloat32);

/// Sets a cap for one test, with no idle blocks left from earlier ones; restores the default.
struct CacheScope {
  explicit CacheScope(int64_t cap) {
    previous = bufferCacheStats().capBytes;
    releaseIdleBuffers();
    setBufferCacheCap(cap);
  }
  ~CacheScope() {
    releaseIdleBuffers();
    setBufferCacheCap(previous);
  }
  int64_t previous;
};

TEST(BufferCache, AFreedBufferIsReusedForTheSameSize) {
  CacheScope scope(64 * kMiB);
  BufferCacheStats before = bufferCacheStats();
  torch::Tensor a = emptyBuffer({kMiB / 4}, kF32);  // 1 MiB
  void *first = a.data_ptr();
  a.fill_(1);
  a = torch::Tensor();
  EXPECT_EQ(bufferCacheStats().idleBytes, kMiB);
  poisonIdleBuffers();
  torch::Tensor b = emptyBuffer({256, 1024}, kF32);  // the same bytes in another shape
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_TRUE(torch::isnan(b).all().item<bool>());
  EXPECT_EQ(bufferCacheStats().idleBytes, 0);
  torch::Tensor c = emptyBuffer({kMiB / 4}, kF32);  // b is in use: new memory
  EXPECT_NE(c.data_ptr(), first);
  torch::Tensor d = emptyBuffer({kMiB / 4 + 1024}, kF32);  // another size class
  BufferCacheStats after = bufferCacheStats();
  EXPECT_EQ(after.hits - before.hits, 1);
  EXPECT_EQ(after.misses - before.misses, 3);
  EXPECT_EQ(after.liveBytes - before.liveBytes, 3 * kMiB + 4096);  // b, c and d
}

TEST(BufferCache, SmallBuffersAndOtherDevicesTakeTheirOwnAllocators) {
  CacheScope scope(64 * kMiB);
  BufferCacheStats before = bufferCacheStats();
  torch::Tensor small = emptyBuffer({1024}, kF32);  // 4 KiB
  torch::Tensor meta = emptyBuffer({kMiB}, kF32.device(torch::kMeta));
  EXPECT_EQ(meta.device().type(), torch::kMeta);
  EXPECT_EQ(small.device().type(), torch::kCPU);
  BufferCacheStats after = bufferCacheStats();
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);
  EXPECT_EQ(after.liveBytes, before.liveBytes);
}

TEST(BufferCache, TheCapReleasesTheLeastRecentlyFreedFirst) {
  CacheScope scope(3 * kMiB);
  torch::Tensor a = emptyBuffer({2 * kMiB / 4}, kF32), b = emptyBuffer({2 * kMiB / 4}, kF32);
  void *pa = a.data_ptr(), *pb = b.data_ptr();
  // 2 MiB and more: aligned for transparent huge pages.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pa) % (2 * kMiB), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pb) % (2 * kMiB), 0u);
  a = torch::Tensor();
  b = torch::Tensor();  // 4 MiB idle > 3: a, freed first, goes back to the system
  EXPECT_EQ(bufferCacheStats().idleBytes, 2 * kMiB);
  torch::Tensor c = emptyBuffer({2 * kMiB / 4}, kF32);
  EXPECT_EQ(c.data_ptr(), pb);
  c = torch::Tensor();
  setBufferCacheCap(0);  // nothing kept from now on
  EXPECT_EQ(bufferCacheStats().idleBytes, 0);
  torch::Tensor d = emptyBuffer({kMiB}, kF32);
  d = torch::Tensor();
  EXPECT_EQ(bufferCacheStats().idleBytes, 0);
  EXPECT_THROW(setBufferCacheCap(-1), c10::Error);
}

TEST(BufferCache, CachedTensorsAreOrdinaryCpuTensors) {
  CacheScope scope(64 * kMiB);
  torch::Tensor t = emptyBuffer({kMiB / 4}, kF32);
  t.copy_(torch::arange(kMiB / 4, kF32));
  t.resize_({kMiB});  // storage grown by the cache's allocator, values kept
  EXPECT_TRUE(torch::equal(t.narrow(0, 0, kMiB / 4), torch::arange(kMiB / 4, kF32)));
  torch::Tensor strided = torch::arange(kMiB / 2, kF32).view({1024, kMiB / 2048}).t();
  torch::Tensor copy = contiguousBuffer(strided);
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_TRUE(torch::equal(copy, strided));
  torch::Tensor already = torch::ones({4, 4});
  EXPECT_EQ(contiguousBuffer(already).data_ptr(), already.data_ptr());
  // Freed on another thread: back in the cache, ready for this one.
  const int64_t idle = bufferCacheStats().idleBytes;
  std::thread([held = std::move(t)]() mutable { held = torch::Tensor(); }).join();
  EXPECT_EQ(bufferCacheStats().idleBytes, idle + 4 * kMiB);
}

TEST(BufferCache, TheEnvironmentCapIsSizeInMiB) {
  EXPECT_EQ(bufferCacheCapFrom(nullptr), 1024 * kMiB);
  EXPECT_EQ(bufferCacheCapFrom(""), 1024 * kMiB);
  EXPECT_EQ(bufferCacheCapFrom("0"), 0);
  EXPECT_EQ(bufferCacheCapFrom("256"), 256 * kMiB);
  for (const char *bad : {"lots", "-1", "12MB", "1e3"}) {
    try {
      bufferCacheCapFrom(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const c10::Error &e) {
      EXPECT_NE(std::string(e.what_without_backtrace())
                    .find("SPECTRA_CPU_BUFFER_CACHE_MB='" + std::string(bad) +
                          "' is not a size in MiB (a whole number, 0 turns the buffer cache off)"),
                std::string::npos)
          << e.what_without_backtrace();
    }
  }
}

/// A training loop's second step allocates nothing new: every buffer of the fused forward and
/// backward (out, its row statistics, dq, dk, dv, the chunk partials) is a block the first
/// step freed. Those blocks are filled with NaN first, so a kernel that read any buffer
/// before writing it (as fresh zero pages used to hide) would make the second step NaN; it
/// must match float64 autograd on its own inputs.
TEST(BufferCache, ASecondTrainingStepTakesNoNewMemoryAndReadsNothingStale) {
  CacheScope scope(256 * kMiB);
  VariantConfig config;
  config.m = 32;
  config.d = 16;
  // PosRF; SADERF (compiled statistics, input scales); TrigRF (varying coefficients); causal.
  for (auto [variant, causal] : {std::pair{"posrf-orf", false}, {"saderf-mm", false},
                                 {"trigrf-orf", false}, {"posrf-orf", true}}) {
    const std::string what = std::string(variant) + (causal ? " causal" : "");
    FusedCpuAttention fused(variant, config, causal);
    const Descriptor &desc = fused.descriptor();
    auto step = [&](int seed, bool reference) {
      torch::manual_seed(seed);
      auto type = reference ? torch::kFloat64 : torch::kFloat32;
      auto draw = [&](double scale) {
        return (torch::randn({2, 2, 2048, 16}, torch::kFloat64) * scale).to(type);
      };
      torch::Tensor q = draw(0.5).requires_grad_(), k = draw(0.5).requires_grad_(),
                    v = draw(1).requires_grad_(), probe = draw(1);
      Weights w = WeightFactory(desc).draw(desc.seed, type);
      AttentionOptions options;
      options.causal = causal;
      torch::Tensor out = reference
                              ? ReferenceFeatureMap(desc).attention(q, k, v, w, std::nullopt, options)
                              : fused.attention(q, k, v, w);
      (out * probe).sum().backward();
      return std::vector<torch::Tensor>{out.detach().to(torch::kFloat64),
                                        q.grad().to(torch::kFloat64),
                                        k.grad().to(torch::kFloat64),
                                        v.grad().to(torch::kFloat64)};
    };
    step(1, false);  // compiles the kernels, fills the cache
    poisonIdleBuffers();
    BufferCacheStats before = bufferCacheStats();
    std::vector<torch::Tensor> second = step(2, false);
    BufferCacheStats after = bufferCacheStats();
    EXPECT_EQ(after.misses, before.misses) << what << ": the second step took new memory";
    EXPECT_GE(after.hits - before.hits, 5)
        << what << ": out, dq, dk, dv and the partials come from the cache";
    std::vector<torch::Tensor> truth = step(2, true);
    const char *names[] = {"out", "dq", "dk", "dv"};
    for (size_t i = 0; i < truth.size(); ++i)
      EXPECT_LT((second[i] - truth[i]).abs().max().item<double>(),
                2e-3 * truth[i].abs().max().item<double>())
          << what << " " << names[i];
  }
}

} // namespace
