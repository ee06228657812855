#include "dsl/optimizers.hpp"

#include "dsl/ops.hpp"
#include "dsl/sharding_thresholds.hpp"

namespace tessera {
namespace {

// Optimizer state laid out like the variable, plus its first unsharded axis split over every
// mesh dim on which the variable is replicated (ZeRO stage 1): each data-parallel device keeps
// and updates its slice, the gradient arrives by reduce_scatter and the new weights leave by
// all_gather, the same bytes as one all_reduce and 1/N of the update's memory traffic. Small
// variables keep replicated state.
Variable sharded_state_like(const Variable& v) {
  const Layout& layout = v.layout();
  if (v.value().node()->numel() * dtype_size(v.dtype()) < kShardingMinimumBytes)  // a bias: one all_reduce beats two collectives
    return Variable(zeros(v.shape(), layout.without_partial(), v.dtype()));
  std::vector<std::vector<int64_t>> axes = layout.axis_mesh_dims();
  std::vector<int64_t> free_dims;
  for (int64_t d = 0; d < layout.mesh().ndim(); ++d)
    if (!layout.sharded_axis_of(d) && !layout.partial_ops()[d] && layout.mesh().shape()[d] > 1) free_dims.push_back(d);
  for (auto& dims : axes)
    if (dims.empty() && !free_dims.empty()) {
      dims = free_dims;
      free_dims.clear();
    }
  return Variable(zeros(v.shape(), Layout(layout.mesh(), axes), v.dtype()));
}

void check_gradients(const std::vector<Variable>& vars, const std::vector<Tensor>& grads, const char* who) {
  if (vars.size() != grads.size())
    throw ShapeError(std::string(who) + ".apply: " + std::to_string(grads.size()) + " gradients for " +
                     std::to_string(vars.size()) + " variables");
}

}  // namespace

SGD::SGD(std::vector<Variable> vars, double learning_rate, double momentum)
    : vars_(std::move(vars)), lr_(learning_rate), momentum_(momentum) {
  if (momentum_ != 0)
    for (const Variable& v : vars_) velocity_.push_back(sharded_state_like(v));
}

void SGD::apply(const std::vector<Tensor>& grads) {
  check_gradients(vars_, grads, "SGD");
  for (size_t i = 0; i < vars_.size(); ++i) {
    Tensor step = grads[i];
    if (momentum_ != 0) {
      Tensor velocity = velocity_[i].value() * momentum_ + with_layout(grads[i], velocity_[i].layout());
      velocity_[i].assign(velocity);
      step = velocity;
    }
    vars_[i].assign(vars_[i].value() - step * lr_);
  }
}

Adam::Adam(std::vector<Variable> vars, double learning_rate, double beta1, double beta2, double epsilon)
    : vars_(std::move(vars)),
      t_([&] {
        if (vars_.empty()) throw ShapeError("Adam: no variables to optimise");
        return zeros({}, Layout::replicated(vars_.front().layout().mesh(), 0));
      }()),
      lr_(learning_rate), beta1_(beta1), beta2_(beta2), epsilon_(epsilon) {
  for (const Variable& v : vars_) {
    m_.push_back(sharded_state_like(v));
    v_.push_back(sharded_state_like(v));
  }
}

void Adam::apply(const std::vector<Tensor>& grads) {
  check_gradients(vars_, grads, "Adam");
  Tensor t = t_.value() + 1.0;
  t_.assign(t);
  // Bias corrections from the step count, computed in the graph (scalars, replicated).
  Tensor correction1 = 1.0 - pow(beta1_, t), correction2 = 1.0 - pow(beta2_, t);
  for (size_t i = 0; i < vars_.size(); ++i) {
    // The gradient once, in the state's (sharded) layout: one reduce_scatter feeds both moments.
    const Tensor g = with_layout(grads[i], m_[i].layout());
    Tensor m = m_[i].value() * beta1_ + g * (1.0 - beta1_);
    Tensor v = v_[i].value() * beta2_ + square(g) * (1.0 - beta2_);
    m_[i].assign(m);
    v_[i].assign(v);
    vars_[i].assign(vars_[i].value() - (m / correction1) / (sqrt(v / correction2) + epsilon_) * lr_);
  }
}

}  // namespace tessera
