#include "nn/gpt_training_step.hpp"

#include "dsl/autodiff.hpp"
#include "nn/clip_grad_norm.hpp"
#include "nn/parallel_styles.hpp"

namespace tessera {
namespace {

Gpt split(Gpt model, const Mesh& mesh, bool sequence_parallel, bool fsdp) {
  distribute_gpt(model, mesh, sequence_parallel, fsdp);
  return model;
}

}  // namespace

GptTrainingStep::GptTrainingStep(const GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp)
    : model_(split(Gpt(config, mesh), mesh, sequence_parallel, fsdp)),
      params_(model_.parameters()),
      optimizer_(params_, 3e-4, 0.9, 0.95, 1e-8, 0.1),
      step_(Step([this](const Tensor& ids, const Tensor& targets) {
        Tensor loss = gpt_loss(model_(ids), targets);
        std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params_.begin(), params_.end()));
        (void)clip_grad_norm(grads, 1.0);
        optimizer_.apply(grads);
        return loss;
      })) {}

Layout GptTrainingStep::batch_layout(const Mesh& mesh) {
  std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
  for (size_t d = 0; d < placements.size(); ++d) {
    if (mesh.dim_names()[d] == "dp") placements[d] = Shard{0};
    if (mesh.dim_names()[d] == "sp") placements[d] = Shard{1};
  }
  return Layout::from_placements(mesh, placements, 2);
}

}  // namespace tessera
