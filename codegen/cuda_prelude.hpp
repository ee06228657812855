// The device-side support every rendered CUDA source starts with: fixed-width integer types
// (NVRTC compiles without host headers, so no <cstdint>), the bf16/f16 conversions, max/min that
// propagate NaN, integer division that never traps, and Philox-4x32-10. Each gives the same bits
// as the CPU path (codegen/llvm_renderer.cpp, dsl/dtype.cpp), so results do not depend on the
// target.
#pragma once

#include <string_view>

namespace tessera {

std::string_view cuda_prelude();

}  // namespace tessera
