#include "codegen/schedule.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <variant>

#include "codegen/collective_buckets.hpp"
#include "codegen/lowering_memo.hpp"
#include "dsl/dot_form.hpp"
#include "dsl/element_count.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

// A Dot the backend's GEMM computes: f32 and f64 everywhere, bf16 where the target has a bf16 GEMM
// (others are generated kernels: lower_kernel.cpp's lower_dot).
bool uses_blas(const LocalNode& n, const Target& target) {
  if (n.op != OpKind::Dot) return false;
  if (n.dtype == DType::bf16) return target.runs(gemm_library_op(n.dtype, target.deterministic));
  return n.dtype == DType::f32 || n.dtype == DType::f64;
}
// dsl/grouped_matmul.hpp's primitives, one library call each.
bool is_grouped_library_call(OpKind op) { return op == OpKind::GroupedDot || op == OpKind::GroupedWeightGrad; }

// Library calls (a GEMM, a grouped GEMM, a fused attention part) read and write plain buffers,
// never inline.
bool library_call(const LocalNode& n, const Target& target) {
  return n.kind == LocalNode::Kind::Compute && (uses_blas(n, target) || n.op == OpKind::Attention || is_grouped_library_call(n.op));
}

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

// Which product a Dot of the program computes (dsl/dot_form.hpp).
DotForm form_of(const LocalProgram& p, const LocalNode& dot) {
  return dot_form(p.nodes[size_t(dot.inputs[0])].rank(), p.nodes[size_t(dot.inputs[1])].rank(), dot.rank());
}

// A GEMM reads operand `i` of Dot `n` through a transpose of its last two axes instead of a
// copy: both operands of a batched product; in a Rows one only the weight (a's rows must be one
// contiguous block), and a ContractRows product already reads a transposed, as stored.
bool reads_through_transpose(const LocalProgram& p, const LocalNode& n, size_t i) {
  const DotForm form = form_of(p, n);
  return swaps_last_two(p.nodes[size_t(n.inputs[i])]) && (form == DotForm::Batched || (form == DotForm::Rows && i == 1));
}

// The values that must live in buffers before any fusion choice.
std::vector<bool> required_materialisation(const LocalProgram& p, const std::vector<std::vector<int>>& consumers) {
  std::vector<bool> mat(p.nodes.size(), false);
  // The largest buffer (in elements) computing the value reads: an input, a collective's
  // result, or the result of work that is not elementwise or movement (which has a buffer of
  // its own), through the elementwise and movement values between.
  std::vector<int64_t> largest_read(p.nodes.size(), 0);
  auto elements = [&](int i) {
    int64_t count = 1;
    for (int64_t e : p.nodes[size_t(i)].global_shape) count *= e;
    return count;
  };
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
        n.op == OpKind::CheckIndex || is_grouped_library_call(n.op))
      mat[i] = true;
    if (n.op == OpKind::Attention || is_grouped_library_call(n.op))
      for (int in : n.inputs) mat[in] = true;
    if (uses_blas(n, p.target))
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        // The library reads plain row-major buffers, or their transposes through its flags.
        const int in = n.inputs[i];
        mat[reads_through_transpose(p, n, i) ? p.nodes[size_t(in)].inputs[0] : in] = true;
      }
    if (is_reduce(n.op) && consumers[i].size() != 1) mat[i] = true;
    // A value read in another part of a program built in order scopes (a 1F1B pipeline's
    // gradient sum, dsl/program_order_scope.hpp) is computed in its own part: inlined into its
    // reader, it would run there, and every value it reads would live until then. One that
    // reads nothing as large as itself (a broadcast bias, a mask from an iota) would keep only
    // small buffers alive: it is inlined where it is read, with no buffer of its own.
    for (int in : n.inputs) {
      const LocalNode& input = p.nodes[size_t(in)];
      const bool buffer = input.kind != LocalNode::Kind::Compute || !(is_elementwise(input.op) || is_movement(input.op));
      largest_read[i] = std::max(largest_read[i], buffer ? elements(in) : largest_read[size_t(in)]);
    }
    if (n.origin.program_order >= 0 && largest_read[i] >= elements(int(i)))
      for (int c : consumers[i]) mat[i] = mat[i] || p.nodes[size_t(c)].origin.program_order != n.origin.program_order;
  }
  return mat;
}

}  // namespace

