// Zeroing the sums a host loop carries between calls (gradient accumulation,
// nn/transformer_training_step.hpp; 1F1B's tick loop, nn/pipeline_tick_loop.hpp).
#pragma once

#include <vector>

#include "dsl/variable.hpp"

namespace tessera {

// Assigns each variable zeros of its own (tagged_full, dsl/ops.hpp): one zeros node for all
// would leave them sharing a buffer, which the next call could not add into in place.
void zero_sums(const std::vector<Variable*>& sums);

}  // namespace tessera
