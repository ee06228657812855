#include "dsl/index_check.hpp"

#include <fmt/format.h>

#include "dsl/string_util.hpp"

namespace tessera {
namespace {

const char* use_text(IndexUse use) {
  switch (use) {
    case IndexUse::Label: return "sparse_softmax_cross_entropy_with_logits: label";
    case IndexUse::GatherIndex: return "gather: index";
    case IndexUse::EmbeddingId: return "embedding: id";
    case IndexUse::TakeAlongAxisIndex: return "take_along_axis: index";
    case IndexUse::ScatterIndex: return "scatter_add: index";
    case IndexUse::IndexSelectIndex: return "index_select: index";
    case IndexUse::MultinomialWeights: return "multinomial: fault code";
    case IndexUse::GroupSize: return "grouped_matmul: group size";
    case IndexUse::GroupSizesTotal: return "grouped_matmul: running total of group sizes";
    case IndexUse::SplitSize: return "all_to_all_v: send count";
    case IndexUse::SplitSizesSent: return "all_to_all_v: a device's total of send counts";
    case IndexUse::SplitSizesReceived: return "all_to_all_v: a device's total of received rows (max_received_rows bounds it)";
    case IndexUse::GroupSizesTotalOnDevice: return "grouped_matmul: running total of group sizes on a device";
  }
  return "index";
}

}  // namespace

Tensor check_index(const Tensor& indices, int64_t lo, int64_t hi, IndexUse use, Loc at) {
  if (indices.dtype() != DType::i32 && indices.dtype() != DType::i64)
    throw DTypeError(std::string(use_text(use)) + "s must be int32 or int64, got " + std::string(dtype_name(indices.dtype())) +
                     at_line(at));
  NodeAttrs attrs;
  attrs.scalar = double(lo);
  attrs.scalar2 = double(hi);
  attrs.seed = uint64_t(use);
  return Tensor(make_node(OpKind::CheckIndex, indices.dtype(), indices.shape(), {indices.node()}, std::move(attrs), at));
}

std::string multinomial_fault_text(int64_t code) {
  switch (MultinomialFault(code)) {
    case MultinomialFault::Negative: return "a negative weight";
    case MultinomialFault::NaN: return "a NaN weight";
    case MultinomialFault::Infinite: return "an infinite weight";
    case MultinomialFault::SumsToZero: return "weights that sum to zero";
  }
  return "invalid weights";
}

std::string index_error_message(const NodeAttrs& attrs, const std::string& location, int64_t value) {
  if (IndexUse(attrs.seed) == IndexUse::MultinomialWeights)
    return fmt::format("multinomial: a row of probs has {}: it is no probability distribution{}", multinomial_fault_text(value),
                       location.empty() ? "" : " (at " + location + ")");
  if (IndexUse(attrs.seed) == IndexUse::GroupSizesTotal)
    return fmt::format("grouped_matmul: the group sizes add up to more than the {} rows of x (the first groups already hold {}){}",
                       int64_t(attrs.scalar2) - 1, value, location.empty() ? "" : " (at " + location + ")");
  if (IndexUse(attrs.seed) == IndexUse::GroupSizesTotalOnDevice)
    return fmt::format("grouped_matmul: inside local_map, a device's group sizes add up to {} more rows than its block of x "
                       "holds (blocks of up to {} rows){}",
                       value - (int64_t(attrs.scalar2) - 1), int64_t(attrs.scalar2) - 1, location.empty() ? "" : " (at " + location + ")");
  return fmt::format("{} {} is outside the valid range [{}, {}){}", use_text(IndexUse(attrs.seed)), value, int64_t(attrs.scalar),
                     int64_t(attrs.scalar2), location.empty() ? "" : " (at " + location + ")");
}

}  // namespace tessera
