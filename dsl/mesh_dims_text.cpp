#include "dsl/mesh_dims_text.hpp"

#include <algorithm>

#include "dsl/error.hpp"

namespace tessera {

std::vector<std::pair<std::string, int64_t>> parse_mesh_dims(const std::string& text, const std::vector<std::string>& allowed,
                                                             const std::string& what) {
  const std::string where = what + " '" + text + "': ";
  std::string names;
  for (const std::string& a : allowed) names += (names.empty() ? "" : ", ") + a;
  std::vector<std::pair<std::string, int64_t>> dims;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw Error(where + "'" + item + "' is not dim=size (" + names.substr(0, names.find(',')) + "=2)");
    const std::string dim = item.substr(0, eq), size_text = item.substr(eq + 1);
    if (std::find(allowed.begin(), allowed.end(), dim) == allowed.end())
      throw Error(where + "unknown mesh dim '" + dim + "' (" + names + ")");
    if (std::any_of(dims.begin(), dims.end(), [&](const auto& d) { return d.first == dim; }))
      throw Error(where + "mesh dim '" + dim + "' is named twice");
    size_t used = 0;
    int64_t size = 0;
    try {
      size = std::stoll(size_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != size_text.size() || size < 1)
      throw Error(where + dim + "'s size '" + size_text + "' is not a whole number of at least 1");
    dims.emplace_back(dim, size);
    at = comma + 1;
  }
  return dims;
}

}  // namespace tessera
