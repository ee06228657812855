#include "dsl/placement.hpp"

#include "dsl/error.hpp"

namespace tessera {

bool is_shard(const Placement& p, std::optional<int64_t> dim) {
  const Shard* s = std::get_if<Shard>(&p);
  return s && (!dim || s->dim == *dim);
}
bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Product: return "product";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  throw InternalError("reduce_op_name: bad op");
}

ReduceOp reduce_op_from_name(std::string_view name) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min})
    if (reduce_op_name(op) == name) return op;
  throw LayoutError("unknown reduce op '" + std::string(name) + "' (expected sum, avg, product, max or min)");
}

std::string placement_string(const Placement& p) {
  if (auto* s = std::get_if<Shard>(&p)) return "Shard(" + std::to_string(s->dim) + ")";
  if (auto* partial = std::get_if<Partial>(&p)) return "Partial(" + std::string(reduce_op_name(partial->op)) + ")";
  return "Replicate()";
}

}  // namespace tessera
