#include "codegen/schedule.hpp"

#include <functional>

#include "codegen/collective_buckets.hpp"
#include "codegen/lower_kernel.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

bool uses_blas(const LocalNode& n) { return n.op == OpKind::Dot && (n.dtype == DType::f32 || n.dtype == DType::f64); }
// Library calls (a GEMM, a fused attention part) read and write plain buffers, never inline.
bool library_call(const LocalNode& n) { return n.kind == LocalNode::Kind::Compute && (uses_blas(n) || n.op == OpKind::Attention); }

// A permute that only swaps the last two axes of a value (what a BLAS transpose flag does).
bool swaps_last_two(const LocalNode& n) {
  if (n.kind != LocalNode::Kind::Compute || n.op != OpKind::Permute) return false;
  const auto& perm = n.attrs.axes;
  const int64_t r = int64_t(perm.size());
  if (r < 2 || perm[r - 1] != r - 2 || perm[r - 2] != r - 1) return false;
  for (int64_t a = 0; a < r - 2; ++a)
    if (perm[a] != a) return false;
  return true;
}

// The values that must live in buffers before any fusion choice.
std::vector<bool> required_materialisation(const LocalProgram& p, const std::vector<std::vector<int>>& consumers) {
  std::vector<bool> mat(p.nodes.size(), false);
  for (int out : p.outputs) mat[out] = true;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const LocalNode& n = p.nodes[i];
    if (n.kind == LocalNode::Kind::Redistribute && n.step.kind == RedistributeKind::LocalChunk) {
      mat[n.inputs[0]] = true;  // a local chunk is a view of its input's buffer, read in place
      continue;
    }
    if (n.kind != LocalNode::Kind::Compute) {
      mat[i] = true;  // inputs and redistribute results are buffers; so are their inputs
      for (int in : n.inputs) mat[in] = true;
      continue;
    }
    if (n.op == OpKind::Dot || n.op == OpKind::ArgMax || n.op == OpKind::Attention || n.op == OpKind::ScatterAddRows ||
        n.op == OpKind::CheckIndex)
      mat[i] = true;
    if (n.op == OpKind::Attention)
      for (int in : n.inputs) mat[in] = true;
    if (uses_blas(n))
      for (int in : n.inputs) {
        // The library reads plain row-major buffers, or their transposes through its flags.
        const LocalNode& operand = p.nodes[in];
        mat[swaps_last_two(operand) ? operand.inputs[0] : in] = true;
      }
    if (is_reduce(n.op) && consumers[i].size() != 1) mat[i] = true;
  }
  return mat;
}

}  // namespace

std::vector<int> step_reads(const LocalProgram& p, const ScheduledStep& step) {
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel:
      return std::vector<int>(step.buffer_nodes.begin() + int64_t(step.outputs.size()), step.buffer_nodes.end());
    case ScheduledStep::Kind::Gemm: return {step.gemm_a, step.gemm_b};
    case ScheduledStep::Kind::Attention: return p.nodes[step.node].inputs;
    case ScheduledStep::Kind::Redistribute: {
      std::vector<int> reads;  // a bucket of all_reduces reads every member's input
      for (int o : step.outputs) reads.insert(reads.end(), p.nodes[o].inputs.begin(), p.nodes[o].inputs.end());
      return reads;
    }
  }
  return {};
}

