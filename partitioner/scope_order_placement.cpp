#include "partitioner/scope_order_placement.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "partitioner/program_order.hpp"

namespace tessera {

void place_in_scope_order(LocalProgram& program) {
  const size_t count = program.nodes.size();
  if (std::none_of(program.nodes.begin(), program.nodes.end(), [](const LocalNode& n) { return n.origin.program_order >= 0; })) return;
  std::vector<std::vector<int>> consumers(count);
  for (size_t i = 0; i < count; ++i)
    for (int in : program.nodes[i].inputs) consumers[size_t(in)].push_back(int(i));
  // A node's effective position: its own, or an earlier reader's (readers come later in the
  // order, so one backward pass decides).
  constexpr int64_t unplaced = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> position(count, unplaced);
  for (size_t i = count; i-- > 0;) {
    if (program.nodes[i].origin.program_order >= 0) position[i] = program.nodes[i].origin.program_order;
    for (int c : consumers[i]) position[i] = std::min(position[i], position[size_t(c)]);
  }
  // Kahn's algorithm, smallest (position, index) first: equal positions keep expansion's order.
  using Ready = std::pair<int64_t, int>;
  std::priority_queue<Ready, std::vector<Ready>, std::greater<Ready>> ready;
  std::vector<int> waiting(count);
  for (size_t i = 0; i < count; ++i) {
    waiting[i] = int(program.nodes[i].inputs.size());
    if (waiting[i] == 0) ready.emplace(position[i], int(i));
  }
  std::vector<int> order;
  order.reserve(count);
  while (!ready.empty()) {
    const int i = ready.top().second;
    ready.pop();
    order.push_back(i);
    for (int c : consumers[size_t(i)])
      if (--waiting[size_t(c)] == 0) ready.emplace(position[size_t(c)], c);
  }
  reorder_nodes(program, order);
}

}  // namespace tessera
