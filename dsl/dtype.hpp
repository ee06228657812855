// Element types, their sizes and names, and the 16-bit float conversions.
// bf16 and f16 are storage formats: arithmetic converts them to float.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessera {

enum class DType { f32, f64, i32, i64, u8 /* bool */, bf16, f16 };

int64_t dtype_size(DType dtype);
// TensorFlow's names: float32, float64, int32, int64, bool, bfloat16, float16.
std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name);  // DTypeError for an unknown name
bool is_floating(DType dtype);
bool is_16_bit_float(DType dtype);  // bf16 or f16

// Storage types of the two 16-bit floats (raw bits).
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);  // round to nearest even, NaN kept quiet
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);   // round to nearest even, overflow to inf

// C++ type -> DType, for templates (Array::from<T>, to_vector<T>).
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::u8; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16_t>() { return DType::f16; }

// Reads element `index` of a buffer of `dtype` as double / writes a double into it.
double load_as_double(const void* data, DType dtype, int64_t index);
void store_from_double(void* data, DType dtype, int64_t index, double value);

}  // namespace tessera
