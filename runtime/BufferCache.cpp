//===- BufferCache.cpp - the fused kernels' CPU buffers, kept for reuse ---===//

#include "runtime/BufferCache.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace spectra {
namespace {

/// Smaller requests take LibTorch's CPU allocator (glibc serves them from its bins).
constexpr size_t kSmallest = size_t(64) << 10;
/// Requests of this size or more are rounded to it, aligned to it and asked for as huge pages.
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kPage = size_t(4) << 10;

} // namespace

int64_t bufferCacheCapFrom(const char *text) {
  constexpr int64_t kDefaultMiB = 1024;
  if (!text || !*text)
    return kDefaultMiB << 20;
  char *end = nullptr;
  errno = 0;
  long long mib = std::strtoll(text, &end, 10);
  TORCH_CHECK(*end == 0 && errno == 0 && mib >= 0 && mib < (int64_t(1) << 40),
              "spectra: SPECTRA_CPU_BUFFER_CACHE_MB='", text,
              "' is not a size in MiB (a whole number, 0 turns the buffer cache off)");
  return static_cast<int64_t>(mib) << 20;
}

namespace {

class BufferCache final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t n) override {
    if (n < kSmallest)
      return c10::GetCPUAllocator()->allocate(n);
    {
      std::lock_guard<std::mutex> lock(mutex);
      cap();  // reads SPECTRA_CPU_BUFFER_CACHE_MB here, where a bad value can be reported
    }
    const size_t bytes = roundUp(n, n >= kHugePage ? kHugePage : kPage);
    void *p = take(bytes);
    if (!p)
      p = fresh(bytes);
    return {p, p, &BufferCache::release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  BufferCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex);
    BufferCacheStats s = counters;
    s.capBytes = cap();
    return s;
  }

  void setCap(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    capBytes = bytes;
    trim();
  }

  void releaseIdle() {
    std::lock_guard<std::mutex> lock(mutex);
    const int64_t keep = cap();
    capBytes = 0;
    trim();
    capBytes = keep;
  }

  void poisonIdle() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Idle &block : idle)
      std::memset(block.ptr, 0xFF, block.bytes);
  }

  static BufferCache &instance() {
    // Never destroyed: tensors holding its blocks may be freed during static destruction.
    static BufferCache *cache = new BufferCache;
    return *cache;
  }

private:
  struct Idle {
    void *ptr;
    size_t bytes;
  };

  static size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

  int64_t cap() {
    if (!capBytes)
      capBytes = bufferCacheCapFrom(std::getenv("SPECTRA_CPU_BUFFER_CACHE_MB"));
    return *capBytes;
  }

  /// The most recently freed idle block of exactly `bytes`, or nullptr (a miss).
  void *take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = bySize.find(bytes);
    if (it == bySize.end() || it->second.empty()) {
      ++counters.misses;
      return nullptr;
    }
    auto entry = it->second.back();
    it->second.pop_back();
    void *p = entry->ptr;
    idle.erase(entry);
    counters.idleBytes -= static_cast<int64_t>(bytes);
    counters.liveBytes += static_cast<int64_t>(bytes);
    live[p] = bytes;
    ++counters.hits;
    return p;
  }

  void *fresh(size_t bytes) {
    const size_t alignment = bytes >= kHugePage ? kHugePage : 64;
    void *p = std::aligned_alloc(alignment, bytes);
    if (!p) {  // give the idle blocks back and try once more
      releaseIdle();
      p = std::aligned_alloc(alignment, bytes);
    }
    TORCH_CHECK(p, "spectra: out of memory allocating a ", bytes, "-byte CPU buffer");
    if (bytes >= kHugePage)
      madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without huge pages, 4 KiB ones
    std::lock_guard<std::mutex> lock(mutex);
    counters.liveBytes += static_cast<int64_t>(bytes);
    live[p] = bytes;
    return p;
  }

  static void release(void *p) { instance().giveBack(p); }

  void giveBack(void *p) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = live.find(p);
    TORCH_INTERNAL_ASSERT(it != live.end(), "spectra: a buffer freed twice or not from the cache");
    const size_t bytes = it->second;
    live.erase(it);
    counters.liveBytes -= static_cast<int64_t>(bytes);
    idle.push_back({p, bytes});
    bySize[bytes].push_back(std::prev(idle.end()));
    counters.idleBytes += static_cast<int64_t>(bytes);
    trim();
  }

  /// Frees the least recently freed idle blocks until the idle bytes fit the cap (locked).
  void trim() {
    const int64_t limit = cap();
    while (counters.idleBytes > limit && !idle.empty()) {
      auto oldest = idle.begin();
      auto &sameSize = bySize[oldest->bytes];  // freed in order: the oldest of its size first
      TORCH_INTERNAL_ASSERT(!sameSize.empty() && sameSize.front() == oldest);
      sameSize.pop_front();
      counters.idleBytes -= static_cast<int64_t>(oldest->bytes);
      std::free(oldest->ptr);
      idle.erase(oldest);
    }
  }

  std::mutex mutex;
  std::list<Idle> idle;  ///< least recently freed first
  std::map<size_t, std::list<std::list<Idle>::iterator>> bySize;  ///< oldest first per size
  std::unordered_map<void *, size_t> live;
  BufferCacheStats counters;
  std::optional<int64_t> capBytes;
};

} // namespace

torch::Tensor emptyBuffer(torch::IntArrayRef sizes, const torch::TensorOptions &options) {
  if (options.device().type() != c10::DeviceType::CPU || options.layout() != torch::kStrided ||
      options.pinned_memory())
    return torch::empty(sizes, options);
  return at::detail::empty_generic(sizes, &BufferCache::instance(),
                                   c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), std::nullopt);
}

torch::Tensor contiguousBuffer(const torch::Tensor &t) {
  if (t.is_contiguous())
    return t;
  torch::Tensor out = emptyBuffer(t.sizes(), t.options());
  out.copy_(t);
  return out;
}

BufferCacheStats bufferCacheStats() { return BufferCache::instance().stats(); }

void poisonIdleBuffers() { BufferCache::instance().poisonIdle(); }

void releaseIdleBuffers() { BufferCache::instance().releaseIdle(); }

void setBufferCacheCap(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "spectra: the buffer cache's cap must be 0 or more bytes, got ", bytes);
  BufferCache::instance().setCap(bytes);
}

} // namespace spectra
