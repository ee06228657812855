// THE shard geometry of Tessera: which block of the global tensor a device holds.
// Everything that needs local shapes or offsets calls shard_geometry(); nothing re-derives it.
//
// Rule (torch.chunk): an extent n split k ways gives chunks of ceil(n / k); trailing chunks are
// smaller or empty (size 0). An axis sharded over several mesh dims applies the rule once per mesh
// dim, in the axis's order (major to minor), each time to the chunk the previous dim produced.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

class Layout;

struct ShardBox {
  std::vector<int64_t> local_shape;    // extent of the block on each axis
  std::vector<int64_t> global_offset;  // where the block starts in the global tensor
  int64_t num_elements() const;
};

// The region both boxes cover; extent 0 on some axis when they do not meet.
ShardBox intersect(const ShardBox& a, const ShardBox& b);

// torch.chunk's piece `index` of an extent `n` split `parts` ways: {start, length}.
struct ChunkRange { int64_t start, length; };
ChunkRange chunk_range(int64_t n, int64_t parts, int64_t index);

// LayoutError when the shape's rank differs from the layout's; MeshError for bad coordinates.
ShardBox shard_geometry(const std::vector<int64_t>& global_shape, const Layout& layout,
                        const std::vector<int64_t>& device_coords);

}  // namespace tessera
