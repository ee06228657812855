// Run-time checks of indices. An index's value exists only when the step runs, so a label of
// sparse_softmax_cross_entropy_with_logits outside [0, classes) or a gather index outside its
// axis cannot be refused while the graph is built. check_index(ids, lo, hi, use) is ids itself;
// the kernel that computes it (codegen/lower_kernel.cpp) records the first element outside
// [lo, hi) in its device's status word, and the executor reads the words once the step is done
// and raises an IndexError naming the op, its source line and the value, as TensorFlow's CPU
// kernels raise InvalidArgumentError. Indices in range cost one pass over the indices.
#pragma once

#include <cstdint>
#include <string>

#include "dsl/error.hpp"
#include "dsl/node.hpp"
#include "dsl/ops.hpp"

namespace tessera {

struct IndexError : Error { using Error::Error; };

// What the checked indices are for: the message names it.
enum class IndexUse { Label, GatherIndex, EmbeddingId, TakeAlongAxisIndex, ScatterIndex, IndexSelectIndex, MultinomialWeights,
                      GroupSize, GroupSizesTotal, /* grouped_matmul: a size, a running total of the sizes */
                      SplitSize, SplitSizesSent, SplitSizesReceived, /* all_to_all_v */
                      // grouped_matmul inside local_map over uneven blocks: a running total plus
                      // how many rows this device's block of x has fewer than the largest block
                      GroupSizesTotalOnDevice };

// MultinomialWeights checks a code per row of probs, not an index: what is wrong with its weights.
enum class MultinomialFault : int64_t { Negative = 1, NaN = 2, Infinite = 3, SumsToZero = 4 };

// `indices` (int32 / int64), checked to lie in [lo, hi) when the step runs.
Tensor check_index(const Tensor& indices, int64_t lo, int64_t hi, IndexUse use, Loc at);

// The IndexError message of a check_index node (its attributes and source line) that met `value`.
std::string index_error_message(const NodeAttrs& attrs, const std::string& location, int64_t value);

}  // namespace tessera
