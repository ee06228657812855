#include "plan/call_sequence_plan.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "codegen/step_costs.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

// Per planned device, the bytes of each value a call reads, by what holds it.
using HeldValues = std::vector<std::map<const void*, int64_t>>;

HeldValues input_values(const ProgramPlan& plan) {
  const LocalProgram& p = plan.program;
  if (plan.input_identities.size() != p.inputs.size())
    throw Error("plan_call_sequence: a call's program plan does not say what holds its inputs (plan it with JitFunction::program_plan)");
  HeldValues out(p.device_ids.size());
  for (const LocalNode& node : p.nodes) {
    if (node.kind != LocalNode::Kind::Input || node.input_index < 0) continue;
    for (size_t d = 0; d < out.size(); ++d)
      out[d][plan.input_identities[size_t(node.input_index)]] = local_bytes(node, p.device_params[d]);
  }
  return out;
}

int64_t bytes_not_in(const std::map<const void*, int64_t>& step, const std::map<const void*, int64_t>& call) {
  int64_t held = 0;
  for (const auto& [identity, bytes] : step)
    if (!call.contains(identity)) held += bytes;
  return held;
}

int64_t total_bytes(const std::map<const void*, int64_t>& values) {
  int64_t total = 0;
  for (const auto& [identity, bytes] : values) total += bytes;
  return total;
}

}  // namespace

PlanReport plan_call_sequence(const std::vector<PlannedCall>& calls, const Hardware& hardware, const std::vector<Variable>& also_held) {
  if (calls.empty()) throw Error("plan_call_sequence: no calls to plan");
  for (const PlannedCall& call : calls) {
    if (call.count < 1) throw Error("plan_call_sequence: a call counted " + std::to_string(call.count) + " times; each runs at least once");
    if (!(call.plan.program.mesh == calls.front().plan.program.mesh) || call.plan.program.device_ids != calls.front().plan.program.device_ids)
      throw MeshError("plan_call_sequence: the calls of one step run on different meshes (" + calls.front().plan.program.mesh.dims_string() +
                      ", " + call.plan.program.mesh.dims_string() + ")");
  }
  std::vector<PlanReport> reports;
  std::vector<HeldValues> inputs;
  for (const PlannedCall& call : calls) {
    reports.push_back(plan_report(call.plan, hardware));
    inputs.push_back(input_values(call.plan));
  }
  const size_t devices = calls.front().plan.program.device_ids.size();
  HeldValues step(devices);  // everything the step holds from its start to its end
  for (const HeldValues& call : inputs)
    for (size_t d = 0; d < devices; ++d) step[d].insert(call[d].begin(), call[d].end());
  const std::vector<int64_t>& device_ids = calls.front().plan.program.device_ids;
  for (const Variable& v : also_held) {
    if (!(v.layout().mesh() == calls.front().plan.program.mesh))
      throw MeshError("plan_call_sequence: a held variable lives on " + v.layout().mesh().dims_string() + ", the calls run on " +
                      calls.front().plan.program.mesh.dims_string());
    for (size_t d = 0; d < devices; ++d) {
      int64_t bytes = dtype_size(v.dtype());
      for (int64_t extent : v.layout().local_shape(v.shape(), device_ids[d])) bytes *= extent;
      step[d].emplace(v.state().get(), bytes);
    }
  }

  PlanReport r = reports.back();  // the step's output and names; the rest is summed below
  r.flops = 0, r.collective_bytes = 0, r.predicted_seconds = 0, r.arena_bytes = 0;
  r.collectives.clear(), r.by_op_kind.clear(), r.by_module.clear(), r.steps.clear();
  for (size_t d = 0; d < devices; ++d) r.device_peak_bytes[d] = 0, r.device_collective_bytes[d] = 0;
  for (size_t k = 0; k < calls.size(); ++k) {
    const PlanReport& one = reports[k];
    const double count = double(calls[k].count);
    r.flops += count * one.flops;
    r.collective_bytes += calls[k].count * one.collective_bytes;
    r.predicted_seconds += count * one.predicted_seconds;
    r.arena_bytes = std::max(r.arena_bytes, one.arena_bytes);
    for (size_t d = 0; d < devices; ++d) {
      r.device_peak_bytes[d] = std::max(r.device_peak_bytes[d], one.device_peak_bytes[d] + bytes_not_in(step[d], inputs[k][d]));
      r.device_collective_bytes[d] += calls[k].count * one.device_collective_bytes[d];
    }
    for (const PlanReport::Collective& c : one.collectives) {
      auto it = std::find_if(r.collectives.begin(), r.collectives.end(),
                             [&](const PlanReport::Collective& o) { return o.kind == c.kind && o.mesh_dim == c.mesh_dim; });
      if (it == r.collectives.end()) it = r.collectives.insert(r.collectives.end(), PlanReport::Collective{c.kind, c.mesh_dim, c.group_size, c.within_node});
      it->calls += calls[k].count * c.calls;
      it->bytes += calls[k].count * c.bytes;
      it->seconds += count * c.seconds;
    }
    for (auto [parts, one_parts] : {std::pair{&r.by_op_kind, &one.by_op_kind}, std::pair{&r.by_module, &one.by_module}})
      for (const PlanReport::Part& part : *one_parts) {
        auto it = std::find_if(parts->begin(), parts->end(), [&](const PlanReport::Part& o) { return o.name == part.name; });
        if (it == parts->end()) it = parts->insert(parts->end(), PlanReport::Part{part.name});
        it->steps += calls[k].count * part.steps;
        it->flops += count * part.flops;
        it->bytes += calls[k].count * part.bytes;
        it->seconds += count * part.seconds;
      }
    // Each call's steps once, in order, each counted as many times as the call runs.
    for (PlanReport::Part s : one.steps) {
      s.steps = calls[k].count;
      r.steps.push_back(s);
    }
  }
  const size_t most = size_t(std::max_element(r.device_peak_bytes.begin(), r.device_peak_bytes.end()) - r.device_peak_bytes.begin());
  r.device = r.device_ids[most];
  r.peak_bytes = r.device_peak_bytes[most];
  r.input_bytes = total_bytes(step[most]);
  r.output_bytes = r.output_bytes_per_device[most];
  r.fits = hardware.memory_bytes <= 0 || r.peak_bytes <= hardware.memory_bytes;
  return r;
}

}  // namespace tessera