std::vector<int> step_reads(const LocalProgram& p, const ScheduledStep& step) {
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel:
      return std::vector<int>(step.buffer_nodes.begin() + int64_t(step.outputs.size()), step.buffer_nodes.end());
    case ScheduledStep::Kind::Gemm: return {step.gemm_a, step.gemm_b};
    case ScheduledStep::Kind::GroupedGemm:
    case ScheduledStep::Kind::Attention: return p.nodes[step.node].inputs;
    case ScheduledStep::Kind::Redistribute: {
      std::vector<int> reads;  // a bucket of all_reduces reads every member's input
      for (int o : step.outputs) reads.insert(reads.end(), p.nodes[o].inputs.begin(), p.nodes[o].inputs.end());
      return reads;
    }
  }
  return {};
}

namespace {

int64_t global_elements(const LocalNode& n) { return element_count(n.global_shape); }

// Values with several consumers are recomputed in each only when cheap: no expensive work
// inlined into them, and at most one buffer of their own size read (a bias or a statistic
// broadcast into it is cheap). Recomputing a value that reads two such buffers costs each
// consumer both reads, more than one write and a read per consumer; and a chain of them (a
// residual stream: x + attention + mlp + ..., each sum read by the next block's norm and by
// the next sum) would otherwise inline every earlier block into each later one, a kernel per
// block that grows with depth. Materialises the others.
void materialise_shared_expensive(const LocalProgram& p, const std::vector<std::vector<int>>& consumers, std::vector<bool>& mat) {
  std::vector<bool> carries_expensive(p.nodes.size(), false);
  // The materialised buffers of at least a value's size that it reads, through what is inlined
  // into it (distinct; beyond kSharedReadLimit + 1 the count no longer matters).
  constexpr size_t kSharedReadLimit = 1;
  std::vector<std::vector<int>> full_reads(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const LocalNode& n = p.nodes[i];
    if (n.kind != LocalNode::Kind::Compute) continue;
    bool expensive = is_expensive(n.op);
    std::vector<int> reads;
    auto add_read = [&](int buffer) {
      if (reads.size() <= kSharedReadLimit && std::find(reads.begin(), reads.end(), buffer) == reads.end()) reads.push_back(buffer);
    };
    const int64_t elements = global_elements(n);
    for (int in : n.inputs) {
      if (!mat[in]) {
        expensive |= carries_expensive[in];
        for (int r : full_reads[in])
          if (global_elements(p.nodes[r]) >= elements) add_read(r);
      } else if (global_elements(p.nodes[in]) >= elements) {
        add_read(in);
      }
    }
    if (!mat[i] && consumers[i].size() > 1 && (expensive || reads.size() > kSharedReadLimit)) {
      mat[i] = true;
      component_logger("codegen").debug("materialising %{} ({}): {} consumers and {}", i, op_name(n.op), consumers[i].size(),
                                        expensive ? "expensive work" : "several reads of its size");
    }
    carries_expensive[i] = !mat[i] && expensive;
    if (!mat[i]) full_reads[i] = std::move(reads);
  }
}

// A kernel inlines at most kMaxInlinedReductions reductions: a sum of many reductions (a
// gradient norm over every parameter) would otherwise be one serial kernel whose size, and
// compile time, grows with the model. Past the limit the reductions are materialised, each
// its own kernel (one kernel for each parameter shape: identical kernels are one), and the sum
// reads their results.
void limit_inlined_reductions(const LocalProgram& p, std::vector<bool>& mat) {
  constexpr int kMaxInlinedReductions = 4;
  std::vector<int> inlined(p.nodes.size(), 0);  // reductions computed inside the value's kernel
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const LocalNode& n = p.nodes[i];
    if (n.kind != LocalNode::Kind::Compute) continue;
    std::vector<int> carried;  // inputs inlined with reductions inside, reductions first
    int total = is_reduce(n.op) ? 1 : 0;
    for (int in : n.inputs)
      if (!mat[in] && inlined[in] > 0) {
        carried.push_back(in);
        total += inlined[in];
      }
    std::stable_sort(carried.begin(), carried.end(), [&](int a, int b) {
      return is_reduce(p.nodes[a].op) != is_reduce(p.nodes[b].op) ? is_reduce(p.nodes[a].op) : inlined[a] > inlined[b];
    });
    for (size_t k = 0; k < carried.size() && total > kMaxInlinedReductions; ++k) {
      mat[carried[k]] = true;
      total -= inlined[carried[k]];
    }
    inlined[i] = total;
  }
}

