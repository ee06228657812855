#include "jit/program_plan.hpp"

#include "jit/backend_registry.hpp"
#include "jit/kernel_runner.hpp"

namespace tessera {

kir::LoopTarget lowering_target(const Mesh& mesh) {
  if (auto forced = substitute_lowering_target()) return *forced;
  return lowering_target_for(mesh.device_kind());
}

ProgramPlan plan_local_program(LocalProgram program) {
  ProgramPlan plan;
  plan.schedule = schedule_program(program, lowering_target(program.mesh));
  plan.memory = plan_memory(program, plan.schedule);
  mark_donor_buffers(plan.schedule, plan.memory);
  plan.program = std::move(program);
  return plan;
}

}  // namespace tessera
