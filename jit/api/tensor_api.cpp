#include "jit/api/tensor_api.hpp"

#include "dsl/memory_counter.hpp"

#include <algorithm>
#include <cstring>

#include "dsl/concrete_value.hpp"
#include "dsl/default_mesh.hpp"
#include "dsl/ops.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"
#include "jit/device_workers.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/mesh_transfer.hpp"
#include "jit/redistribute_executor.hpp"
#include "jit/runtime.hpp"

namespace tessera {
namespace {

void check_rank(const std::vector<int64_t>& shape, const Layout& layout, const char* what) {
  if (int64_t(shape.size()) != layout.rank())
    throw LayoutError(std::string(what) + ": a tensor of shape " + shape_string(shape) + " (rank " +
                      std::to_string(shape.size()) + ") cannot take the rank-" + std::to_string(layout.rank()) +
                      " layout " + layout.specs_string());
}

// Components made on the host for the mesh's devices: from here on their devices hold them
// (memory_stats).
Tensor make_tensor(std::vector<int64_t> shape, DType dtype, Layout layout, std::vector<Array> components) {
  const std::vector<std::string> names = layout.mesh().local_devices();
  for (size_t i = 0; i < components.size() && i < names.size(); ++i)
    if (components[i].memory_space() == MemorySpace::Host) components[i] = components[i].charged_to(memory_counter(names[i]));
  return Tensor(make_leaf(std::move(shape), dtype, std::move(layout),
                          std::make_shared<ShardedStorage>(ShardedStorage{std::move(components)})));
}

// Builds every local device's component on its own worker thread.
template <class MakeComponent>
std::vector<Array> build_components(const Layout& layout, MakeComponent make) {
  const Mesh& mesh = layout.mesh();
  const auto coords = local_device_coords(mesh);
  const std::vector<std::string> names = mesh.local_devices();
  std::vector<Array> out(coords.size());
  run_on_devices(mesh_worker_indices(mesh), [&](int64_t i) { out[i] = make(coords[i]).on_device(names[i]); });
  return out;
}

// The global extent of each axis implied by per-device components (uneven shards included).
std::vector<int64_t> infer_global_shape(const std::vector<Array>& components, const Layout& layout) {
  const Mesh& mesh = layout.mesh();
  const auto coords = local_device_coords(mesh);
  std::vector<int64_t> shape = components.front().shape();
  for (int64_t axis = 0; axis < layout.rank(); ++axis) {
    const auto& dims = layout.axis_mesh_dims()[axis];
    if (dims.empty()) continue;
    // Sum the extents held by the devices whose other-dim coordinates are 0 (one per shard).
    int64_t total = 0;
    for (size_t i = 0; i < coords.size(); ++i) {
      bool representative = true;
      for (int64_t m = 0; m < mesh.ndim(); ++m)
        if (std::find(dims.begin(), dims.end(), m) == dims.end() && coords[i][m] != 0) representative = false;
      if (representative) total += components[i].shape()[axis];
    }
    shape[axis] = total;
  }
  // Across clients each holds some of the shards: the extents of sharded axes add up.
  if (mesh.num_local_devices() != mesh.size()) {
    std::vector<int64_t> sharded(shape.size(), 0);
    for (int64_t axis = 0; axis < layout.rank(); ++axis)
      if (!layout.axis_mesh_dims()[axis].empty()) sharded[axis] = shape[axis];
    sum_over_clients(sharded);
    for (int64_t axis = 0; axis < layout.rank(); ++axis)
      if (!layout.axis_mesh_dims()[axis].empty()) shape[axis] = sharded[axis];
  }
  return shape;
}

// `array` of client `root` on every client of `clients`: dtype, rank and extents, then the bytes.
Array broadcast_array(const std::vector<int>& clients, const Array& array, int root) {
  std::vector<std::byte> message;
  if (client_id() == root) {
    std::vector<int64_t> header = {int64_t(array.dtype()), array.rank()};
    for (int64_t e : array.shape()) header.push_back(e);
    message.resize(header.size() * sizeof(int64_t) + size_t(array.nbytes()));
    std::memcpy(message.data(), header.data(), header.size() * sizeof(int64_t));
    std::memcpy(message.data() + header.size() * sizeof(int64_t), array.bytes(), size_t(array.nbytes()));
  }
  broadcast_among_clients(clients, message, root);
  auto header_at = [&](size_t i) {
    int64_t v;
    std::memcpy(&v, message.data() + i * sizeof(int64_t), sizeof v);
    return v;
  };
  const DType dtype = DType(header_at(0));
  std::vector<int64_t> shape;
  for (int64_t a = 0; a < header_at(1); ++a) shape.push_back(header_at(size_t(2 + a)));
  Array out = Array::uninitialized(shape, dtype);
  std::memcpy(out.mutable_bytes(), message.data() + (2 + shape.size()) * sizeof(int64_t), size_t(out.nbytes()));
  return out;
}

// from_local(run_check): every client's local rank, dtype and shape must be what the layout
// gives each of its devices. Every client sees every client's shape, so all raise alike.
// Returns the global shape (given, or the first client's shape times the shard counts).
std::vector<int64_t> check_local_shapes_across_clients(const Array& local, const Layout& layout,
                                                       const std::optional<std::vector<int64_t>>& global_shape) {
  const Mesh& mesh = layout.mesh();
  const std::vector<int> clients = clients_of(mesh);
  const std::vector<int64_t> kinds = gather_among_clients(clients, {local.rank(), int64_t(local.dtype())});
  for (size_t c = 0; c < clients.size(); ++c) {
    if (kinds[2 * c] != local.rank())
      throw ShapeError("from_local(run_check): client " + std::to_string(clients[c]) + " passed a rank-" +
                       std::to_string(kinds[2 * c]) + " local tensor, this client a rank-" + std::to_string(local.rank()) + " one");
    if (kinds[2 * c + 1] != int64_t(local.dtype()))
      throw DTypeError("from_local(run_check): client " + std::to_string(clients[c]) + " passed " +
                       std::string(dtype_name(DType(kinds[2 * c + 1]))) + ", this client " + std::string(dtype_name(local.dtype())));
  }
  const std::vector<int64_t> shapes = gather_among_clients(clients, local.shape());
  const size_t rank = size_t(local.rank());
  auto shape_of = [&](size_t c) { return std::vector<int64_t>(shapes.begin() + c * rank, shapes.begin() + (c + 1) * rank); };
  std::vector<int64_t> shape = global_shape ? *global_shape : shape_of(0);
  if (!global_shape)
    for (size_t axis = 0; axis < rank; ++axis) shape[axis] *= layout.num_shards(int64_t(axis));
  const auto& devices = mesh.global_device_names();
  for (int64_t id = 0; id < mesh.size(); ++id) {
    const size_t c = devices.empty() ? 0 : size_t(std::find(clients.begin(), clients.end(), int(devices[id].task)) - clients.begin());
    const std::vector<int64_t> expected = shard_geometry(shape, layout, mesh.coords(id)).local_shape;
    if (shape_of(c) != expected)
      throw ShapeError("from_local(run_check): client " + std::to_string(clients[c]) + " passed a local tensor of shape " +
                       shape_string(shape_of(c)) + " but layout " + layout.specs_string() + " of global shape " +
                       shape_string(shape) + " gives its device " + std::to_string(id) + " " + shape_string(expected));
  }
  return shape;
}

// from_local(run_check): along each Replicate mesh dim, the data of coordinate 0 on every device
// (PyTorch broadcasts from the first rank of each mesh-dim group).
void broadcast_replicated_from_first(std::vector<Array>& components, const Layout& layout) {
  const Mesh& mesh = layout.mesh();
  const std::vector<Placement> placements = layout.placements();
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    if (!is_replicate(placements[size_t(d)]) || mesh.shape()[size_t(d)] == 1) continue;
    const auto comms = mesh_dim_communicators(mesh, d);
    run_on_devices(mesh_worker_indices(mesh), [&](int64_t i) {
      Array& c = components[size_t(i)];
      comms[size_t(i)]->broadcast(c.mutable_bytes(), c.numel(), c.dtype(), 0);
    });
  }
}

// PyTorch's from_local(..., stride=): Tessera's tensors are contiguous, so only the row-major
// strides of the global shape describe one.
void check_contiguous_stride(const std::vector<int64_t>& stride, const std::vector<int64_t>& shape) {
  std::vector<int64_t> contiguous(shape.size(), 1);
  for (size_t a = shape.size(); a-- > 1;) contiguous[a - 1] = contiguous[a] * std::max<int64_t>(shape[a], 1);
  if (stride != contiguous)
    throw LayoutError("from_local: stride " + shape_string(stride) + " is not the contiguous stride " + shape_string(contiguous) +
                      " of the global shape " + shape_string(shape) + "; Tessera's tensors are contiguous (make the "
                      "tensor contiguous, or pass the shape alone)");
}

}  // namespace

