#include "nn/rotary.hpp"

#include <cmath>
#include <string>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

int64_t checked_half_dim(const TransformerConfig& config) {
  const int64_t head_dim = checked_transformer_config(config).head_dim();
  if (head_dim % 2 != 0)
    throw ShapeError("rotary embeddings rotate pairs of dims: head_dim " + std::to_string(head_dim) + " (dim " +
                     std::to_string(config.dim) + " / heads " + std::to_string(config.heads) + ") is odd");
  return head_dim / 2;
}

// Llama 3's apply_scaling, on a tensor of inverse frequencies (f32, on the devices). It is
// continuous across both thresholds, so values within an ulp of one agree with the host's.
Tensor llama3_scaled(const Tensor& inv_freq, const RopeScaling& s) {
  const double original = double(s.original_max_position);
  const Tensor wavelength = (2 * M_PI) / inv_freq;
  const Tensor smooth = (inv_freq * (original / (2 * M_PI)) - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const Tensor blended = (1.0 - smooth) * (inv_freq / s.factor) + smooth * inv_freq;
  const Tensor long_waves = where(wavelength > original / s.low_freq_factor, inv_freq / s.factor, blended);
  return where(wavelength < original / s.high_freq_factor, inv_freq, long_waves);
}

}  // namespace

std::vector<double> rotary_inverse_frequencies(const TransformerConfig& config) {
  const int64_t half = checked_half_dim(config);
  std::vector<double> inv(size_t(half), 0.0);
  for (int64_t i = 0; i < half; ++i) {
    double f = std::pow(config.rope_theta, -double(2 * i) / double(2 * half));
    if (const auto& s = config.rope_scaling) {
      const double wavelength = 2 * M_PI / f, original = double(s->original_max_position);
      if (wavelength > original / s->low_freq_factor) f /= s->factor;
      else if (wavelength >= original / s->high_freq_factor) {
        const double smooth = (original / wavelength - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
        f = (1 - smooth) * f / s->factor + smooth * f;
      }
    }
    inv[size_t(i)] = f;
  }
  return inv;
}

RotaryTables rotary_tables(const TransformerConfig& config, int64_t seq, const Mesh& mesh) {
  const int64_t half = checked_half_dim(config);
  if (seq < 1) throw ShapeError("rotary_tables: seq must be at least 1, got " + std::to_string(seq));
  // theta^(-2i / head_dim) = exp(i * (-2 ln theta / head_dim)), from an iota over i.
  const Tensor index = cast(iota({1, half}, 1, Layout::replicated(mesh, 2)), DType::f32);
  Tensor inv_freq = exp(index * (-2.0 * std::log(config.rope_theta) / double(2 * half)));
  if (config.rope_scaling) inv_freq = llama3_scaled(inv_freq, *config.rope_scaling);
  const Tensor positions = cast(iota({seq, 1}, 0, Layout::replicated(mesh, 2)), DType::f32);
  const Tensor angles = positions * inv_freq;  // [seq, half]
  return {cos(angles), sin(angles)};
}

Tensor apply_rotary(const Tensor& x, const RotaryTables& tables) {
  const int64_t r = x.rank();
  if (r < 4) throw ShapeError("apply_rotary: x must be [..., batch, seq, heads, head_dim], got " + shape_string(x.shape()));
  const std::vector<int64_t>& shape = x.shape();
  const int64_t t = shape[size_t(r - 3)], d = shape[size_t(r - 1)], half = d / 2;
  if (d % 2 != 0 || tables.cos.rank() != 2 || tables.cos.shape()[1] != half || tables.cos.shape()[0] < t)
    throw ShapeError("apply_rotary: tables " + shape_string(tables.cos.shape()) + " do not cover x " + shape_string(x.shape()) +
                     " (they need [>= seq, head_dim / 2])");
  // [seq, half] -> [1, ..., seq, 1, half]: broadcast over the leading axes and the heads.
  std::vector<int64_t> table_shape(size_t(r), 1);
  table_shape[size_t(r - 3)] = t, table_shape[size_t(r - 1)] = half;
  auto table = [&](const Tensor& full) { return reshape(slice(full, {0, 0}, {t, half}), table_shape); };
  const Tensor c = cast(table(tables.cos), x.dtype()), s = cast(table(tables.sin), x.dtype());
  std::vector<int64_t> begin(size_t(r), 0), size = shape;
  size.back() = half;
  const Tensor x1 = slice(x, begin, size);
  begin.back() = half;
  const Tensor x2 = slice(x, begin, size);
  return concat({x1 * c - x2 * s, x1 * s + x2 * c}, r - 1);
}

}  // namespace tessera
