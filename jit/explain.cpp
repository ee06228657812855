#include "jit/explain.hpp"

#include <fmt/format.h>

#include "dsl/attention_parts.hpp"
#include "dsl/string_util.hpp"
#include "jit/driver.hpp"
#include "jit/executable.hpp"
#include "codegen/step_costs.hpp"

namespace tessera {
namespace {

struct Walk {
  const Executable& exe;
  template <class Visit>
  void for_each_step(Visit visit) const {
    const LocalProgram& p = exe.program();
    for (size_t d = 0; d < p.device_params.size(); ++d) {
      const std::vector<int64_t> coords = p.mesh.coords(p.device_ids[d]);
      for (const ScheduledStep& step : exe.schedule().steps) visit(d, step, p.nodes[step.node], p.device_params[d], coords);
    }
  }
};

}  // namespace

std::string describe_step(const Executable& exe, const ScheduledStep& step, size_t device) {
  const LocalProgram& p = exe.program();
  const std::vector<int64_t>& params = p.device_params[device];
  const std::vector<int64_t> coords = p.mesh.coords(p.device_ids[device]);
  const LocalNode& n = p.nodes[step.node];
  const auto shape = n.shape_on(params);
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel: {
      const auto& k = exe.schedule().kernels[step.kernel];
      return fmt::format("kernel {:<3} [{}] -> {} {}", step.kernel, join(k.fused_ops, ", "),
                         dtype_name(n.dtype), shape_string(shape));
    }
    case ScheduledStep::Kind::Gemm: {
      const auto a = p.nodes[n.inputs[0]].shape_on(params);
      // BLAS's names: sgemm, dgemm; bf16 operands with f32 sums are oneDNN's and PyTorch's "bf16 gemm".
      const char* name = n.dtype == DType::f32 ? "sgemm" : n.dtype == DType::f64 ? "dgemm" : "bf16 gemm";
      return fmt::format("gemm       {} {} x {} -> {}: {} multiplications", name,
                         shape_string(a), shape_string(p.nodes[n.inputs[1]].shape_on(params)), shape_string(shape),
                         dot_multiplies(p, n, params));
    }
    case ScheduledStep::Kind::GroupedGemm:
      // The multiplications of every row in a group, an upper bound: the sizes are known at run time.
      return fmt::format("gemm       {} {} -> {}: at most {} multiplications", op_name(n.op),
                         join(n.inputs, " ", [&](int in) { return shape_string(p.nodes[in].shape_on(params)); }),
                         shape_string(shape), dot_multiplies(p, n, params));
    case ScheduledStep::Kind::Attention:
      return fmt::format("attention  {} {} -> {}: {} multiplications", attention_part_name(attention_attrs(n.attrs).part),
                         join(n.inputs, " ", [&](int in) { return shape_string(p.nodes[in].shape_on(params)); }),
                         shape_string(shape), dot_multiplies(p, n, params));
    case ScheduledStep::Kind::Redistribute:
      if (step.outputs.size() > 1)
        return fmt::format("{:<14} over {}: {} bytes of {}, a bucket of {}: {}", redistribute_kind_name(n.step.kind),
                           p.mesh.dim_names()[n.step.mesh_dim], received_bytes(p, step, params, coords), dtype_name(n.dtype), step.outputs.size(),
                           join(step.outputs, " ", [&](int o) { return shape_string(p.nodes[o].shape_on(params)); }));
      // The dtype is the wire's and, for a reduction, the sums' (mixed precision's reduce_dtype).
      return fmt::format("{:<14} over {}: {} bytes of {}, {} -> [{}]", redistribute_kind_name(n.step.kind),
                         p.mesh.dim_names()[n.step.mesh_dim], received_elements(p, n, params, coords) * dtype_size(n.dtype), dtype_name(n.dtype),
                         shape_string(shape), join(n.layout.sharding_specs(), ","));
  }
  return {};
}

PlanSummary plan_summary(const Executable& executable) {
  const Executable* exe = &executable;
  const LocalProgram& p = exe->program();
  PlanSummary s;
  for (const ScheduledStep& step : exe->schedule().steps) {
    if (step.kind == ScheduledStep::Kind::Kernel) ++s.kernels;
    if (step.kind == ScheduledStep::Kind::Gemm || step.kind == ScheduledStep::Kind::GroupedGemm || step.kind == ScheduledStep::Kind::Attention)
      ++s.gemms;
    const LocalNode& n = p.nodes[step.node];
    if (step.kind == ScheduledStep::Kind::Redistribute && is_collective(n.step.kind))
      s.collectives.push_back(std::string(redistribute_kind_name(n.step.kind)) + "(" + p.mesh.dim_names()[n.step.mesh_dim] + ")");
  }
  Walk{*exe}.for_each_step([&](size_t, const ScheduledStep& step, const LocalNode& n, const std::vector<int64_t>& params,
                               const std::vector<int64_t>& coords) {
    s.multiplies += dot_multiplies(p, n, params);
    if (step.kind == ScheduledStep::Kind::Redistribute) s.bytes_moved += received_bytes(p, step, params, coords);
  });
  return s;
}

namespace {

// A computed tensor is explained by the program that computed it.
std::shared_ptr<const Executable> program_of(const Tensor& t) {
  if (auto producer = producer_of(t.node())) return producer;
  return executable_for({t.node()});
}

}  // namespace

PlanSummary plan_summary(const Tensor& t) { return plan_summary(*program_of(t)); }

std::string explain(const Tensor& t) { return explain(*program_of(t)); }

std::string explain(const Executable& executable) {
  const Executable* exe = &executable;
  const LocalProgram& p = exe->program();
  const std::vector<std::string> devices = p.mesh.local_devices();
  std::string outputs;
  for (int o : p.outputs)
    outputs += fmt::format("{}{} {}", outputs.empty() ? "" : ", ", dtype_name(p.nodes[o].dtype), shape_string(p.nodes[o].global_shape));
  const PlanSummary summary = plan_summary(executable);
  std::string out = fmt::format("plan for {} on mesh {} ({} kernel launches of {} distinct kernels, {} library calls per device)\ntarget: {}\n",
                                outputs, p.mesh.to_string(), summary.kernels, exe->kernel_count(), summary.gemms, p.target.to_string());
  int64_t total_multiplies = 0, total_bytes = 0;
  for (size_t d = 0; d < p.device_params.size(); ++d) {
    const auto& params = p.device_params[d];
    const std::vector<int64_t> coords = p.mesh.coords(p.device_ids[d]);
    int64_t flops = 0, bytes = 0, multiplies = 0;
    out += fmt::format("{}:\n", devices[d]);
    for (const ScheduledStep& step : exe->schedule().steps) {
      const LocalNode& n = p.nodes[step.node];
      multiplies += dot_multiplies(p, n, params);
      flops += step_flops(p, exe->schedule(), step, params);
      if (step.kind == ScheduledStep::Kind::Redistribute) bytes += received_bytes(p, step, params, coords);
      out += fmt::format("  {}  @{}\n", describe_step(executable, step, d), n.origin.location);
    }
    out += fmt::format("  total: {} FLOPs, {} multiplications, {} bytes received\n", flops, multiplies, bytes);
    total_multiplies += multiplies;
    total_bytes += bytes;
  }
  out += fmt::format("all devices: {} multiplications, {} bytes moved\n", total_multiplies, total_bytes);
  return out;
}

}  // namespace tessera
