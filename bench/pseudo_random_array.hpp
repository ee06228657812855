// f32 arrays of values in [-1, 1] from a 64-bit LCG: the same inputs in every run of a
// benchmark, made without a dataset or a random engine's cost per element.
#pragma once

#include <cstdint>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::bench {

inline Array pseudo_random_array(const std::vector<int64_t>& shape, uint64_t seed) {
  Array a(shape, DType::f32);
  uint64_t s = seed;
  for (int64_t i = 0; i < a.numel(); ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    a.mutable_data<float>()[i] = float(int64_t(s >> 40) % 2001 - 1000) / 1000.0f;
  }
  return a;
}

}  // namespace tessera::bench