Tensor pack(std::vector<Array> components, Layout layout) {
  const Mesh& mesh = layout.mesh();
  if (int64_t(components.size()) != mesh.num_local_devices())
    throw LayoutError("pack: got " + std::to_string(components.size()) + " components for a mesh with " +
                      std::to_string(mesh.num_local_devices()) + " local devices (one component per device)");
  const DType dtype = components.front().dtype();
  for (size_t i = 0; i < components.size(); ++i) {
    if (components[i].rank() != layout.rank())
      throw LayoutError("pack: component " + std::to_string(i) + " has rank " + std::to_string(components[i].rank()) +
                        " but the layout " + layout.specs_string() + " has rank " + std::to_string(layout.rank()));
    if (components[i].dtype() != dtype)
      throw DTypeError("pack: component " + std::to_string(i) + " is " + std::string(dtype_name(components[i].dtype())) +
                       " but component 0 is " + std::string(dtype_name(dtype)));
  }
  std::vector<int64_t> shape = infer_global_shape(components, layout);
  check_component_shapes(components, layout, shape, "pack");
  // Components are copied onto their devices (TF copies them too), so later writes to the
  // caller's arrays cannot change the tensor.
  const std::vector<std::string> names = mesh.local_devices();
  for (size_t i = 0; i < components.size(); ++i) components[i] = components[i].clone().on_device(names[i]);
  return make_tensor(std::move(shape), dtype, std::move(layout), std::move(components));
}

