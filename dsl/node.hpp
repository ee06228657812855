// A node of the global op graph: op, global shape, dtype, inputs and attributes, plus the user's
// source line and module (a node built again keeps its first builder's). Nodes are immutable
// and hash-consed (building the same expression twice gives the same node), so a graph's
// structure has a canonical hash. The only mutable part is the result cache: once a node's
// value has been computed it is kept, and later graphs use it as a leaf.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dsl/block_extents.hpp"
#include "dsl/comm_module_scope.hpp"
#include "dsl/dtype.hpp"
#include "dsl/layout.hpp"
#include "dsl/op_kind.hpp"
#include "dsl/source_location.hpp"

namespace tessera {

struct ShardedStorage;
struct CheckpointRegion;
struct Node;
struct GradientRule;
using NodeRef = std::shared_ptr<const Node>;

struct NodeAttrs {
  std::vector<int64_t> axes;  // reduce axes, permutation, concat / iota / argmax axis
  std::vector<int64_t> lo;    // slice begins, low pads
  std::vector<int64_t> hi;    // high pads
  double scalar = 0;          // full value, pad fill, random minval / mean
  double scalar2 = 0;         // random maxval / stddev
  uint64_t seed = 0;          // random seed
  // Iota: a tag that makes iotas of equal values distinct nodes (a pipeline tick's stage masks,
  // nn/pipeline.hpp). Not lowered: the kernels of every tag are one kernel.
  int64_t tag = 0;
  std::optional<Layout> layout;  // Leaf: its layout; sources: the requested layout; WithLayout: the constraint
  std::optional<Layout> grad_layout;  // WithLayout: where its gradient is wanted (redistribute's grad_placements)
  // WithLayout: the dtype its gradient is cast to before that relayout, so a Partial gradient is
  // reduced in it (MixedPrecisionPolicy's reduce_dtype, nn/mixed_precision.hpp).
  std::optional<DType> grad_dtype;
  std::optional<BlockExtents> extents;  // Expand inside local_map: the uneven extents it broadcasts to
  // A copy autodiff made to compute a checkpointed value again (dsl/checkpoint.hpp): never the
  // same node as the value it recomputes, which hash-consing would otherwise return.
  bool recomputed = false;
  // A composite's own vector-Jacobian rule (dsl/gradient_rule.hpp), on its output's node. Not
  // hashed (the compiled program does not depend on it); nodes with different rules are distinct.
  std::shared_ptr<const GradientRule> gradient_rule;
  bool operator==(const NodeAttrs& other) const;
};

// A computed value: per-device components and the layout they are in. On an abstract mesh
// (abstract_mesh) values have a layout and no storage: nothing there is ever computed.
struct NodeValue {
  std::shared_ptr<const ShardedStorage> storage;
  Layout layout;
  bool is_abstract() const { return storage == nullptr; }
};

struct Node {
  OpKind op;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<NodeRef> inputs;
  NodeAttrs attrs;
  SourceLocation where;
  ModulePath module;        // the CommModuleScope it was built in (null: none), for CommDebugMode
  // The checkpointed call it was built in (dsl/checkpoint.hpp; null: none): the backward reads
  // it through a recomputed copy.
  std::shared_ptr<const CheckpointRegion> checkpoint;
  // The ProgramOrderScope it was built in (dsl/program_order_scope.hpp; none: no scope).
  int64_t program_order = -1;
  uint64_t hash = 0;        // structural: op, dtype, shape, attrs, the inputs' hashes (leaves: identity)
  uint64_t local_hash = 0;  // op, dtype, shape and attrs only (canonical program hashes build on it)
  // Made under TESSERA_DETERMINISTIC: the two modes compute different bits, so a node (and the
  // value it keeps) is never shared between them when a program switches modes.
  bool deterministic = false;
  Mesh mesh;          // derived: the mesh of its layout or of its inputs (empty: none yet)
  // Derived, for local_map: a local value is one device's block (made by to_local, not yet
  // turned back by from_local); `varying` has bit d set when its blocks may differ along mesh dim
  // d (JAX's varying axes). Autodiff needs it: an invariant value used by varying computations
  // gets the sum of their adjoints (an all_reduce), as if broadcast to them.
  bool local = false;
  uint64_t varying = 0;
  // Derived for a local value whose blocks differ in extent between devices (local_map over
  // uneven shards, dsl/block_extents.hpp); `shape` is then the first device's block.
  std::optional<BlockExtents> extents;
  // Derived: a mesh_transfer is in its graph (forcing computes those first; others skip the walk).
  bool crosses_meshes = false;
  // Derived: it depends on an argument (or a variable read) of a function jit traces, so its
  // value exists only when the compiled function runs (dsl/concrete_value.hpp).
  bool traced = false;

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Releases the inputs it last owned from a loop, not by recursion (dsl/release_iteratively.hpp).
  ~Node();

  int64_t rank() const { return int64_t(shape.size()); }
  int64_t numel() const;
  std::string location() const;  // "file.cpp:12"
  std::string module_path() const { return module ? *module : std::string(); }

  // The cached value (Leaf nodes are born with one).
  std::optional<NodeValue> value() const;
  void set_value(NodeValue value) const;

 private:
  mutable std::mutex value_mutex_;
  mutable std::optional<NodeValue> value_;
};

// Builds (or finds) the node. Leaves are never shared: each call makes a new one.
NodeRef make_node(OpKind op, DType dtype, std::vector<int64_t> shape, std::vector<NodeRef> inputs, NodeAttrs attrs,
                  SourceLocation where);
NodeRef make_leaf(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage,
                  SourceLocation where = SourceLocation::current());

// A stable 64-bit mix (splitmix64-style; never std::hash) for canonical hashes.
uint64_t hash_mix(uint64_t h, uint64_t v);
uint64_t hash_text(uint64_t h, const std::string& text);

// A leaf standing for an argument of a function jit traces: `traced`, and so is everything built
// from it. Its storage is the tracing call's value (the partitioner reads its layout only).
// `where`: the source line of the value it stands for (the argument's, the variable's), so that
// what is said of the input (a collective that gathers it, an error) points at the user's code.
NodeRef make_traced_leaf(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage,
                         SourceLocation where);

// Number of live nodes in this thread's hash-consing table (tests).
size_t live_node_count();
// Entries in that table, dead nodes' included until the next sweep (tests: bounded by ~2x live).
size_t node_table_entries();

}  // namespace tessera
