// Axis arithmetic shared by the ops built from others (indexing, sorting): a negative axis
// counted from the end, and the permutations that move an axis last and back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/error.hpp"
#include "dsl/source_location.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

// `axis` of a rank-`rank` tensor as 0..rank-1 (negative: from the end); ShapeError naming `op`.
inline int64_t checked_axis(std::string_view op, int64_t axis, int64_t rank, const SourceLocation& at) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank) + at_line(at));
  return a;
}

// The permutation that moves `axis` last, the others keeping their order.
inline std::vector<int64_t> axis_last(int64_t rank, int64_t axis) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  return perm;
}

inline std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm) {
  std::vector<int64_t> out(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out[size_t(perm[i])] = int64_t(i);
  return out;
}

}  // namespace tessera
