#include "nn/adam.hpp"

#include "dsl/user_frame.hpp"

namespace tessera {

Adam::Adam(std::vector<Variable> vars, double learning_rate, double beta1, double beta2, double epsilon)
    : state_(make_adam_state(std::move(vars), "Adam")), lr_(learning_rate), beta1_(beta1), beta2_(beta2), epsilon_(epsilon) {}

void Adam::apply(const std::vector<Tensor>& grads, SourceLocation where) {
  const UserCallScope caller(where);
  adam_update(state_, grads, lr_, beta1_, beta2_, epsilon_, 0.0, "Adam");
}

}  // namespace tessera
