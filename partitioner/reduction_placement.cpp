#include "partitioner/reduction_placement.hpp"

#include <algorithm>

#include "dsl/shard_geometry.hpp"
#include "partitioner/program_order.hpp"

namespace tessera {
namespace {

// The bytes of the largest block any device of the mesh holds of `n`: the block at coordinates
// all 0, as torch.chunk's leading chunks are the largest (dsl/shard_geometry.hpp). Not the
// largest this client's devices hold: every client must order its program the same way, or
// their collectives meet out of step (clients whose uneven blocks straddle a decision).
int64_t largest_block_bytes(const LocalProgram& p, const LocalNode& n) {
  const std::vector<int64_t> origin(size_t(p.mesh.ndim()), 0);
  return shard_geometry(n.global_shape, n.layout, origin).num_elements() * dtype_size(n.dtype);
}

bool recomputed(const LocalNode& n) { return n.kind == LocalNode::Kind::Compute && n.attrs.recomputed; }

bool is_reduction(const LocalProgram& p, const LocalNode& n) {
  if (n.kind == LocalNode::Kind::Input || n.inputs.empty()) return false;
  // A local chunk is a view of its input, which lives as long: moving it frees nothing.
  if (n.kind == LocalNode::Kind::Redistribute && n.step.kind != RedistributeKind::ReduceScatter) return false;
  int64_t largest_input = 0;
  for (int in : n.inputs) largest_input = std::max(largest_input, largest_block_bytes(p, p.nodes[size_t(in)]));
  return largest_block_bytes(p, n) < largest_input;
}

}  // namespace

void place_reductions_early(LocalProgram& program) {
  const size_t count = program.nodes.size();
  std::vector<std::vector<int>> consumers(count);
  for (size_t i = 0; i < count; ++i)
    for (int in : program.nodes[i].inputs) consumers[size_t(in)].push_back(int(i));
  // Eager: a reduction, or a view or elementwise value that only eager nodes read (what a
  // reduction's kernel computes inline: the dY * x-hat of a layer norm's weight gradient).
  // Consumers come later in the order, so one backward pass decides.
  std::vector<bool> eager(count, false);
  for (size_t i = count; i-- > 0;) {
    const LocalNode& n = program.nodes[i];
    // Recomputed copies run where recompute placement put them, just before the backward reads
    // them: one that reads only forward values, run as early as its inputs allow, would run in
    // the forward and be kept. One that reads another copy cannot run before that copy, and may
    // move (the view of a recomputed activation its weight gradient reads).
    if (recomputed(n) && std::none_of(n.inputs.begin(), n.inputs.end(), [&](int in) { return recomputed(program.nodes[size_t(in)]); }))
      continue;
    if (is_reduction(program, n)) eager[i] = true;
    // An elementwise value moves only with its one reader: one that several read, run early,
    // could wait long for another input of one of them.
    else if (n.kind == LocalNode::Kind::Compute && (is_movement(n.op) || (is_elementwise(n.op) && consumers[i].size() == 1)) &&
             !consumers[i].empty())
      eager[i] = std::all_of(consumers[i].begin(), consumers[i].end(), [&](int c) { return eager[size_t(c)]; });
  }
  // Every other node in its order; an eager one as soon as its last input is emitted.
  std::vector<int> order, position(count, -1), waiting(count, 0);
  for (size_t i = 0; i < count; ++i) waiting[i] = int(program.nodes[i].inputs.size());
  std::vector<int> ready;
  auto emit = [&](int first) {
    ready.push_back(first);
    while (!ready.empty()) {
      const int i = ready.back();
      ready.pop_back();
      position[size_t(i)] = int(order.size());
      order.push_back(i);
      for (int c : consumers[size_t(i)])
        if (--waiting[size_t(c)] == 0 && eager[size_t(c)]) ready.push_back(c);
    }
  };
  for (size_t i = 0; i < count; ++i)
    if (position[i] < 0 && (!eager[i] || waiting[i] == 0)) emit(int(i));
  reorder_nodes(program, order);
}

}  // namespace tessera
