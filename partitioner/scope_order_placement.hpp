// Where nodes built in ProgramOrderScopes run (dsl/program_order_scope.hpp): a schedule that
// interleaves parts of a program (a 1F1B pipeline's forward and backward ticks) gives each part a
// position, and expansion's depth-first order, which runs a value's producers when its first
// reader is expanded, would not follow it. This pass re-sorts the program topologically,
// choosing among the nodes whose inputs exist the one of smallest position. A node built in no
// scope (a parameter's gather, a relayout expansion inserted) takes the smallest position of
// its readers, so it runs just before the first part that needs it; nodes no part needs keep
// their order after every part. A program built in no scope is left as it is. It runs before
// the recompute and reduction placements, which refine the order it leaves.
#pragma once

#include "ir/local_program.hpp"

namespace tessera {

void place_in_scope_order(LocalProgram& program);

}  // namespace tessera
