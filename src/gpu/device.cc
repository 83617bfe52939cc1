// Device memory, streams and pinned memory (device.h), and what the machine has (gpu.h).
#include "gpu/cublas.h"
#include "gpu/device.h"
#include "gpu/nccl/nccl.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "loom/core/error.h"

namespace loom::gpu {
namespace {

constexpr size_t kSmall = size_t{1} << 20;
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

std::string gib(int64_t bytes) {
  char out[32];
  std::snprintf(out, sizeof out, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return out;
}

}  // namespace

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw RuntimeError(cat(call, " failed: ", cudaGetErrorString(status),
                           " (is the GPU visible to this process? nvidia-smi shows it; docs/gpu.md)"));
}

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) throw RuntimeError(cat(call, " failed: cuBLAS status ", int(status)));
}

bool compiled() { return true; }
bool nccl_compiled() { return NcclGroup::compiled(); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: none, not an error to keep
    return 0;
  }
  return n;
}

void require_device(int device) {
  const int n = device_count();
  if (device >= n)
    throw RuntimeError(cat("job.device = \"cuda\": no CUDA device ", device, " is visible to this process (", n,
                           " found; CUDA_VISIBLE_DEVICES, the driver and nvidia-smi say why; docs/gpu.md)"));
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  if (device < 0 || device >= device_count() || cudaGetDeviceProperties(&p, device) != cudaSuccess) return "";
  return cat(p.name, ", sm_", p.major, p.minor, ", ", p.multiProcessorCount, " SMs, ",
             gib(static_cast<int64_t>(p.totalGlobalMem)));
}

double bf16_gemm_tflops(int device, int64_t n) {
  check(cudaSetDevice(device), "cudaSetDevice");
  DeviceAllocator alloc;
  const size_t bytes = size_t(n) * size_t(n) * 2;
  DeviceBuffer a(alloc, bytes, "peak A"), b(alloc, bytes, "peak B"), c(alloc, bytes, "peak C");
  check(cudaMemset(a.as<void>(), 0, bytes), "cudaMemset");  // zeros: the rate does not depend on the values
  check(cudaMemset(b.as<void>(), 0, bytes), "cudaMemset");
  Stream s;
  cublasHandle_t h = nullptr;
  check(cublas().create(&h), "cublasCreate");
  check(cublas().set_stream(h, s.get()), "cublasSetStream");
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const float alpha = 1.0f, beta = 0.0f;
  const int in = static_cast<int>(n), reps = 10;
  double best = 0;
  for (int round = 0; round < 4; ++round) {  // the first round warms up
    check(cudaEventRecord(start, s.get()), "cudaEventRecord");
    for (int r = 0; r < reps; ++r)
      check(cublas().gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, in, in, in, &alpha, a.as<void>(), CUDA_R_16BF, in, b.as<void>(),
                         CUDA_R_16BF, in, &beta, c.as<void>(), CUDA_R_16BF, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    check(cudaEventRecord(stop, s.get()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (round > 0) best = std::max(best, 2.0 * double(n) * double(n) * double(n) * reps / (double(ms) * 1e9));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublas().destroy(h);
  return best;
}

DeviceAllocator::~DeviceAllocator() {
  for (auto& [ptr, size] : sizes_) cudaFree(ptr);
}

size_t DeviceAllocator::rounded(size_t bytes) {
  const size_t r = bytes < kSmall ? kSmallRound : kLargeRound;
  return std::max<size_t>(r, (bytes + r - 1) / r * r);
}

void* DeviceAllocator::allocate(size_t bytes, const std::string& what) {
  const size_t size = rounded(bytes);
  ++stats_.allocations;
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= size + size / 4) {
    void* ptr = it->second;
    stats_.in_use += static_cast<int64_t>(it->first);
    free_.erase(it);
    ++stats_.cache_hits;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return ptr;
  }
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, size) != cudaSuccess) {
    (void)cudaGetLastError();
    empty_cache();
    if (cudaMalloc(&ptr, size) != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw RuntimeError(cat("out of GPU memory for ", what, ": ", bytes, " bytes asked (", gib(int64_t(bytes)),
                             "), ", gib(stats_.in_use), " in use by Loom, ", gib(int64_t(free_bytes)), " free of ",
                             gib(int64_t(total)), "; lower training.micro_batch or the model's size"));
    }
  }
  sizes_[ptr] = size;
  stats_.in_use += static_cast<int64_t>(size);
  stats_.reserved += static_cast<int64_t>(size);
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return ptr;
}

void DeviceAllocator::release(void* ptr) {
  const auto it = sizes_.find(ptr);
  LOOM_CHECK(it != sizes_.end());
  stats_.in_use -= static_cast<int64_t>(it->second);
  free_.emplace(it->second, ptr);
}

void DeviceAllocator::empty_cache() {
  for (auto& [size, ptr] : free_) {
    cudaFree(ptr);
    sizes_.erase(ptr);
    stats_.reserved -= static_cast<int64_t>(size);
  }
  free_.clear();
}

PinnedBuffer::PinnedBuffer(size_t bytes) { check(cudaMallocHost(&ptr_, std::max<size_t>(bytes, 1)), "cudaMallocHost"); }

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = o.ptr_;
    o.ptr_ = nullptr;
  }
  return *this;
}

Stream::Stream() {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
}

Stream::~Stream() {
  cudaEventDestroy(event_);
  cudaStreamDestroy(stream_);
}

void Stream::signal(const Stream& other) const {
  check(cudaEventRecord(event_, stream_), "cudaEventRecord");
  check(cudaStreamWaitEvent(other.stream_, event_, 0), "cudaStreamWaitEvent");
}

void Stream::synchronize() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void PhaseTimer::mark(const char* phase, cudaStream_t stream) {
  if (!on_) return;
  if (used_ == events_.size()) {
    events_.emplace_back();
    check(cudaEventCreate(&events_.back()), "cudaEventCreate");
  }
  check(cudaEventRecord(events_[used_++], stream), "cudaEventRecord");
  names_.push_back(phase);
}

void PhaseTimer::collect() {
  if (!on_) return;
  for (size_t i = 1; i < used_; ++i) {
    check(cudaEventSynchronize(events_[i]), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "cudaEventElapsedTime");
    const std::string name = names_[i - 1];
    auto it = std::find_if(totals_.begin(), totals_.end(), [&](const auto& t) { return t.first == name; });
    if (it == totals_.end()) it = totals_.insert(totals_.end(), {name, 0.0});
    it->second += ms;
  }
  used_ = 0;
  names_.clear();
}

std::vector<std::pair<std::string, double>> PhaseTimer::take() {
  std::vector<std::pair<std::string, double>> out;
  out.swap(totals_);
  return out;
}

}  // namespace loom::gpu
