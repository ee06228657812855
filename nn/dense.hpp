// The dense (fully connected) layer of the MNIST tutorial, as a Module.
#pragma once

#include <functional>
#include <vector>

#include "nn/module.hpp"

namespace tessera {

// y = activation(x @ weight + bias), parameters "weight" (in_dim, out_dim) and "bias" (out_dim).
// The weight's layout is a parameter (replicated for data parallelism, [unsharded, model] or
// [model, unsharded] for Megatron-style tensor parallelism); the bias takes
// weight_layout.delete_axes({0}). Weights are Xavier-uniform through stateless random numbers
// (the same values on any mesh); the bias starts at zero.
class Dense : public Module {
 public:
  using Activation = std::function<Tensor(const Tensor&)>;
  Dense(int64_t in_dim, int64_t out_dim, Layout weight_layout, uint64_t seed, Activation activation = nullptr);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;  // one input, one output

  // The current parameters (set_parameter may have replaced them).
  Variable weight() const { return get_parameter("weight"); }
  Variable bias() const { return get_parameter("bias"); }

 private:
  Activation activation_;
};

}  // namespace tessera
