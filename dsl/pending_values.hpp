// Values built but not yet computed. Tessera is lazy: an op builds a node, and its value (and
// the collectives it needs) is computed when something looks at it. A PendingValueWatch
// remembers every node built while it is open, so CommDebugMode can compute, when its counts are
// read, what an eager system would already have run (dsl/comm_debug_mode.hpp).
#pragma once

#include <memory>
#include <vector>

#include "dsl/node.hpp"

namespace tessera {

class PendingValueWatch {
 public:
  PendingValueWatch();
  ~PendingValueWatch();
  PendingValueWatch(const PendingValueWatch&) = delete;
  PendingValueWatch& operator=(const PendingValueWatch&) = delete;

  // The nodes built while open that are still alive, have no value yet, can be computed outside
  // a trace, and are not an input of another such node built while open: computing these (in
  // one program) computes everything built here that anything still uses. In build order.
  std::vector<NodeRef> pending_results() const;

  struct Built;

 private:
  std::shared_ptr<Built> built_;
};

// Called by make_node for every node it returns (new or found).
void note_node_built(const NodeRef& node);

}  // namespace tessera
