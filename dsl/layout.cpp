#include "dsl/layout.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "dsl/error.hpp"
#include "dsl/node.hpp"  // hash_mix, hash_text
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

struct Layout::Impl {
  Mesh mesh;
  std::vector<std::vector<int64_t>> axes;
  std::vector<std::optional<ReduceOp>> partial;  // size mesh.ndim()
  std::vector<std::string> specs;                // derived: TF sharding specs
  // derived: to_string(), rendered on first use (a mesh of thousands of devices makes a long
  // text, and propagation builds many layouts it never prints)
  mutable std::once_flag text_once;
  mutable std::string text;
  size_t hash = 0;                               // derived: hash()
};

namespace {

std::string spec_of(const Mesh& mesh, const std::vector<int64_t>& dims) {
  if (dims.empty()) return UNSHARDED;
  const std::vector<std::string>& names = mesh.dim_names();
  return join(dims, "+", [&](int64_t d) { return names[d]; });
}

int64_t mesh_dim_for_layout(const Mesh& mesh, std::string_view name) {
  if (!mesh.contains_dim(name)) {
    const std::vector<std::string>& names = mesh.dim_names();
    throw LayoutError("layout refers to mesh dimension '" + std::string(name) +
                      "', which the mesh does not have (its dims are " +
                      join(names, ", ", [](const std::string& s) { return "'" + s + "'"; }) + ")");
  }
  return mesh.dim_index(name);
}

// Of what operator== compares: the placements, and the mesh by its shape and global devices (a
// part of what Mesh's == compares, so equal meshes hash alike).
uint64_t layout_hash(const Mesh& mesh, const std::vector<std::vector<int64_t>>& axes, const std::vector<std::optional<ReduceOp>>& partial) {
  uint64_t h = 0;
  for (const auto& dims : axes) {
    h = hash_mix(h, dims.size());
    for (int64_t d : dims) h = hash_mix(h, uint64_t(d));
  }
  for (const auto& op : partial) h = hash_mix(h, op ? uint64_t(*op) + 1 : 0);
  for (int64_t size : mesh.shape()) h = hash_mix(h, uint64_t(size));
  return hash_mix(h, mesh.global_device_ids_hash());
}

}  // namespace

// The layouts this thread built lately, by hash: a layout built again on the same mesh object
// shares the first one's Impl (propagation builds the same few layouts hundreds of thousands of
// times while planning a pipeline, and equal handles then compare by pointer). Bounded: emptied
// when full.
struct Layout::Interned {
  std::unordered_multimap<uint64_t, std::shared_ptr<const Impl>> by_hash;
  static constexpr size_t kMost = 4096;
};

Layout::Layout(Mesh mesh, std::vector<std::vector<int64_t>> axes, std::vector<std::optional<ReduceOp>> partial) {
  if (!mesh.is_valid()) throw LayoutError("a layout needs a mesh (got an empty Mesh handle)");
  int64_t ndim = mesh.ndim();
  if (partial.empty()) partial.resize(ndim);
  thread_local Interned interned;
  const uint64_t hash = layout_hash(mesh, axes, partial);
  for (auto [it, end] = interned.by_hash.equal_range(hash); it != end; ++it)
    // The same mesh object, not just an equal one: a layout prints its mesh as it was written,
    // and a mesh spanning clients is checked per object before anything runs on it.
    if (it->second->axes == axes && it->second->partial == partial && it->second->mesh.same_instance(mesh)) {
      impl_ = it->second;
      return;
    }
  auto impl = std::make_shared<Impl>();
  if (int64_t(partial.size()) != ndim)
    throw LayoutError("layout has " + std::to_string(partial.size()) + " partial entries for a " +
                      std::to_string(ndim) + "-D mesh");
  std::vector<int> uses(ndim, 0);
  const std::vector<std::string>& names = mesh.dim_names();
  for (size_t axis = 0; axis < axes.size(); ++axis)
    for (int64_t d : axes[axis]) {
      if (d < 0 || d >= ndim)
        throw LayoutError("tensor axis " + std::to_string(axis) + " refers to mesh dim index " +
                          std::to_string(d) + " of a " + std::to_string(ndim) + "-D mesh");
      if (uses[d]++)
        throw LayoutError("mesh dimension '" + names[d] + "' is used twice in one layout (a mesh dim can shard at most one tensor axis)");
    }
  for (int64_t d = 0; d < ndim; ++d)
    if (partial[d] && uses[d])
      throw LayoutError("mesh dimension '" + names[d] + "' cannot both shard a tensor axis and hold Partial values");
  for (const auto& dims : axes) impl->specs.push_back(spec_of(mesh, dims));
  impl->mesh = std::move(mesh);
  impl->axes = std::move(axes);
  impl->partial = std::move(partial);
  impl->hash = hash;
  impl_ = std::move(impl);
  if (interned.by_hash.size() >= Interned::kMost) interned.by_hash.clear();
  interned.by_hash.emplace(hash, impl_);
}

