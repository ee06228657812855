#include "nn/adamw.hpp"

#include "dsl/user_frame.hpp"

#include "jit/api/tensor_api.hpp"

namespace tessera {

AdamW::AdamW(std::vector<Variable> vars, double learning_rate, double beta1, double beta2, double epsilon, double weight_decay)
    : state_(make_adam_state(std::move(vars), "AdamW")),
      lr_(full({}, learning_rate, Layout::replicated(state_.step.layout().mesh(), 0), DType::f64)),
      lr_value_(learning_rate), beta1_(beta1), beta2_(beta2), epsilon_(epsilon), weight_decay_(weight_decay) {}

void AdamW::set_learning_rate(double learning_rate) {
  lr_value_ = learning_rate;
  // A computed value, not full(): a Full node's scalar is part of the program that computes it,
  // so every new rate would compile (and keep) a program of its own.
  lr_.assign(copy_to_mesh(Array::scalar<double>(learning_rate), lr_.layout()));
}

void AdamW::apply(const std::vector<Tensor>& grads, SourceLocation where) {
  const UserCallScope caller(where);
  adam_update(state_, grads, lr_.value(), beta1_, beta2_, epsilon_, weight_decay_, "AdamW");
}

}  // namespace tessera
