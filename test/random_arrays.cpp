#include "random_arrays.hpp"

#include <algorithm>
#include <cmath>

#include "dsl/error.hpp"

namespace tessera::testing {

Array random_f64(const std::vector<int64_t>& shape, std::mt19937& rng, double lo, double hi) {
  Array a(shape, DType::f64);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<double>()[i] = dist(rng);
  return a;
}

Array random_f32(const std::vector<int64_t>& shape, std::mt19937& rng, float lo, float hi) {
  Array a(shape, DType::f32);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = dist(rng);
  return a;
}

double max_difference(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) throw Error("max_difference: arrays of different shapes");
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.element_as_double(i) - b.element_as_double(i)));
  return m;
}

}  // namespace tessera::testing
