// INT8 weights and their product: quantization, the generic kernel, the driver that splits
// channels over threads and the float steps every path shares. See int8_matmul.h.
#include "kernels/int8_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/parallel.h"
#include "kernels/pointwise.h"
#include "loom/core/error.h"

namespace loom::kernels {
namespace {

constexpr int kRows = int8_detail::kInt8MaxRows;

std::shared_ptr<int8_t[]> aligned_bytes(int64_t bytes) {
  const auto rounded = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  auto* p = static_cast<int8_t*>(std::aligned_alloc(64, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return std::shared_ptr<int8_t[]>(p, [](int8_t* q) { std::free(q); });
}

// Symmetric int8 of `n` values: q = round(x x 127 / max |x|), clamped; returns the scale
// max |x| / 127 (0 when every x is 0, NaN when an x is NaN or infinite; every q 0 then).
float quantize_row(const float* x, int64_t n, int64_t stride, int8_t* q) {
  // An empty row has scale 0. Saying so first also tells the compiler that n > 0 below:
  // GCC 13 otherwise took the fill of q for one of a negative length (-Wstringop-overflow,
  // -Warray-bounds under -Werror).
  if (n <= 0) return 0.0f;
  // The largest |x|, and whether any is NaN (a NaN makes the scale NaN, as an infinity
  // does). max is exact in any order; an input row (stride 1) takes it in vectors.
  float amax = 0;
  int nan = 0;
  if (stride == 1) {
#pragma omp simd reduction(max : amax) reduction(| : nan)
    for (int64_t p = 0; p < n; ++p) {
      const float a = std::fabs(x[p]);
      amax = amax > a ? amax : a;
      nan |= a != a;
    }
  } else {
    for (int64_t p = 0; p < n; ++p) {
      const float a = std::fabs(x[p * stride]);
      amax = amax > a ? amax : a;
      nan |= a != a;
    }
  }
  if (nan || !(amax > 0) || !std::isfinite(amax)) {
    std::memset(q, 0, static_cast<size_t>(n));
    return !nan && std::isfinite(amax) ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  // Each |x| <= amax, so x 127 / amax rounds into [-127, 127]: clamped all the same, as
  // integers (a float clamp keeps NaN's order: compares and masked blends, 9% of an 8-row
  // 1024 x 256 product's time).
  const float inv = 127.0f / amax;
  for (int64_t p = 0; p < n; ++p) {
    const auto r = static_cast<int32_t>(std::nearbyint(x[p * stride] * inv));
    q[p] = static_cast<int8_t>(std::clamp(r, -127, 127));
  }
  return amax / 127.0f;
}

// u = q + 128 as unsigned bytes (VNNI's operand). Its own function: in the driver, whose
// locals a lambda captures, byte stores may alias them and the loop ran a byte at a time.
void offset_by_128(const int8_t* q, int64_t n, uint8_t* u) {
  for (int64_t p = 0; p < n; ++p) u[p] = static_cast<uint8_t>(q[p] + 128);
}

void kernel_generic(int64_t kp, const int8_t* a, const uint8_t* /*au*/, int64_t lda, int rows, const int8_t* w,
                    const int32_t* /*sum*/, const int8_detail::Int8Out& to) {
  int32_t acc[kRows * kInt8Tile];
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < to.cols; ++c) {
      int32_t s = 0;
      for (int64_t p = 0; p < kp; ++p) s += int32_t{a[r * lda + p]} * int32_t{w[p / 4 * 4 * kInt8Tile + c * 4 + p % 4]};
      acc[r * kInt8Tile + c] = s;
    }
  int8_detail::finish_rows(acc, kInt8Tile, rows, to);
}

// The input rows quantized (signed, and + 128 as unsigned for VNNI) and their scales: kept
// per thread, so a decoding step allocates nothing.
struct QuantizedRows {
  std::vector<int8_t> a;
  std::vector<uint8_t> au;
  std::vector<float> scale;
};

Int8Path g_path = Int8Path::kAuto;

Int8Path best_path() {
  for (Int8Path p : {Int8Path::kVnni, Int8Path::kAvx2})
    if (int8_path_supported(p)) return p;
  return Int8Path::kGeneric;
}

int8_detail::Int8KernelFn kernel_of(Int8Path path) {
  switch (path == Int8Path::kAuto ? best_path() : path) {
    case Int8Path::kVnni:
      return int8_detail::kInt8Vnni;
    case Int8Path::kAvx2:
      return int8_detail::kInt8Avx2;
    default:
      return kernel_generic;
  }
}

}  // namespace

void int8_detail::finish_rows(const int32_t* acc, int64_t ldacc, int rows, const Int8Out& to) {
  for (int r = 0; r < rows; ++r) {
    float* o = to.out + r * to.ldout;
    const int32_t* a = acc + r * ldacc;
    const float si = to.sa[r];
    if (to.bias != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < to.cols; ++c) o[c] = std::fma(static_cast<float>(a[c]), si * to.sw[c], to.bias[c]);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < to.cols; ++c) o[c] = std::fma(static_cast<float>(a[c]), si * to.sw[c], 0.0f);
    }
  }
}

Int8Weight make_int8_weight(int64_t k, int64_t m) {
  LOOM_CHECK(k >= 1 && m >= 1);
  Int8Weight w;
  w.k = k;
  w.m = m;
  w.k_padded = (k + kInt8Pad - 1) / kInt8Pad * kInt8Pad;
  w.m_padded = (m + kInt8Tile - 1) / kInt8Tile * kInt8Tile;
  w.q = aligned_bytes(w.k_padded * w.m_padded);
  w.scale.assign(static_cast<size_t>(m), 0.0f);
  w.sum.assign(static_cast<size_t>(w.m_padded), 0);
  return w;
}

void finish_int8_weight(Int8Weight& w) {
  for (int64_t j = 0; j < w.m; ++j) {
    int32_t s = 0;
    for (int64_t p = 0; p < w.k; ++p) s += w.at(j, p);
    w.sum[j] = s;
  }
}

Int8Weight quantize_int8(const float* w, int64_t k, int64_t m, WeightLayout layout) {
  Int8Weight out = make_int8_weight(k, m);
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t j = 0; j < m; ++j) {
    const float* col = layout == WeightLayout::kKM ? w + j : w + j * k;
    out.scale[j] = quantize_row(col, k, layout == WeightLayout::kKM ? m : 1, q.data());
    for (int64_t p = 0; p < k; ++p) out.at(j, p) = q[p];
  }
  finish_int8_weight(out);
  return out;
}

