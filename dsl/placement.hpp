// Per-mesh-dimension placements (PyTorch's Shard / Replicate / Partial) and reduce ops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace tessera {

enum class ReduceOp { Sum, Avg, Product, Max, Min };

struct Shard {
  int64_t dim;
  bool operator==(const Shard&) const = default;
};
struct Replicate {
  bool operator==(const Replicate&) const = default;
};
struct Partial {
  ReduceOp op = ReduceOp::Sum;
  bool operator==(const Partial&) const = default;
};
using Placement = std::variant<Shard, Replicate, Partial>;

// PyTorch's Placement.is_shard(dim) / is_replicate() / is_partial(), as free functions.
bool is_shard(const Placement& p, std::optional<int64_t> dim = std::nullopt);  // any dim, or that one
bool is_replicate(const Placement& p);
bool is_partial(const Placement& p);

std::string_view reduce_op_name(ReduceOp op);       // "sum", "avg", "product", "max", "min"
ReduceOp reduce_op_from_name(std::string_view name);  // LayoutError for an unknown name
std::string placement_string(const Placement& p);     // "Shard(0)", "Replicate()", "Partial(sum)"

}  // namespace tessera
