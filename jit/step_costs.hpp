// What one scheduled step costs one device, counted from the program alone: the elements and
// bytes a redistribute step receives (the executor's own accounting, which CommDebugMode
// reports), the multiplications and FLOPs of kernels and library calls, and the bytes a step
// touches. explain() prints them; plan reports (jit/plan_report.hpp) predict from them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "codegen/schedule.hpp"
#include "ir/local_program.hpp"

namespace tessera {

int64_t shape_elements(const std::vector<int64_t>& shape);
// Bytes of `node`'s block on a device with parameter values `params`.
int64_t local_bytes(const LocalNode& node, const std::vector<int64_t>& params);

// Elements one device receives in a redistribute step (jit/redistribute_executor.cpp counts the same).
int64_t received_elements(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params);
// Bytes a redistribute step receives on one device (a bucket of all_reduces: all its members).
int64_t received_bytes(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params);
// Multiplications of a dot step (GEMM call or generated integer kernel) on one device, or of a
// fused attention part.
int64_t dot_multiplies(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params);
// The arithmetic intensity m n k / (m n + n k + m k) of one matrix of a dot step or of a fused
// attention part's score product (Hardware::gemm_efficiency); 0 for other steps.
double gemm_intensity(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params);
// Floating-point operations of a kernel or library step on one device: two per multiplication
// of a dot; for other kernels one per op evaluated (Kernel::per_output_element, per_reduced_element)
// and element of the output, or of a reduction's largest input for the ops inside it; none for
// redistributes.
int64_t step_flops(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step, const std::vector<int64_t>& params);
// Evaluations of exp, log, tanh and pow in a kernel step on one device (Hardware::
// special_functions_per_second), counted as step_flops counts ops.
int64_t special_function_evaluations(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step,
                                     const std::vector<int64_t>& params);
// Of a kernel step's operations on one device, those whose results are rounded to bf16 and to
// f16: each costs that rounding's integer work besides the op (Hardware::vector_flops[bf16]).
std::pair<int64_t, int64_t> rounded_operations(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step,
                                               const std::vector<int64_t>& params);
// Bytes a kernel or library step reads and writes on one device (each buffer once).
int64_t step_bytes_touched(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params);

}  // namespace tessera
