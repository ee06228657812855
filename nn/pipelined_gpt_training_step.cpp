#include "nn/pipelined_gpt_training_step.hpp"

#include "nn/clip_grad_norm.hpp"

namespace tessera {
namespace {

// The parameters once the model is split over the mesh.
std::vector<Variable> distributed_parameters(PipelinedGpt& model, const Mesh& mesh, bool fsdp, bool sequence_parallel) {
  distribute_pipelined_gpt(model, mesh, fsdp, sequence_parallel);
  return model.parameters();
}

}  // namespace

PipelinedGptTrainingStep::PipelinedGptTrainingStep(const GptConfig& config, const Mesh& mesh, int64_t microbatches,
                                                   PipelineSchedule schedule, bool fsdp, bool sequence_parallel)
    : model_(config, mesh, pipeline_schedule_loops(schedule) ? 2 : 1),  // the loop schedules run 2 chunks per device
      params_(distributed_parameters(model_, mesh, fsdp, sequence_parallel)),
      optimizer_(params_, 3e-4, 0.9, 0.95, 1e-8, 0.1),
      step_(Step([this, microbatches, schedule](const Tensor& ids, const Tensor& targets) {
        auto [loss, grads] = model_.loss_and_gradients(ids, targets, microbatches, schedule);
        (void)clip_grad_norm(grads, model_.gradient_squares(grads), 1.0);
        optimizer_.apply(grads);
        return loss;
      })) {}

}  // namespace tessera
