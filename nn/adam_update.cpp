#include "nn/adam_update.hpp"

#include "dsl/error.hpp"
#include "nn/optimizer_state.hpp"

namespace tessera {

AdamState make_adam_state(std::vector<Variable> vars, const char* who) {
  if (vars.empty()) throw ShapeError(std::string(who) + ": no variables to optimise");
  // The step count in float64: bias corrections such as 1 - 0.999^t lose 1e-5 of their value in
  // float32 (PyTorch computes them in double too).
  AdamState s{{}, {}, {}, Variable(zeros({}, Layout::replicated(vars.front().layout().mesh(), 0), DType::f64))};
  for (const Variable& v : vars) {
    s.first_moments.push_back(sharded_state_like(v));
    s.second_moments.push_back(sharded_state_like(v));
  }
  s.vars = std::move(vars);
  return s;
}

void adam_update(AdamState& s, const std::vector<Tensor>& grads, const Operand& lr, double beta1, double beta2, double epsilon,
                 double weight_decay, const char* who) {
  check_gradients(s.vars, grads, who);
  Tensor t = s.step.value() + 1.0;
  s.step.assign(t);
  // Bias corrections from the step count, computed in the graph (scalars, replicated).
  Tensor correction1 = 1.0 - pow(beta1, t), correction2 = 1.0 - pow(beta2, t);
  for (size_t i = 0; i < s.vars.size(); ++i) {
    // The scalars, computed in float64, in the variable's dtype.
    const DType dtype = s.vars[i].value().dtype();
    const Tensor c1 = cast(correction1, dtype), c2 = cast(correction2, dtype);
    const Operand rate = lr.tensor ? Operand(cast(*lr.tensor, dtype)) : lr;
    const Tensor g = with_layout(grads[i], s.first_moments[i].layout());
    Tensor m = s.first_moments[i].value() * beta1 + g * (1.0 - beta1);
    Tensor v = s.second_moments[i].value() * beta2 + square(g) * (1.0 - beta2);
    s.first_moments[i].assign(m);
    s.second_moments[i].assign(v);
    Tensor var = s.vars[i].value();
    if (weight_decay != 0.0) var = var - var * rate * weight_decay;
    s.vars[i].assign(var - (m / c1) / (sqrt(v / c2) + epsilon) * rate);
  }
}

}  // namespace tessera
