// local_map with uneven shards: inside fn, a local value's block can have different extents on
// different devices (5 rows over 2 devices: 3 and 2). Tessera still runs ONE program, so every
// local value describes its per-device extents the way a layout describes a sharded tensor's:
// per axis, a global extent and the mesh dims it is split over (shard_geometry's rule, major to
// minor). An axis split over no mesh dim has the same extent everywhere. The partitioner then
// treats a local value as a block of that virtual global value, and the per-device extents
// become run-time parameters like any uneven shard's.
//
// The rules below carry these descriptions through every local op and collective, and give a
// ShapeError naming the op where devices would disagree (adding blocks of 3 and 2 rows to
// blocks of 3 and 3) or where no single program can express the result (a reshape that merges
// an axis whose extent differs with others).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsl/mesh.hpp"
#include "dsl/op_kind.hpp"

namespace tessera {

class Layout;
struct Node;
struct NodeAttrs;

// One axis: `global` split over `dims` (none: `global` on every device).
struct AxisExtent {
  int64_t global = 0;
  std::vector<int64_t> dims;
  bool is_constant() const { return dims.empty(); }
  bool operator==(const AxisExtent&) const = default;
};

struct BlockExtents {
  Mesh mesh;
  std::vector<AxisExtent> axes;
  bool operator==(const BlockExtents&) const = default;
};

// The extent of one axis on the device at `coords`.
int64_t extent_on(const AxisExtent& axis, const Mesh& mesh, const std::vector<int64_t>& coords);
// The block shape on the device at `coords`.
std::vector<int64_t> extents_on(const BlockExtents& extents, const std::vector<int64_t>& coords);
// The canonical form: an axis whose extent is the same on every device has no dims.
AxisExtent normalized(AxisExtent axis, const Mesh& mesh);
// Whether the extent changes between devices that differ only in mesh dim `d`.
bool varies_along(const AxisExtent& axis, const Mesh& mesh, int64_t d);
// The virtual global value: its shape and the layout whose blocks have these extents.
std::vector<int64_t> extents_global_shape(const BlockExtents& extents);
Layout extents_layout(const BlockExtents& extents);
// Every axis the same on every device: `shape`.
BlockExtents constant_extents(const Mesh& mesh, const std::vector<int64_t>& shape);
bool all_constant(const BlockExtents& extents);
// "[3, 2]": the extents of an axis on the devices of the mesh, for messages.
std::string extents_text(const AxisExtent& axis, const Mesh& mesh);

// A node's extents: its own (local values with uneven blocks), else its shape everywhere.
BlockExtents extents_of(const Node& n, const Mesh& mesh);
// "3x4 on every device" / "[3, 2]x4 on the devices of mesh dim x", for messages.
std::string extents_string(const BlockExtents& extents);

// Derived in make_node for a local value (nullopt: its shape on every device). `attrs.extents`
// of an expand gives the extents of the axes it broadcasts to (numpy broadcasting against an
// operand whose blocks differ). ShapeError when the devices' extents disagree or cannot be
// expressed.
std::optional<BlockExtents> derive_block_extents(OpKind op, const std::vector<int64_t>& shape,
                                                 const std::vector<std::shared_ptr<const Node>>& inputs,
                                                 const NodeAttrs& attrs, const Mesh& mesh, const std::string& where);

// The output extents of a functional collective over mesh dim `mesh_dim` (axes: its axis
// arguments); its traced shape is the first device's block.
BlockExtents collective_extents(OpKind op, const Node& input, int64_t mesh_dim, const std::vector<int64_t>& axes,
                                const std::string& where);

// The extents numpy broadcasting gives `shape` from `operands` (rank-aligned from the right):
// on each axis, an operand's extents where it is not broadcast. nullopt: all constant.
std::optional<BlockExtents> broadcast_extents(const std::vector<std::shared_ptr<const Node>>& operands,
                                              const std::vector<int64_t>& shape);
// The first device's block: the shape fn is traced with.
std::vector<int64_t> traced_shape(const BlockExtents& extents);

// from_local: the global extent of `axis` when local blocks with extents `local` are the
// blocks of a value sharded over `dims` (ShapeError naming `what` when they are not).
int64_t assembled_extent(const AxisExtent& local, const std::vector<int64_t>& dims, const Mesh& mesh, int64_t axis,
                         const std::string& what);

}  // namespace tessera
