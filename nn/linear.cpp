#include "nn/linear.hpp"

#include <cmath>
#include <string>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"

namespace tessera {

Linear::Linear(int64_t in_dim, int64_t out_dim, const Mesh& mesh, uint64_t seed, bool bias) : bias_(bias) {
  if (in_dim < 1 || out_dim < 1)
    throw ShapeError("Linear: in_dim and out_dim must be at least 1, got " + std::to_string(in_dim) + " and " + std::to_string(out_dim));
  const double bound = 1.0 / std::sqrt(double(in_dim));
  register_parameter("weight", Variable(random_uniform({in_dim, out_dim}, seed, Layout::replicated(mesh, 2), -bound, bound)));
  if (bias_) register_parameter("bias", Variable(random_uniform({out_dim}, seed + 1, Layout::replicated(mesh, 1), -bound, bound)));
}

std::vector<Tensor> Linear::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 1) throw Error("Linear: forward takes one input, got " + std::to_string(inputs.size()));
  Tensor y = matmul(inputs.front(), parameter_value("weight"));
  if (bias_) y = y + parameter_value("bias");
  return {y};
}

}  // namespace tessera
