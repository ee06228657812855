// The plan of a step made of several jit calls: gradient accumulation's microbatch call, run
// once per microbatch, then the update (nn/transformer_training_step.hpp). Each distinct call is
// planned once and counted, so planning costs the same whatever the microbatch count, and the
// peak stays exact: a device holds, during each call, that call's own peak (its inputs, arena,
// outputs and staging) plus every value of the step the call does not read (the optimizer's
// moments during a microbatch, the batch during the update), and the step's peak is the largest
// of those.
#pragma once

#include <cstdint>
#include <vector>

#include "dsl/variable.hpp"
#include "jit/program_plan.hpp"
#include "plan/plan_report.hpp"

namespace tessera {

struct PlannedCall {
  ProgramPlan plan;   // from JitFunction::program_plan, with its input identities
  int64_t count = 1;  // how many times the step runs it
};

// The calls in the order the step runs them, on one mesh. Values read by several calls (the
// parameters, the gradient sums carried from one microbatch to the next) are counted once: a
// program's inputs are known by what holds them (ProgramPlan::input_identities). FLOPs, bytes,
// collectives and time add up over the calls, each times its count; the step's output is the
// last call's. Error for no calls, a count below 1, or calls on different meshes.
//
// `also_held`: variables the step holds throughout that no call reads under their own name, such
// as 1F1B's kept stage inputs, which the host moves from slot to slot between calls
// (nn/pipeline_tick_loop.hpp) so that each is read only once it reaches a slot that is read.
PlanReport plan_call_sequence(const std::vector<PlannedCall>& calls, const Hardware& hardware, const std::vector<Variable>& also_held = {});

}  // namespace tessera
