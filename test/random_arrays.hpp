// Random float64 arrays for the tests' inputs (uniform in [lo, hi)).
#pragma once

#include <random>
#include <vector>

#include "dsl/array.hpp"

namespace tessera::testing {

Array random_f64(const std::vector<int64_t>& shape, std::mt19937& rng, double lo = -1.5, double hi = 1.5);

}  // namespace tessera::testing
