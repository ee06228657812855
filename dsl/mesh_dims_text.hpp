// Mesh dims written as text, "dp=2,tp=4": the samples' --mesh and the planner's --plan.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// The dims of `text` and their sizes, in order: each name one of `allowed` and named once, each
// size a whole number of at least 1. Error starting "<what> '<text>': " and naming the part
// that is wrong (`what`: the flag or the thing parsed, "--mesh", "plan").
std::vector<std::pair<std::string, int64_t>> parse_mesh_dims(const std::string& text, const std::vector<std::string>& allowed,
                                                             const std::string& what);

}  // namespace tessera
