#include "jit/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "dsl/logging.hpp"
#include "codegen/in_place.hpp"
#include "dsl/string_util.hpp"
#include "jit/arena_placement.hpp"

namespace tessera {
namespace {

struct Item {
  int node;
  int64_t size, begin, end;  // bytes; the steps it lives over
};

// TESSERA_LOG=memory: the values alive when the arena holds the most, largest first, so a plan
// that needs more memory than expected says what holds it.
void log_arena_peak(const LocalProgram& p, const Schedule& schedule, const std::vector<Item>& items) {
  const size_t steps = schedule.steps.size();
  spdlog::logger& log = component_logger("memory");
  if (!log.should_log(spdlog::level::debug) || items.empty()) return;
  std::vector<int64_t> live(steps + 1, 0);
  for (const Item& item : items)
    for (int64_t s = item.begin; s <= item.end && s < int64_t(live.size()); ++s) live[size_t(s)] += item.size;
  const int64_t peak_step = std::max_element(live.begin(), live.end()) - live.begin();
  std::vector<Item> alive;
  for (const Item& item : items)
    if (item.begin <= peak_step && peak_step <= item.end) alive.push_back(item);
  std::sort(alive.begin(), alive.end(), [](const Item& a, const Item& b) { return a.size > b.size; });
  std::string text = fmt::format("arena peak at step {} of {}: {} in {} values", peak_step, steps, bytes_text(double(live[size_t(peak_step)])),
                                 alive.size());
  for (size_t i = 0; i < alive.size() && i < 24; ++i) {
    const LocalNode& n = p.nodes[size_t(alive[i].node)];
    auto where = [](const LocalNode& v) { return fmt::format("{} {}", v.origin.module ? *v.origin.module : std::string(), v.origin.location); };
    auto what = [](const LocalNode& v) { return v.kind == LocalNode::Kind::Redistribute ? "redistribute" : op_name(v.op); };
    // An output lives past the last step (it is copied out after it).
    std::string reader = "an output";
    if (alive[i].end < int64_t(steps)) {
      const int r = schedule.steps[size_t(alive[i].end)].node;
      reader = fmt::format("%{} {} {}", r, what(p.nodes[size_t(r)]), where(p.nodes[size_t(r)]));
    }
    text += fmt::format("\n  %{} {} {} {}: steps {}..{} {}; last read by {}", alive[i].node, what(n), dtype_name(n.dtype),
                        bytes_text(double(alive[i].size)), alive[i].begin, alive[i].end, where(n), reader);
  }
  log.debug("{}", text);
}

}  // namespace

MemoryPlan plan_memory(const LocalProgram& p, const Schedule& schedule) {
  const size_t count = p.nodes.size();
  MemoryPlan plan;
  plan.offset.assign(count, -1);
  plan.size.assign(count, 0);
  std::vector<int64_t> first(count, -1), last(count, -1), bytes(count, 0);
  std::vector<bool> is_output(count, false);
  for (int o : p.outputs) is_output[o] = true;
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const ScheduledStep& step = schedule.steps[s];
    // Written into the arena: a kernel's or library call's result, and an all_to_all_v's (its
    // bound's extent, as large as the dispatch it serves: a fresh buffer would fault its pages
    // in at every run).
    if (step.kind != ScheduledStep::Kind::Redistribute || p.nodes[step.node].step.kind == RedistributeKind::AllToAllV)
      for (int o : step.outputs) first[o] = int64_t(s);
    for (int r : step_reads(p, step)) last[r] = std::max(last[r], int64_t(s));
  }
  // A local chunk may be a view of its input (a contiguous block), and so is a local partial on
  // the coordinate that keeps the value: the input lives as long, to the end when the view is an
  // output (copied out of the arena after the last step).
  for (size_t s = schedule.steps.size(); s-- > 0;) {
    const int chunk = schedule.steps[s].node;
    const LocalNode& n = p.nodes[chunk];
    const bool view = n.step.kind == RedistributeKind::LocalChunk || n.step.kind == RedistributeKind::LocalPartial;
    if (schedule.steps[s].kind != ScheduledStep::Kind::Redistribute || !view) continue;
    const int64_t chunk_last = is_output[chunk] ? int64_t(schedule.steps.size()) : last[chunk];
    last[n.inputs[0]] = std::max(last[n.inputs[0]], chunk_last);
  }
  // Values gathered in place: produced by a kernel or GEMM and gathered by an all_gather whose
  // blocks lie back to back (every axis before the gathered one has extent 1). Their other
  // readers read the block inside the gathered output, which lives outside the arena.
  plan.in_gather.assign(count, -1);
  for (const ScheduledStep& step : schedule.steps) {
    const LocalNode& g = p.nodes[step.node];
    if (step.kind != ScheduledStep::Kind::Redistribute || g.step.kind != RedistributeKind::AllGather) continue;
    const int v = g.inputs[0];
    if (first[v] < 0 || is_output[v] || plan.in_gather[v] >= 0) continue;
    const int64_t axis = *g.step.before.sharded_axis_of(g.step.mesh_dim);
    bool contiguous = true;
    for (int64_t a = 0; a < axis; ++a) contiguous &= g.local_shape[a] == SymbolicDim{1, -1};
    if (contiguous) plan.in_gather[v] = step.node;
  }
  plan.in_exchange.assign(count, -1);
  for (const ScheduledStep& step : schedule.steps) {
    const LocalNode& x = p.nodes[step.node];
    if (step.kind != ScheduledStep::Kind::Redistribute || x.step.kind != RedistributeKind::AllToAllV) continue;
    const int v = x.inputs[0];
    const auto& shape = p.nodes[v].local_shape;
    const bool fixed = std::all_of(shape.begin(), shape.end(), [](const SymbolicDim& d) { return d.param < 0; });
    if (first[v] >= 0 && !is_output[v] && plan.in_gather[v] < 0 && plan.in_exchange[v] < 0 && fixed) plan.in_exchange[v] = step.node;
  }
  std::vector<Item> items;
  for (size_t n = 0; n < count; ++n) {
    if (first[n] < 0 || is_output[n] || plan.in_gather[n] >= 0) continue;
    int64_t largest = 0;  // the largest block any device holds
    for (const auto& params : p.device_params) {
      int64_t elements = 1;
      for (const SymbolicDim& d : p.nodes[n].local_shape) elements *= d.on(params);
      largest = std::max(largest, elements);
    }
    const int64_t size = (largest * dtype_size(p.nodes[n].dtype) + 63) / 64 * 64;
    items.push_back({int(n), std::max<int64_t>(size, 64), first[n], std::max(last[n], first[n])});
  }
  // Largest first, each at the lowest offset clear of every placed item alive at the same time.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.size > b.size; });
  std::vector<ArenaItem> lifetimes;
  for (const Item& item : items) lifetimes.push_back({item.size, item.begin, item.end});
  // An output's view lives one step past the last (it is copied out after it).
  const ArenaPlacement placed = place_in_arena(lifetimes, int64_t(schedule.steps.size()) + 1);
  for (size_t i = 0; i < items.size(); ++i) {
    plan.offset[size_t(items[i].node)] = placed.offset[i];
    plan.size[size_t(items[i].node)] = items[i].size;
  }
  plan.arena_bytes = placed.arena_bytes;
  log_arena_peak(p, schedule, items);
  // Inputs an output may be written over: read last by the kernel that writes the output, at
  // the element it writes (buffers: the step's outputs first, then buffer_nodes' others).
  plan.donors.assign(count, {});
  std::vector<int64_t> last_of_input;  // per program input: its last reader, over every node bound to it
  for (size_t n = 0; n < count; ++n) {
    const int k = p.nodes[n].input_index;
    if (p.nodes[n].kind != LocalNode::Kind::Input || k < 0) continue;
    if (size_t(k) >= last_of_input.size()) last_of_input.resize(size_t(k) + 1, -1);
    last_of_input[size_t(k)] = std::max(last_of_input[size_t(k)], is_output[n] ? int64_t(schedule.steps.size()) : last[n]);
  }
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const ScheduledStep& step = schedule.steps[s];
    if (step.kind != ScheduledStep::Kind::Kernel) continue;
    const kir::Kernel& kernel = schedule.kernels[size_t(step.kernel)];
    for (size_t slot = 0; slot < step.outputs.size(); ++slot) {
      const int o = step.outputs[slot];
      if (!is_output[size_t(o)] || plan.offset[size_t(o)] >= 0 || plan.in_gather[size_t(o)] >= 0) continue;
      for (size_t b = step.outputs.size(); b < step.buffer_nodes.size(); ++b) {
        const int in = step.buffer_nodes[b];
        const LocalNode& input = p.nodes[size_t(in)];
        const bool fits = input.kind == LocalNode::Kind::Input && input.input_index >= 0 && last_of_input[size_t(input.input_index)] <= int64_t(s) &&
                          input.dtype == p.nodes[size_t(o)].dtype && input.local_shape == p.nodes[size_t(o)].local_shape;
        if (fits && kir::writes_in_place(kernel, int(slot), int(b))) plan.donors[size_t(o)].push_back(in);
      }
    }
  }
  // Every produced value's buffer is dropped after its last reader (a view's input after the
  // view's: `last` covers them); an arena value's is only a view, dropped all the same.
  plan.release_after.assign(schedule.steps.size(), {});
  for (size_t s = 0; s < schedule.steps.size(); ++s)
    for (int o : schedule.steps[s].outputs) {
      const int64_t after = std::max(int64_t(s), last[size_t(o)]);  // past the end: an output's view
      if (!is_output[size_t(o)] && after < int64_t(schedule.steps.size())) plan.release_after[size_t(after)].push_back(o);
    }
  return plan;
}

