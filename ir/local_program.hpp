// The output of SPMD expansion: ONE program that every device runs on its own block of each
// value. Compute nodes apply the same primitive ops to local blocks; Redistribute nodes are one
// per-mesh-dim step each (a collective or a local chunk). Local extents and global offsets that
// differ between devices are run-time parameters (slots of a per-device array), so each kernel
// is compiled once for all devices; extents equal on every device are constants. Random ops'
// seeds are parameters too, so a kernel is compiled once for every seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsl/node.hpp"
#include "ir/redistribute_step.hpp"
#include "ir/target.hpp"

namespace tessera {

// Where a local node came from: the user's source line and module (explain(), CommDebugMode).
// The global node itself is held weakly: a cached program must not keep the graph it was
// compiled from, and the values computed for that graph, alive.
struct NodeOrigin {
  NodeOrigin() = default;
  explicit NodeOrigin(const NodeRef& n)
      : node(n),
        known(n != nullptr),
        location(n ? n->location() : ""),
        module(n ? n->module : nullptr),
        program_order(n ? n->program_order : -1) {}
  std::weak_ptr<const Node> node;  // while the graph lives (the driver maps collectives to it)
  bool known = false;
  std::string location;            // "file.cpp:12", or empty
  ModulePath module;               // null: built in no CommModuleScope
  int64_t program_order = -1;      // its ProgramOrderScope's position (-1: none)
};

// A local extent or offset: a constant, or parameter slot `param` of the device's array.
struct SymbolicDim {
  int64_t constant = 0;
  int param = -1;
  bool is_constant() const { return param < 0; }
  int64_t on(const std::vector<int64_t>& params) const { return is_constant() ? constant : params[size_t(param)]; }
  bool operator==(const SymbolicDim&) const = default;
};

struct LocalNode {
  enum class Kind { Input, Compute, Redistribute };
  Kind kind = Kind::Compute;
  OpKind op = OpKind::Leaf;        // Compute: the primitive, applied to local blocks
  NodeAttrs attrs;                 // Compute: the global node's attributes
  DType dtype = DType::f32;
  std::vector<int64_t> global_shape;
  Layout layout;                   // how this value is sharded (Partial dims included)
  std::vector<int> inputs;         // indices of earlier nodes
  NodeOrigin origin;               // the global node's source line and module
  int input_index = -1;            // Input: which program input it is bound to
  RedistributeStep step;           // Redistribute
  std::vector<SymbolicDim> local_shape, local_offset;
  // Random ops: the parameter slot holding attrs.seed, so kernels that differ only in their seed
  // (a model's initialisers, a dropout's steps) are one kernel.
  int seed_param = -1;

  int64_t rank() const { return int64_t(global_shape.size()); }
  // The local extents on a device with parameter values `params`.
  std::vector<int64_t> shape_on(const std::vector<int64_t>& params) const {
    std::vector<int64_t> out;
    for (const SymbolicDim& d : local_shape) out.push_back(d.on(params));
    return out;
  }
};

struct LocalProgram {
  Mesh mesh;
  Target target;                           // what it is compiled for (the partitioner sets it)
  std::vector<LocalNode> nodes;            // topological order
  // Values bound at run time (leaves, computed nodes) of the graph partitioned; the driver maps
  // them to positions and drops them, so a cached program keeps no values alive.
  std::vector<NodeRef> inputs;
  std::vector<int> outputs;                // one per requested output
  int num_params = 0;
  std::vector<std::vector<int64_t>> device_params;  // per planned device, num_params values
  // The global ids of the devices device_params describe: the mesh's local devices; on an
  // abstract mesh (which has none) the devices whose coordinates are all 0 or 1, whose shards
  // and buffers are at least those of every other device (partitioner/expansion.cpp).
  std::vector<int64_t> device_ids;

  std::string to_string() const;           // one line per node (TESSERA_DUMP, explain)
  // Everything that decides the values the program computes (ops, attributes, dtypes, shapes,
  // layouts, steps, parameters, target), none of what only names them (source lines): two graphs
  // given one executable-cache key must have equal canonical texts (jit/driver.cpp checks it).
  std::string canonical_text() const;
};

}  // namespace tessera
