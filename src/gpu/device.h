// Device memory, streams and pinned host memory for the GPU trainer (docs/gpu.md,
// "Memory"). Every CUDA and cuBLAS call goes through check(), which throws RuntimeError
// naming the call and CUDA's reason.
// Thread-safety: one thread uses an allocator and its buffers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/gpu/gpu.h"

namespace loom::gpu {

void check(cudaError_t status, const char* call);
void check(cublasStatus_t status, const char* call);

// A caching allocator: sizes round up to 512 bytes (under 1 MiB) or to 2 MiB, and a freed
// buffer waits in a free list by size for the next request it fits (at most 1.25x its
// size), so that a training step's activations are reused by the next step instead of
// going back to cudaMalloc. When cudaMalloc fails, the cache is given back and the call
// tried once more; then the error names the buffer, the bytes asked and what is in use.
class DeviceAllocator {
 public:
  DeviceAllocator() = default;
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* allocate(size_t bytes, const std::string& what);
  void release(void* ptr);
  void empty_cache();
  MemoryStats stats() const { return stats_; }
  static size_t rounded(size_t bytes);

 private:
  std::multimap<size_t, void*> free_;
  std::unordered_map<void*, size_t> sizes_;  // every buffer reserved, by its rounded size
  MemoryStats stats_;
};

// A buffer from a DeviceAllocator, given back when destroyed. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceAllocator& alloc, size_t bytes, const std::string& what)
      : alloc_(&alloc), ptr_(bytes ? alloc.allocate(bytes, what) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : alloc_(o.alloc_), ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  void reset() {
    if (ptr_ != nullptr) alloc_->release(ptr_);
    ptr_ = nullptr;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  DeviceAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory, so that copies to and from the device run asynchronously.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// A stream and an event, destroyed with their owner.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  // Work queued on `other` after this call waits for what is queued here now.
  void signal(const Stream& other) const;
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

// Times named phases of the work queued on one stream with CUDA events (`loom bench gpu
// --profile`, docs/gpu.md): mark(name) begins phase `name` where the previous phase ends;
// collect(), once the stream has done that work, adds each phase's time to its total. Off,
// both do nothing.
class PhaseTimer {
 public:
  explicit PhaseTimer(bool on) : on_(on) {}
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  void enable(bool on) { on_ = on; }
  void mark(const char* phase, cudaStream_t stream);
  void collect();
  // Milliseconds by phase since the last take, in the order the phases first ran.
  std::vector<std::pair<std::string, double>> take();

 private:
  bool on_;
  std::vector<cudaEvent_t> events_;  // a pool; the first `used_` recorded since the last collect
  std::vector<const char*> names_;
  size_t used_ = 0;
  std::vector<std::pair<std::string, double>> totals_;
};

}  // namespace loom::gpu
