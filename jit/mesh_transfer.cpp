#include "jit/mesh_transfer.hpp"

#include <functional>
#include <map>
#include <unordered_set>

#include "comm/comm_debug_mode.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/redistribute_executor.hpp"

namespace tessera {
namespace {

// The region both boxes cover, or nullopt when they do not meet.
std::optional<ShardBox> overlap(const ShardBox& a, const ShardBox& b) {
  ShardBox r;
  for (size_t i = 0; i < a.local_shape.size(); ++i) {
    const int64_t lo = std::max(a.global_offset[i], b.global_offset[i]);
    const int64_t hi = std::min(a.global_offset[i] + a.local_shape[i], b.global_offset[i] + b.local_shape[i]);
    if (hi <= lo) return std::nullopt;
    r.global_offset.push_back(lo);
    r.local_shape.push_back(hi - lo);
  }
  return r;
}

void check_in_process(const Mesh& mesh, const char* which) {
  if (mesh.num_local_devices() != mesh.size())
    throw CommError(std::string("mesh_transfer: the ") + which + " mesh " + mesh.to_string() +
                    " spans several processes; redistribute between meshes runs within one process for now");
}

// The value of a transfer: `source` (no Partial) on its mesh, moved into `target`.
NodeValue transfer(const NodeRef& node, const NodeValue& source) {
  const Layout& target = *node->attrs.layout;
  const Mesh& from = source.layout.mesh();
  const Mesh& to = target.mesh();
  check_in_process(from, "source");
  check_in_process(to, "target");
  const Layout unreduced = target.without_partial();
  // Source blocks by region: replicas hold the same box, any of them will do.
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<size_t>> holders;
  const auto from_coords = local_device_coords(from);
  std::vector<ShardBox> from_boxes;
  for (size_t i = 0; i < from_coords.size(); ++i) {
    from_boxes.push_back(shard_geometry(node->shape, source.layout, from_coords[i]));
    holders[{from_boxes[i].global_offset, from_boxes[i].local_shape}].push_back(i);
  }
  const auto to_coords = local_device_coords(to);
  auto storage = std::make_shared<ShardedStorage>();
  int64_t moved = 0;
  for (size_t j = 0; j < to_coords.size(); ++j) {
    const ShardBox box = shard_geometry(node->shape, unreduced, to_coords[j]);
    Array out = Array::uninitialized(box.local_shape, node->dtype);
    for (const auto& [region, devices] : holders) {
      const ShardBox& held = from_boxes[devices.front()];
      const auto part = overlap(box, held);
      if (!part || part->num_elements() == 0) continue;
      size_t pick = devices.front();  // a replica on the target's own device moves nothing
      for (size_t i : devices)
        if (from.local_device_names()[i] == to.local_device_names()[j]) pick = i;
      if (!(from.local_device_names()[pick] == to.local_device_names()[j])) moved += part->num_elements();
      copy_region(source.storage->components[pick], from_boxes[pick].global_offset, out, box.global_offset,
                  part->global_offset, part->local_shape);
    }
    storage->components.push_back(std::move(out));
  }
  if (target.has_partial()) storage->components = apply_partial_rule(std::move(storage->components), target);
  if (comm_debug_mode_active())
    record_collective({"mesh_transfer", "", to.to_string(), std::string(dtype_name(node->dtype)), node->location(), "",
                       moved * dtype_size(node->dtype)});
  return NodeValue{std::move(storage), target};
}

}  // namespace

Tensor mesh_transfer(const Tensor& x, Layout layout, Loc where) {
  if (x.node()->local) throw LayoutError("mesh_transfer: a local value of local_map has no mesh to leave");
  if (layout.rank() != x.rank())
    throw LayoutError("mesh_transfer: a tensor of rank " + std::to_string(x.rank()) + " cannot take a rank-" +
                      std::to_string(layout.rank()) + " layout");
  NodeAttrs attrs;
  attrs.layout = std::move(layout);
  return Tensor(make_node(OpKind::MeshTransfer, x.dtype(), x.shape(), {x.node()}, std::move(attrs), where));
}

void compute_mesh_transfers(const std::vector<NodeRef>& outputs) {
  std::vector<NodeRef> pending;  // post-order: a transfer after the transfers it reads
  std::unordered_set<const Node*> seen;
  std::function<void(const NodeRef&)> visit = [&](const NodeRef& n) {
    if (!seen.insert(n.get()).second || n->value()) return;
    for (const auto& in : n->inputs) visit(in);
    if (n->op == OpKind::MeshTransfer) pending.push_back(n);
  };
  for (const auto& out : outputs) visit(out);
  for (const NodeRef& n : pending) {
    const NodeRef& input = n->inputs[0];
    const Layout source_layout = planned_layout(input).without_partial();
    const NodeValue source = force_values({input}, {source_layout}).front();
    n->set_value(transfer(n, source));
  }
}

}  // namespace tessera
