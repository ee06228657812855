#include "dsl/dtype.hpp"

#include <bit>
#include <cmath>

#include "dsl/error.hpp"

namespace tessera {

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::bf16: case DType::f16: return 2;
  }
  throw InternalError("dtype_size: bad dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "bool";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  throw InternalError("dtype_name: bad dtype");
}

DType dtype_from_name(std::string_view name) {
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8, DType::bf16, DType::f16})
    if (dtype_name(d) == name) return d;
  if (name == "uint8") return DType::u8;
  throw DTypeError("unknown dtype name '" + std::string(name) +
                   "' (expected float32, float64, int32, int64, bool, bfloat16 or float16)");
}

bool is_16_bit_float(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16;
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return uint16_t((bits >> 16) | 0x40);  // keep it a quiet NaN
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return uint16_t((bits + rounding) >> 16);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal half: normalise into a float
      int shift = 0;
      while (!(mantissa & 0x400)) { mantissa <<= 1; ++shift; }
      mantissa &= 0x3ff;
      bits = sign | uint32_t(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  uint32_t abs_bits = bits & 0x7fffffff;
  if (abs_bits >= 0x7f800000) return sign | (abs_bits > 0x7f800000 ? 0x7e00 : 0x7c00);
  if (abs_bits >= 0x477ff000) return sign | 0x7c00;  // rounds past the largest half: inf
  if (abs_bits < 0x38800000) {                        // below the smallest normal half
    if (abs_bits < 0x33000000) return sign;           // rounds to zero
    uint32_t exponent = abs_bits >> 23;
    uint32_t mantissa = (abs_bits & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exponent;  // value = half * 2^-24 = mantissa * 2^(exponent - 150)
    uint32_t half = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1))) ++half;
    return sign | uint16_t(half);
  }
  uint32_t rounded = abs_bits + 0xfff + ((abs_bits >> 13) & 1);
  return sign | uint16_t((rounded - (112u << 23)) >> 13);
}

double load_as_double(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f64: return static_cast<const double*>(data)[i];
    case DType::i32: return static_cast<const int32_t*>(data)[i];
    case DType::i64: return double(static_cast<const int64_t*>(data)[i]);
    case DType::u8: return static_cast<const uint8_t*>(data)[i];
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  throw InternalError("load_as_double: bad dtype");
}

void store_from_double(void* data, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[i] = float(v); return;
    case DType::f64: static_cast<double*>(data)[i] = v; return;
    case DType::i32: static_cast<int32_t*>(data)[i] = int32_t(v); return;
    case DType::i64: static_cast<int64_t*>(data)[i] = int64_t(v); return;
    case DType::u8: static_cast<uint8_t*>(data)[i] = uint8_t(v != 0); return;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = float_to_bf16(float(v)); return;
    case DType::f16: static_cast<uint16_t*>(data)[i] = float_to_f16(float(v)); return;
  }
  throw InternalError("store_from_double: bad dtype");
}

}  // namespace tessera
