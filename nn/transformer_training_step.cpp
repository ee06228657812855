#include "nn/transformer_training_step.hpp"

#include <string>

#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "dsl/program_order_scope.hpp"
#include "nn/clip_grad_norm.hpp"
#include "nn/training_step_adamw.hpp"
#include "nn/pipeline.hpp"

namespace tessera {
namespace {

std::unique_ptr<Transformer> distributed(std::unique_ptr<Transformer> model, const Mesh& mesh, bool sequence_parallel, bool fsdp) {
  distribute_transformer(*model, mesh, sequence_parallel, fsdp);
  return model;
}

}  // namespace

TransformerTrainingStep::TransformerTrainingStep(const TransformerConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                                 int64_t microbatches)
    : TransformerTrainingStep(std::make_unique<Transformer>(config, mesh), mesh, sequence_parallel, fsdp, microbatches) {}

TransformerTrainingStep::TransformerTrainingStep(std::unique_ptr<Transformer> model, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                                 int64_t microbatches)
    : model_(distributed(std::move(model), mesh, sequence_parallel, fsdp)),
      microbatches_(microbatches),
      params_(model_->parameters()),
      optimizer_(training_step_adamw(params_)),
      step_(Step([this](const Tensor& ids, const Tensor& targets) { return step(ids, targets); })) {
  if (microbatches < 1) throw Error("TransformerTrainingStep: microbatches must be at least 1, got " + std::to_string(microbatches));
}

Tensor TransformerTrainingStep::objective(const Tensor& ids, const Tensor& targets) {
  Tensor loss = cross_entropy((*model_)(ids), targets);
  if (!model_->moe_layers().empty()) loss = loss + model_->config().moe->aux_loss_coefficient * model_->moe_aux_loss();
  return loss;
}

Tensor TransformerTrainingStep::step(const Tensor& ids, const Tensor& targets) {
  const std::vector<Tensor> wrt(params_.begin(), params_.end());
  std::vector<Tensor> grads;
  Tensor loss;
  if (microbatches_ == 1) {
    loss = objective(ids, targets);
    grads = gradients(loss, wrt);
  } else {
    // Each microbatch's forward and backward at a position of its own, so the next one's
    // forward runs after this one's backward and its activations are freed first.
    for (int64_t m = 0; m < microbatches_; ++m) {
      const ProgramOrderScope in_order(m);
      const Tensor term = objective(microbatch(ids, m, microbatches_), microbatch(targets, m, microbatches_));
      const std::vector<Tensor> g = gradients(term / double(microbatches_), wrt);
      if (m == 0) {
        grads = g, loss = term;
      } else {
        for (size_t i = 0; i < grads.size(); ++i) grads[i] = grads[i] + g[i];
        loss = loss + term;
      }
    }
    loss = loss / double(microbatches_);
    // Handed out as gradients() hands out one: the partial sums over dp, added up, are reduced
    // once for clipping and the optimizer both, not once for each.
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = hand_out_gradient(grads[i], params_[i].layout().without_partial());
  }
  (void)clip_grad_norm(grads, 1.0);
  optimizer_.apply(grads);
  return loss;
}

Layout TransformerTrainingStep::batch_layout(const Mesh& mesh) {
  std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
  for (size_t d = 0; d < placements.size(); ++d) {
    if (mesh.dim_names()[d] == "dp" || mesh.dim_names()[d] == "ep") placements[d] = Shard{0};
    if (mesh.dim_names()[d] == "sp" || mesh.dim_names()[d] == "cp") placements[d] = Shard{1};
  }
  return Layout::from_placements(mesh, placements, 2);
}

}  // namespace tessera