Layout::Layout(std::vector<std::string> sharding_specs, Mesh mesh) {
  if (!mesh.is_valid()) throw LayoutError("a layout needs a mesh (got an empty Mesh handle)");
  std::vector<std::vector<int64_t>> axes;
  for (const auto& spec : sharding_specs) {
    std::vector<int64_t> dims;
    if (spec != UNSHARDED) {
      if (spec.empty()) throw LayoutError("empty sharding spec (use 'unsharded' for a replicated axis)");
      for (const auto& name : split(spec, '+')) dims.push_back(mesh_dim_for_layout(mesh, name));
    }
    axes.push_back(std::move(dims));
  }
  *this = Layout(std::move(mesh), std::move(axes));
}

const Layout::Impl& Layout::impl() const {
  if (!impl_) throw LayoutError("use of an empty Layout handle (default-constructed)");
  return *impl_;
}

Layout Layout::replicated(Mesh mesh, int64_t rank) {
  if (rank < 0) throw LayoutError("Layout::replicated: rank " + std::to_string(rank) + " is negative");
  return Layout(std::move(mesh), std::vector<std::vector<int64_t>>(rank));
}

Layout Layout::batch_sharded(Mesh mesh, std::string mesh_dim, int64_t rank, int64_t axis) {
  if (rank < 1) throw LayoutError("Layout::batch_sharded: rank " + std::to_string(rank) + " has no axis to shard");
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank)
    throw LayoutError("Layout::batch_sharded: axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  std::vector<std::vector<int64_t>> axes(rank);
  axes[axis] = {mesh_dim_for_layout(mesh, mesh_dim)};
  return Layout(std::move(mesh), std::move(axes));
}

Layout Layout::inner_sharded(Mesh mesh, std::string mesh_dim, int64_t rank) {
  return batch_sharded(std::move(mesh), std::move(mesh_dim), rank, rank - 1);
}

Layout Layout::from_placements_or_replicated(Mesh mesh, std::vector<Placement> placements, int64_t rank) {
  if (placements.empty() && mesh.is_valid()) placements.assign(size_t(mesh.ndim()), Replicate{});
  return from_placements(std::move(mesh), std::move(placements), rank);
}

Layout Layout::from_placements(Mesh mesh, std::vector<Placement> placements, int64_t rank) {
  if (!mesh.is_valid()) throw LayoutError("a layout needs a mesh (got an empty Mesh handle)");
  if (int64_t(placements.size()) != mesh.ndim())
    throw LayoutError("got " + std::to_string(placements.size()) + " placements for a " +
                      std::to_string(mesh.ndim()) + "-D mesh (one placement per mesh dimension)");
  if (rank < 0) throw LayoutError("rank " + std::to_string(rank) + " is negative");
  std::vector<std::vector<int64_t>> axes(rank);
  std::vector<std::optional<ReduceOp>> partial(placements.size());
  std::vector<std::string> names = mesh.dim_names();
  for (size_t d = 0; d < placements.size(); ++d) {
    if (auto* s = std::get_if<Shard>(&placements[d])) {
      int64_t axis = s->dim < 0 ? s->dim + rank : s->dim;
      if (axis < 0 || axis >= rank)
        throw LayoutError("Shard(" + std::to_string(s->dim) + ") on mesh dimension '" + names[d] +
                          "' is out of range for a rank-" + std::to_string(rank) + " tensor");
      axes[axis].push_back(int64_t(d));
    } else if (auto* p = std::get_if<Partial>(&placements[d])) {
      partial[d] = p->op;
    }
  }
  return Layout(std::move(mesh), std::move(axes), std::move(partial));
}

