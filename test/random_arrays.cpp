#include "random_arrays.hpp"

namespace tessera::testing {

Array random_f64(const std::vector<int64_t>& shape, std::mt19937& rng, double lo, double hi) {
  Array a(shape, DType::f64);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<double>()[i] = dist(rng);
  return a;
}

}  // namespace tessera::testing
