// AdamW (PyTorch's defaults): Adam with decoupled weight decay. Its learning rate is a scalar
// Variable, so a schedule that sets it between steps (nn/lr_schedule.hpp) also drives a step
// traced once by jit.
#pragma once

#include <vector>

#include "dsl/variable.hpp"
#include "nn/adam_update.hpp"

namespace tessera {

class AdamW {
 public:
  AdamW(std::vector<Variable> vars, double learning_rate = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double epsilon = 1e-8, double weight_decay = 1e-2);
  // The update ops are reported at `where`, the caller's line (dsl/user_frame.hpp).
  void apply(const std::vector<Tensor>& grads, SourceLocation where = SourceLocation::current());
  void set_learning_rate(double learning_rate);
  double learning_rate() const { return lr_value_; }
  const std::vector<Variable>& first_moments() const { return state_.first_moments; }
  const std::vector<Variable>& second_moments() const { return state_.second_moments; }
  const Variable& step() const { return state_.step; }

 private:
  AdamState state_;
  Variable lr_;
  double lr_value_, beta1_, beta2_, epsilon_, weight_decay_;
};

}  // namespace tessera
