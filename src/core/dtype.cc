#include "loom/core/dtype.h"

#include <bit>
#include <cmath>

#include "loom/core/error.h"

namespace loom {
namespace {

struct DTypeInfo {
  DType type;
  size_t size;
  std::string_view name;
  std::string_view st_name;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kF32, 4, "f32", "F32"},  {DType::kF64, 8, "f64", "F64"},
    {DType::kBF16, 2, "bf16", "BF16"}, {DType::kF16, 2, "f16", "F16"},
    {DType::kI32, 4, "i32", "I32"},  {DType::kI64, 8, "i64", "I64"},
    {DType::kU8, 1, "u8", "U8"},     {DType::kU16, 2, "u16", "U16"},
    {DType::kI8, 1, "i8", "I8"},
};

const DTypeInfo& info(DType t) {
  auto i = static_cast<size_t>(t);
  LOOM_CHECK_LT(i, std::size(kInfo));
  return kInfo[i];
}

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view safetensors_dtype_name(DType t) { return info(t).st_name; }

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.st_name == name) return i.type;
  return std::nullopt;
}

uint16_t f32_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_to_f32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

uint16_t f32_to_f16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in f16: scale so the f16 subnormal unit (2^-24) becomes 1.0 and
    // let the FPU's round-to-nearest-even do the work.
    float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
}

float f16_to_f32(uint16_t x) {
  uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16;
  uint32_t exp = (x >> 10) & 0x1fu;
  uint32_t mant = x & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

double load_element(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kU16: return static_cast<const uint16_t*>(p)[i];
    case DType::kI8: return static_cast<const int8_t*>(p)[i];
  }
  return 0;
}

void store_element(DType t, void* p, size_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::kF64: static_cast<double*>(p)[i] = v; return;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v)); return;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v)); return;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::kI64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
    case DType::kU16: static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); return;
    case DType::kI8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); return;
  }
}

}  // namespace loom