Layout Layout::from_string(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return LayoutError("malformed layout string '" + std::string(text) + "': " + why +
                       " (expected 'sharding_specs:x,unsharded, mesh:|x=2|0,1|0,1|CPU:0,CPU:1')");
  };
  constexpr std::string_view specs_key = "sharding_specs:", mesh_key = "mesh:", partial_key = "partial:";
  if (text.substr(0, specs_key.size()) != specs_key) throw bad("it does not start with 'sharding_specs:'");
  size_t mesh_pos = text.find(mesh_key);
  if (mesh_pos == std::string_view::npos) throw bad("no 'mesh:' part");
  std::string_view head = text.substr(specs_key.size(), mesh_pos - specs_key.size());
  std::string_view partial_text;
  if (size_t p = head.find(partial_key); p != std::string_view::npos) {
    partial_text = head.substr(p + partial_key.size());
    head = head.substr(0, p);
  }
  auto strip_separator = [](std::string_view s) {  // the ", " between parts
    s = trim(s);
    if (!s.empty() && s.back() == ',') s.remove_suffix(1);
    return trim(s);
  };
  head = strip_separator(head);
  partial_text = strip_separator(partial_text);
  Mesh mesh;
  try {
    mesh = Mesh::from_string(text.substr(mesh_pos + mesh_key.size()));
  } catch (const MeshError& e) {
    throw bad(e.what());
  }
  std::vector<std::string> specs;
  if (!head.empty())
    for (const auto& s : split(head, ',')) specs.emplace_back(trim(s));
  Layout layout(specs, mesh);
  if (partial_text.empty()) return layout;
  std::vector<std::optional<ReduceOp>> partial(mesh.ndim());
  for (const auto& item : split(partial_text, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) throw bad("partial entry '" + item + "' is not dim=op");
    std::string name(trim(std::string_view(item).substr(0, eq)));
    partial[mesh_dim_for_layout(mesh, name)] = reduce_op_from_name(trim(std::string_view(item).substr(eq + 1)));
  }
  return Layout(mesh, layout.axis_mesh_dims(), std::move(partial));
}

std::string Layout::to_string() const {
  const Impl& l = impl();
  std::call_once(l.text_once, [&] { l.text = render(); });
  return l.text;
}

std::string Layout::render() const {
  const Impl& l = impl();
  std::string out = "sharding_specs:" + join(l.specs, ",");
  if (has_partial()) {
    std::vector<std::string> names = l.mesh.dim_names(), items;
    for (size_t d = 0; d < l.partial.size(); ++d)
      if (l.partial[d]) items.push_back(names[d] + "=" + std::string(reduce_op_name(*l.partial[d])));
    out += ", partial:" + join(items, ",");
  }
  return out + ", mesh:" + l.mesh.to_string();
}

std::string Layout::global_text() const {
  std::string text = join(sharding_specs(), ",") + "|";
  for (const auto& p : partial_ops()) text += p ? std::string(reduce_op_name(*p)) : "-";
  const Mesh& m = mesh();
  text += "|" + join(m.dim_names(), ",");
  text += "|" + join(m.shape(), ",", [](int64_t v) { return std::to_string(v); });
  text += "|" + m.global_device_ids_text();
  return text;
}

const std::vector<std::string>& Layout::sharding_specs() const { return impl().specs; }

std::string Layout::specs_string() const {
  return "[" + join(impl().specs, ", ") + "]";
}

std::vector<Placement> Layout::placements() const {
  const Impl& l = impl();
  std::vector<Placement> out(l.partial.size(), Replicate{});
  for (size_t d = 0; d < l.partial.size(); ++d)
    if (l.partial[d]) out[d] = Partial{*l.partial[d]};
  for (size_t axis = 0; axis < l.axes.size(); ++axis)
    for (int64_t d : l.axes[axis]) out[d] = Shard{int64_t(axis)};
  return out;
}

const Mesh& Layout::mesh() const { return impl().mesh; }
int64_t Layout::rank() const { return int64_t(impl().axes.size()); }

bool Layout::is_fully_replicated() const {
  for (const auto& dims : impl().axes)
    if (!dims.empty()) return false;
  return !has_partial();
}

bool Layout::has_partial() const {
  for (const auto& p : impl().partial)
    if (p) return true;
  return false;
}

int64_t Layout::num_shards(int64_t axis) const {
  if (axis < 0 || axis >= rank())
    throw LayoutError("num_shards: axis " + std::to_string(axis) + " is out of range for a rank-" + std::to_string(rank()) + " layout");
  std::vector<int64_t> sizes = mesh().shape();
  int64_t n = 1;
  for (int64_t d : impl().axes[axis]) n *= sizes[d];
  return n;
}

