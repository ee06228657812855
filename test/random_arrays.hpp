// Random arrays for the tests' inputs (uniform in [lo, hi)), and how far two arrays are apart.
#pragma once

#include <random>
#include <vector>

#include "dsl/array.hpp"

namespace tessera::testing {

Array random_f64(const std::vector<int64_t>& shape, std::mt19937& rng, double lo = -1.5, double hi = 1.5);
Array random_f32(const std::vector<int64_t>& shape, std::mt19937& rng, float lo = -2, float hi = 2);

// The largest absolute difference of two arrays of one shape (any dtypes), as doubles.
double max_difference(const Array& a, const Array& b);

}  // namespace tessera::testing
