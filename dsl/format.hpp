// fmt formatters for the public value types, in TensorFlow DTensor's print forms:
//   Mesh   -> Mesh.from_string(|x=3,y=2|0,...,5|0,...,5|CPU:0,...,CPU:5)
//   Layout -> Layout.from_string(sharding_specs:x,unsharded, mesh:|...|)
//   Array  -> [[0 1] [2 3]]
//   Tensor -> Tensor({"CPU:0": [[1 1] [1 1]], ...}, layout="sharding_specs:x,y, mesh:|...|",
//             shape=(6, 4), dtype=float32); a fully replicated tensor prints its single value.
#pragma once

#include <fmt/format.h>

#include <string>

#include "dsl/array_printer.hpp"
#include "dsl/layout.hpp"
#include "dsl/mesh.hpp"
#include "dsl/tensor.hpp"

namespace tessera {
std::string tensor_to_string(const Tensor& t);  // defined in jit/ (printing may force a value)
}  // namespace tessera

template <>
struct fmt::formatter<tessera::Mesh> : fmt::formatter<std::string_view> {
  auto format(const tessera::Mesh& m, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format("Mesh.from_string(" + m.to_string() + ")", ctx);
  }
};

template <>
struct fmt::formatter<tessera::Layout> : fmt::formatter<std::string_view> {
  auto format(const tessera::Layout& l, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format("Layout.from_string(" + l.to_string() + ")", ctx);
  }
};

template <>
struct fmt::formatter<tessera::Array> : fmt::formatter<std::string_view> {
  auto format(const tessera::Array& a, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessera::array_to_string(a), ctx);
  }
};

template <>
struct fmt::formatter<tessera::Tensor> : fmt::formatter<std::string_view> {
  auto format(const tessera::Tensor& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessera::tensor_to_string(t), ctx);
  }
};

template <>
struct fmt::formatter<tessera::DType> : fmt::formatter<std::string_view> {
  auto format(tessera::DType d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(tessera::dtype_name(d), ctx);
  }
};
