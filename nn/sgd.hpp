// SGD with momentum. Its state lives in Variables, so apply() works eagerly and inside jit
// (where each variable's update is one fused kernel); the velocity is sharded as
// nn/optimizer_state.hpp says (ZeRO stage 1).
#pragma once

#include <vector>

#include "dsl/variable.hpp"

namespace tessera {

// w -= lr * (momentum * velocity + g), velocity = momentum * velocity + g (PyTorch's SGD).
// `vars` may be a Module's parameters(); build the optimizer after distribute_module, which
// replaces them.
class SGD {
 public:
  SGD(std::vector<Variable> vars, double learning_rate, double momentum = 0);
  // The update ops are reported at `where`, the caller's line (dsl/user_frame.hpp).
  void apply(const std::vector<Tensor>& grads, SourceLocation where = SourceLocation::current());

 private:
  std::vector<Variable> vars_, velocity_;
  double lr_, momentum_;
};

}  // namespace tessera
