// Tensor: a DTensor. A handle to a node of the global op graph: global shape, dtype, and (once
// computed) its layout and components, one Array per local device. Ops build nodes and run
// nothing; looking at a value (components, printing, full_tensor, unpack) forces the pending
// part of the graph. Members that must run something are defined in jit/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/array.hpp"
#include "dsl/layout.hpp"
#include "dsl/node.hpp"
#include "dsl/source_location.hpp"

namespace tessera {

// The materialised value of a tensor: component i belongs to the mesh's local device i.
struct ShardedStorage {
  std::vector<Array> components;
};

// Defined in jit/: the value of a node (computed, or found in its cache), and the layout the
// value has or will have.
NodeValue force_value(const NodeRef& node);
// Several values at once (one program), each in the given layout where one is given.
std::vector<NodeValue> force_values(const std::vector<NodeRef>& outputs,
                                    const std::vector<std::optional<Layout>>& layouts = {});
Layout planned_layout(const NodeRef& node);
// Several at once, from one propagation: what a caller about to ask many values of one graph
// (a model's gradients) asks first, so that each later planned_layout is answered.
std::vector<Layout> planned_layouts(const std::vector<NodeRef>& nodes);
// force_value, except on an abstract mesh (abstract_mesh), where nothing runs: the node's value
// there is abstract, its layout without storage. For what is held rather than looked at
// (variables, traced arguments): they compile and plan, and allocate nothing.
NodeValue force_or_abstract_value(const NodeRef& node);

// ShapeError unless component i is the block `layout` gives local device i in a tensor of
// `shape` (one component per local device); `what` names the caller in the message.
void check_component_shapes(const std::vector<Array>& components, const Layout& layout, const std::vector<int64_t>& shape,
                            std::string_view what);

class Tensor {
 public:
  Tensor() = default;  // an empty handle; only assignable
  explicit Tensor(NodeRef node) : node_(std::move(node)) {}
  // A materialised tensor: one component per local device, each the block `layout` gives it
  // (checked: ShapeError / LayoutError / DTypeError name the component at fault). Tessera's own
  // code, which builds components right by construction, makes leaves with make_leaf.
  Tensor(std::vector<int64_t> shape, DType dtype, Layout layout, std::shared_ptr<const ShardedStorage> storage);

  std::vector<int64_t> shape() const;
  DType dtype() const;
  Layout layout() const;  // may run sharding propagation, never kernels
  int64_t rank() const;
  bool is_valid() const { return node_ != nullptr; }
  bool is_computed() const;

  Tensor redistribute(std::vector<Placement> placements = {}, std::vector<Placement> grad_placements = {},
                      SourceLocation where = SourceLocation::current()) const;
  // Onto another mesh (lazy, differentiable; jit/mesh_transfer.hpp): e.g. a pipeline stage's
  // activations to the next stage's devices. The same mesh is an ordinary redistribute.
  Tensor redistribute(const Mesh& mesh, std::vector<Placement> placements = {},
                      SourceLocation where = SourceLocation::current()) const;
  // PyTorch's redistribute(..., async_op=True), accepted either way: Tessera is lazy, so every
  // redistribute is already asynchronous (its collectives run when the value is first needed,
  // overlapped with the program around them).
  Tensor redistribute(std::vector<Placement> placements, bool async_op, SourceLocation where = SourceLocation::current()) const;
  Tensor redistribute(const Mesh& mesh, std::vector<Placement> placements, bool async_op,
                      SourceLocation where = SourceLocation::current()) const;
  std::vector<Placement> placements() const;  // the layout's, one per mesh dim (PyTorch's property)
  Mesh device_mesh() const;                   // the layout's mesh
  Array to_local() const;      // this client's component (first local device): a host copy, or the GPU block itself
  Array full_tensor() const;   // gathers; works for every layout

  std::vector<Array> components() const;  // forces; one per local device
  const NodeRef& node() const;

 private:
  NodeRef node_;
};

}  // namespace tessera
