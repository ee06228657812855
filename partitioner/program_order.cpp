#include "partitioner/program_order.hpp"

#include "dsl/error.hpp"

namespace tessera {

void reorder_nodes(LocalProgram& program, const std::vector<int>& order) {
  const size_t count = program.nodes.size();
  if (order.size() != count) throw InternalError("reorder_nodes: the order does not name every node once");
  std::vector<int> position(count, -1);
  for (size_t p = 0; p < count; ++p) position[size_t(order[p])] = int(p);
  std::vector<LocalNode> nodes;
  nodes.reserve(count);
  for (int i : order) {
    nodes.push_back(std::move(program.nodes[size_t(i)]));
    for (int& in : nodes.back().inputs) in = position[size_t(in)];
  }
  program.nodes = std::move(nodes);
  for (int& o : program.outputs) o = position[size_t(o)];
}

}  // namespace tessera
