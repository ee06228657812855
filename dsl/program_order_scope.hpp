// ProgramOrderScope: the order a compiled program runs its parts in, where data flow leaves it
// open. Expansion emits each value at its first use in a depth-first walk from the outputs
// (docs/COMPILER.md), which suits a forward and its backward but not a schedule that interleaves
// them: a 1F1B pipeline's loss reads every forward tick, so the walk would run every forward
// before any backward and keep every microbatch's stage inputs alive at once. Nodes built in a
// scope carry its position; the partitioner runs them in the order of their positions as far as
// their inputs allow (partitioner/scope_order_placement.hpp), and a node built in no scope just
// before the first one that reads it. Like a module path, a node built again keeps its first
// builder's position. The positions change only when values are computed, never which.
#pragma once

#include <cstdint>

namespace tessera {

class ProgramOrderScope {
 public:
  // position >= 0: smaller runs earlier; none: as outside every scope (a pass that rebuilds a
  // node builds it at the position it had).
  explicit ProgramOrderScope(int64_t position);
  ~ProgramOrderScope();
  ProgramOrderScope(const ProgramOrderScope&) = delete;
  ProgramOrderScope& operator=(const ProgramOrderScope&) = delete;

  static constexpr int64_t none = -1;
  // This thread's current position (none outside every scope).
  static int64_t current();

 private:
  int64_t previous_;
};

}  // namespace tessera