// A value that may share a kernel with its elementwise siblings: no library call, reduce, dot,
// scatter or index check at its root.
bool is_elementwise_root(const LocalNode& n) {
  return n.kind == LocalNode::Kind::Compute && n.op != OpKind::Attention && !is_grouped_library_call(n.op) && !is_reduce(n.op) &&
         n.op != OpKind::Dot && n.op != OpKind::ScatterAddRows && n.op != OpKind::CheckIndex;
}

// The materialised values the kernel of `id` reads (in `reads`), walking through the values
// inlined into it, and whether a reduce is among those inlined.
void materialised_reads(const LocalProgram& p, const std::vector<bool>& mat, int id, std::vector<int>& reads, bool& inlined_reduce) {
  for (int in : p.nodes[id].inputs) {
    if (mat[in]) reads.push_back(in);
    else {
      inlined_reduce |= is_reduce(p.nodes[in].op);
      materialised_reads(p, mat, in, reads, inlined_reduce);
    }
  }
}

// readers[v]: the materialised values whose step reads buffer v (a GEMM's transposed operand
// counts as reading the buffer under the transpose too).
std::vector<std::vector<int>> buffer_readers(const LocalProgram& p, const std::vector<bool>& mat) {
  std::vector<std::vector<int>> readers(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (!mat[i] || p.nodes[i].kind == LocalNode::Kind::Input) continue;
    std::vector<int> reads;
    bool unused = false;
    materialised_reads(p, mat, int(i), reads, unused);
    for (int r : reads) {
      readers[r].push_back(int(i));
      if (p.nodes[r].kind == LocalNode::Kind::Compute && !p.nodes[r].inputs.empty()) readers[p.nodes[r].inputs[0]].push_back(int(i));
    }
  }
  return readers;
}

struct SiblingGroups {
  std::vector<std::vector<int>> groups;  // members in program order
  std::vector<int> group_of;             // per node; -1: in no group
};

// Sibling elementwise values with the same local shape (an optimizer's new moments and weight)
// share one kernel, run where the last of them would: every buffer a member reads is ready by
// then, and nothing outside the group reads a member's buffer earlier. No reduce is inlined.
// Members come from one part of a program built in order scopes: a group would run where its
// last member runs, in a later part.
SiblingGroups sibling_groups(const LocalProgram& p, const std::vector<bool>& mat) {
  const std::vector<std::vector<int>> readers = buffer_readers(p, mat);
  SiblingGroups out;
  out.group_of.assign(p.nodes.size(), -1);
  auto& groups = out.groups;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (!mat[i] || !is_elementwise_root(p.nodes[i])) continue;
    std::vector<int> reads;
    bool inlined_reduce = false;
    materialised_reads(p, mat, int(i), reads, inlined_reduce);
    int joined = -1;
    for (int g = int(groups.size()) - 1; !inlined_reduce && g >= 0 && g >= int(groups.size()) - 4; --g) {
      const int first = groups[g].front();
      if (p.nodes[first].local_shape != p.nodes[i].local_shape || p.nodes[first].global_shape != p.nodes[i].global_shape) continue;
      if (p.nodes[first].origin.program_order != p.nodes[i].origin.program_order) continue;
      // The group moves to position i: no other step before i may read what it produces.
      bool movable = true;
      for (int member : groups[g])
        for (int reader : readers[member]) movable &= reader == int(i) || out.group_of[reader] == g || reader > int(i);
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
    out.group_of[i] = joined;
  }
  return out;
}

// The kernels of a schedule, each distinct text once (a repeated block lowers the same kernels
// again and again; the lowering memo has verified each, codegen/lowering_memo.hpp).
struct KernelTable {
  Schedule& schedule;
  std::unordered_map<std::string, int> index_of_text;
  int add(const LoweredKernel& lowered) {
    auto [it, fresh] = index_of_text.try_emplace(lowered.text, int(schedule.kernels.size()));
    if (fresh) schedule.kernels.push_back(lowered.kernel);
    return it->second;
  }
};

