#include "ir/local_program_verify.hpp"

#include <fmt/format.h>

#include "dsl/error.hpp"

namespace tessera {
namespace {

class ProgramVerifier {
 public:
  explicit ProgramVerifier(const LocalProgram& p) : p_(p) {}

  void run() {
    if (p_.device_ids.size() != p_.device_params.size())
      fail(fmt::format("{} planned devices' parameters but {} device ids", p_.device_params.size(), p_.device_ids.size()));
    for (size_t d = 0; d < p_.device_params.size(); ++d)
      if (int64_t(p_.device_params[d].size()) != p_.num_params)
        fail(fmt::format("device {} has {} parameter values for {} slots", p_.device_ids[d], p_.device_params[d].size(), p_.num_params));
    for (size_t i = 0; i < p_.nodes.size(); ++i) node(int(i));
    for (int o : p_.outputs)
      if (o < 0 || size_t(o) >= p_.nodes.size()) fail(fmt::format("output {} is not a node (the program has {})", o, p_.nodes.size()));
  }

 private:
  void node(int id) {
    const LocalNode& n = p_.nodes[size_t(id)];
    for (int in : n.inputs)
      if (in < 0 || in >= id) fail_at(id, fmt::format("reads node {}, which is not an earlier node", in));
    switch (n.kind) {
      case LocalNode::Kind::Input:
        if (!n.inputs.empty()) fail_at(id, "is an input but reads other nodes");
        if (n.input_index < 0 || (!p_.inputs.empty() && size_t(n.input_index) >= p_.inputs.size()))
          fail_at(id, fmt::format("is bound to input {}, which the program does not have", n.input_index));
        break;
      case LocalNode::Kind::Redistribute:
        if (n.inputs.empty()) fail_at(id, "redistributes no value");
        if (n.step.mesh_dim < 0 || n.step.mesh_dim >= p_.mesh.ndim())
          fail_at(id, fmt::format("steps over mesh dim {} of a {}-dim mesh", n.step.mesh_dim, p_.mesh.ndim()));
        break;
      case LocalNode::Kind::Compute:
        break;
    }
    if (!n.layout.is_valid()) fail_at(id, "has no layout");
    if (n.layout.rank() != n.rank()) fail_at(id, fmt::format("has a rank-{} layout for a rank-{} value", n.layout.rank(), n.rank()));
    if (int64_t(n.local_shape.size()) != n.rank())
      fail_at(id, fmt::format("has {} local extents for a rank-{} value", n.local_shape.size(), n.rank()));
    if (!n.local_offset.empty() && int64_t(n.local_offset.size()) != n.rank())
      fail_at(id, fmt::format("has {} local offsets for a rank-{} value", n.local_offset.size(), n.rank()));
    for (const auto* dims : {&n.local_shape, &n.local_offset})
      for (const SymbolicDim& dim : *dims)
        if (dim.param >= p_.num_params) fail_at(id, fmt::format("reads parameter slot {} of {}", dim.param, p_.num_params));
    if (n.seed_param < -1 || n.seed_param >= p_.num_params)
      fail_at(id, fmt::format("reads its seed from parameter slot {} of {}", n.seed_param, p_.num_params));
    for (size_t d = 0; d < p_.device_params.size(); ++d)
      for (size_t axis = 0; axis < n.local_shape.size(); ++axis)
        if (n.local_shape[axis].on(p_.device_params[d]) < 0)
          fail_at(id, fmt::format("has extent {} on axis {} on device {}", n.local_shape[axis].on(p_.device_params[d]), axis, p_.device_ids[d]));
  }

  [[noreturn]] void fail_at(int id, const std::string& what) const {
    const LocalNode& n = p_.nodes[size_t(id)];
    const std::string op = n.kind == LocalNode::Kind::Input          ? "input"
                           : n.kind == LocalNode::Kind::Redistribute ? std::string(redistribute_kind_name(n.step.kind))
                                                                     : std::string(op_name(n.op));
    fail(fmt::format("node {} ({}{}{}) {}", id, op, n.origin.location.empty() ? "" : " @", n.origin.location, what));
  }

  [[noreturn]] static void fail(const std::string& what) { throw InternalError("local program: " + what); }

  const LocalProgram& p_;
};

}  // namespace

void verify(const LocalProgram& program) { ProgramVerifier(program).run(); }

}  // namespace tessera
