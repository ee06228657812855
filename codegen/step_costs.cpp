#include "codegen/step_costs.hpp"

#include <algorithm>
#include <set>

#include "dsl/attention_parts.hpp"
#include "dsl/dot_form.hpp"
#include "dsl/element_count.hpp"

namespace tessera {

int64_t local_bytes(const LocalNode& node, const std::vector<int64_t>& params) {
  return element_count(node.shape_on(params)) * dtype_size(node.dtype);
}

int64_t received_elements(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params,
                          const std::vector<int64_t>& coords) {
  const int64_t in = element_count(p.nodes[n.inputs[0]].shape_on(params)), out = element_count(n.shape_on(params));
  const int64_t k = p.mesh.shape()[n.step.mesh_dim];
  switch (n.step.kind) {
    case RedistributeKind::AllGather: return out - in;
    case RedistributeKind::AllToAll: return in * (k - 1) / k;
    case RedistributeKind::AllToAllV: return out * (k - 1) / k;  // as all_to_all, at its bound
    case RedistributeKind::AllReduce: return 2 * in * (k - 1) / k;
    case RedistributeKind::ReduceScatter: return out * (k - 1);
    case RedistributeKind::Shift: {  // a device that a permutation leaves its block receives nothing
      const int64_t me = coords[size_t(n.step.mesh_dim)];
      return n.step.destinations[size_t(me)] == me ? 0 : in;
    }
    default: return 0;
  }
}

int64_t received_bytes(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params,
                       const std::vector<int64_t>& coords) {
  int64_t bytes = 0;
  for (int o : step.outputs) bytes += received_elements(p, p.nodes[o], params, coords) * dtype_size(p.nodes[o].dtype);
  return bytes;
}

// Causal masks skip about half of the (query, key) pairs; a forward multiplies twice per pair
// and feature (q k^T, p v), dq three times, dk and dv four.
int64_t dot_multiplies(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params) {
  if (n.kind != LocalNode::Kind::Compute) return 0;
  if (n.op == OpKind::Dot) {
    const DotExtents e = dot_extents(p.nodes[n.inputs[0]].shape_on(params), p.nodes[n.inputs[1]].shape_on(params), n.shape_on(params));
    return e.batch * e.m * e.n * e.k;
  }
  if (n.op == OpKind::GroupedDot || n.op == OpKind::GroupedWeightGrad) {
    // Every row in some group (the sizes exist only at run time): N * K * F, an upper bound.
    const auto x = p.nodes[n.inputs[0]].shape_on(params), other = p.nodes[n.inputs[1]].shape_on(params);
    return x[0] * x[1] * other.back();
  }
  if (n.op != OpKind::Attention) return 0;
  const auto q = p.nodes[n.inputs[0]].shape_on(params), k = p.nodes[n.inputs[1]].shape_on(params);
  const int64_t pairs = element_count(q) / q.back() * k[k.size() - 2];  // batch * lq * lk
  const int64_t e = q.back();
  const AttentionAttrs a = attention_attrs(n.attrs);
  const int64_t products = a.part == AttentionPart::Forward ? 2 : a.part == AttentionPart::GradQ ? 3 : 4;
  return pairs * e * products / (a.causal ? 2 : 1);
}

double gemm_intensity(const LocalProgram& p, const LocalNode& n, const std::vector<int64_t>& params) {
  if (n.kind != LocalNode::Kind::Compute || (n.op != OpKind::Dot && n.op != OpKind::Attention)) return 0;
  const auto a = p.nodes[n.inputs[0]].shape_on(params);
  if (a.size() < 2) return 0;
  double m = double(a[a.size() - 2]), k = double(a.back()), cols = 0;
  if (n.op == OpKind::Dot) {
    const DotExtents e = dot_extents(a, p.nodes[n.inputs[1]].shape_on(params), n.shape_on(params));
    m = double(e.m);
    k = double(e.k);
    cols = double(e.n);
  } else {
    const auto keys = p.nodes[n.inputs[1]].shape_on(params);
    cols = double(keys[keys.size() - 2]);
  }
  const double touched = m * cols + cols * k + m * k;
  return touched > 0 ? m * cols * k / touched : 0;
}

namespace {

// The elements a kernel's reductions read: its largest input's (its output's when larger).
int64_t reduced_elements(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params) {
  int64_t domain = element_count(p.nodes[size_t(step.node)].shape_on(params));
  for (int r : step_reads(p, step)) domain = std::max(domain, element_count(p.nodes[size_t(r)].shape_on(params)));
  return domain;
}

}  // namespace

kir::Kernel::OpCounts op_evaluations(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step,
                                     const std::vector<int64_t>& params) {
  if (step.kind != ScheduledStep::Kind::Kernel || dot_multiplies(p, p.nodes[size_t(step.node)], params)) return {};
  const kir::Kernel& kernel = schedule.kernels[size_t(step.kernel)];
  const int64_t outputs = element_count(p.nodes[size_t(step.node)].shape_on(params)), read = reduced_elements(p, step, params);
  const kir::Kernel::OpCounts &out = kernel.per_output_element, &reduced = kernel.per_reduced_element;
  kir::Kernel::OpCounts evaluated{out.ops * outputs + reduced.ops * read, out.rounded_to_bf16 * outputs + reduced.rounded_to_bf16 * read,
                                  out.rounded_to_f16 * outputs + reduced.rounded_to_f16 * read};
  for (size_t f = 0; f < evaluated.special.size(); ++f) evaluated.special[f] = out.special[f] * outputs + reduced.special[f] * read;
  return evaluated;
}

int64_t step_flops(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params,
                   const kir::Kernel::OpCounts& evaluated) {
  const LocalNode& n = p.nodes[step.node];
  const int64_t mults = dot_multiplies(p, n, params);
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel: return mults ? 2 * mults : evaluated.ops;
    case ScheduledStep::Kind::Gemm:
    case ScheduledStep::Kind::GroupedGemm:
    case ScheduledStep::Kind::Attention: return 2 * mults;
    case ScheduledStep::Kind::Redistribute: return 0;
  }
  return 0;
}

int64_t step_flops(const LocalProgram& p, const Schedule& schedule, const ScheduledStep& step, const std::vector<int64_t>& params) {
  return step_flops(p, step, params, op_evaluations(p, schedule, step, params));
}

int64_t step_bytes_touched(const LocalProgram& p, const ScheduledStep& step, const std::vector<int64_t>& params) {
  std::set<int> buffers(step.outputs.begin(), step.outputs.end());
  for (int r : step_reads(p, step)) buffers.insert(r);
  int64_t bytes = 0;
  for (int b : buffers) bytes += local_bytes(p.nodes[size_t(b)], params);
  return bytes;
}

}  // namespace tessera