std::vector<int> assign_donors(const LocalProgram& p, const MemoryPlan& memory, const std::vector<bool>& donated) {
  std::vector<int> donor(p.nodes.size(), -1);
  if (donated.empty() || memory.donors.empty()) return donor;
  std::vector<bool> taken(p.nodes.size(), false);
  for (int o : p.outputs) {
    if (donor[size_t(o)] >= 0) continue;  // an output listed twice
    for (int in : memory.donors[size_t(o)]) {
      const int k = p.nodes[size_t(in)].input_index;
      if (taken[size_t(in)] || k < 0 || size_t(k) >= donated.size() || !donated[size_t(k)]) continue;
      donor[size_t(o)] = in;
      taken[size_t(in)] = true;
      break;
    }
  }
  return donor;
}

void mark_donor_buffers(Schedule& schedule, const MemoryPlan& memory) {
  for (const ScheduledStep& step : schedule.steps) {
    if (step.kind != ScheduledStep::Kind::Kernel) continue;
    kir::Kernel& kernel = schedule.kernels[size_t(step.kernel)];  // shared by steps alike: marked for any of them
    for (size_t slot = 0; slot < step.outputs.size(); ++slot)
      for (int donor : memory.donors[size_t(step.outputs[slot])])
        for (size_t b = step.outputs.size(); b < step.buffer_nodes.size(); ++b)
          if (step.buffer_nodes[b] == donor) kernel.buffers[slot].may_alias = kernel.buffers[b].may_alias = true;
  }
}

}  // namespace tessera
