#include "dsl/layers.hpp"

#include <cmath>

namespace tessera {

Dense::Dense(int64_t in_dim, int64_t out_dim, Layout weight_layout, uint64_t seed, Activation activation)
    : weight([&] {
        const double limit = std::sqrt(6.0 / double(in_dim + out_dim));
        return random_uniform({in_dim, out_dim}, seed, weight_layout, -limit, limit);
      }()),
      bias(zeros({out_dim}, weight_layout.delete_axes({0}))),
      activation_(std::move(activation)) {}

Tensor Dense::operator()(const Tensor& x) const {
  Tensor z = matmul(x, weight.value()) + bias.value();
  return activation_ ? activation_(z) : z;
}

Tensor accuracy(const Tensor& logits, const Tensor& labels, Loc where) {
  Tensor predicted = argmax(logits, -1, where);
  Tensor hit = cast(predicted == Operand(cast(labels, DType::i64, where), where), DType::f32, where);
  return reduce_mean(hit, {}, false, where);
}

}  // namespace tessera
