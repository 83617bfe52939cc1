#include "loom/core/tensor.h"

#include <gtest/gtest.h>

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/core/params.h"

namespace loom {
namespace {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3}, DType::kF32);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  Tensor rows = t.slice_rows(1, 3);
  rows.data<float>()[0] = 5.0f;
  EXPECT_EQ(t.data<float>()[3], 5.0f);
  Tensor flat = t.view({12});
  EXPECT_EQ(flat.data<float>()[3], 5.0f);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_EQ(shape_str(t.shape()), "[4, 3]");
}

TEST(Tensor, ZeroSizedTensorsAreValid) {
  Tensor t = Tensor::zeros({0, 5}, DType::kBF16);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  t.zero();
}

// zero() and copy_from() of a megabyte or more run in chunks on the OpenMP pool: every byte
// written, none past the end, at sizes that end mid-chunk, on one thread and several.
TEST(Tensor, LargeZeroAndCopyCoverEveryByte) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3})
    for (int64_t n : {int64_t{1} << 18, (int64_t{1} << 20) + 5, int64_t{3} << 20}) {
      omp_set_num_threads(threads);
      Tensor src = Tensor::zeros({n + 1}, DType::kU8);
      uint8_t* s = src.data<uint8_t>();
      for (int64_t i = 0; i <= n; ++i) s[i] = static_cast<uint8_t>(i * 7 + 1);
      Tensor dst = Tensor::zeros({n + 1}, DType::kU8);
      dst.data<uint8_t>()[n] = 0xee;  // past the copied part
      dst.slice_rows(0, n).copy_from(src.slice_rows(0, n));
      EXPECT_EQ(std::memcmp(dst.data<uint8_t>(), s, static_cast<size_t>(n)), 0) << n << " at " << threads;
      EXPECT_EQ(dst.data<uint8_t>()[n], 0xee) << n;
      src.slice_rows(0, n).zero();
      EXPECT_EQ(std::vector<uint8_t>(s, s + n), std::vector<uint8_t>(static_cast<size_t>(n), 0)) << n;
      EXPECT_EQ(s[n], static_cast<uint8_t>(n * 7 + 1)) << n << ": zeroed past the end";
    }
  omp_set_num_threads(saved);
}

TEST(Arena, ReusesOneBlockAfterReset) {
  Arena a;
  for (int step = 0; step < 3; ++step) {
    Tensor x = a.alloc({1 << 19}, DType::kF32);  // 2 MiB each: forces a second block
    Tensor y = a.alloc({1 << 19}, DType::kF32);
    EXPECT_NE(x.raw(), y.raw());
    a.reset();
  }
  EXPECT_EQ(a.peak_bytes(), size_t{4} << 20);
  Tensor z = a.zeros({7}, DType::kF64);
  EXPECT_EQ(z.data<double>()[6], 0.0);
}

// The pages of [p, p + bytes) that are resident (mincore).
size_t resident_pages(const void* p, size_t bytes) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t pages = (reinterpret_cast<uintptr_t>(p) + bytes - begin + page - 1) / page;
  std::vector<unsigned char> in(pages);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), pages * page, in.data()), 0);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

TEST(Arena, MergesItsBlocksWithoutFreshPages) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  Arena a;
  {
    Tensor x = a.alloc({3 << 20}, DType::kU8);  // two blocks: 3 MiB, then 6 (twice the last)
    Tensor y = a.alloc({6 << 20}, DType::kU8);
    std::memset(x.raw(), 1, x.nbytes());
    std::memset(y.raw(), 2, y.nbytes());
  }
  a.reset();  // nothing holds the blocks: their written pages become the merged block's
  Tensor z = a.alloc({9 << 20}, DType::kU8);
  const size_t pages = (size_t{9} << 20) / page;
  EXPECT_EQ(resident_pages(z.raw(), z.nbytes()), pages) << "the merged block took fresh pages";
  std::memset(z.raw(), 3, z.nbytes());  // and they are writable, all of them
  EXPECT_EQ(z.data<uint8_t>()[z.numel() - 1], 3);
}

TEST(Arena, LeavesABlockATensorHoldsToIt) {
  Arena a;
  Tensor kept = a.alloc({3 << 20}, DType::kU8);
  Tensor other = a.alloc({5 << 20}, DType::kU8);
  std::memset(kept.raw(), 7, kept.nbytes());
  other = Tensor();
  a.reset();
  Tensor z = a.alloc({8 << 20}, DType::kU8);
  std::memset(z.raw(), 9, z.nbytes());
  EXPECT_NE(z.raw(), kept.raw());
  const auto* k = kept.data<uint8_t>();
  EXPECT_EQ(std::count(k, k + kept.numel(), uint8_t{7}), kept.numel()) << "a held tensor's bytes changed";
}

TEST(ParamSet, FlatLayoutInRegistrationOrder) {
  ParamSet ps;
  ParamRef a = ps.add("a.weight", {2, 3}, ParamKind::kWeight);
  ParamRef b = ps.add("a.bias", {3}, ParamKind::kBias);
  ps.allocate();
  EXPECT_EQ(ps.numel(), 9);
  EXPECT_EQ(b.info().offset, 6);
  b.value().data<float>()[0] = 2.0f;
  a.grad().data<float>()[5] = 3.0f;
  EXPECT_EQ(ps.values().data<float>()[6], 2.0f);
  EXPECT_EQ(ps.grads().data<float>()[5], 3.0f);
  EXPECT_EQ(ps.find("a.bias"), 1);
  EXPECT_EQ(ps.find("nope"), -1);
}

}  // namespace
}  // namespace loom