NodeValue tensorflow_view(const Tensor& t) {
  NodeValue value = force_value(t.node());
  if (!value.layout.has_partial()) return value;
  // TensorFlow has no Partial a user sees: its calls get the reduced value, in the layout
  // fetch_layout reports (docs/DTENSOR_USERS.md, "Partial values: PyTorch's calls see them,
  // TensorFlow's calls never do").
  return force_values({t.node()}, {value.layout.without_partial()}).front();
}

std::vector<Array> unpack(const Tensor& t) {
  require_concrete(t.node(), "unpack()");
  const NodeValue value = tensorflow_view(t);  // keeps the storage alive while it is copied
  std::vector<Array> out;
  for (const Array& a : value.storage->components) out.push_back(a.clone());
  return out;
}

Tensor copy_to_mesh(const Array& global, Layout layout) {
  check_rank(global.shape(), layout, "copy_to_mesh");
  const std::vector<int64_t> shape = global.shape();
  const std::vector<int64_t> origin(shape.size(), 0);
  std::vector<Array> components = build_components(layout, [&](const std::vector<int64_t>& coords) {
    ShardBox box = shard_geometry(shape, layout, coords);
    Array local = Array::uninitialized(box.local_shape, global.dtype());
    copy_region(global, origin, local, box.global_offset, box.global_offset, box.local_shape);
    return local;
  });
  components = apply_partial_rule(std::move(components), layout);
  return make_tensor(shape, global.dtype(), std::move(layout), std::move(components));
}