std::vector<std::vector<int64_t>> Layout::offset_to_shard() const {
  const std::vector<int64_t> sizes = mesh().shape();
  std::vector<std::vector<int64_t>> out;
  for (int64_t id = 0; id < mesh().size(); ++id) {
    const std::vector<int64_t> coords = mesh().coords(id);
    std::vector<int64_t> shard;
    for (const auto& dims : impl().axes) {
      int64_t index = 0;
      for (int64_t d : dims) index = index * sizes[d] + coords[d];
      shard.push_back(index);
    }
    out.push_back(std::move(shard));
  }
  return out;
}

int64_t Layout::offset_tuple_to_global_index(const std::vector<int64_t>& offset_tuple) const {
  if (int64_t(offset_tuple.size()) != rank())
    throw LayoutError("offset_tuple_to_global_index: a tuple of " + std::to_string(offset_tuple.size()) +
                      " offsets for the rank-" + std::to_string(rank()) + " layout " + specs_string());
  int64_t index = 0;
  for (int64_t a = 0; a < rank(); ++a) {
    const int64_t shards = num_shards(a);
    if (offset_tuple[a] < 0 || offset_tuple[a] >= shards)
      throw LayoutError("offset_tuple_to_global_index: offset " + std::to_string(offset_tuple[a]) + " on axis " +
                        std::to_string(a) + " is outside its " + std::to_string(shards) + " shards");
    index = index * shards + offset_tuple[a];
  }
  return index;
}

Layout Layout::delete_axes(std::vector<int64_t> axes) const {
  std::vector<bool> drop(rank(), false);
  for (int64_t axis : axes) {
    int64_t a = axis < 0 ? axis + rank() : axis;
    if (a < 0 || a >= rank())
      throw LayoutError("delete_axes: axis " + std::to_string(axis) + " is out of range for a rank-" + std::to_string(rank()) + " layout");
    drop[a] = true;
  }
  std::vector<std::vector<int64_t>> kept;
  for (int64_t a = 0; a < rank(); ++a)
    if (!drop[a]) kept.push_back(impl().axes[a]);
  return Layout(mesh(), std::move(kept), impl().partial);
}

std::vector<int64_t> Layout::local_shape(std::vector<int64_t> global_shape, int64_t device_id) const {
  return shard_geometry(global_shape, *this, mesh().coords(device_id)).local_shape;
}

const std::vector<std::vector<int64_t>>& Layout::axis_mesh_dims() const { return impl().axes; }
const std::vector<std::optional<ReduceOp>>& Layout::partial_ops() const { return impl().partial; }

std::optional<int64_t> Layout::sharded_axis_of(int64_t mesh_dim) const {
  const auto& axes = impl().axes;
  for (size_t a = 0; a < axes.size(); ++a)
    if (std::find(axes[a].begin(), axes[a].end(), mesh_dim) != axes[a].end()) return int64_t(a);
  return std::nullopt;
}

Layout Layout::with_placement(int64_t mesh_dim, const Placement& placement) const {
  std::vector<std::vector<int64_t>> axes = impl().axes;
  std::vector<std::optional<ReduceOp>> partial = impl().partial;
  for (auto& dims : axes) std::erase(dims, mesh_dim);
  partial[mesh_dim].reset();
  if (auto* s = std::get_if<Shard>(&placement)) {
    if (s->dim < 0 || s->dim >= rank())
      throw LayoutError("Shard(" + std::to_string(s->dim) + ") is out of range for a rank-" + std::to_string(rank()) + " layout");
    axes[s->dim].push_back(mesh_dim);
  } else if (auto* p = std::get_if<Partial>(&placement)) {
    partial[mesh_dim] = p->op;
  }
  return Layout(mesh(), std::move(axes), std::move(partial));
}

Layout Layout::without_partial() const { return Layout(mesh(), impl().axes); }

uint64_t Layout::global_hash() const {
  uint64_t h = hash();  // axes, partial sums, the mesh's shape and global device ids
  for (const std::string& name : mesh().dim_names()) h = hash_text(h, name);
  return h;
}

size_t Layout::hash() const { return impl_ ? impl_->hash : 0; }

bool Layout::operator==(const Layout& other) const {
  if (impl_ == other.impl_) return true;
  if (!impl_ || !other.impl_) return false;
  return impl_->axes == other.impl_->axes && impl_->partial == other.impl_->partial && impl_->mesh == other.impl_->mesh;
}

}  // namespace tessera
