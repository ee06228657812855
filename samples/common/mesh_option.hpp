// The samples' --mesh option: "dp=2,tp=2" names the mesh dims and their sizes, in order.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <tessera/tessera.hpp>

namespace samples {

using MeshDims = std::vector<std::pair<std::string, int64_t>>;

// Parses "name=size,..." with each name one of `allowed`, at most once; tessera::Error naming the
// offending part otherwise.
inline MeshDims parse_mesh_option(const std::string& text, const std::vector<std::string>& allowed) {
  MeshDims dims;
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == ',') parts.emplace_back();
    else parts.back().push_back(c);
  }
  for (const std::string& part : parts) {
    const size_t eq = part.find('=');
    const std::string name = part.substr(0, eq);
    bool known = false;
    for (const std::string& a : allowed) known = known || a == name;
    if (!known) {
      std::string names;
      for (const std::string& a : allowed) names += (names.empty() ? "" : ", ") + a;
      throw tessera::Error("--mesh '" + text + "': unknown mesh dim '" + name + "' (use " + names + ")");
    }
    for (const auto& [seen, size] : dims)
      if (seen == name) throw tessera::Error("--mesh '" + text + "': mesh dim '" + name + "' given twice");
    int64_t size = 0;
    try {
      size_t used = 0;
      size = eq == std::string::npos ? 0 : std::stoll(part.substr(eq + 1), &used);
      if (eq + 1 + used != part.size()) size = 0;
    } catch (const std::exception&) {
      size = 0;
    }
    if (size < 1) throw tessera::Error("--mesh '" + text + "': '" + part + "' is not name=size with a positive size");
    dims.emplace_back(name, size);
  }
  return dims;
}

inline int64_t mesh_dim_size(const MeshDims& dims, const std::string& name) {
  for (const auto& [n, size] : dims)
    if (n == name) return size;
  return 1;
}

}  // namespace samples
