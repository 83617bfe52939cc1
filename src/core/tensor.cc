#include "loom/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

namespace loom {

namespace {

// f(offset, bytes) over [0, total) in 256 KiB chunks on the OpenMP pool, for a fill or copy of
// a megabyte or more outside any parallel region (a step's gradients zeroed, a block's
// d(input) moved out of the workspace): done by one thread, the pool's others waited (each
// about 1% of a 2-thread bf16 gpt-mini step). Smaller, or inside a region: one call.
template <typename F>
void by_chunks(size_t total, F&& f) {
  constexpr size_t kChunk = size_t{1} << 18;
  if (total < 4 * kChunk || omp_get_level() > 0 || omp_get_max_threads() == 1) {
    f(size_t{0}, total);
    return;
  }
  const auto chunks = static_cast<int64_t>((total + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t offset = static_cast<size_t>(c) * kChunk;
    f(offset, std::min(total - offset, kChunk));
  }
}

}  // namespace

Storage::Storage(size_t bytes, bool huge_pages) : bytes_(bytes) {
  if (bytes >= kMappedBytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (huge_pages) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice: it works without
    data_ = static_cast<std::byte*>(p);  // page aligned, reads as zero
    mapped_ = true;
    return;
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  data_ = static_cast<std::byte*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, rounded == 0 ? 64 : rounded);
}

void populate_for_write(void* p, size_t bytes) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

void discard_pages(void* p, size_t bytes) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::shared_ptr<Storage> Storage::merged(std::vector<std::shared_ptr<Storage>> old, size_t bytes) {
  auto merged = std::make_shared<Storage>(bytes);
  if (!merged->mapped_) return merged;
  static const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t room = (bytes + page - 1) / page * page;
  std::sort(old.begin(), old.end(), [](const auto& a, const auto& b) { return a->bytes_ > b->bytes_; });
  size_t filled = 0;
  for (const std::shared_ptr<Storage>& s : old) {
    if (filled == room) break;
    if (s.use_count() != 1 || !s->mapped_) continue;  // a tensor still holds it, or it is not pages
    const size_t length = (s->bytes_ + page - 1) / page * page, moved = std::min(length, room - filled);
    // MREMAP_FIXED replaces the fresh pages at the destination; a failure leaves both as they were.
    if (::mremap(s->data_, moved, moved, MREMAP_MAYMOVE | MREMAP_FIXED, merged->data_ + filled) == MAP_FAILED)
      continue;
    if (moved < length) ::munmap(s->data_ + moved, length - moved);
    s->data_ = nullptr;  // its pages are the merged buffer's now, or freed: nothing left to unmap
    s->mapped_ = false;
    filled += moved;
  }
  return merged;
}

Storage::~Storage() {
  if (keep_) return;
  if (mapped_) ::munmap(data_, bytes_);
  else std::free(data_);
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset_bytes),
      shape_(std::move(shape)),
      strides_(contiguous_strides(shape_)),
      dtype_(dtype) {
  for (int64_t d : shape_) LOOM_CHECK_LE(0, d);
  LOOM_CHECK_LE(offset_ + nbytes(), storage_->bytes());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  auto storage = std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype));
  return Tensor(std::move(storage), 0, shape, dtype);
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim();
  LOOM_CHECK(i >= 0 && i < ndim());
  return shape_[i];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::view(const Shape& shape) const {
  LOOM_CHECK(is_contiguous());
  LOOM_CHECK_EQ(shape_numel(shape), numel());
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  LOOM_CHECK(is_contiguous() && ndim() >= 1);
  LOOM_CHECK(0 <= begin && begin <= end && end <= shape_[0]);
  Shape s = shape_;
  s[0] = end - begin;
  size_t row_bytes = static_cast<size_t>(strides_[0]) * dtype_size(dtype_);
  return Tensor(storage_, offset_ + begin * row_bytes, s, dtype_);
}

void Tensor::zero() const {
  LOOM_CHECK(is_contiguous());
  std::byte* p = static_cast<std::byte*>(raw());
  by_chunks(nbytes(), [p](size_t offset, size_t bytes) { std::memset(p + offset, 0, bytes); });
}

void Tensor::copy_from(const Tensor& src) const {
  LOOM_CHECK(is_contiguous() && src.is_contiguous());
  LOOM_CHECK(dtype_ == src.dtype_);
  LOOM_CHECK_EQ(numel(), src.numel());
  std::byte* to = static_cast<std::byte*>(raw());
  const std::byte* from = static_cast<const std::byte*>(src.raw());
  by_chunks(nbytes(), [to, from](size_t offset, size_t bytes) { std::memcpy(to + offset, from + offset, bytes); });
}

Tensor Arena::alloc(const Shape& shape, DType dtype) {
  size_t bytes = (shape_numel(shape) * dtype_size(dtype) + 63) / 64 * 64;
  if (blocks_.empty() || used_ + bytes > blocks_.back()->bytes()) {
    size_t last = blocks_.empty() ? 0 : blocks_.back()->bytes();
    blocks_.push_back(std::make_shared<Storage>(std::max({bytes, 2 * last, size_t{1} << 20})));
    used_ = 0;
  }
  Tensor t(blocks_.back(), used_, shape, dtype);
  used_ += bytes;
  total_used_ += bytes;
  peak_ = std::max(peak_, total_used_);
  return t;
}

Tensor Arena::zeros(const Shape& shape, DType dtype) {
  Tensor t = alloc(shape, dtype);
  t.zero();
  return t;
}

void Arena::reset() {
  // Tensors handed out earlier keep their blocks alive; the arena only forgets them.
  if (blocks_.size() > 1) {
    std::shared_ptr<Storage> merged = Storage::merged(std::move(blocks_), peak_);
    blocks_.clear();
    blocks_.push_back(std::move(merged));
  }
  used_ = 0;
  total_used_ = 0;
}

}  // namespace loom
