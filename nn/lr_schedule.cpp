#include "nn/lr_schedule.hpp"

#include <cmath>
#include <string>

#include "dsl/error.hpp"

namespace tessera {

double warmup_cosine_lr(int64_t step, int64_t warmup_steps, int64_t total_steps, double peak, double minimum) {
  if (warmup_steps < 0 || warmup_steps > total_steps)
    throw Error("warmup_cosine_lr: need 0 <= warmup_steps (" + std::to_string(warmup_steps) + ") <= total_steps (" +
                std::to_string(total_steps) + ")");
  if (step < warmup_steps) return peak * double(step + 1) / double(warmup_steps);
  if (step >= total_steps) return minimum;
  const double progress = double(step - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  return minimum + 0.5 * (peak - minimum) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace tessera
