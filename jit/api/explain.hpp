// explain(): the per-device plan of what forcing a tensor would run: each kernel with the ops
// fused into it, library calls, collectives (kind, mesh dim, bytes, the user's source line that
// caused them), and per-device FLOPs and bytes moved. Compiles if needed; runs nothing.
#pragma once

#include <string>
#include <vector>

#include "dsl/tensor.hpp"

namespace tessera {

struct PlanSummary {
  int64_t kernels = 0;               // kernels per device (every device runs the same program)
  int64_t gemms = 0;                 // library calls per device
  std::vector<std::string> collectives;  // "all_reduce(x)" ..., in program order
  int64_t multiplies = 0;            // GEMM multiplications summed over all devices
  int64_t bytes_moved = 0;           // collective bytes received, summed over all devices
};

std::string explain(const Tensor& t);
PlanSummary plan_summary(const Tensor& t);

class Executable;
std::string explain(const Executable& executable);
PlanSummary plan_summary(const Executable& executable);

}  // namespace tessera
