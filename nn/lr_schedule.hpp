// Learning-rate schedules as plain functions of the step (set them on the optimizer between
// steps: AdamW::set_learning_rate).
#pragma once

#include <cstdint>

namespace tessera {

// Linear warmup from 0 to `peak` over `warmup_steps`, then a cosine decay to `minimum` at
// `total_steps` (and `minimum` after). Error unless 0 <= warmup_steps <= total_steps.
double warmup_cosine_lr(int64_t step, int64_t warmup_steps, int64_t total_steps, double peak, double minimum = 0.0);

}  // namespace tessera
