// verify(LocalProgram): the local program's invariants, checked where the partitioner hands a
// program on (after expansion and the passes that reorder its nodes), as kir::verify
// (codegen/kernel_verify.hpp) checks each kernel: a partitioner bug is then an InternalError
// naming the node, its op and source line and the broken rule, rather than a wrong value or a
// crash in the lowering or the executor. The rules:
//  - nodes are in topological order: each input is an earlier node;
//  - an Input node has no inputs and is bound to a program input; a Redistribute node reads at
//    least one value and steps over a dim of the program's mesh;
//  - every node has a valid layout of its own rank, and local extents (and offsets, where it has
//    them) for each axis, each a constant or a parameter slot the program has; extents are not
//    negative on any planned device;
//  - a random op's seed slot is a parameter slot the program has;
//  - outputs are nodes of the program; every planned device has one value per parameter slot,
//    and one global device id.
#pragma once

#include "ir/local_program.hpp"

namespace tessera {

// InternalError("local program: ...") at the first rule broken.
void verify(const LocalProgram& program);

}  // namespace tessera
