#include "dsl/gradient_rule.hpp"

#include "dsl/node.hpp"

namespace tessera {

Tensor with_gradient_rule(const Tensor& output, const Layout& layout, std::shared_ptr<const GradientRule> rule, SourceLocation where) {
  NodeAttrs attrs;
  attrs.layout = layout;
  attrs.gradient_rule = std::move(rule);
  return Tensor(make_node(OpKind::WithLayout, output.dtype(), output.shape(), {output.node()}, std::move(attrs), where));
}

}  // namespace tessera
