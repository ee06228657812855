#include "jit/mesh_transfer.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_set>

#include "dsl/collective_recorder.hpp"
#include "dsl/error.hpp"
#include "dsl/hardware.hpp"
#include "dsl/shard_geometry.hpp"
#include "jit/mesh_agreement.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/redistribute_executor.hpp"
#include "jit/runtime.hpp"

namespace tessera {
namespace {


// A mesh's devices in global order: names (for "same device") and owning clients.
struct Devices {
  std::vector<int64_t> ids;
  std::vector<DeviceName> names;
  std::vector<int> clients;
  std::vector<int> local_index;  // position among this client's components, or -1
};

Devices devices_of(const Mesh& mesh) {
  check_clients_agree_on_mesh(mesh);  // the devices' owners below are those the clients agreed on
  Devices d;
  d.ids = mesh.global_device_ids();
  const auto& global = mesh.global_device_names();
  const auto local_ids = mesh.local_device_ids();
  for (size_t k = 0; k < d.ids.size(); ++k) {
    const auto at = std::find(local_ids.begin(), local_ids.end(), d.ids[k]);
    d.local_index.push_back(at == local_ids.end() ? -1 : int(at - local_ids.begin()));
    // A single-client mesh lists no global names: every device is this client's.
    d.names.push_back(global.empty() ? mesh.local_device_names()[size_t(d.local_index.back())] : global[k]);
    d.clients.push_back(global.empty() ? client_id() : int(global[k].task));
  }
  return d;
}

// One region of a target block and the source device it is copied from.
struct Piece {
  size_t from, to;  // global positions in the source and target meshes
  ShardBox region;
};

// The plan every client computes alike: each target block from the source blocks it meets,
// each region from one holder, preferring the target's own device, then its client.
struct TransferPlan {
  std::vector<ShardBox> from_boxes, to_boxes;  // every device's block, by global position
  std::vector<Piece> pieces;
};

TransferPlan plan_transfer(const NodeRef& node, const Layout& source, const Layout& target, const Devices& from,
                           const Devices& to) {
  TransferPlan plan;
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<size_t>> holders;
  for (size_t k = 0; k < from.ids.size(); ++k) {
    plan.from_boxes.push_back(shard_geometry(node->shape, source, source.mesh().coords(from.ids[k])));
    holders[{plan.from_boxes[k].global_offset, plan.from_boxes[k].local_shape}].push_back(k);
  }
  for (size_t t = 0; t < to.ids.size(); ++t) {
    plan.to_boxes.push_back(shard_geometry(node->shape, target, target.mesh().coords(to.ids[t])));
    for (const auto& [region, devices] : holders) {
      const ShardBox part = intersect(plan.to_boxes[t], plan.from_boxes[devices.front()]);
      if (part.num_elements() == 0) continue;
      size_t pick = devices.front();
      for (size_t k : devices)
        if (from.clients[k] == to.clients[t] && from.clients[pick] != to.clients[t]) pick = k;
      for (size_t k : devices)
        if (from.names[k] == to.names[t]) pick = k;
      plan.pieces.push_back({pick, t, part});
    }
  }
  return plan;
}

// The value of a transfer: `source` (no Partial) on its mesh, moved into the node's layout.
// Clients holding devices of either mesh take part; regions between clients travel in one
// all_to_all among them.
NodeValue transfer(const NodeRef& node, const NodeValue& source) {
  const Layout& target = *node->attrs.layout;
  const Layout unreduced = target.without_partial();
  const Mesh &from_mesh = source.layout.mesh(), &to_mesh = target.mesh();
  const Devices from = devices_of(from_mesh), to = devices_of(to_mesh);
  std::set<int> involved(from.clients.begin(), from.clients.end());
  involved.insert(to.clients.begin(), to.clients.end());
  auto storage = std::make_shared<ShardedStorage>();
  if (!involved.count(client_id())) return NodeValue{std::move(storage), target};  // neither mesh is here

  const TransferPlan plan = plan_transfer(node, source.layout, unreduced, from, to);
  const std::vector<Piece>& pieces = plan.pieces;
  const std::vector<ShardBox>& boxes = plan.to_boxes;
  const int64_t esize = dtype_size(node->dtype);
  const int me = client_id();
  auto source_block = [&](size_t k) -> const Array& { return source.storage->components[size_t(from.local_index[k])]; };
  auto source_offset = [&](size_t k) -> const std::vector<int64_t>& { return plan.from_boxes[k].global_offset; };
  for (size_t t = 0; t < to.ids.size(); ++t)
    if (to.local_index[t] >= 0) storage->components.push_back(Array::uninitialized(boxes[t].local_shape, node->dtype));
  // Bytes for each other client, in plan order (both ends walk the plan alike).
  const std::vector<int> group(involved.begin(), involved.end());
  std::map<int, std::vector<std::byte>> outgoing;
  std::map<int, int64_t> incoming;
  int64_t moved = 0;
  for (const Piece& p : pieces) {
    if (!(from.names[p.from] == to.names[p.to])) moved += p.region.num_elements();
    const bool send = from.clients[p.from] == me, receive = to.clients[p.to] == me;
    if (send && receive) {
      Array& out = storage->components[size_t(to.local_index[p.to])];
      copy_region(source_block(p.from), source_offset(p.from), out, boxes[p.to].global_offset, p.region.global_offset,
                  p.region.local_shape);
    } else if (send) {
      Array packed = Array::uninitialized(p.region.local_shape, node->dtype);
      copy_region(source_block(p.from), source_offset(p.from), packed, p.region.global_offset, p.region.global_offset,
                  p.region.local_shape);
      auto& bytes = outgoing[to.clients[p.to]];
      bytes.insert(bytes.end(), packed.bytes(), packed.bytes() + packed.nbytes());
    } else if (receive) {
      incoming[from.clients[p.from]] += p.region.num_elements() * esize;
    }
  }
  if (group.size() > 1) {  // every client of the group joins, with or without bytes to move
    std::map<int, std::vector<std::byte>> received = exchange_among_clients(group, outgoing, incoming);
    std::map<int, int64_t> read;
    for (const Piece& p : pieces) {
      if (to.clients[p.to] != me || from.clients[p.from] == me) continue;
      const int peer = from.clients[p.from];
      Array& out = storage->components[size_t(to.local_index[p.to])];
      copy_region(BlockRef{received[peer].data() + read[peer], p.region.local_shape, p.region.global_offset}, out.mutable_bytes(),
                  boxes[p.to].local_shape, boxes[p.to].global_offset, p.region.global_offset, p.region.local_shape, esize);
      read[peer] += p.region.num_elements() * esize;
    }
  }
  if (target.has_partial()) storage->components = apply_partial_rule(std::move(storage->components), target);
  if (collective_recording_active())
    record_collective({"mesh_transfer", "", to_mesh.to_string(), std::string(dtype_name(node->dtype)), node->location(), "",
                       moved * esize});
  return NodeValue{std::move(storage), target};
}

}  // namespace

Tensor mesh_transfer(const Tensor& x, Layout layout, Loc where) {
  if (x.node()->local) throw LayoutError("mesh_transfer: a local value of local_map has no mesh to leave");
  if (layout.rank() != x.rank())
    throw LayoutError("mesh_transfer: a tensor of rank " + std::to_string(x.rank()) + " cannot take a rank-" +
                      std::to_string(layout.rank()) + " layout");
  // An abstract mesh's devices do not exist in this process: no value leaves one, and none can
  // land on one (the transfer would look for a device of this client there and find none).
  const Mesh& from = x.node()->mesh;
  if (from.is_valid() && from.is_abstract() != layout.mesh().is_abstract()) {
    auto describe = [](const Mesh& m) {
      return m.is_abstract() ? "abstract mesh (" + m.dims_string() + " of " + m.hardware().name + ")" : "mesh " + m.to_string();
    };
    throw MeshError("mesh_transfer: cannot move a value from " + describe(from) + " to " + describe(layout.mesh()) +
                    ": an abstract mesh's devices do not exist in this process (abstract_mesh plans programs, and never runs them)");
  }
  NodeAttrs attrs;
  attrs.layout = std::move(layout);
  return Tensor(make_node(OpKind::MeshTransfer, x.dtype(), x.shape(), {x.node()}, std::move(attrs), where));
}

void compute_mesh_transfers(const std::vector<NodeRef>& outputs) {
  if (std::none_of(outputs.begin(), outputs.end(), [](const NodeRef& n) { return n->crosses_meshes; })) return;
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
    // A client with no device of the source mesh only receives: it computes nothing there.
    NodeValue source{std::make_shared<ShardedStorage>(), source_layout};
    if (source_layout.mesh().num_local_devices() > 0) source = force_values({input}, {source_layout}).front();
    n->set_value(transfer(n, source));
  }
}

}  // namespace tessera
