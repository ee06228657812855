// The training steps' plan() (nn/transformer_training_step.hpp,
// nn/pipelined_transformer_training_step.hpp): their jit'd step planned, defined here so that
// nn/ includes nothing from plan/.
#include "nn/pipelined_transformer_training_step.hpp"
#include "nn/transformer_training_step.hpp"
#include "plan/plan_report.hpp"

namespace tessera {

PlanReport TransformerTrainingStep::plan(const Tensor& ids, const Tensor& targets) { return step_.plan(ids, targets); }

PlanReport TransformerTrainingStep::plan(const Hardware& hardware, const Tensor& ids, const Tensor& targets) {
  return step_.plan(hardware, ids, targets);
}

PlanReport PipelinedTransformerTrainingStep::plan(const Tensor& ids, const Tensor& targets) { return step_.plan(ids, targets); }

}  // namespace tessera
