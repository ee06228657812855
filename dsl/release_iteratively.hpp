// Freeing a graph whose nodes own their inputs through shared pointers recurses once per node
// along the longest chain (each destructor releases the next node's last owner), and a chain
// of 100,000 ops overflowed the stack. A destructor calling release_iteratively(inputs) frees
// them from a loop instead: the outermost call drains every node freed while it runs.
#pragma once

#include <algorithm>
#include <iterator>
#include <memory>
#include <vector>

namespace tessera {

template <class T>
void release_iteratively(std::vector<std::shared_ptr<const T>>& owned) {
  // The nodes the outermost call on this thread still has to release; null when none runs.
  thread_local std::vector<std::shared_ptr<const T>>* pending = nullptr;
  if (owned.empty()) return;
  if (pending) {
    for (auto& node : owned) pending->push_back(std::move(node));
    return;
  }
  // Nothing freed past this node (every input is shared): the vector's own release suffices.
  if (std::none_of(owned.begin(), owned.end(), [](const auto& node) { return node.use_count() == 1; })) return;
  std::vector<std::shared_ptr<const T>> queue(std::make_move_iterator(owned.begin()), std::make_move_iterator(owned.end()));
  pending = &queue;
  while (!queue.empty()) {
    std::shared_ptr<const T> last = std::move(queue.back());
    queue.pop_back();
    last.reset();  // when this was its last owner, its own inputs join the queue
  }
  pending = nullptr;
}

}  // namespace tessera
