#include "dsl/local_map.hpp"

#include "dsl/block_extents.hpp"
#include "dsl/default_mesh.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

std::vector<Mesh>& scope_meshes() {
  thread_local std::vector<Mesh> meshes;
  return meshes;
}

std::string placements_text(const std::vector<Placement>& placements) {
  return "[" + join(placements, ", ", [](const Placement& p) { return placement_string(p); }) + "]";
}

// The local value `t` of a functional collective, and its mesh dim's index and size.
struct CollectiveOperand {
  NodeRef node;
  int64_t mesh_dim;
  int64_t ways;
};

CollectiveOperand collective_operand(std::string_view op, const Tensor& t, std::string_view mesh_dim, Loc where) {
  const NodeRef& n = t.node();
  if (!n->local)
    throw LayoutError(std::string(op) + ": functional collectives take local values (the tensors inside a local_map'ed "
                      "function); this tensor is global" + at_line(where));
  if (!n->mesh.contains_dim(mesh_dim))
    throw MeshError(std::string(op) + ": unknown mesh dim '" + std::string(mesh_dim) + "' of mesh " + n->mesh.to_string() + at_line(where));
  const int64_t d = n->mesh.dim_index(mesh_dim);
  return {n, d, n->mesh.shape()[size_t(d)]};
}

int64_t checked_axis(std::string_view op, const NodeRef& n, int64_t axis, Loc where) {
  const int64_t a = axis < 0 ? axis + n->rank() : axis;
  if (a < 0 || a >= n->rank())
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for a local value of shape " +
                     shape_string(n->shape) + at_line(where));
  return a;
}

// The collective's node; its shape is the first device's block of the extents it gives (blocks
// may differ between devices: dsl/block_extents.hpp).
Tensor collective(OpKind op, const CollectiveOperand& x, std::vector<int64_t> axes, double scalar, Loc where) {
  std::vector<int64_t> shape = traced_shape(collective_extents(op, *x.node, x.mesh_dim, axes, at_line(where)));
  NodeAttrs attrs;
  attrs.axes = {x.mesh_dim};
  attrs.axes.insert(attrs.axes.end(), axes.begin(), axes.end());
  attrs.scalar = scalar;
  return Tensor(make_node(op, x.node->dtype, std::move(shape), {x.node}, std::move(attrs), where));
}

// A Shift node moving device i's block to device destinations[i]; its table follows the mesh
// dim in attrs.axes, so programs of different tables differ in their nodes and cache keys.
Tensor permuted_blocks(const Tensor& t, const CollectiveOperand& x, std::vector<int64_t> destinations, Loc where) {
  bool identity = true;
  for (size_t i = 0; i < destinations.size(); ++i) identity = identity && destinations[i] == int64_t(i);
  if (identity) return t;
  return collective(OpKind::Shift, x, std::move(destinations), 0, where);
}

void check_permutation(const std::vector<int64_t>& destinations, const CollectiveOperand& x, std::string_view mesh_dim, Loc where) {
  auto fail = [&](const std::string& why) {
    const std::string table = "[" + join(destinations, ", ", [](int64_t d) { return std::to_string(d); }) + "]";
    throw LayoutError("permute: destinations " + table + " are not a permutation of the " +
                      std::to_string(x.ways) + " devices of mesh dim '" + std::string(mesh_dim) + "': " + why + at_line(where));
  };
  if (int64_t(destinations.size()) != x.ways)
    fail(std::to_string(destinations.size()) + " entries for " + std::to_string(x.ways) + " devices");
  std::vector<bool> taken(size_t(x.ways), false);
  for (int64_t d : destinations) {
    if (d < 0 || d >= x.ways) fail(std::to_string(d) + " is out of range [0, " + std::to_string(x.ways) + ")");
    if (taken[size_t(d)]) fail("device " + std::to_string(d) + " is named twice");
    taken[size_t(d)] = true;
  }
}

