#include "nn/pipelined_transformer_training_step.hpp"

#include "dsl/error.hpp"
#include "nn/clip_grad_norm.hpp"
#include "nn/training_step_adamw.hpp"

namespace tessera {
namespace {

// The parameters once the model is split over the mesh.
std::vector<Variable> distributed_parameters(PipelinedTransformer& model, const Mesh& mesh, bool fsdp, bool sequence_parallel) {
  distribute_pipelined_transformer(model, mesh, fsdp, sequence_parallel);
  return model.parameters();
}

}  // namespace

int64_t default_virtual_stages(PipelineSchedule schedule) { return pipeline_schedule_loops(schedule) ? 2 : 1; }

PipelinedTransformerTrainingStep::PipelinedTransformerTrainingStep(const TransformerConfig& config, const Mesh& mesh, int64_t microbatches,
                                                                   PipelineSchedule schedule, bool fsdp, bool sequence_parallel)
    : PipelinedTransformerTrainingStep(std::make_unique<PipelinedTransformer>(config, mesh, default_virtual_stages(schedule)), mesh,
                                       microbatches, schedule, fsdp, sequence_parallel) {}

PipelinedTransformerTrainingStep::PipelinedTransformerTrainingStep(std::unique_ptr<PipelinedTransformer> model, const Mesh& mesh,
                                                                   int64_t microbatches, PipelineSchedule schedule, bool fsdp,
                                                                   bool sequence_parallel)
    : model_(std::move(model)),
      microbatches_(microbatches),
      params_(distributed_parameters(*model_, mesh, fsdp, sequence_parallel)),
      optimizer_(training_step_adamw(params_)),
      step_(Step([this, microbatches, schedule](const Tensor& ids, const Tensor& targets) {
        auto [loss, grads] = model_->loss_and_gradients(ids, targets, microbatches, schedule);
        (void)clip_grad_norm(grads, model_->gradient_squares(grads), 1.0);
        optimizer_.apply(grads);
        return loss;
      })),
      warm_up_(tick_call(PipelineTickPhase::WarmUp)),
      steady_(tick_call(PipelineTickPhase::Steady)),
      cool_down_(tick_call(PipelineTickPhase::CoolDown)),
      update_(Update([this] { return update(); })) {
  if (schedule == PipelineSchedule::OneFOneB && model_->stages() > 1 && !model_->transformer_config().moe)
    loop_.emplace(model_->stages(), microbatches);
}

PipelinedTransformerTrainingStep::TickCall PipelinedTransformerTrainingStep::tick_call(PipelineTickPhase phase) {
  return [this, phase](const Tensor& ids, const Tensor& targets) { return loop_->call(phase, model_->tick_model(ids, targets, microbatches_)); };
}

JitFunction<PipelinedTransformerTrainingStep::TickCall>& PipelinedTransformerTrainingStep::tick_program(PipelineTickPhase phase) {
  switch (phase) {
    case PipelineTickPhase::WarmUp: return warm_up_;
    case PipelineTickPhase::Steady: return steady_;
    case PipelineTickPhase::CoolDown: return cool_down_;
  }
  throw Error("PipelinedTransformerTrainingStep: no such tick phase");
}

Tensor PipelinedTransformerTrainingStep::update() {
  const PipelineLoss parts = model_->parameter_parts();
  const PipelineGradients sums = loop_->sums(parts.first_parameters, parts.stage_parameters, parts.last_parameters);
  std::vector<Tensor> grads = model_->joined_gradients(sums);
  (void)clip_grad_norm(grads, model_->gradient_squares(grads), 1.0);
  optimizer_.apply(grads);
  loop_->zero_sums();
  return sums.loss;
}

Tensor PipelinedTransformerTrainingStep::operator()(const Tensor& ids, const Tensor& targets) {
  if (!loop_) return step_(ids, targets);
  loop_->prepare(model_->tick_model(ids, targets, microbatches_));
  const int64_t calls = microbatches_ + 2 * (model_->stages() - 1);
  for (int64_t n = 0; n < calls; ++n) loop_->advance(tick_program(loop_->phase_of_call(n))(ids, targets));
  return update_();
}

}  // namespace tessera
