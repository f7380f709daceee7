//===- BufferCache.h - the fused kernels' CPU buffers, kept for reuse -----===//
//
// Every forward and backward of the fused kernels allocates the same buffers
// again: the output and its row statistics, dq, dk and dv, the per-chunk
// partial sums. On the CPU a fresh buffer of a few MiB comes from glibc as
// fresh pages (mmap, or a heap top trimmed since the last step), and the
// kernel that first writes it pays a page fault per 4 KiB: at B=8 H=2 N=4096
// that was 15% of a training step run with glibc's defaults. CUDA's caching
// allocator avoids this on GPUs; this is the CPU's counterpart for the
// buffers the runtime itself allocates.
//
// Buffers of 64 KiB or more come from a cache of freed blocks of the same
// size (exact size classes: a training loop asks for the same sizes each
// step); a freed block returns to the cache, and the least recently freed
// blocks go back to the system once the idle bytes pass the cap
// (SPECTRA_CPU_BUFFER_CACHE_MB, default 1024; 0 turns the cache off). Blocks
// of 2 MiB or more are 2 MiB aligned and asked for as transparent huge pages
// (madvise), so a first touch faults once per 2 MiB. Smaller buffers take
// LibTorch's CPU allocator. Tensors made here are ordinary CPU tensors: they
// may be resized, kept by the user or freed on any thread.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_RUNTIME_BUFFERCACHE_H
#define SPECTRA_RUNTIME_BUFFERCACHE_H

#include <torch/torch.h>

#include <cstdint>

namespace spectra {

/// An uninitialised tensor like torch::empty(sizes, options): CPU tensors from the buffer
/// cache, other devices from their own allocator.
torch::Tensor emptyBuffer(torch::IntArrayRef sizes, const torch::TensorOptions &options);

/// t itself when it is contiguous, else a contiguous copy in a cached buffer.
torch::Tensor contiguousBuffer(const torch::Tensor &t);

/// The cache's counters (process-wide).
struct BufferCacheStats {
  int64_t hits = 0;         ///< allocations served by an idle block
  int64_t misses = 0;       ///< allocations that took new memory
  int64_t idleBytes = 0;    ///< bytes held by idle blocks now
  int64_t liveBytes = 0;    ///< bytes of cached-size blocks in use now
  int64_t capBytes = 0;     ///< the idle bytes kept at most
};
BufferCacheStats bufferCacheStats();

/// The cap SPECTRA_CPU_BUFFER_CACHE_MB=text sets, in bytes (nullptr or empty: the default,
/// 1 GiB); throws c10::Error naming the variable for anything but a whole number of MiB.
int64_t bufferCacheCapFrom(const char *text);

/// Returns every idle block to the system (blocks in use return when freed).
void releaseIdleBuffers();

/// Fills every idle block with 0xFF bytes (NaN in f32, bf16 and f16): a test's way to show
/// that no kernel reads a buffer it has not written.
void poisonIdleBuffers();

/// Sets the cap on idle bytes (0: every freed block returns to the system at once); the
/// default comes from SPECTRA_CPU_BUFFER_CACHE_MB. Excess idle blocks are released now.
void setBufferCacheCap(int64_t bytes);

} // namespace spectra

#endif // SPECTRA_RUNTIME_BUFFERCACHE_H
