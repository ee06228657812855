// Adam. Its state lives in Variables, so apply() works eagerly and inside jit (where each
// variable's update is one fused kernel); the moments are sharded as nn/optimizer_state.hpp says
// (ZeRO stage 1). The step count is a scalar Variable, so bias correction stays correct when
// the step is traced once and replayed.
#pragma once

#include <vector>

#include "dsl/variable.hpp"
#include "nn/adam_update.hpp"

namespace tessera {

// Adam with bias correction (Kingma & Ba; the tutorial's formulation). `vars` may be a Module's
// parameters(); build the optimizer after distribute_module, which replaces them.
class Adam {
 public:
  Adam(std::vector<Variable> vars, double learning_rate = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double epsilon = 1e-7);
  // The update ops are reported at `where`, the caller's line (dsl/user_frame.hpp).
  void apply(const std::vector<Tensor>& grads, SourceLocation where = SourceLocation::current());
  const std::vector<Variable>& first_moments() const { return state_.first_moments; }
  const std::vector<Variable>& second_moments() const { return state_.second_moments; }
  const Variable& step() const { return state_.step; }

 private:
  AdamState state_;
  double lr_, beta1_, beta2_, epsilon_;
};

}  // namespace tessera
