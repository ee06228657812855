#include "nn/transformer_training_step.hpp"

#include "dsl/autodiff.hpp"
#include "nn/clip_grad_norm.hpp"

namespace tessera {
namespace {

std::unique_ptr<Transformer> distributed(std::unique_ptr<Transformer> model, const Mesh& mesh, bool sequence_parallel, bool fsdp) {
  distribute_transformer(*model, mesh, sequence_parallel, fsdp);
  return model;
}

}  // namespace

TransformerTrainingStep::TransformerTrainingStep(const TransformerConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp)
    : TransformerTrainingStep(std::make_unique<Transformer>(config, mesh), mesh, sequence_parallel, fsdp) {}

TransformerTrainingStep::TransformerTrainingStep(std::unique_ptr<Transformer> model, const Mesh& mesh, bool sequence_parallel, bool fsdp)
    : model_(distributed(std::move(model), mesh, sequence_parallel, fsdp)),
      params_(model_->parameters()),
      optimizer_(params_, 3e-4, 0.9, 0.95, 1e-8, 0.1),
      step_(Step([this](const Tensor& ids, const Tensor& targets) {
        Tensor loss = cross_entropy((*model_)(ids), targets);
        if (!model_->moe_layers().empty()) loss = loss + model_->config().moe->aux_loss_coefficient * model_->moe_aux_loss();
        std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params_.begin(), params_.end()));
        (void)clip_grad_norm(grads, 1.0);
        optimizer_.apply(grads);
        return loss;
      })) {}

Layout TransformerTrainingStep::batch_layout(const Mesh& mesh) {
  std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
  for (size_t d = 0; d < placements.size(); ++d) {
    if (mesh.dim_names()[d] == "dp" || mesh.dim_names()[d] == "ep") placements[d] = Shard{0};
    if (mesh.dim_names()[d] == "sp" || mesh.dim_names()[d] == "cp") placements[d] = Shard{1};
  }
  return Layout::from_placements(mesh, placements, 2);
}

}  // namespace tessera
