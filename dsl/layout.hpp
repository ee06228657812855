// Layout: how a tensor is placed on a mesh. Two views of one thing:
//  - TF sharding specs, one per tensor axis: "unsharded", a mesh dim "x", or several mesh dims
//    "x+y" (axis split over x first, then each x-chunk split over y: major to minor);
//  - PyTorch placements, one per mesh dim: Shard(axis) / Replicate / Partial(op).
// Internally each axis keeps the ORDERED list of mesh dims that shard it (NOTES.md: PyTorch had to
// retrofit _StridedShard because it did not), plus the mesh dims holding pending Partial values.
// from_placements orders several mesh dims on one axis by mesh-dim index (PyTorch's convention).
//
// String form (TF's, extended minimally):
//   "sharding_specs:x,unsharded, mesh:|x=3,y=2|0,...,5|0,...,5|CPU:0,...,CPU:5"
//   "sharding_specs:x+y,unsharded, partial:z=sum, mesh:|...|"   (several dims / Partial)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/mesh.hpp"
#include "dsl/placement.hpp"

namespace tessera {

inline const std::string UNSHARDED = "unsharded";

class Layout {
 public:
  Layout() = default;  // an empty handle; only assignable
  bool is_valid() const { return impl_ != nullptr; }
  Layout(std::vector<std::string> sharding_specs, Mesh mesh);
  // The internal form: mesh dim indices per axis (major to minor), and a reduce op per mesh dim
  // that holds Partial values (nullopt elsewhere; empty vector = none).
  Layout(Mesh mesh, std::vector<std::vector<int64_t>> axis_mesh_dims,
         std::vector<std::optional<ReduceOp>> partial = {});

  static Layout replicated(Mesh mesh, int64_t rank);
  static Layout batch_sharded(Mesh mesh, std::string mesh_dim, int64_t rank, int64_t axis = 0);
  static Layout inner_sharded(Mesh mesh, std::string mesh_dim, int64_t rank);
  static Layout from_placements(Mesh mesh, std::vector<Placement> placements, int64_t rank);
  // PyTorch's default for an API taking placements: none given means Replicate on every mesh dim.
  static Layout from_placements_or_replicated(Mesh mesh, std::vector<Placement> placements, int64_t rank);
  static Layout from_string(std::string_view text);

  std::string to_string() const;
  // The layout as every client of a multi-client run sees it: specs, partials, the mesh's dims
  // and global device ids, but not which devices are local (for hashes compared across clients).
  std::string global_text() const;
  // What global_text() says, hashed without building it (the text holds every device id: 4,000
  // characters on 1,024 devices); the same on every client.
  uint64_t global_hash() const;
  const std::vector<std::string>& sharding_specs() const;
  std::string specs_string() const;  // "[x, unsharded]", for messages
  std::vector<Placement> placements() const;
  const Mesh& mesh() const;
  int64_t rank() const;
  bool is_fully_replicated() const;  // no sharded axis and no Partial
  bool has_partial() const;
  int64_t num_shards(int64_t axis) const;
  Layout delete_axes(std::vector<int64_t> axes) const;
  std::vector<int64_t> local_shape(std::vector<int64_t> global_shape, int64_t device_id) const;
  // TF's Layout API: for each device id, the index of the shard it holds along every axis (an
  // axis over several mesh dims counts major to minor); and the row-major number of a shard
  // index tuple among all shards (LayoutError for a tuple of the wrong length or out of range).
  std::vector<std::vector<int64_t>> offset_to_shard() const;
  int64_t offset_tuple_to_global_index(const std::vector<int64_t>& offset_tuple) const;

  // Internal views.
  const std::vector<std::vector<int64_t>>& axis_mesh_dims() const;
  const std::vector<std::optional<ReduceOp>>& partial_ops() const;  // one entry per mesh dim
  std::optional<int64_t> sharded_axis_of(int64_t mesh_dim) const;   // which axis a mesh dim shards
  Layout with_placement(int64_t mesh_dim, const Placement& placement) const;  // appends Shard innermost
  Layout without_partial() const;

  bool operator==(const Layout& other) const;
  bool operator!=(const Layout& other) const { return !(*this == other); }
  // Consistent with ==: equal layouts hash alike (unordered containers keyed by layouts).
  size_t hash() const;

 private:
  struct Impl;
  struct Interned;
  const Impl& impl() const;
  std::string render() const;
  std::shared_ptr<const Impl> impl_;
};

inline size_t hash_value(const Layout& layout) { return layout.hash(); }

}  // namespace tessera

template <>
struct std::hash<tessera::Layout> {
  size_t operator()(const tessera::Layout& layout) const noexcept { return layout.hash(); }
};
