#include "dsl/shard_geometry.hpp"

#include <algorithm>

#include "dsl/element_count.hpp"
#include "dsl/error.hpp"
#include "dsl/layout.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

int64_t ShardBox::num_elements() const { return element_count(local_shape); }

ChunkRange chunk_range(int64_t n, int64_t parts, int64_t index) {
  int64_t chunk = (n + parts - 1) / parts;
  int64_t start = std::min(index * chunk, n);
  return {start, std::min(chunk, n - start)};
}

ShardBox shard_geometry(const std::vector<int64_t>& global_shape, const Layout& layout,
                        const std::vector<int64_t>& coords) {
  if (int64_t(global_shape.size()) != layout.rank())
    throw LayoutError("a tensor of shape " + shape_string(global_shape) + " (rank " +
                     std::to_string(global_shape.size()) + ") cannot take a rank-" +
                     std::to_string(layout.rank()) + " layout [" +
                     join(layout.sharding_specs(), ", ") + "]");
  const std::vector<int64_t>& mesh_shape = layout.mesh().shape();
  if (coords.size() != mesh_shape.size())
    throw MeshError(std::to_string(coords.size()) + " device coordinates for a " +
                    std::to_string(mesh_shape.size()) + "-D mesh");
  ShardBox box{global_shape, std::vector<int64_t>(global_shape.size(), 0)};
  for (size_t axis = 0; axis < global_shape.size(); ++axis) {
    if (global_shape[axis] < 0)
      throw ShapeError("shape " + shape_string(global_shape) + " has a negative extent on axis " + std::to_string(axis));
    for (int64_t d : layout.axis_mesh_dims()[axis]) {
      if (coords[d] < 0 || coords[d] >= mesh_shape[d]) throw MeshError("device coordinate out of range");
      ChunkRange r = chunk_range(box.local_shape[axis], mesh_shape[d], coords[d]);
      box.global_offset[axis] += r.start;
      box.local_shape[axis] = r.length;
    }
  }
  return box;
}

ShardBox intersect(const ShardBox& a, const ShardBox& b) {
  ShardBox r;
  for (size_t i = 0; i < a.local_shape.size(); ++i) {
    const int64_t lo = std::max(a.global_offset[i], b.global_offset[i]);
    const int64_t hi = std::min(a.global_offset[i] + a.local_shape[i], b.global_offset[i] + b.local_shape[i]);
    r.global_offset.push_back(lo);
    r.local_shape.push_back(std::max<int64_t>(hi - lo, 0));
  }
  return r;
}

}  // namespace tessera
