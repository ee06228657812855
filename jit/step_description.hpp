// One step of an executable as explain() prints it (jit/api/explain.hpp) and the step
// profiles label it (jit/executable.cpp): a kernel with the ops fused into it, a library call
// with its shapes and multiplications, a collective with its mesh dim and bytes.
#pragma once

#include <cstddef>
#include <string>

namespace tessera {

class Executable;
struct ScheduledStep;

// The step on the program's device `device` (an index into its device_params), without the
// source line.
std::string describe_step(const Executable& executable, const ScheduledStep& step, size_t device);

}  // namespace tessera
