#include "nn/pipelined_transformer_training_step.hpp"

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
      params_(distributed_parameters(*model_, mesh, fsdp, sequence_parallel)),
      optimizer_(training_step_adamw(params_)),
      step_(Step([this, microbatches, schedule](const Tensor& ids, const Tensor& targets) {
        auto [loss, grads] = model_->loss_and_gradients(ids, targets, microbatches, schedule);
        (void)clip_grad_norm(grads, model_->gradient_squares(grads), 1.0);
        optimizer_.apply(grads);
        return loss;
      })) {}

}  // namespace tessera
