// Small model helpers of the MNIST tutorial: a dense layer and the accuracy metric.
#pragma once

#include <functional>
#include <vector>

#include "dsl/ops.hpp"
#include "dsl/variable.hpp"

namespace tessera {

// y = activation(x @ w + b). The weight's layout is a parameter (replicated for data parallelism,
// [unsharded, model] or [model, unsharded] for Megatron-style tensor parallelism); the bias
// takes weight_layout.delete_axes({0}). Weights are Xavier-uniform through stateless random
// numbers (the same values on any mesh); the bias starts at zero.
class Dense {
 public:
  using Activation = std::function<Tensor(const Tensor&)>;
  Dense(int64_t in_dim, int64_t out_dim, Layout weight_layout, uint64_t seed, Activation activation = nullptr);
  Tensor operator()(const Tensor& x) const;
  std::vector<Variable> variables() const { return {weight, bias}; }

  Variable weight, bias;

 private:
  Activation activation_;
};

// Fraction of rows whose argmax over the last axis equals the label.
Tensor accuracy(const Tensor& logits, const Tensor& labels, Loc where = Loc::current());

}  // namespace tessera
