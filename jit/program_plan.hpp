// A program partitioned, scheduled and memory-planned: what an Executable runs, without its
// devices, communicators or compiled kernels. Planning (plan/plan_report.hpp) reads it on real
// and abstract meshes alike; nothing in it allocates device memory.
#pragma once

#include <optional>
#include <vector>

#include "codegen/schedule.hpp"
#include "jit/memory_plan.hpp"
#include "ir/local_program.hpp"

namespace tessera {

struct ProgramPlan {
  LocalProgram program;
  Schedule schedule;
  MemoryPlan memory;
  // Per program input: whether a run may write outputs over it (Executable::run's `donated`):
  // a jit call's variables that it reads and assigns, planned as donated (their old values held
  // by nothing else, as in a training loop). Empty: none.
  std::vector<bool> donated_inputs;
  // Per program input, what holds its value between calls: the variable's state, the caller's
  // argument node, or the captured node. Two programs of one step that read one value give it
  // one identity, so a plan of several calls (plan/call_sequence_plan.hpp) counts it once.
  // Empty where the plan was not made for a jit call.
  std::vector<const void*> input_identities;
};

// The loop structures a program on `mesh` is lowered to: its devices' backend's (a test's
// substitute runner first: jit/kernel_runner.hpp).
kir::LoopTarget lowering_target(const Mesh& mesh);

// Schedules `program` (fusion and kernel IR) and plans its memory.
ProgramPlan plan_local_program(LocalProgram program);

// The plan of what forcing `outputs` (each in its layout, where one is given) would run:
// partitioned as the driver partitions it (jit/driver.hpp), never compiled or run.
ProgramPlan plan_program(const std::vector<NodeRef>& outputs, const std::vector<std::optional<Layout>>& layouts = {});

}  // namespace tessera
