#include "nn/adam.hpp"

#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "nn/optimizer_state.hpp"

namespace tessera {

Adam::Adam(std::vector<Variable> vars, double learning_rate, double beta1, double beta2, double epsilon)
    : vars_(std::move(vars)),
      t_([&] {
        if (vars_.empty()) throw ShapeError("Adam: no variables to optimise");
        return zeros({}, Layout::replicated(vars_.front().layout().mesh(), 0));
      }()),
      lr_(learning_rate), beta1_(beta1), beta2_(beta2), epsilon_(epsilon) {
  for (const Variable& v : vars_) {
    m_.push_back(sharded_state_like(v));
    v_.push_back(sharded_state_like(v));
  }
}

void Adam::apply(const std::vector<Tensor>& grads) {
  check_gradients(vars_, grads, "Adam");
  Tensor t = t_.value() + 1.0;
  t_.assign(t);
  // Bias corrections from the step count, computed in the graph (scalars, replicated).
  Tensor correction1 = 1.0 - pow(beta1_, t), correction2 = 1.0 - pow(beta2_, t);
  for (size_t i = 0; i < vars_.size(); ++i) {
    // The gradient once, in the state's (sharded) layout: one reduce_scatter feeds both moments.
    const Tensor g = with_layout(grads[i], m_[i].layout());
    Tensor m = m_[i].value() * beta1_ + g * (1.0 - beta1_);
    Tensor v = v_[i].value() * beta2_ + square(g) * (1.0 - beta2_);
    m_[i].assign(m);
    v_[i].assign(v);
    vars_[i].assign(vars_[i].value() - (m / correction1) / (sqrt(v / correction2) + epsilon_) * lr_);
  }
}

}  // namespace tessera
