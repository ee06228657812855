// hardware_profile(name): the Hardware (dsl/hardware.hpp) a plan's times are predicted
// with. "h100-sxm" and "h200" are published figures; "this-machine" is measured once, by a short
// calibration of this machine's CPU devices (GEMM and vector rates, memory bandwidth, the cost of
// a call, and the in-process collective's latency and bandwidth), and kept as JSON beside the
// compile cache (jit/compile_cache.hpp), so later processes read it instead of measuring.
#pragma once

#include <string>

#include "dsl/hardware.hpp"

namespace tessera {

// Error naming the known profiles for an unknown name.
Hardware hardware_profile(const std::string& name);

// A fresh calibration of this machine (about a second), cached nowhere.
Hardware measure_this_machine();

}  // namespace tessera