// Lowers the group `roots` into a kernel step. A value lowering refuses to inline is
// materialised, gets its own kernel first, and the group is lowered again.
void lower_kernel_step(const LocalProgram& p, const std::vector<int>& roots, std::vector<bool>& mat, kir::LoopTarget target,
                       KernelTable& kernels) {
  Schedule& schedule = kernels.schedule;
  while (true) {
    ScheduledStep step;
    step.node = roots.front();
    step.outputs = roots;
    step.kind = ScheduledStep::Kind::Kernel;
    auto lowered = lower_group_memoised(p, roots, mat, step.buffer_nodes, target);
    if (auto* kernel = std::get_if<std::shared_ptr<const LoweredKernel>>(&lowered)) {
      step.kernel = kernels.add(**kernel);
      schedule.steps.push_back(std::move(step));
      return;
    }
    const FusionRefusal& refused = std::get<FusionRefusal>(lowered);
    if (mat[refused.node]) throw InternalError("fusion refused for an already materialised value");
    component_logger("codegen").debug("fusion of %{} into %{} refused: {}", refused.node, roots.front(), refused.why);
    mat[refused.node] = true;
    lower_kernel_step(p, {refused.node}, mat, target, kernels);
  }
}

// The step of a collective or a library call (a BLAS GEMM, whose operands may be read through a
// transpose that was not materialised, or fused attention).
ScheduledStep library_or_collective_step(const LocalProgram& p, const std::vector<bool>& mat, int id) {
  const LocalNode& n = p.nodes[id];
  ScheduledStep step;
  step.node = id;
  step.outputs = {id};
  step.kind = n.kind == LocalNode::Kind::Redistribute ? ScheduledStep::Kind::Redistribute
              : uses_blas(n, p.target)                ? ScheduledStep::Kind::Gemm
              : is_grouped_library_call(n.op)         ? ScheduledStep::Kind::GroupedGemm
                                                      : ScheduledStep::Kind::Attention;
  if (step.kind == ScheduledStep::Kind::Gemm) {
    auto operand = [&](size_t i, int& buffer, bool& transposed) {
      const int in = n.inputs[i];
      transposed = !mat[in] && reads_through_transpose(p, n, i);
      buffer = transposed ? p.nodes[size_t(in)].inputs[0] : in;
    };
    operand(0, step.gemm_a, step.trans_a);
    operand(1, step.gemm_b, step.trans_b);
    // out [k, n] = a^T b over a's rows: a [rows, k] is read transposed as it lies.
    if (form_of(p, n) == DotForm::ContractRows) step.trans_a = true;
  }
  return step;
}

}  // namespace

Schedule schedule_program(const LocalProgram& p, kir::LoopTarget target) {
  const size_t count = p.nodes.size();
  std::vector<std::vector<int>> consumers(count);
  for (size_t i = 0; i < count; ++i)
    for (int in : p.nodes[i].inputs) consumers[in].push_back(int(i));
  std::vector<bool> mat = required_materialisation(p, consumers);
  materialise_shared_expensive(p, consumers, mat);
  limit_inlined_reductions(p, mat);
  const SiblingGroups groups = sibling_groups(p, mat);

  Schedule schedule;
  KernelTable kernels{schedule, {}};
  for (size_t i = 0; i < count; ++i) {
    const LocalNode& n = p.nodes[i];
    if (!mat[i] || n.kind == LocalNode::Kind::Input) continue;
    const int group = groups.group_of[i];
    if (n.kind == LocalNode::Kind::Redistribute || library_call(n, p.target)) schedule.steps.push_back(library_or_collective_step(p, mat, int(i)));
    else if (group < 0) lower_kernel_step(p, {int(i)}, mat, target, kernels);
    else if (groups.groups[size_t(group)].back() == int(i)) lower_kernel_step(p, groups.groups[size_t(group)], mat, target, kernels);
  }
  bucket_small_all_reduces(p, schedule.steps);
  schedule.materialised = std::move(mat);
  return schedule;
}

}  // namespace tessera
