#include "nn/dense.hpp"

#include <cmath>
#include <string>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"

namespace tessera {

Dense::Dense(int64_t in_dim, int64_t out_dim, Layout weight_layout, uint64_t seed, Activation activation)
    : activation_(std::move(activation)) {
  const double limit = std::sqrt(6.0 / double(in_dim + out_dim));
  register_parameter("weight", Variable(random_uniform({in_dim, out_dim}, seed, weight_layout, -limit, limit)));
  register_parameter("bias", Variable(zeros({out_dim}, weight_layout.delete_axes({0}))));
}

std::vector<Tensor> Dense::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() != 1) throw Error("Dense: forward takes one input, got " + std::to_string(inputs.size()));
  Tensor z = matmul(inputs.front(), parameter_value("weight")) + parameter_value("bias");
  return {activation_ ? activation_(z) : z};
}

}  // namespace tessera