void dequantize_channel(const Int8Weight& w, int64_t j, float* out) {
  const int8_t* q = &w.at(j, 0);  // then 4 bytes every 256 (Int8Weight's tiles)
  const float s = w.scale[j];
  for (int64_t p4 = 0; p4 < w.k_padded / 4; ++p4)
    for (int64_t i = 0; i < 4 && 4 * p4 + i < w.k; ++i)
      out[4 * p4 + i] = static_cast<float>(q[p4 * 4 * kInt8Tile + i]) * s;
}

void int8_matmul_forward(float* out, const float* inp, const Int8Weight& w, const float* bias, int64_t n,
                         float* gelu_out) {
  const int64_t k = w.k, m = w.m, kp = w.k_padded;
  if (n == 0) return;
  const int8_detail::Int8KernelFn kernel = kernel_of(g_path);
  const bool vnni = kernel == int8_detail::kInt8Vnni;
  thread_local QuantizedRows rows;
  rows.a.assign(static_cast<size_t>(n * kp), 0);
  rows.au.resize(vnni ? static_cast<size_t>(n * kp) : 0);
  rows.scale.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    rows.scale[i] = quantize_row(inp + i * k, k, 1, rows.a.data() + i * kp);
    if (vnni) offset_by_128(rows.a.data() + i * kp, kp, rows.au.data() + i * kp);
  }
  const int8_t* qa = rows.a.data();
  const uint8_t* qu = rows.au.data();
  const float* sa = rows.scale.data();
  const int64_t tiles = w.m_padded / kInt8Tile;
  const auto one_tile = [&](int64_t t) {
    const int64_t j0 = t * kInt8Tile, cols = std::min(kInt8Tile, m - j0);
    // The rows in passes of at most kRows, as even as they go: a short pass costs more per row.
    const int64_t passes = (n + kRows - 1) / kRows;
    for (int64_t q = 0, i0 = 0, count = 0; q < passes; ++q, i0 += count) {
      count = n / passes + (q < n % passes ? 1 : 0);
      const int8_detail::Int8Out to{.out = out + i0 * m + j0,
                                    .ldout = m,
                                    .sa = sa + i0,
                                    .sw = w.scale.data() + j0,
                                    .bias = bias != nullptr ? bias + j0 : nullptr,
                                    .cols = cols};
      kernel(kp, qa + i0 * kp, vnni ? qu + i0 * kp : nullptr, kp, static_cast<int>(count), w.tile(t), w.sum.data() + j0,
             to);
      if (gelu_out != nullptr)
        for (int64_t i = i0; i < i0 + count; ++i) gelu_forward_serial(gelu_out + i * m + j0, out + i * m + j0, cols);
    }
  };
  // As parallel.h decides (a team of one, a decoding lane, opens no region), with the work
  // counted as the multiply-adds / 64, one VNNI instruction's: a one-row product of gpt-mini
  // (at most 256 x 1024) stays on one thread, where two lost to the fork and join (1 thread
  // 4,401 tokens/s in loom sample, 2 threads 2,654).
  parallel_for(tiles, n * m * k / 64, one_tile);
}

bool int8_path_supported(Int8Path path) {
  switch (path) {
    case Int8Path::kVnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni");
    case Int8Path::kAvx2:
      return __builtin_cpu_supports("avx2");
    default:
      return true;
  }
}

const char* int8_path_name(Int8Path path) {
  switch (path) {
    case Int8Path::kVnni:
      return "avx512-vnni";
    case Int8Path::kAvx2:
      return "avx2";
    case Int8Path::kGeneric:
      return "generic";
    default:
      return "auto";
  }
}

std::vector<Int8Path> int8_supported_paths() {
  std::vector<Int8Path> paths;
  for (Int8Path p : {Int8Path::kVnni, Int8Path::kAvx2, Int8Path::kGeneric})
    if (int8_path_supported(p)) paths.push_back(p);
  return paths;
}

void set_int8_path(Int8Path path) {
  if (!int8_path_supported(path))
    throw InputError(cat("int8 kernel path ", int8_path_name(path), " needs ",
                         path == Int8Path::kVnni ? "AVX-512 VNNI" : "AVX2", ", which this CPU does not have"));
  g_path = path;
}

Int8Path int8_active_path() { return g_path == Int8Path::kAuto ? best_path() : g_path; }

}  // namespace loom::kernels
