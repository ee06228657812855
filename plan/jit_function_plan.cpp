// JitFunction::plan's report: the jit runtime lowers the call (TraceCache::program_plan), the
// planner prices it. Defined here so that jit/ includes nothing from plan/.
#include "jit/jit_function.hpp"
#include "jit/program_plan.hpp"
#include "plan/plan_report.hpp"

namespace tessera::detail {

PlanReport TraceCache::plan(const std::vector<Tensor>& args, const Trace& trace, const std::optional<Hardware>& hardware) {
  const ProgramPlan plan = program_plan(args, trace);
  return plan_report(plan, hardware ? *hardware : planning_hardware(plan.program.mesh));
}

}  // namespace tessera::detail
