#include "ir/local_program.hpp"

#include <fmt/format.h>

#include <bit>

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
           join(n.layout.sharding_specs(), ",") + "]" +
           (n.layout.has_partial() ? " partial" : "") +
           (n.origin.program_order >= 0 ? " order " + std::to_string(n.origin.program_order) : "") + "  @" + n.origin.location + "\n";
  }
  out += "outputs: " + join(outputs, ", ", [](int x) { return "%" + std::to_string(x); }) + "\n";
  return out;
}

namespace {

std::string list_text(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); }

std::string dims_text(const std::vector<SymbolicDim>& v) {
  return "[" + join(v, ",", [](const SymbolicDim& d) { return d.is_constant() ? std::to_string(d.constant) : "p" + std::to_string(d.param); }) + "]";
}

std::string layout_text(const Layout& l) { return l.is_valid() ? l.to_string() : "-"; }

// Every attribute a kernel or step reads; scalars by their bits (text would round them).
std::string attrs_text(const NodeAttrs& a) {
  std::string out = "axes" + list_text(a.axes) + " lo" + list_text(a.lo) + " hi" + list_text(a.hi) +
                    fmt::format(" s{:x} s{:x} seed{}", std::bit_cast<uint64_t>(a.scalar), std::bit_cast<uint64_t>(a.scalar2), a.seed);
  if (a.layout) out += " layout{" + layout_text(*a.layout) + "}";
  if (a.grad_layout) out += " grad_layout{" + layout_text(*a.grad_layout) + "}";
  if (a.grad_dtype) out += " grad_dtype " + std::string(dtype_name(*a.grad_dtype));
  if (a.extents)
    for (const AxisExtent& e : a.extents->axes) out += fmt::format(" extent {}{}", e.global, list_text(e.dims));
  if (a.recomputed) out += " recomputed";
  return out;
}

}  // namespace

std::string LocalProgram::canonical_text() const {
  std::string out = "target " + target.to_string() + " " + target.arch + fmt::format(" library {:x}", target.library.bits()) +
                    "\nmesh " + (mesh.is_valid() ? mesh.to_string() : "-") + "\n";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const LocalNode& n = nodes[i];
    out += fmt::format("%{} kind{} {} {}{} [{}] {} local {} offset {} seed_param {}", i, int(n.kind), op_name(n.op),
                       dtype_name(n.dtype), shape_string(n.global_shape), fmt::join(n.inputs, ","), layout_text(n.layout),
                       dims_text(n.local_shape), dims_text(n.local_offset), n.seed_param);
    if (n.kind == LocalNode::Kind::Input) out += " input " + std::to_string(n.input_index);
    if (n.kind == LocalNode::Kind::Compute) out += " " + attrs_text(n.attrs);
    if (n.kind == LocalNode::Kind::Redistribute)
      out += fmt::format(" step {} dim {} op {} destinations {} from {} to {}", redistribute_kind_name(n.step.kind), n.step.mesh_dim,
                         reduce_op_name(n.step.op), list_text(n.step.destinations), layout_text(n.step.before),
                         layout_text(n.step.after));
    out += "\n";
  }
  out += "outputs " + fmt::format("{}", fmt::join(outputs, ",")) + fmt::format("\nparams {}\n", num_params);
  for (size_t d = 0; d < device_params.size(); ++d)
    out += "device " + (d < device_ids.size() ? std::to_string(device_ids[d]) : "?") + " " + list_text(device_params[d]) + "\n";
  return out;
}

}  // namespace tessera
