#include "jit/api/visualize_sharding.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "dsl/element_count.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"
#include "jit/mesh_communicators.hpp"

namespace tessera {
namespace {

std::string range_text(int64_t start, int64_t length) {
  if (length == 0) return "empty";
  return std::to_string(start) + "-" + std::to_string(start + length - 1);
}

std::string pad(const std::string& s, size_t width) { return s + std::string(width - s.size(), ' '); }

}  // namespace

std::string visualize_sharding(const Tensor& t, const std::string& header) {
  const int64_t rank = t.rank();
  if (rank != 1 && rank != 2)
    throw ShapeError("visualize_sharding shows 1-D and 2-D tensors; this one has shape " + shape_string(t.shape()));
  const Layout layout = t.layout();
  const std::vector<int64_t> shape = t.shape();
  const auto coords = local_device_coords(layout.mesh());
  const std::vector<std::string> names = layout.mesh().local_devices();
  // Block (row range, column range) -> devices holding it.
  using Range = std::pair<int64_t, int64_t>;
  std::map<std::pair<Range, Range>, std::vector<std::string>> blocks;
  std::set<Range> rows, cols;
  for (size_t i = 0; i < coords.size(); ++i) {
    ShardBox box = shard_geometry(shape, layout, coords[i]);
    Range row = rank == 2 ? Range{box.global_offset[0], box.local_shape[0]} : Range{0, 1};
    Range col = {box.global_offset[rank - 1], box.local_shape[rank - 1]};
    rows.insert(row);
    cols.insert(col);
    blocks[{row, col}].push_back(names[i]);
  }
  std::vector<std::string> col_titles = {""};
  for (const Range& c : cols) col_titles.push_back("Col " + range_text(c.first, c.second));
  std::vector<std::vector<std::string>> table = {col_titles};
  for (const Range& r : rows) {
    std::vector<std::string> line = {rank == 2 ? "Row " + range_text(r.first, r.second) : ""};
    for (const Range& c : cols) {
      auto it = blocks.find({r, c});
      line.push_back(it == blocks.end() ? "" : join(it->second, ", "));
    }
    table.push_back(std::move(line));
  }
  std::vector<size_t> widths(table[0].size(), 0);
  for (const auto& line : table)
    for (size_t c = 0; c < line.size(); ++c) widths[c] = std::max(widths[c], line[c].size());
  auto rule = [&] {
    std::string s = "+";
    for (size_t w : widths) s += std::string(w + 2, '-') + "+";
    return s + "\n";
  };
  std::string out = header.empty() ? "" : header + "\n";
  if (element_count(shape) == 0) out += "empty: shape " + shape_string(shape) + " has no elements, so every block is empty\n";
  if (layout.has_partial()) {
    std::vector<std::string> dims = layout.mesh().dim_names(), partial;
    for (size_t m = 0; m < dims.size(); ++m)
      if (layout.partial_ops()[m]) partial.push_back(dims[m] + ": Partial(" + std::string(reduce_op_name(*layout.partial_ops()[m])) + ")");
    out += "pending reductions: " + join(partial, ", ") + "\n";
  }
  out += rule();
  for (size_t l = 0; l < table.size(); ++l) {
    out += "|";
    for (size_t c = 0; c < table[l].size(); ++c) out += " " + pad(table[l][c], widths[c]) + " |";
    out += "\n";
    if (l == 0) out += rule();
  }
  return out + rule();
}

}  // namespace tessera
