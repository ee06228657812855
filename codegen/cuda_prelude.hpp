// The device-side support every rendered CUDA source starts with: fixed-width integer types
// (NVRTC compiles without host headers, so no <cstdint>), the bf16/f16 conversions, max/min that
// propagate NaN, and integer division that never traps. Each gives the same bits as the CPU
// path (codegen/llvm_renderer.cpp, dsl/dtype.cpp), so results do not depend on the target.
// Philox is kernel IR (codegen/philox.hpp), not prelude code.
#pragma once

#include <string_view>

namespace tessera {

std::string_view cuda_prelude();

}  // namespace tessera
