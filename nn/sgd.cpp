#include "nn/sgd.hpp"

#include "dsl/user_frame.hpp"

#include "dsl/ops.hpp"
#include "nn/optimizer_state.hpp"

namespace tessera {

SGD::SGD(std::vector<Variable> vars, double learning_rate, double momentum)
    : vars_(std::move(vars)), lr_(learning_rate), momentum_(momentum) {
  if (momentum_ != 0)
    for (const Variable& v : vars_) velocity_.push_back(sharded_state_like(v));
}

void SGD::apply(const std::vector<Tensor>& grads, SourceLocation where) {
  const UserCallScope caller(where);
  check_gradients(vars_, grads, "SGD");
  for (size_t i = 0; i < vars_.size(); ++i) {
    Tensor step = grads[i];
    if (momentum_ != 0) {
      Tensor velocity = velocity_[i].value() * momentum_ + with_layout(grads[i], velocity_[i].layout());
      velocity_[i].assign(velocity);
      step = velocity;
    }
    vars_[i].assign(vars_[i].value() - step * lr_);
  }
}

}  // namespace tessera
