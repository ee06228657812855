// What a loop target offers kernel lowering (tinygrad's renderers and Halide's Target features
// are the models): codegen/lower_kernel.cpp and codegen/reduction_strategy.cpp ask for these,
// never for the target by name, so a new target states what it can do in one place.
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera {

struct LoopCapabilities {
  // The range loop's iterations are threads, thousands at once (a GPU's grid), where a CPU
  // splits them over a few cores and vectorises the inner loops: a nest's leading axes flatten
  // into one range loop, a column reduction runs a thread per output element, a long reduction
  // is not inlined into every thread that reads it, and loops a CPU runs in order
  // (scatter_add_rows, check_index) are spread over threads.
  bool thread_per_iteration = false;
  // A group of threads (a warp, a block) may split a loop and combine its partial results
  // (kir LoopKind::Lanes): a reduction may run a warp or a block per output element.
  bool lanes = false;
};

// The CPU: neither. CUDA: both.
LoopCapabilities loop_capabilities(kir::LoopTarget target);

}  // namespace tessera
