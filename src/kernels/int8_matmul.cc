// INT8 weights and their product: quantization, the generic kernel, the driver that splits
// channels over threads and the float steps every path shares. See int8_matmul.h.
#include "kernels/int8_matmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/pointwise.h"
#include "loom/error.h"

namespace loom::kernels {
namespace {

constexpr int kBlock = 4;  // rows and channels per kernel call

std::shared_ptr<int8_t[]> aligned_bytes(int64_t bytes) {
  const auto rounded = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  auto* p = static_cast<int8_t*>(std::aligned_alloc(64, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return std::shared_ptr<int8_t[]>(p, [](int8_t* q) { std::free(q); });
}

// Symmetric int8 of `n` values: q = round(x x 127 / max |x|), clamped; returns the scale
// max |x| / 127 (0 when every x is 0, and then every q is 0).
float quantize_row(const float* x, int64_t n, int64_t stride, int8_t* q) {
  float amax = 0;
  for (int64_t p = 0; p < n; ++p) amax = std::max(amax, std::fabs(x[p * stride]));
  if (!(amax > 0) || !std::isfinite(amax)) {
    std::fill(q, q + n, int8_t{0});
    return std::isfinite(amax) ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / amax;
  for (int64_t p = 0; p < n; ++p) {
    const float r = std::nearbyint(x[p * stride] * inv);
    q[p] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  return amax / 127.0f;
}

void kernel_generic(int64_t kp, const int8_t* const* a, const uint8_t* const* /*au*/, int rows, const int8_t* const* w,
                    const int32_t* /*sum*/, int cols, int32_t* acc, int64_t ldacc) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      int32_t s = 0;
      for (int64_t p = 0; p < kp; ++p) s += static_cast<int32_t>(a[r][p]) * static_cast<int32_t>(w[c][p]);
      acc[r * ldacc + c] = s;
    }
}

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

Int8Weight make_int8_weight(int64_t k, int64_t m) {
  LOOM_CHECK(k >= 1 && m >= 1);
  Int8Weight w;
  w.k = k;
  w.m = m;
  w.k_padded = (k + kInt8Pad - 1) / kInt8Pad * kInt8Pad;
  w.q = aligned_bytes(w.k_padded * m);
  w.scale.assign(static_cast<size_t>(m), 0.0f);
  w.sum.assign(static_cast<size_t>(m), 0);
  return w;
}

void finish_int8_weight(Int8Weight& w) {
  for (int64_t j = 0; j < w.m; ++j) {
    const int8_t* q = w.channel(j);
    int32_t s = 0;
    for (int64_t p = 0; p < w.k; ++p) s += q[p];
    w.sum[j] = s;
  }
}

Int8Weight quantize_int8(const float* w, int64_t k, int64_t m, WeightLayout layout) {
  Int8Weight out = make_int8_weight(k, m);
  for (int64_t j = 0; j < m; ++j) {
    const float* col = layout == WeightLayout::kKM ? w + j : w + j * k;
    out.scale[j] = quantize_row(col, k, layout == WeightLayout::kKM ? m : 1, out.channel(j));
  }
  finish_int8_weight(out);
  return out;
}

void dequantize_channel(const Int8Weight& w, int64_t j, float* out) {
  const int8_t* q = w.channel(j);
  for (int64_t p = 0; p < w.k; ++p) out[p] = static_cast<float>(q[p]) * w.scale[j];
}

void int8_matmul_forward(float* out, const float* inp, const Int8Weight& w, const float* bias, int64_t n,
                         float* gelu_out) {
  const int64_t k = w.k, m = w.m, kp = w.k_padded;
  if (n == 0) return;
  const int8_detail::Int8KernelFn kernel = kernel_of(g_path);
  const bool vnni = kernel == int8_detail::kInt8Vnni;
  // The input rows, quantized once: signed, and for VNNI also offset by 128 as unsigned.
  std::shared_ptr<int8_t[]> qa = aligned_bytes(n * kp);
  std::shared_ptr<int8_t[]> qu = vnni ? aligned_bytes(n * kp) : nullptr;
  std::vector<float> sa(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int8_t* row = qa.get() + i * kp;
    sa[i] = quantize_row(inp + i * k, k, 1, row);
    if (vnni) {
      auto* u = reinterpret_cast<uint8_t*>(qu.get() + i * kp);
      for (int64_t p = 0; p < kp; ++p) u[p] = static_cast<uint8_t>(row[p] + 128);
    }
  }
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  const bool parallel = !omp_in_parallel() && n * m * k >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t jb = 0; jb < blocks; ++jb) {
    const int64_t j0 = jb * kBlock;
    const int cols = static_cast<int>(std::min<int64_t>(kBlock, m - j0));
    // Missing channels repeat the last one (the kernels compute 4 x 4 and only the wanted
    // ones are read back).
    const int8_t* wp[kBlock];
    int32_t sums[kBlock];
    for (int c = 0; c < kBlock; ++c) {
      wp[c] = w.channel(j0 + std::min(c, cols - 1));
      sums[c] = w.sum[j0 + std::min(c, cols - 1)];
    }
    int32_t acc[kBlock * kBlock];
    for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlock, n - i0));
      const int8_t* ap[kBlock];
      const uint8_t* up[kBlock];
      for (int r = 0; r < kBlock; ++r) {
        const int64_t i = i0 + std::min(r, rows - 1);
        ap[r] = qa.get() + i * kp;
        up[r] = vnni ? reinterpret_cast<const uint8_t*>(qu.get() + i * kp) : nullptr;
      }
      kernel(kp, ap, up, rows, wp, sums, cols, acc, kBlock);
      for (int r = 0; r < rows; ++r) {
        float* o = out + (i0 + r) * m + j0;
        for (int c = 0; c < cols; ++c) {
          const float s = sa[i0 + r] * w.scale[j0 + c];
          o[c] = std::fma(static_cast<float>(acc[r * kBlock + c]), s, bias != nullptr ? bias[j0 + c] : 0.0f);
        }
        if (gelu_out != nullptr) gelu_forward_serial(gelu_out + (i0 + r) * m + j0, o, cols);
      }
    }
  }
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
