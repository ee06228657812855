// Checked element counts: every shape that enters Tessera (a node's, an Array's, a mesh's) has
// non-negative extents whose product, and byte count, fit comfortably in 64 bits. Unchecked,
// a product that overflows wraps to a small or negative number and the op hangs, reads out of
// bounds or allocates forever.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace tessera {

// The most elements one tensor may have (2^48: its bytes, at 8 per element, stay far from 2^63).
inline constexpr int64_t kMaxElements = int64_t(1) << 48;

// The product of `shape`; ShapeError naming `what` and the shape when an extent is negative or
// the product exceeds kMaxElements.
int64_t checked_element_count(std::span<const int64_t> shape, std::string_view what);

// The product of a shape already checked where it entered (a node's, an Array's, a block's).
inline int64_t element_count(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

}  // namespace tessera
