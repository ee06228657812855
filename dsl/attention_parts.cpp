#include "dsl/attention_parts.hpp"

#include "dsl/error.hpp"

namespace tessera {

NodeAttrs attention_node_attrs(const AttentionAttrs& a) {
  NodeAttrs attrs;
  attrs.axes = {int64_t(a.part), a.causal ? 1 : 0};
  attrs.scalar = a.scale;
  return attrs;
}

AttentionAttrs attention_attrs(const NodeAttrs& attrs) {
  if (attrs.axes.size() != 2 || attrs.axes[0] < 0 || attrs.axes[0] > int64_t(AttentionPart::GradKV))
    throw InternalError("attention node without its part and causal flag");
  return {AttentionPart(attrs.axes[0]), attrs.axes[1] != 0, attrs.scalar};
}

std::string_view attention_part_name(AttentionPart part) {
  switch (part) {
    case AttentionPart::Forward: return "forward";
    case AttentionPart::GradQ: return "grad_q";
    case AttentionPart::GradKV: return "grad_kv";
  }
  return "?";
}

size_t attention_operand_count(AttentionPart part) { return part == AttentionPart::Forward ? 3 : 5; }

}  // namespace tessera
