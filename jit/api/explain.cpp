#include "jit/api/explain.hpp"

#include <fmt/format.h>

#include "dsl/attention_parts.hpp"
#include "dsl/string_util.hpp"
#include "jit/driver.hpp"
#include "jit/executable.hpp"
#include "jit/jit_function.hpp"
#include "jit/step_description.hpp"
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

// A jit function's explain(args...) (jit/jit_function.hpp), defined with explain().
std::string detail::TraceCache::explain(const std::vector<Tensor>& args, const Trace& trace) {
  return tessera::explain(*executable(args, trace));
}

}  // namespace tessera
