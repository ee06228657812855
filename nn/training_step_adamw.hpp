// The AdamW every training step builds (TransformerTrainingStep, PipelinedTransformerTrainingStep,
// ModelTrainingStep): GPT-3's and torchtitan's settings, learning rate 3e-4, betas (0.9, 0.95),
// eps 1e-8, weight decay 0.1. One place, so that plans of the three steps price the same update.
#pragma once

#include <utility>
#include <vector>

#include "nn/adamw.hpp"

namespace tessera {

inline AdamW training_step_adamw(std::vector<Variable> params) { return AdamW(std::move(params), 3e-4, 0.9, 0.95, 1e-8, 0.1); }

}  // namespace tessera