Tensor make_tensor_from_callback(std::vector<int64_t> shape, Layout layout, const std::function<Array(const ShardBox&)>& shard) {
  check_rank(shape, layout, "make_tensor_from_callback");
  std::vector<Array> components = build_components(layout, [&](const std::vector<int64_t>& coords) {
    const ShardBox box = shard_geometry(shape, layout, coords);
    Array local = shard(box);
    if (local.shape() != box.local_shape)
      throw ShapeError("make_tensor_from_callback: the callback returned shape " + shape_string(local.shape()) +
                       " for the region of shape " + shape_string(box.local_shape) + " at " + shape_string(box.global_offset));
    return local;
  });
  const DType dtype = components.front().dtype();
  for (const Array& c : components)
    if (c.dtype() != dtype)
      throw DTypeError("make_tensor_from_callback: the callback returned both " + std::string(dtype_name(dtype)) + " and " +
                       std::string(dtype_name(c.dtype())) + " components");
  components = apply_partial_rule(std::move(components), layout);
  return make_tensor(std::move(shape), dtype, std::move(layout), std::move(components));
}

Tensor relayout(const Tensor& t, Layout layout, SourceLocation where) {
  check_rank(t.shape(), layout, "relayout");
  if (t.node()->mesh.is_valid() && !(layout.mesh() == t.node()->mesh)) return mesh_transfer(t, std::move(layout), where);
  return with_layout(t, std::move(layout), where);
}

Tensor Tensor::redistribute(const Mesh& mesh, std::vector<Placement> placements, SourceLocation where) const {
  return relayout(*this, Layout::from_placements_or_replicated(mesh, std::move(placements), rank()), where);
}

Tensor Tensor::redistribute(std::vector<Placement> placements, std::vector<Placement> grad_placements,
                            SourceLocation where) const {
  const Mesh mesh = device_mesh();
  auto layout_of = [&](std::vector<Placement> p) { return Layout::from_placements_or_replicated(mesh, std::move(p), rank()); };
  std::optional<Layout> grad_layout;
  if (!grad_placements.empty()) grad_layout = layout_of(std::move(grad_placements));
  return with_layout(*this, layout_of(std::move(placements)), std::move(grad_layout), where);
}

Tensor Tensor::redistribute(std::vector<Placement> placements, bool, SourceLocation where) const {
  return redistribute(std::move(placements), std::vector<Placement>{}, where);
}

Tensor Tensor::redistribute(const Mesh& mesh, std::vector<Placement> placements, bool, SourceLocation where) const {
  return redistribute(mesh, std::move(placements), where);
}

std::vector<Placement> Tensor::placements() const { return layout().placements(); }
Mesh Tensor::device_mesh() const { return layout().mesh(); }

// TensorFlow's layout of the value: what unpack() returns is laid out so (a Partial value is
// reduced when a TF call looks at it).
Layout fetch_layout(const Tensor& t) { return t.layout().without_partial(); }

Array to_array(const Tensor& t) {
  require_concrete(t.node(), "to_array()");
  // A sharded value would need a gather, which full_tensor() names (TF raises too); checked on
  // the computed value, before any reduction runs.
  const Layout layout = force_value(t.node()).layout.without_partial();
  if (!layout.is_fully_replicated())
    throw LayoutError("to_array: the tensor's layout " + layout.specs_string() +
                      " is sharded; only fully replicated tensors convert (use full_tensor() to gather)");
  return tensorflow_view(t).storage->components.front().clone();
}

