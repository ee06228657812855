#include "ir/local_program.hpp"

#include "dsl/string_util.hpp"

namespace tessera {

std::string LocalProgram::to_string() const {
  std::string out;
  auto dims = [](const std::vector<SymbolicDim>& v) {
    return "[" + join(v, ",", [](const SymbolicDim& d) { return d.is_constant() ? std::to_string(d.constant) : "p" + std::to_string(d.param); }) + "]";
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const LocalNode& n = nodes[i];
    std::string what;
    switch (n.kind) {
      case LocalNode::Kind::Input: what = "input #" + std::to_string(n.input_index); break;
      case LocalNode::Kind::Compute: what = std::string(op_name(n.op)); break;
      case LocalNode::Kind::Redistribute: what = std::string(redistribute_kind_name(n.step.kind)) + "(" +
                                                  mesh.dim_names()[n.step.mesh_dim] + ")"; break;
    }
    out += "%" + std::to_string(i) + " = " + what + "(" +
           join(n.inputs, ", ", [](int x) { return "%" + std::to_string(x); }) + ") " +
           std::string(dtype_name(n.dtype)) + shape_string(n.global_shape) + " local " + dims(n.local_shape) + " [" +
           join(n.layout.sharding_specs(), ",", [](const std::string& s) { return s; }) + "]" +
           (n.layout.has_partial() ? " partial" : "") +
           (n.origin.program_order >= 0 ? " order " + std::to_string(n.origin.program_order) : "") + "  @" + n.origin.location + "\n";
  }
  out += "outputs: " + join(outputs, ", ", [](int x) { return "%" + std::to_string(x); }) + "\n";
  return out;
}

}  // namespace tessera
