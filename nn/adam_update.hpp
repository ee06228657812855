// What Adam and AdamW share: their state (moments sharded as nn/optimizer_state.hpp says, and a
// scalar step count, so bias correction stays right when a step is traced once and replayed)
// and the update itself.
#pragma once

#include <vector>

#include "dsl/ops.hpp"
#include "dsl/variable.hpp"

namespace tessera {

struct AdamState {
  std::vector<Variable> vars, first_moments, second_moments;
  Variable step;
};

// ShapeError naming `who` when there is nothing to optimise.
AdamState make_adam_state(std::vector<Variable> vars, const char* who);

// One step (Kingma & Ba, with bias correction): the moments from each gradient, taken once in
// the state's sharded layout (one reduce_scatter feeds both), then each variable moved by
// lr * m_hat / (sqrt(v_hat) + epsilon), after decoupled weight decay var *= 1 - lr * decay
// (Loshchilov & Hutter's AdamW) when `weight_decay` is not zero.
void adam_update(AdamState& state, const std::vector<Tensor>& grads, const Operand& learning_rate, double beta1, double beta2,
                 double epsilon, double weight_decay, const char* who);

}  // namespace tessera
