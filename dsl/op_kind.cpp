#include "dsl/op_kind.hpp"

#include "dsl/error.hpp"
#include "dsl/placement.hpp"

namespace tessera {

std::string_view op_name(OpKind op) {
  switch (op) {
#define TESSERA_OP_NAME(name, text, category) \
  case OpKind::name:                          \
    return text;
    TESSERA_OP_KINDS(TESSERA_OP_NAME)
#undef TESSERA_OP_NAME
  }
  return "?";
}

OpCategory op_category(OpKind op) {
  switch (op) {
#define TESSERA_OP_CATEGORY(name, text, category) \
  case OpKind::name:                              \
    return OpCategory::category;
    TESSERA_OP_KINDS(TESSERA_OP_CATEGORY)
#undef TESSERA_OP_CATEGORY
  }
  return OpCategory::Source;
}

bool is_elementwise(OpKind op) {
  switch (op_category(op)) {
    case OpCategory::Unary: case OpCategory::Binary: case OpCategory::Compare: case OpCategory::Ternary:
    case OpCategory::Cast:
      return true;
    default:
      return false;
  }
}

bool is_reduce(OpKind op) { return op_category(op) == OpCategory::Reduce; }

ReduceOp reduce_op_of(OpKind op) {
  switch (op) {
    case OpKind::ReduceSum: return ReduceOp::Sum;
    case OpKind::ReduceProd: return ReduceOp::Product;
    case OpKind::ReduceMax: return ReduceOp::Max;
    case OpKind::ReduceMin: return ReduceOp::Min;
    default: throw InternalError("reduce_op_of: " + std::string(op_name(op)) + " is not a reduce");
  }
}
bool is_movement(OpKind op) { return op_category(op) == OpCategory::Movement; }
bool is_functional_collective(OpKind op) { return op_category(op) == OpCategory::Collective; }

bool is_expensive(OpKind op) {
  switch (op) {
    case OpKind::Exp: case OpKind::Log: case OpKind::Div: case OpKind::Pow: case OpKind::Tanh: case OpKind::Sin: case OpKind::Cos: case OpKind::Dot:
    case OpKind::GroupedDot: case OpKind::GroupedWeightGrad: case OpKind::Attention:
    case OpKind::RandomNormal: case OpKind::RandomUniform:
      return true;
    default:
      return is_reduce(op);
  }
}

}  // namespace tessera