Schedule schedule_program(const LocalProgram& p, kir::LoopTarget target) {
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

  // Sibling elementwise values with the same local shape (an optimizer's new moments and weight)
  // share one kernel, run where the last of them would: every buffer a member reads is ready by
  // then, and nothing outside the group reads a member's buffer earlier. No reduce is inlined.
  auto elementwise_root = [&](int id) {
    const LocalNode& n = p.nodes[id];
    return n.kind == LocalNode::Kind::Compute && !library_call(n) && !is_reduce(n.op) && n.op != OpKind::Dot &&
           n.op != OpKind::ScatterAddRows && n.op != OpKind::CheckIndex;
  };
  std::function<void(int, std::vector<int>&, bool&)> frontier = [&](int id, std::vector<int>& reads, bool& inlined_reduce) {
    for (int in : p.nodes[id].inputs) {
      if (mat[in]) reads.push_back(in);
      else {
        inlined_reduce |= is_reduce(p.nodes[in].op);
        frontier(in, reads, inlined_reduce);
      }
    }
  };
  // read_by[v]: the materialised values whose step reads buffer v (a GEMM's transposed operand
  // counts as reading the buffer under the transpose too).
  std::vector<std::vector<int>> read_by(count);
  for (size_t i = 0; i < count; ++i) {
    if (!mat[i] || p.nodes[i].kind == LocalNode::Kind::Input) continue;
    std::vector<int> reads;
    bool unused = false;
    frontier(int(i), reads, unused);
    for (int r : reads) {
      read_by[r].push_back(int(i));
      if (p.nodes[r].kind == LocalNode::Kind::Compute && !p.nodes[r].inputs.empty()) read_by[p.nodes[r].inputs[0]].push_back(int(i));
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(count, -1);
  for (size_t i = 0; i < count; ++i) {
    if (!mat[i] || !elementwise_root(int(i))) continue;
    std::vector<int> reads;
    bool inlined_reduce = false;
    frontier(int(i), reads, inlined_reduce);
    int joined = -1;
    for (int g = int(groups.size()) - 1; !inlined_reduce && g >= 0 && g >= int(groups.size()) - 4; --g) {
      const int first = groups[g].front();
      if (p.nodes[first].local_shape != p.nodes[i].local_shape || p.nodes[first].global_shape != p.nodes[i].global_shape) continue;
      // The group moves to position i: no other step before i may read what it produces.
      bool movable = true;
      for (int member : groups[g])
        for (int reader : read_by[member]) movable &= reader == int(i) || group_of[reader] == g || reader > int(i);
      if (movable) {
        joined = g;
        break;
      }
    }
    if (joined < 0) {
      joined = int(groups.size());
      groups.push_back({});
    }
    groups[joined].push_back(int(i));
    group_of[i] = joined;
  }

  Schedule schedule;
  // Lowers the group `roots` into a kernel step. A reduce that cannot be computed inline is
  // materialised, gets its own kernel first, and the group is lowered again.
  std::function<void(std::vector<int>)> lower_kernel = [&](std::vector<int> roots) {
    while (true) {
      ScheduledStep step;
      step.node = roots.front();
      step.outputs = roots;
      step.kind = ScheduledStep::Kind::Kernel;
      try {
        kir::Kernel k = lower_group(p, roots, mat, step.buffer_nodes, target);
        step.kernel = int(schedule.kernels.size());
        schedule.kernels.push_back(std::move(k));
        schedule.steps.push_back(std::move(step));
        return;
      } catch (const FusionRefused& refused) {
        if (mat[refused.node]) throw InternalError("fusion refused for an already materialised value");
        component_logger("codegen").debug("fusion of %{} into %{} refused: {}", refused.node, roots.front(), refused.what());
        mat[refused.node] = true;
        lower_kernel({refused.node});
      }
    }
  };
  for (size_t i = 0; i < count; ++i) {
    const LocalNode& n = p.nodes[i];
    if (!mat[i] || n.kind == LocalNode::Kind::Input) continue;
    if (n.kind == LocalNode::Kind::Redistribute || library_call(n)) {
      ScheduledStep step;
      step.node = int(i);
      step.outputs = {int(i)};
      step.kind = n.kind == LocalNode::Kind::Redistribute ? ScheduledStep::Kind::Redistribute
                  : uses_blas(n)                          ? ScheduledStep::Kind::Gemm
                                                          : ScheduledStep::Kind::Attention;
      if (step.kind == ScheduledStep::Kind::Gemm) {
        auto operand = [&](int in, int& buffer, bool& transposed) {
          const LocalNode& o = p.nodes[in];
          transposed = !mat[in] && swaps_last_two(o);
          buffer = transposed ? o.inputs[0] : in;
        };
        operand(n.inputs[0], step.gemm_a, step.trans_a);
        operand(n.inputs[1], step.gemm_b, step.trans_b);
      }
      schedule.steps.push_back(std::move(step));
    } else if (group_of[i] < 0) {
      lower_kernel({int(i)});
    } else if (groups[group_of[i]].back() == int(i)) {
      lower_kernel(groups[group_of[i]]);
    }
  }
  bucket_small_all_reduces(p, schedule.steps);
  schedule.materialised = std::move(mat);
  return schedule;
}

}  // namespace tessera
