#include "comm/reduce.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "comm/copy.h"

namespace loom::comm {
namespace {

// Inline twins of dtype.h's conversions, so the loops below vectorize.
inline float bf16_f32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }
inline uint16_t f32_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct Bf16 {
  static float load(uint16_t x) { return bf16_f32(x); }
  static uint16_t store(float x) { return f32_bf16(x); }
};
struct F16 {
  static float load(uint16_t x) { return f16_to_f32(x); }
  static uint16_t store(float x) { return f32_to_f16(x); }
};

template <typename T>
inline T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(a + b);
    case ReduceOp::kProd: return static_cast<T>(a * b);
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  return a;
}

// One loop per op so each body is a plain vectorizable loop.
template <typename T>
void into_native(T* __restrict acc, const T* __restrict in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + in[i]);
      return;
    case ReduceOp::kProd:
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] * in[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = in[i] < acc[i] ? in[i] : acc[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = in[i] > acc[i] ? in[i] : acc[i];
      return;
  }
}

template <typename H>
void into_half(uint16_t* __restrict acc, const uint16_t* __restrict in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) acc[i] = H::store(combine(H::load(acc[i]), H::load(in[i]), op));
}

constexpr size_t kBlock = 1024;  // elements per f32 accumulation block

template <typename T>
void avg_native(T* buf, size_t count, int n) {
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(buf[i] / static_cast<T>(n));
}

// A finished block to out: streaming stores (into memory) or ordinary ones (into the cache).
void write_block(void* out, const void* block, size_t bytes, bool stream) {
  if (stream) {
    stream_copy(out, block, bytes);
  } else {
    copy_bytes(out, block, bytes);
  }
}

template <typename T>
void many_native(T* out, T* out2, const void* const* ins, int n, size_t count, ReduceOp op, bool stream_out) {
  // Block-wise so the partial result stays in L1 while each input streams past once.
  for (size_t b = 0; b < count; b += kBlock) {
    size_t m = std::min(kBlock, count - b);
    T tmp[kBlock];
    copy_bytes(tmp, static_cast<const T*>(ins[0]) + b, m * sizeof(T));
    for (int k = 1; k < n; ++k) into_native(tmp, static_cast<const T*>(ins[k]) + b, m, op);
    if (op == ReduceOp::kAvg) avg_native(tmp, m, n);
    write_block(out + b, tmp, m * sizeof(T), stream_out);
    if (out2) copy_bytes(out2 + b, tmp, m * sizeof(T));
  }
}

template <typename H>
void many_half(uint16_t* out, uint16_t* out2, const void* const* ins, int n, size_t count, ReduceOp op,
               bool stream_out) {
  for (size_t b = 0; b < count; b += kBlock) {
    size_t m = std::min(kBlock, count - b);
    float tmp[kBlock];
    const auto* first = static_cast<const uint16_t*>(ins[0]) + b;
    for (size_t i = 0; i < m; ++i) tmp[i] = H::load(first[i]);
    for (int k = 1; k < n; ++k) {
      const auto* in = static_cast<const uint16_t*>(ins[k]) + b;
      for (size_t i = 0; i < m; ++i) tmp[i] = combine(tmp[i], H::load(in[i]), op);
    }
    if (op == ReduceOp::kAvg)
      for (size_t i = 0; i < m; ++i) tmp[i] /= static_cast<float>(n);
    uint16_t bits[kBlock];
    for (size_t i = 0; i < m; ++i) bits[i] = H::store(tmp[i]);
    write_block(out + b, bits, m * sizeof(uint16_t), stream_out);
    if (out2) copy_bytes(out2 + b, bits, m * sizeof(uint16_t));
  }
}

}  // namespace

void check_reducible(DType dtype, ReduceOp op) {
  if (dtype == DType::kU16 || dtype == DType::kI8)
    throw InputError(cat("reduction ", reduce_op_name(op), " is not supported on ", dtype_name(dtype)));
}

void reduce_into(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32: return into_native(static_cast<float*>(acc), static_cast<const float*>(in), count, op);
    case DType::kF64: return into_native(static_cast<double*>(acc), static_cast<const double*>(in), count, op);
    case DType::kI32: return into_native(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), count, op);
    case DType::kI64: return into_native(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), count, op);
    case DType::kU8: return into_native(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), count, op);
    case DType::kBF16:
      return into_half<Bf16>(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), count, op);
    case DType::kF16:
      return into_half<F16>(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(in), count, op);
    case DType::kU16:
    case DType::kI8: break;
  }
  check_reducible(dtype, op);
}

void reduce_many(void* out, const void* const* ins, int n, size_t count, DType dtype, ReduceOp op,
                 void* out2, bool stream_out) {
  switch (dtype) {
    case DType::kF32:
      return many_native(static_cast<float*>(out), static_cast<float*>(out2), ins, n, count, op, stream_out);
    case DType::kF64:
      return many_native(static_cast<double*>(out), static_cast<double*>(out2), ins, n, count, op, stream_out);
    case DType::kI32:
      return many_native(static_cast<int32_t*>(out), static_cast<int32_t*>(out2), ins, n, count, op, stream_out);
    case DType::kI64:
      return many_native(static_cast<int64_t*>(out), static_cast<int64_t*>(out2), ins, n, count, op, stream_out);
    case DType::kU8:
      return many_native(static_cast<uint8_t*>(out), static_cast<uint8_t*>(out2), ins, n, count, op, stream_out);
    case DType::kBF16:
      return many_half<Bf16>(static_cast<uint16_t*>(out), static_cast<uint16_t*>(out2), ins, n, count, op, stream_out);
    case DType::kF16:
      return many_half<F16>(static_cast<uint16_t*>(out), static_cast<uint16_t*>(out2), ins, n, count, op, stream_out);
    case DType::kU16:
    case DType::kI8: break;
  }
  check_reducible(dtype, op);
}

void finish_avg(void* buf, size_t count, DType dtype, int n) {
  switch (dtype) {
    case DType::kF32: return avg_native(static_cast<float*>(buf), count, n);
    case DType::kF64: return avg_native(static_cast<double*>(buf), count, n);
    case DType::kI32: return avg_native(static_cast<int32_t*>(buf), count, n);
    case DType::kI64: return avg_native(static_cast<int64_t*>(buf), count, n);
    case DType::kU8: return avg_native(static_cast<uint8_t*>(buf), count, n);
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = f32_bf16(bf16_f32(p[i]) / static_cast<float>(n));
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = f32_to_f16(f16_to_f32(p[i]) / static_cast<float>(n));
      return;
    }
    case DType::kU16:
    case DType::kI8: check_reducible(dtype, ReduceOp::kAvg);
  }
}

}  // namespace loom::comm
