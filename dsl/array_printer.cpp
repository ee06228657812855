#include "dsl/array_printer.hpp"

#include <fmt/format.h>

namespace tessera {
namespace {

constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

std::string element_text(const Array& a, int64_t i) {
  const std::byte* data = a.bytes();
  switch (a.dtype()) {
    case DType::f32: return fmt::format("{:.9g}", reinterpret_cast<const float*>(data)[i]);
    case DType::f64: return fmt::format("{:.17g}", reinterpret_cast<const double*>(data)[i]);
    case DType::bf16: return fmt::format("{:.4g}", a.element_as_double(i));
    case DType::f16: return fmt::format("{:.5g}", a.element_as_double(i));
    case DType::i32: return fmt::format("{}", reinterpret_cast<const int32_t*>(data)[i]);
    case DType::i64: return fmt::format("{}", reinterpret_cast<const int64_t*>(data)[i]);
    case DType::u8: return reinterpret_cast<const uint8_t*>(data)[i] ? "True" : "False";
  }
  return "?";
}

void render(const Array& a, int64_t axis, int64_t base, const std::vector<int64_t>& strides, bool summarise,
            std::string& out) {
  const auto& shape = a.shape_ref();
  out += '[';
  const int64_t n = shape[axis];
  const bool elide = summarise && n > 2 * kEdgeItems;
  bool first = true;
  for (int64_t i = 0; i < n; ++i) {
    if (elide && i == kEdgeItems) {
      out += " ...";
      i = n - kEdgeItems;
    }
    if (!first) out += ' ';
    first = false;
    if (axis + 1 == int64_t(shape.size())) out += element_text(a, base + i);
    else render(a, axis + 1, base + i * strides[axis], strides, summarise, out);
  }
  out += ']';
}

}  // namespace

std::string array_to_string(const Array& a) {
  if (a.rank() == 0) return element_text(a, 0);
  std::vector<int64_t> strides(a.rank(), 1);
  for (int64_t i = a.rank() - 2; i >= 0; --i) strides[i] = strides[i + 1] * a.shape_ref()[i + 1];
  std::string out;
  render(a, 0, 0, strides, a.numel() > kSummaryThreshold, out);
  return out;
}

}  // namespace tessera
