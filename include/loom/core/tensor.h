// Tensor: a typed, shaped, strided, non-owning view into a Storage (DESIGN.md section 3).
//
// Storage is one flat, 64-byte aligned byte buffer; each role (parameters, gradients,
// optimizer moments, activations) lives in one, and tensors are views into it, so data
// parallel buckets and ZeRO shards are offset arithmetic. A Tensor keeps its Storage
// alive through a shared_ptr; copying a Tensor copies the view, never the data.
//
// Thread-safety: a Tensor is a value; concurrent reads are safe, concurrent writes to the
// same elements are the caller's to avoid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom {

// Owns one zero-initialised, 64-byte aligned byte buffer. Buffers of kMappedBytes or more
// are anonymous page mappings: their zero pages cost no memory until first written, so a
// buffer that is zeroed but not yet used (a ZeRO-2/3 gradient buffer, optimizer moments
// before the first step) is not resident.
class Storage {
 public:
  // Zeroed. `huge_pages`: a mapped allocation asks the kernel for huge pages (far fewer page
  // faults when it is written whole at once, e.g. a checkpoint's copy of the model).
  explicit Storage(size_t bytes, bool huge_pages = false);
  // `bytes` at `data`, which `keep` keeps alive (memory another owner hands out, e.g. a
  // communicator's shared memory); not zeroed here.
  Storage(std::byte* data, size_t bytes, std::shared_ptr<void> keep)
      : data_(data), bytes_(bytes), keep_(std::move(keep)) {}
  // A buffer of `bytes` made, as far as they reach, of the pages of the mapped buffers in
  // `old` that nobody else holds (use_count 1), largest first: their pages are moved into
  // it (mremap), not copied and not freed, so they stay resident. Pages the kernel hands
  // out fresh cost a fault each on first write, and on a virtual machine the hypervisor
  // charges that write again (0.3-0.4 GB/s on this project's VM): an arena merging its first
  // step's blocks into a fresh one paid 0.7-0.8 s in gpt2-124m's second step. The rest of
  // `old`'s pages are freed; buffers still held are left to their holders. Unlike the
  // constructor's, the contents are unspecified: moved pages keep what they held.
  static std::shared_ptr<Storage> merged(std::vector<std::shared_ptr<Storage>> old, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  static constexpr size_t kMappedBytes = size_t{1} << 20;

 private:
  std::byte* data_;
  size_t bytes_;
  bool mapped_ = false;
  std::shared_ptr<void> keep_;  // set: the memory is another owner's
};

// Makes the whole pages in [p, p + bytes) resident and writable now, in one call, for memory
// about to be written whole (a checkpoint's load): one call instead of a page fault per page
// (on this project's VM a 2-rank resume of 194 MiB each went from 1.04 s to 0.62 s; the
// hypervisor still charges each page's first write). Advice: a kernel without it (before
// Linux 5.14) leaves the pages to fault as usual.
void populate_for_write(void* p, size_t bytes);
// Gives the whole pages inside [p, p + bytes) back to the system (MADV_DONTNEED): they read
// as zero afterwards and hold no memory until written. For buffers a process no longer
// needs but cannot free alone (an int8 model's f32 weights inside its flat parameters).
void discard_pages(void* p, size_t bytes);

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;
  // A contiguous view of `shape` starting `offset_bytes` into `storage`.
  Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, Shape shape, DType dtype);
  // A fresh contiguous tensor with its own zeroed storage.
  static Tensor zeros(const Shape& shape, DType dtype);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t dim(int i) const;                            // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return storage_ != nullptr; }
  bool is_contiguous() const;
  size_t offset_bytes() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Typed element pointer. REQUIRES: T matches dtype(); bf16 and f16 elements are read
  // and written as their uint16_t bits.
  template <typename T>
  T* data() const {
    LOOM_CHECK(dtype_of<T>() == dtype_ ||
               (std::is_same_v<T, uint16_t> && (dtype_ == DType::kBF16 || dtype_ == DType::kF16)));
    return reinterpret_cast<T*>(storage_->data() + offset_);
  }
  void* raw() const { return storage_->data() + offset_; }

  // Same elements, new shape. REQUIRES: contiguous, same numel.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) of the leading dimension. REQUIRES: contiguous.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Sets every element to zero. REQUIRES: contiguous.
  void zero() const;
  // Copies elements from `src` (same dtype and numel). REQUIRES: both contiguous.
  void copy_from(const Tensor& src) const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::kF32;
};

// Bump allocator for activations: one micro-batch's tensors come from here, and reset()
// recycles them all at once. After the first step it holds one block of the peak size,
// merged from the first step's blocks (Storage::merged) where no tensor still holds them:
// tensors a caller keeps across a reset keep their block, and the arena then takes fresh
// pages in its place. Memory from alloc holds whatever it held: zeros() zeroes.
// Thread-safety: not thread-safe; one arena per micro-batch context.
class Arena {
 public:
  Tensor alloc(const Shape& shape, DType dtype);
  Tensor zeros(const Shape& shape, DType dtype);
  void reset();
  size_t peak_bytes() const { return peak_; }

 private:
  std::vector<std::shared_ptr<Storage>> blocks_;
  size_t used_ = 0;       // bytes used in the last block
  size_t total_used_ = 0;  // bytes used across blocks since reset
  size_t peak_ = 0;
};

}  // namespace loom