Array Tensor::to_local() const {
  require_concrete(node(), "to_local()");
  // A host block is copied (the caller may write it); a GPU block is shared, as PyTorch's
  // to_local() returns the device tensor: device arrays are never written after they are made.
  Array block = components().front();  // components() returns a fresh vector: keep a copy
  return block.memory_space() == MemorySpace::Host ? block.clone() : block;
}

Array Tensor::full_tensor() const {
  require_concrete(node(), "full_tensor()");
  // The value is computed (and kept) in its own layout, then gathered for the caller only.
  const NodeValue value = force_value(node());
  const Layout replicated = Layout::replicated(value.layout.mesh(), rank());
  if (value.layout == replicated) return value.storage->components.front().clone();
  return force_values({node()}, {replicated}).front().storage->components.front().clone();
}

Tensor distribute_tensor(const Array& global, Mesh mesh, std::vector<Placement> placements, int src_data_rank) {
  mesh = mesh_or_default(mesh, "distribute_tensor");
  const std::vector<int> clients = clients_of(mesh);
  if (src_data_rank >= 0 && std::find(clients.begin(), clients.end(), src_data_rank) == clients.end())
    throw MeshError("distribute_tensor: src_data_rank " + std::to_string(src_data_rank) + " is not a client of the mesh " +
                    mesh.to_string() + " (its clients: " + join(clients, ", ", [](int c) { return std::to_string(c); }) + ")");
  // (A client with no device of the mesh holds nothing and takes no part.)
  if (src_data_rank < 0 || clients.size() < 2 || mesh.num_local_devices() == 0)
    return copy_to_mesh(global, Layout::from_placements_or_replicated(std::move(mesh), std::move(placements), global.rank()));
  const Array data = broadcast_array(clients, global, src_data_rank);
  return copy_to_mesh(data, Layout::from_placements_or_replicated(std::move(mesh), std::move(placements), data.rank()));
}

Tensor distribute_tensor(const Array& global, std::vector<Placement> placements, int src_data_rank) {
  return distribute_tensor(global, Mesh{}, std::move(placements), src_data_rank);
}

Tensor from_local(const Array& local, Mesh mesh, std::vector<Placement> placements,
                  std::optional<std::vector<int64_t>> global_shape, bool run_check, std::optional<std::vector<int64_t>> stride) {
  mesh = mesh_or_default(mesh, "from_local");
  Layout layout = Layout::from_placements(mesh, std::move(placements), local.rank());
  std::vector<int64_t> shape = local.shape();
  if (global_shape) {
    shape = *global_shape;
    check_rank(shape, layout, "from_local");
  } else {
    for (int64_t axis = 0; axis < layout.rank(); ++axis) shape[axis] *= layout.num_shards(axis);
  }
  if (stride) check_contiguous_stride(*stride, shape);
  if (run_check) shape = check_local_shapes_across_clients(local, layout, global_shape);
  std::vector<Array> components(mesh.num_local_devices(), local);
  check_component_shapes(components, layout, shape, "from_local");
  const std::vector<std::string> names = mesh.local_devices();
  for (size_t i = 0; i < components.size(); ++i) components[i] = local.clone().on_device(names[i]);
  if (run_check) broadcast_replicated_from_first(components, layout);
  return make_tensor(std::move(shape), local.dtype(), std::move(layout), std::move(components));
}

Tensor from_local(const Array& local, std::vector<Placement> placements, std::optional<std::vector<int64_t>> global_shape,
                  bool run_check, std::optional<std::vector<int64_t>> stride) {
  return from_local(local, Mesh{}, std::move(placements), std::move(global_shape), run_check, std::move(stride));
}

Tensor from_local(std::vector<Array> locals, Mesh mesh, std::vector<Placement> placements) {
  if (locals.empty()) throw LayoutError("from_local: no local components given");
  mesh = mesh_or_default(mesh, "from_local");
  int64_t rank = locals.front().rank();
  return pack(std::move(locals), Layout::from_placements(std::move(mesh), std::move(placements), rank));
}

}  // namespace tessera