// The first device's block: local_map traces fn with it (other devices' blocks may be smaller).
std::vector<int64_t> first_block_shape(const std::vector<int64_t>& shape, const Layout& layout) {
  return shard_geometry(shape, layout, std::vector<int64_t>(size_t(layout.mesh().ndim()), 0)).local_shape;
}

std::string argument_name(size_t index) { return "tensor argument " + std::to_string(index); }
std::string output_name(size_t index) { return "output " + std::to_string(index); }

void check_output_count(size_t count, const LocalMapSpec& spec) {
  if (spec.out_placements.size() != count)
    throw LayoutError("local_map: out_placements has " + std::to_string(spec.out_placements.size()) + " entries but fn returned " +
                      std::to_string(count) + " outputs" + at_line(spec.where));
}

}  // namespace

Tensor all_reduce(const Tensor& t, ReduceOp op, std::string_view mesh_dim, Loc where) {
  const CollectiveOperand x = collective_operand("all_reduce", t, mesh_dim, where);
  return collective(OpKind::AllReduce, x, {}, double(int(op)), where);
}

Tensor all_gather(const Tensor& t, std::string_view mesh_dim, int64_t axis, Loc where) {
  const CollectiveOperand x = collective_operand("all_gather", t, mesh_dim, where);
  const int64_t a = checked_axis("all_gather", x.node, axis, where);
  return collective(OpKind::AllGather, x, {a}, 0, where);
}

Tensor reduce_scatter(const Tensor& t, ReduceOp op, std::string_view mesh_dim, int64_t axis, Loc where) {
  const CollectiveOperand x = collective_operand("reduce_scatter", t, mesh_dim, where);
  const int64_t a = checked_axis("reduce_scatter", x.node, axis, where);
  return collective(OpKind::ReduceScatter, x, {a}, double(int(op)), where);
}

Tensor all_to_all(const Tensor& t, std::string_view mesh_dim, int64_t split_axis, int64_t concat_axis, Loc where) {
  const CollectiveOperand x = collective_operand("all_to_all", t, mesh_dim, where);
  const int64_t split = checked_axis("all_to_all", x.node, split_axis, where);
  const int64_t concat = checked_axis("all_to_all", x.node, concat_axis, where);
  if (split == concat)
    throw ShapeError("all_to_all: split_axis and concat_axis are both " + std::to_string(split) +
                     "; they must differ" + at_line(where));
  return collective(OpKind::AllToAll, x, {split, concat}, 0, where);
}

Tensor shift(const Tensor& t, std::string_view mesh_dim, int64_t offset, Loc where) {
  const CollectiveOperand x = collective_operand("shift", t, mesh_dim, where);
  const int64_t normalized = ((offset % x.ways) + x.ways) % x.ways;
  std::vector<int64_t> destinations(size_t(x.ways));
  for (int64_t i = 0; i < x.ways; ++i) destinations[size_t(i)] = (i + normalized) % x.ways;
  return permuted_blocks(t, x, std::move(destinations), where);
}

Tensor permute(const Tensor& t, std::string_view mesh_dim, std::vector<int64_t> destinations, Loc where) {
  const CollectiveOperand x = collective_operand("permute", t, mesh_dim, where);
  check_permutation(destinations, x, mesh_dim, where);
  return permuted_blocks(t, x, std::move(destinations), where);
}

Tensor local_chunk(const Tensor& t, std::string_view mesh_dim, int64_t axis, Loc where) {
  const CollectiveOperand x = collective_operand("local_chunk", t, mesh_dim, where);
  if (x.node->varying >> x.mesh_dim & 1)
    throw LayoutError("local_chunk: the value differs between the devices of mesh dim '" + std::string(mesh_dim) +
                      "'; a local chunk is taken of a value that is the same on each (all_gather it first)" + at_line(where));
  const int64_t a = checked_axis("local_chunk", x.node, axis, where);
  return collective(OpKind::LocalChunk, x, {a}, 0, where);
}

