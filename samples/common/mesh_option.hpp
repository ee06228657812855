// The samples' --mesh option: "dp=2,tp=2" names the mesh dims and their sizes, in order.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <tessera/tessera.hpp>

#include "dsl/mesh_dims_text.hpp"

namespace samples {

using MeshDims = std::vector<std::pair<std::string, int64_t>>;

// Parses "name=size,..." with each name one of `allowed`, at most once; tessera::Error naming the
// offending part otherwise (the library's parse_mesh_dims, as the planner's --plan).
inline MeshDims parse_mesh_option(const std::string& text, const std::vector<std::string>& allowed) {
  return tessera::parse_mesh_dims(text, allowed, "--mesh");
}

inline int64_t mesh_dim_size(const MeshDims& dims, const std::string& name) {
  for (const auto& [n, size] : dims)
    if (n == name) return size;
  return 1;
}

}  // namespace samples
