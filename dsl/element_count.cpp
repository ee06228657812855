#include "dsl/element_count.hpp"

#include <string>

#include "dsl/error.hpp"

namespace tessera {
namespace {

std::string text(std::span<const int64_t> shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

int64_t checked_element_count(std::span<const int64_t> shape, std::string_view what) {
  int64_t count = 1;
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] < 0)
      throw ShapeError(std::string(what) + ": shape " + text(shape) + " has a negative extent on axis " + std::to_string(a));
    if (shape[a] != 0 && count > kMaxElements / shape[a]) count = kMaxElements + 1;
    else count *= shape[a];
  }
  // A zero extent anywhere makes the tensor empty, however large the others.
  for (int64_t e : shape)
    if (e == 0) return 0;
  if (count > kMaxElements)
    throw ShapeError(std::string(what) + ": shape " + text(shape) + " has more than 2^48 elements");
  return count;
}

}  // namespace tessera
