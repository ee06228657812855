#include "dsl/node.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <unordered_map>

#include "dsl/checkpoint.hpp"
#include "dsl/determinism.hpp"
#include "dsl/element_count.hpp"
#include "dsl/pending_values.hpp"
#include "dsl/release_iteratively.hpp"
#include "dsl/program_order_scope.hpp"
#include "dsl/user_frame.hpp"
#include "dsl/string_util.hpp"
#include "dsl/tensor.hpp"

namespace tessera {
namespace {

uint64_t mix(uint64_t h, uint64_t v) { return hash_mix(h, v); }

}  // namespace

uint64_t hash_mix(uint64_t h, uint64_t v) {
  // splitmix64-style combine: stable across runs and platforms (never std::hash).
  v += 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (v ^ (v >> 31));
}

uint64_t hash_text(uint64_t h, const std::string& s) {
  for (char c : s) h = hash_mix(h, uint8_t(c));
  return hash_mix(h, s.size());
}

namespace {

uint64_t hash_attrs(uint64_t h, const NodeAttrs& a) {
  for (const auto* list : {&a.axes, &a.lo, &a.hi}) {
    h = mix(h, list->size());
    for (int64_t v : *list) h = mix(h, uint64_t(v));
  }
  h = mix(h, std::bit_cast<uint64_t>(a.scalar));
  h = mix(h, std::bit_cast<uint64_t>(a.scalar2));
  h = mix(h, a.seed);
  h = mix(h, uint64_t(a.tag));
  h = mix(h, uint64_t(a.recomputed));
  if (a.layout) h = mix(h, a.layout->global_hash());  // the same on every client
  if (a.grad_layout) h = mix(mix(h, 0x67ad), a.grad_layout->global_hash());
  if (a.grad_dtype) h = mix(h, 0x9d00 + uint64_t(*a.grad_dtype));
  if (a.extents)
    for (const AxisExtent& e : a.extents->axes) {
      h = mix(mix(h, uint64_t(e.global)), e.dims.size());
      for (int64_t d : e.dims) h = mix(h, uint64_t(d));
    }
  return h;
}

// Hash-consing: a node built twice is one node. One table per thread: a node carries the
// context its builder traced it in (module, checkpoint region, program position), so threads
// tracing at once (auto_parallelize plans candidates so) must not take each other's nodes.
struct NodeTable {
  std::unordered_map<uint64_t, std::vector<std::weak_ptr<const Node>>> buckets;
  size_t entries = 0;      // weak pointers held, dead nodes' included
  size_t sweep_at = 4096;  // entries at which the next sweep runs
};

NodeTable& table() {
  thread_local NodeTable t;  // weak pointers only: nodes may outlive it
  return t;
}

// Leaves are identities, unique over every thread.
std::atomic<uint64_t> leaf_counter = 0;

bool same_structure(const Node& n, OpKind op, DType dtype, const std::vector<int64_t>& shape,
                    const std::vector<NodeRef>& inputs, const NodeAttrs& attrs, bool deterministic) {
  return n.op == op && n.dtype == dtype && n.shape == shape && n.inputs == inputs && n.attrs == attrs &&
         n.deterministic == deterministic;
}

}  // namespace

bool NodeAttrs::operator==(const NodeAttrs& o) const {
  return axes == o.axes && lo == o.lo && hi == o.hi && std::bit_cast<uint64_t>(scalar) == std::bit_cast<uint64_t>(o.scalar) &&
         std::bit_cast<uint64_t>(scalar2) == std::bit_cast<uint64_t>(o.scalar2) && seed == o.seed && tag == o.tag && layout == o.layout &&
         grad_layout == o.grad_layout && grad_dtype == o.grad_dtype && extents == o.extents && recomputed == o.recomputed &&
         gradient_rule == o.gradient_rule;
}

Node::~Node() { release_iteratively(inputs); }

int64_t Node::numel() const { return element_count(shape); }

std::string Node::location() const { return source_line(where); }

std::optional<NodeValue> Node::value() const {
  std::lock_guard lock(value_mutex_);
  return value_;
}

void Node::set_value(NodeValue value) const {
  std::lock_guard lock(value_mutex_);
  if (!value_) value_ = std::move(value);
}

namespace {

// Node::local and Node::varying from the op and its inputs (see node.hpp).
void derive_locality(Node& node) {
  const bool collective = is_functional_collective(node.op);
  const uint64_t dim_bit = collective ? uint64_t(1) << node.attrs.axes.at(0) : 0;
  switch (node.op) {
    case OpKind::ToLocal: {
      const Layout& layout = *node.attrs.layout;
      node.local = true;
      for (const auto& dims : layout.axis_mesh_dims())
        for (int64_t d : dims) node.varying |= uint64_t(1) << d;
      for (size_t d = 0; d < layout.partial_ops().size(); ++d)
        if (layout.partial_ops()[d]) node.varying |= uint64_t(1) << d;
      return;
    }
    case OpKind::FromLocal: return;
    case OpKind::AllReduce: case OpKind::AllGather:
      node.local = true;
      node.varying = node.inputs[0]->varying & ~dim_bit;
      return;
    default:
      for (const auto& in : node.inputs) {
        node.local |= in->local;
        node.varying |= in->varying;
      }
      if (collective) {
        node.local = true;
        node.varying |= dim_bit;
      }
  }
}

}  // namespace

namespace {

NodeRef find_or_build_node(OpKind op, DType dtype, std::vector<int64_t> shape, std::vector<NodeRef> inputs, NodeAttrs attrs,
                           SourceLocation where) {
  checked_element_count(shape, op_name(op));
  uint64_t h = mix(mix(0x7e55e7aULL, uint64_t(op)), uint64_t(dtype));
  h = mix(h, shape.size());
  for (int64_t e : shape) h = mix(h, uint64_t(e));
  h = hash_attrs(h, attrs);
  const uint64_t local = h;
  for (const auto& in : inputs) h = mix(h, in->hash);
  const bool deterministic = deterministic_mode();
  h = mix(h, uint64_t(deterministic));
  NodeTable& t = table();
  if (t.entries >= t.sweep_at) {  // drop dead nodes' entries and empty buckets, amortised
    for (auto it = t.buckets.begin(); it != t.buckets.end();) {
      t.entries -= std::erase_if(it->second, [](const std::weak_ptr<const Node>& w) { return w.expired(); });
      it = it->second.empty() ? t.buckets.erase(it) : std::next(it);
    }
    t.sweep_at = std::max<size_t>(4096, 2 * t.entries);
  }
  auto& bucket = t.buckets[h];
  t.entries -= std::erase_if(bucket, [](const std::weak_ptr<const Node>& w) { return w.expired(); });
  for (const auto& weak : bucket)
    if (auto existing = weak.lock(); existing && same_structure(*existing, op, dtype, shape, inputs, attrs, deterministic)) return existing;
  // Not make_shared: a dead node's weak pointer in the table would keep the whole Node's memory.
  std::shared_ptr<Node> node(new Node());
  node->op = op;
  node->dtype = dtype;
  node->shape = std::move(shape);
  node->inputs = std::move(inputs);
  node->attrs = std::move(attrs);
  node->where = user_frame(where);  // the user's line, inside library modules too
  node->module = current_module_path();
  node->checkpoint = current_checkpoint_region();
  node->program_order = ProgramOrderScope::current();
  node->hash = h;
  node->local_hash = local;
  node->deterministic = deterministic;
  if (node->attrs.layout) node->mesh = node->attrs.layout->mesh();
  for (const auto& in : node->inputs)
    if (!node->mesh.is_valid() && in->mesh.is_valid()) node->mesh = in->mesh;
  if (node->attrs.extents && !node->mesh.is_valid()) node->mesh = node->attrs.extents->mesh;
  derive_locality(*node);
  node->local |= node->attrs.extents.has_value();  // a constant broadcast to uneven local blocks
  if (node->local) node->extents = derive_block_extents(op, node->shape, node->inputs, node->attrs, node->mesh, at_line(where));
  if (node->extents)  // blocks of different extents are different values
    for (const AxisExtent& a : node->extents->axes)
      for (int64_t d : a.dims) node->varying |= uint64_t(1) << d;
  node->crosses_meshes = node->op == OpKind::MeshTransfer;
  for (const auto& in : node->inputs) {
    node->crosses_meshes |= in->crosses_meshes;
    node->traced |= in->traced;
  }
  bucket.push_back(node);
  ++t.entries;
  return node;
}

}  // namespace

NodeRef make_node(OpKind op, DType dtype, std::vector<int64_t> shape, std::vector<NodeRef> inputs, NodeAttrs attrs,
                  SourceLocation where) {
  NodeRef node = find_or_build_node(op, dtype, std::move(shape), std::move(inputs), std::move(attrs), where);
  note_node_built(node);  // outside the table's lock
  return node;
}

namespace {

std::shared_ptr<Node> new_leaf(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage,
                               SourceLocation where) {
  auto node = std::make_shared<Node>();
  node->op = OpKind::Leaf;
  node->dtype = dtype;
  node->shape = std::move(shape);
  node->attrs.layout = layout;
  node->mesh = layout.mesh();
  node->where = user_frame(where);  // the user's line, inside library modules too
  node->module = current_module_path();
  node->hash = mix(0x1eafULL, ++leaf_counter);  // identity: no two leaves are the same node
  node->set_value(NodeValue{std::move(storage), std::move(layout)});
  return node;
}

}  // namespace

NodeRef make_leaf(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage,
                  SourceLocation where) {
  return new_leaf(std::move(shape), dtype, std::move(layout), std::move(storage), where);
}

NodeRef make_traced_leaf(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage,
                         SourceLocation where) {
  auto node = new_leaf(std::move(shape), dtype, std::move(layout), std::move(storage), where);
  node->traced = true;
  return node;
}

size_t node_table_entries() {
  NodeTable& t = table();
  return t.entries;
}

size_t live_node_count() {
  NodeTable& t = table();
  size_t n = 0;
  for (auto& [h, bucket] : t.buckets)
    for (auto& w : bucket) n += !w.expired();
  return n;
}

}  // namespace tessera
