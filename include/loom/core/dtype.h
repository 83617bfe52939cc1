// Element types of Loom tensors and the bf16/f16 conversions (round to nearest even).
//
// Numbers of DType are part of no file format (formats use names: "F32", "BF16", ...),
// but never renumber them anyway. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

enum class DType : uint8_t { kF32 = 0, kF64, kBF16, kF16, kI32, kI64, kU8, kU16, kI8 };

size_t dtype_size(DType t);
// Loom's short name: "f32", "bf16", ...
std::string_view dtype_name(DType t);
// The safetensors name: "F32", "BF16", ...
std::string_view safetensors_dtype_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view name);

// Round-to-nearest-even conversions; NaN stays NaN (quiet), infinities stay infinite.
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t x);

// Element i of a buffer of `t`, as a double (and back, rounding as the dtype does). For
// checks and tools, not hot loops.
double load_element(DType t, const void* data, size_t i);
void store_element(DType t, void* data, size_t i, double v);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kF32; }
template <>
constexpr DType dtype_of<double>() { return DType::kF64; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <>
constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <>
constexpr DType dtype_of<uint16_t>() { return DType::kU16; }
template <>
constexpr DType dtype_of<int8_t>() { return DType::kI8; }

}  // namespace loom
