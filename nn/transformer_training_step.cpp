#include "nn/transformer_training_step.hpp"

#include <string>

#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "nn/clip_grad_norm.hpp"
#include "nn/training_step_adamw.hpp"
#include "nn/pipeline.hpp"
#include "nn/zero_sums.hpp"

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
      step_(Step([this](const Tensor& ids, const Tensor& targets) { return step(ids, targets); })),
      accumulate_(Accumulate([this](const Tensor& ids, const Tensor& targets) {
        accumulate(ids, targets);
        return std::vector<Tensor>{};
      })),
      update_(Update([this] { return update(); })) {
  if (microbatches < 1) throw Error("TransformerTrainingStep: microbatches must be at least 1, got " + std::to_string(microbatches));
}

Tensor TransformerTrainingStep::objective(const Tensor& ids, const Tensor& targets) {
  Tensor loss = cross_entropy((*model_)(ids), targets);
  if (!model_->moe_layers().empty()) loss = loss + model_->config().moe->aux_loss_coefficient * model_->moe_aux_loss();
  return loss;
}

std::vector<Tensor> TransformerTrainingStep::parameter_values() const { return std::vector<Tensor>(params_.begin(), params_.end()); }

Tensor TransformerTrainingStep::step(const Tensor& ids, const Tensor& targets) {
  const Tensor loss = objective(ids, targets);
  std::vector<Tensor> grads = gradients(loss, parameter_values());
  (void)clip_grad_norm(grads, 1.0);
  optimizer_.apply(grads);
  return loss;
}

std::vector<Tensor> TransformerTrainingStep::microbatch_terms(const Tensor& ids, const Tensor& targets, const Tensor& index) {
  const Tensor term = objective(microbatch(ids, index, microbatches_), microbatch(targets, index, microbatches_));
  std::vector<Tensor> terms{term};
  for (const Tensor& g : gradients(term / double(microbatches_), parameter_values())) terms.push_back(gradient_as_computed(g));
  return terms;
}

void TransformerTrainingStep::make_sums(const Tensor& ids, const Tensor& targets) {
  if (microbatch_index_) return;
  const Tensor index = zeros({}, Layout::replicated(ids.layout().mesh(), 0), DType::i32);
  const std::vector<Tensor> terms = microbatch_terms(ids, targets, index);
  std::vector<NodeRef> nodes;
  for (const Tensor& t : terms) nodes.push_back(t.node());
  const std::vector<Layout> layouts = planned_layouts(nodes);  // one propagation, not one per gradient
  loss_sum_.emplace(zeros(terms[0].shape(), layouts[0], terms[0].dtype()));
  for (size_t i = 1; i < terms.size(); ++i) gradient_sums_.emplace_back(zeros(terms[i].shape(), layouts[i], terms[i].dtype()));
  microbatch_index_.emplace(index);
}

void TransformerTrainingStep::accumulate(const Tensor& ids, const Tensor& targets) {
  const Tensor index = microbatch_index_->value();
  const std::vector<Tensor> terms = microbatch_terms(ids, targets, index);
  std::vector<Tensor> sums{loss_sum_->value() + terms[0]};
  for (size_t i = 0; i < gradient_sums_.size(); ++i) sums.push_back(gradient_sums_[i].value() + terms[i + 1]);
  std::vector<NodeRef> nodes;
  for (const Tensor& sum : sums) nodes.push_back(sum.node());
  (void)planned_layouts(nodes);  // one propagation for the assignments' layout checks below
  loss_sum_->assign(sums[0]);
  for (size_t i = 0; i < gradient_sums_.size(); ++i) gradient_sums_[i].assign(sums[i + 1]);
  const Tensor next = index + 1;
  microbatch_index_->assign(where(next == microbatches_, 0, next));
}

Tensor TransformerTrainingStep::update() {
  // Handed out as gradients() hands out one: a sum pending over dp is reduced here, once for
  // clipping and the optimizer both.
  std::vector<Tensor> grads;
  for (size_t i = 0; i < gradient_sums_.size(); ++i)
    grads.push_back(hand_out_gradient(gradient_sums_[i].value(), params_[i].layout().without_partial()));
  const Tensor loss = loss_sum_->value() / double(microbatches_);
  (void)clip_grad_norm(grads, 1.0);
  optimizer_.apply(grads);
  std::vector<Variable*> sums;
  for (Variable& sum : gradient_sums_) sums.push_back(&sum);
  sums.push_back(&*loss_sum_);
  zero_sums(sums);
  return loss;
}

Tensor TransformerTrainingStep::operator()(const Tensor& ids, const Tensor& targets) {
  if (microbatches_ == 1) return step_(ids, targets);
  make_sums(ids, targets);
  for (int64_t m = 0; m < microbatches_; ++m) (void)accumulate_(ids, targets);
  return update_();
}

std::shared_ptr<const Executable> TransformerTrainingStep::executable(const Tensor& ids, const Tensor& targets) {
  if (microbatches_ == 1) return step_.executable(ids, targets);
  make_sums(ids, targets);
  return accumulate_.executable(ids, targets);
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