Tensor axis_index(std::string_view mesh_dim, Loc where) {
  if (scope_meshes().empty())
    throw LayoutError("axis_index: only inside a function run by local_map" + at_line(where));
  const Mesh& mesh = scope_meshes().back();
  if (!mesh.contains_dim(mesh_dim))
    throw MeshError("axis_index: unknown mesh dim '" + std::string(mesh_dim) + "' of mesh " + mesh.to_string() + at_line(where));
  // Every device's block of an iota sharded over the dim is its own coordinate.
  const int64_t d = mesh.dim_index(mesh_dim);
  std::vector<std::vector<int64_t>> axis_dims(1);
  axis_dims[0] = {d};
  const Layout layout(mesh, axis_dims);
  Tensor coordinates = iota({mesh.shape()[size_t(d)]}, 0, layout, DType::i32, where);
  return reshape(detail::to_local_node(coordinates, layout, {1}, where), {}, where);
}

namespace detail {

std::vector<int64_t> shift_destinations(const NodeAttrs& attrs) { return {attrs.axes.begin() + 1, attrs.axes.end()}; }

Tensor to_local_node(const Tensor& global, const Layout& layout, std::vector<int64_t> block_shape, Loc where) {
  NodeAttrs attrs;
  attrs.layout = layout;
  return Tensor(make_node(OpKind::ToLocal, global.dtype(), std::move(block_shape), {global.node()}, std::move(attrs), where));
}

Tensor from_local_node(const Tensor& local, const Layout& layout, std::vector<int64_t> shape, Loc where) {
  NodeAttrs attrs;
  attrs.layout = layout;
  return Tensor(make_node(OpKind::FromLocal, local.dtype(), std::move(shape), {local.node()}, std::move(attrs), where));
}

LocalMapScope::LocalMapScope(const Mesh& mesh) { scope_meshes().push_back(mesh); }
LocalMapScope::~LocalMapScope() { scope_meshes().pop_back(); }

Mesh local_map_mesh(const LocalMapSpec& spec, const std::vector<Tensor>& tensor_args) {
  Mesh mesh = spec.mesh;
  for (size_t i = 0; i < tensor_args.size(); ++i) {
    const NodeRef& n = tensor_args[i].node();
    if (n->local)
      throw LayoutError("local_map: " + argument_name(i) + " is already a local value (local_map inside local_map)" + at_line(spec.where));
    if (!n->mesh.is_valid()) continue;
    if (!mesh.is_valid()) mesh = n->mesh;
    else if (!(n->mesh == mesh))
      throw LayoutError("local_map: " + argument_name(i) + " lives on mesh " + n->mesh.to_string() + " but the call runs on " +
                        mesh.to_string() + " (mismatched meshes)" + at_line(spec.where));
  }
  if (mesh.is_valid()) return mesh;
  if (std::optional<Mesh> scoped = default_mesh()) return *scoped;
  throw LayoutError("local_map: no mesh: pass one, open a DefaultMeshScope, or pass a tensor argument that lives on one" +
                    at_line(spec.where));
}

Tensor local_map_input(const Tensor& arg, size_t index, size_t count, const LocalMapSpec& spec, const Mesh& mesh) {
  if (!spec.in_placements.empty() && spec.in_placements.size() != count)
    throw LayoutError("local_map: in_placements has " + std::to_string(spec.in_placements.size()) + " entries for " +
                      std::to_string(count) + " tensor arguments" + at_line(spec.where));
  Tensor x = arg;
  const bool on_mesh = x.node()->mesh.is_valid();
  if (!spec.in_placements.empty() && !spec.in_placements[index].empty()) {
    const std::vector<Placement>& wanted = spec.in_placements[index];
    if (int64_t(wanted.size()) != mesh.ndim())
      throw LayoutError("local_map: in_placements for " + argument_name(index) + " has " + std::to_string(wanted.size()) +
                        " placements for a " + std::to_string(mesh.ndim()) + "-dim mesh" + at_line(spec.where));
    const Layout required = Layout::from_placements(mesh, wanted, x.rank());
    // Asked to redistribute, a pending argument is pinned to the placements wanted without
    // asking its layout: the answer would propagate the graph pending before it (a pipeline's
    // stage shifts asked it of every tick: a sixth of planning GPT-3's pipelines), and a pin
    // on a value already so laid out moves nothing.
    if (spec.redistribute_inputs && on_mesh && !x.node()->value()) {
      x = with_layout(x, required, spec.where);
      return to_local_node(x, required, first_block_shape(x.shape(), required), spec.where);
    }
    const Layout layout = on_mesh ? x.layout() : Layout::replicated(mesh, x.rank());
    if (required != layout) {
      if (!spec.redistribute_inputs)
        throw LayoutError("local_map: " + argument_name(index) + " has placements " + placements_text(layout.placements()) +
                          " but in_placements asks for " + placements_text(wanted) +
                          "; redistribute it first or pass redistribute_inputs = true" + at_line(spec.where));
      x = with_layout(x, required, spec.where);
    }
    return to_local_node(x, required, first_block_shape(x.shape(), required), spec.where);
  }
  const Layout layout = on_mesh ? x.layout() : Layout::replicated(mesh, x.rank());
  return to_local_node(x, layout, first_block_shape(x.shape(), layout), spec.where);
}

void check_non_tensor_output(size_t index, size_t count, const LocalMapSpec& spec) {
  check_output_count(count, spec);
  if (spec.out_placements[index].is_tensor())
    throw LayoutError("local_map: " + output_name(index) + " is not a tensor but out_placements gives it placements " +
                      placements_text(spec.out_placements[index].placements()) + "; use std::nullopt (PyTorch's None) for it" +
                      at_line(spec.where));
}

Tensor local_map_output(const Tensor& local, size_t index, size_t count, const LocalMapSpec& spec, const Mesh& mesh) {
  check_output_count(count, spec);
  const NodeRef& n = local.node();
  if (!n->local && n->mesh.is_valid())
    throw LayoutError("local_map: " + output_name(index) + " is a global tensor, not computed from fn's local arguments; "
                      "return local values (or constants) only" + at_line(spec.where));
  if (!spec.out_placements[index].is_tensor())
    throw LayoutError("local_map: " + output_name(index) + " is a tensor but its out_placements entry is std::nullopt "
                      "(PyTorch's None), which is for outputs that are not tensors; give its placements" + at_line(spec.where));
  const std::vector<Placement>& placements = spec.out_placements[index].placements();
  if (int64_t(placements.size()) != mesh.ndim())
    throw LayoutError("local_map: out_placements for " + output_name(index) + " has " + std::to_string(placements.size()) +
                      " placements for a " + std::to_string(mesh.ndim()) + "-dim mesh" + at_line(spec.where));
  const std::vector<std::string> dims = mesh.dim_names();
  for (size_t d = 0; d < placements.size(); ++d)
    if (is_replicate(placements[d]) && (n->varying >> d & 1))
      throw LayoutError("local_map: " + output_name(index) + " differs between the devices of mesh dim '" + dims[d] +
                        "' (it depends on a value sharded or partial there) but out_placements says Replicate() for it; "
                        "all_reduce or all_gather it over '" + dims[d] + "' first, or return it as Shard / Partial" +
                        at_line(spec.where));
  const Layout layout = Layout::from_placements(mesh, placements, local.rank());
  const BlockExtents extents = extents_of(*n, mesh);
  std::vector<int64_t> shape;
  for (int64_t a = 0; a < local.rank(); ++a)
    shape.push_back(assembled_extent(extents.axes[size_t(a)], layout.axis_mesh_dims()[size_t(a)], mesh, a,
                                     output_name(index) + at_line(spec.where)));
  return from_local_node(local, layout, std::move(shape), spec.where);
}

}  // namespace detail
}  // namespace tessera
