// A composite op's own vector-Jacobian rule (JAX's custom_vjp, torch.autograd.Function's
// backward), for composites whose best backward is not the one autodiff would derive from their
// ops. Ring attention is one: differentiated op by op, its backward would keep every block of
// keys and values the ring passed to a device, the whole sequence's; its own backward passes
// them around the ring again and keeps only the device's block.
//
// The rule sits on the composite's output node (NodeAttrs::gradient_rule). gradients()
// (dsl/autodiff.hpp) then differentiates that node with respect to the rule's inputs, ancestors
// of the node, instead of walking into the ops between them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dsl/tensor.hpp"

namespace tessera {

struct GradientRule {
  // The values the rule differentiates with respect to, and any others it reads (their
  // adjoints come back empty).
  std::vector<NodeRef> inputs;
  // The adjoint of each of `inputs` (empty for none) given `g`, the output's. `output` and
  // `inputs` are the values to read: the nodes themselves, or under activation checkpointing
  // (dsl/checkpoint.hpp) copies computed again for the backward.
  std::function<std::vector<std::optional<Tensor>>(const NodeRef& output, const std::vector<NodeRef>& inputs, const Tensor& g)> vjp;
};

// `output` (a value of the composite whose rule this is, in `layout`) as a node that carries the
// rule: the same value in the same layout, so nothing runs for it.
Tensor with_gradient_rule(const Tensor& output, const Layout& layout, std::shared_ptr<const GradientRule> rule, SourceLocation where);

}  // namespace tessera
