// The training steps' plan() (nn/transformer_training_step.hpp,
// nn/pipelined_transformer_training_step.hpp): their jit'd step planned, defined here so that
// nn/ includes nothing from plan/.
#include "nn/pipelined_transformer_training_step.hpp"
#include "nn/transformer_training_step.hpp"
#include "plan/call_sequence_plan.hpp"
#include "plan/plan_report.hpp"

namespace tessera {

PlanReport TransformerTrainingStep::plan(const Tensor& ids, const Tensor& targets) {
  return plan(planning_hardware(ids.layout().mesh()), ids, targets);
}

PlanReport TransformerTrainingStep::plan(const Hardware& hardware, const Tensor& ids, const Tensor& targets) {
  if (microbatches_ == 1) return step_.plan(hardware, ids, targets);
  // The host loop: the microbatch's program once per microbatch, then the update.
  make_sums(ids, targets);
  return plan_call_sequence({{accumulate_.program_plan(ids, targets), microbatches_}, {update_.program_plan(), 1}}, hardware);
}

PlanReport PipelinedTransformerTrainingStep::plan(const Tensor& ids, const Tensor& targets) {
  if (!loop_) return step_.plan(ids, targets);
  // 1F1B's host loop: each tick program once, counted as often as the loop calls it, then the update.
  loop_->prepare(model_->tick_model(ids, targets, microbatches_));
  std::vector<PlannedCall> calls;
  for (PipelineTickPhase phase : {PipelineTickPhase::WarmUp, PipelineTickPhase::Steady, PipelineTickPhase::CoolDown})
    calls.push_back({tick_program(phase).program_plan(ids, targets), loop_->calls(phase)});
  calls.push_back({update_.program_plan(), 1});
  return plan_call_sequence(calls, planning_hardware(ids.layout().mesh()), loop_->slots_read_later());
}

}  // namespace tessera
