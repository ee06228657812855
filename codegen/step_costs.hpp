// What one scheduled step costs one device, counted from the program alone: the elements and
// bytes a redistribute step receives (the executor's own accounting, which CommDebugMode
// reports), the multiplications and FLOPs of kernels and library calls, and the bytes a step
// touches. explain() prints them; plan reports (plan/plan_report.hpp) predict from them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "codegen/schedule.hpp"
#include "ir/local_program.hpp"

namespace tessera {

// Bytes of `node`'s block on a device with parameter values `params`.
int64_t local_bytes(const LocalNode& node, const std::vector<int64_t>& params);

// Elements one device, at mesh coordinates `coords`, receives in a redistribute step
// (jit/redistribute_executor.cpp counts the same).
int64_t received_elements(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params,
                          const std::vector<int64_t>& coords);
// Bytes a redistribute step receives on one device (a bucket of all_reduces: all its members).
int64_t received_bytes(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params,
                       const std::vector<int64_t>& coords);
// Multiplications of a dot step (GEMM call or generated integer kernel) on one device, or of a
// fused attention part.
int64_t dot_multiplies(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params);
// The arithmetic intensity m n k / (m n + n k + m k) of one matrix of a dot step or of a fused
// attention part's score product (Hardware::gemm_efficiency); 0 for other steps.
double gemm_intensity(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params);
// The ops a generated kernel step (not a dot: dot_multiplies counts those) evaluates on one
// device, its Kernel::per_reduced_element counts times the elements its reductions read (its
// largest input's) plus its per_output_element counts times its output's elements: every op, the
// special functions among them (each of exp, log, tanh, pow: Hardware::special_functions_per_second),
// and those rounded to bf16 and to f16 (each costing that rounding's integer work besides the
// op: Hardware::vector_flops[bf16]). All zero for other steps.
kir::Kernel::OpCounts op_evaluations(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step,
                                     const std::vector<int64_t>& params);
// Floating-point operations of a kernel or library step on one device: two per multiplication
// of a dot, for other kernels op_evaluations' ops; none for redistributes.
int64_t step_flops(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step, const std::vector<int64_t>& params);
// The same, given the step's op_evaluations (a caller that needs both counts them once).
int64_t step_flops(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params,
                   const kir::Kernel::OpCounts& evaluated);
// Bytes a kernel or library step reads and writes on one device (each buffer once).
int64_t step_bytes_touched(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params);

}  // namespace tessera
