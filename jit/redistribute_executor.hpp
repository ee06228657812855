// Runs redistribute plans (partitioner/redistribute_plan.hpp) on a tensor's components: every
// step runs on all local devices in parallel, each on its worker thread, using the mesh-dim
// communicators; each collective step is counted once in CommDebugMode.
#pragma once

#include <vector>

#include "dsl/collective_recorder.hpp"
#include "comm/communicator.hpp"
#include "dsl/tensor.hpp"
#include "ir/local_program.hpp"
#include "ir/redistribute_step.hpp"
#include "jit/device.hpp"

namespace tessera {

// Runs a whole plan on a value (all local devices in parallel) and returns the moved value.
NodeValue execute_redistribute(const NodeValue& value, const std::vector<int64_t>& shape, DType dtype,
                               const Layout& target);

// CommDebugMode's record of a collective step on `mesh` that moved `bytes`, reported at `origin`
// (the op that needs it: its source line and module); null: the calling thread's module.
CollectiveRecord collective_record(const RedistributeStep& step, const Mesh& mesh, DType dtype, int64_t bytes,
                                   const NodeOrigin& origin);

// One step on one device, from inside that device's worker thread (compiled programs run their
// redistributes this way). `received` gets the elements this device received.
// `all_gather_output`: an all_gather's preallocated output (the input may already lie in it, at
// all_gather_own_block_offset). `device`: the device running the step; a communicator over
// device memory takes its buffers (and packing copies) from it, and local steps fill in its
// memory. Null: host memory throughout.
Array run_redistribute_step(const RedistributeStep& step, const std::vector<int64_t>& shape, DType dtype,
                            const std::vector<int64_t>& coords, Communicator* comm, const Array& input,
                            int64_t& received, const Array* all_gather_output = nullptr, Device* device = nullptr);

// A bucket of all_reduces over one group (small values, one collective's latency for all):
// the inputs are concatenated, reduced once and returned as separate arrays. `received` gets
// The bytes run_redistribute_step allocates on the device at `coords` for `step` in host memory:
// its result's own buffer (0 where the result is a view of its input, or the input itself) and
// the staging it frees before returning. Plans (plan/plan_report.cpp) count memory with it.
struct StepAllocation {
  int64_t result = 0;
  int64_t staging = 0;
};
StepAllocation redistribute_step_allocation(const RedistributeStep& step, const std::vector<int64_t>& shape, DType dtype,
                                            const std::vector<int64_t>& coords, bool all_gather_preallocated);

// the elements this device received, per input. `device` as for run_redistribute_step.
std::vector<Array> run_all_reduce_bucket(const std::vector<Array>& inputs, DType dtype, ReduceOp op, Communicator* comm,
                                         std::vector<int64_t>& received, Device* device = nullptr);

// For an all_gather step whose blocks lie back to back: where this device's own block starts in
// its output, in elements (a value written there is gathered in place).
int64_t all_gather_own_block_offset(const RedistributeStep& step, const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& coords);

// The local-partial rule (Replicate -> Partial) applied to per-device components of a
// replicated-valued tensor, for every Partial mesh dim of `layout`.
std::vector<Array> apply_partial_rule(std::vector<Array> components, const Layout& layout);

}  // namespace tessera
