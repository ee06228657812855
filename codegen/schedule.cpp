#include "codegen/schedule.hpp"

#include <functional>

#include "codegen/lower_kernel.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

bool uses_blas(const LocalNode& n) { return n.op == OpKind::Dot && (n.dtype == DType::f32 || n.dtype == DType::f64); }

// The values that must live in buffers before any fusion choice.
std::vector<bool> required_materialisation(const LocalProgram& p, const std::vector<std::vector<int>>& consumers) {
  std::vector<bool> mat(p.nodes.size(), false);
  for (int out : p.outputs) mat[out] = true;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const LocalNode& n = p.nodes[i];
    if (n.kind != LocalNode::Kind::Compute) {
      mat[i] = true;  // inputs and redistribute results are buffers; so are their inputs
      for (int in : n.inputs) mat[in] = true;
      continue;
    }
    if (n.op == OpKind::Dot || n.op == OpKind::ArgMax) mat[i] = true;
    if (uses_blas(n))
      for (int in : n.inputs) mat[in] = true;  // the library reads plain row-major buffers
    if (is_reduce(n.op) && consumers[i].size() != 1) mat[i] = true;
  }
  return mat;
}

}  // namespace

Schedule schedule_program(const LocalProgram& p) {
  const size_t count = p.nodes.size();
  std::vector<std::vector<int>> consumers(count);
  for (size_t i = 0; i < count; ++i)
    for (int in : p.nodes[i].inputs) consumers[in].push_back(int(i));
  std::vector<bool> mat = required_materialisation(p, consumers);

  // Values with several consumers are recomputed in each only when cheap; "expensive" includes
  // expensive work inlined into the value.
  std::vector<bool> carries_expensive(count, false);
  for (size_t i = 0; i < count; ++i) {
    const LocalNode& n = p.nodes[i];
    if (n.kind != LocalNode::Kind::Compute) continue;
    bool expensive = is_expensive(n.op);
    for (int in : n.inputs) expensive |= !mat[in] && carries_expensive[in];
    if (!mat[i] && consumers[i].size() > 1 && expensive) {
      mat[i] = true;
      component_logger("codegen").debug("materialising %{} ({}): {} consumers and expensive work", i, op_name(n.op),
                                        consumers[i].size());
    }
    carries_expensive[i] = !mat[i] && expensive;
  }

  Schedule schedule;
  // Lowers node `id` into a kernel step. A reduce that cannot be computed inline is materialised,
  // gets its own kernel first, and the node is lowered again.
  std::function<void(int)> lower_kernel = [&](int id) {
    while (true) {
      ScheduledStep step;
      step.node = id;
      step.kind = ScheduledStep::Kind::Kernel;
      try {
        kir::Kernel k = lower_group(p, id, mat, step.buffer_nodes);
        step.kernel = int(schedule.kernels.size());
        schedule.kernels.push_back(std::move(k));
        schedule.steps.push_back(std::move(step));
        return;
      } catch (const FusionRefused& refused) {
        if (mat[refused.node]) throw InternalError("fusion refused for an already materialised value");
        component_logger("codegen").debug("fusion of %{} into %{} refused: {}", refused.node, id, refused.what());
        mat[refused.node] = true;
        lower_kernel(refused.node);
      }
    }
  };
  for (size_t i = 0; i < count; ++i) {
    const LocalNode& n = p.nodes[i];
    if (!mat[i] || n.kind == LocalNode::Kind::Input) continue;
    if (n.kind == LocalNode::Kind::Redistribute || uses_blas(n)) {
      ScheduledStep step;
      step.node = int(i);
      step.kind = n.kind == LocalNode::Kind::Redistribute ? ScheduledStep::Kind::Redistribute : ScheduledStep::Kind::Gemm;
      schedule.steps.push_back(std::move(step));
    } else {
      lower_kernel(int(i));
    }
  }
  schedule.materialised = std::move(mat);
  return schedule;
}

}  // namespace tessera
