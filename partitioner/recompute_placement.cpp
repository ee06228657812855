#include "partitioner/recompute_placement.hpp"

#include <algorithm>
#include <functional>

#include "partitioner/program_order.hpp"

namespace tessera {

void place_recomputed_values_late(LocalProgram& program) {
  const size_t count = program.nodes.size();
  if (std::none_of(program.nodes.begin(), program.nodes.end(), [](const LocalNode& n) { return n.attrs.recomputed; })) return;
  std::vector<std::vector<int>> consumers(count);
  for (size_t i = 0; i < count; ++i)
    for (int in : program.nodes[i].inputs) consumers[size_t(in)].push_back(int(i));
  std::vector<bool> output(count, false);
  for (int o : program.outputs) output[size_t(o)] = true;
  // Late: a recomputed copy, or a value only late ones read. Consumers come later in the order,
  // so one backward pass decides.
  std::vector<bool> late(count, false);
  for (size_t i = count; i-- > 0;) {
    const LocalNode& n = program.nodes[i];
    if (output[i] || n.kind == LocalNode::Kind::Input) continue;
    bool only_late_readers = !consumers[i].empty();
    for (int c : consumers[i]) only_late_readers = only_late_readers && late[size_t(c)];
    late[i] = (n.kind == LocalNode::Kind::Compute && n.attrs.recomputed) || only_late_readers;
  }
  // The other nodes keep their order; a late one is emitted when a node that reads it is.
  std::vector<int> order, position(count, -1);
  std::function<void(int)> emit = [&](int i) {
    if (position[size_t(i)] >= 0) return;
    for (int in : program.nodes[size_t(i)].inputs)
      if (late[size_t(in)]) emit(in);
    position[size_t(i)] = int(order.size());
    order.push_back(i);
  };
  for (size_t i = 0; i < count; ++i)
    if (!late[i]) emit(int(i));
  for (size_t i = 0; i < count; ++i) emit(int(i));  // late values nothing reads (none in practice)
  reorder_nodes(program, order);
}

}  // namespace tessera
