// Where reductions run: expansion emits a value at its first use in a depth-first walk from the
// program's outputs, so a value that only a late consumer needs is emitted late. A training
// step's weight gradients are the costly case: the gradient clipping that first reads them is
// expanded after the whole backward, so each block's dW = x^T dY GEMM (and its data-parallel
// reduce_scatter) would run at the end, keeping every block's activations and output gradients
// alive until then: as much memory as not recomputing activations at all.
//
// This pass runs each reduction as soon as its inputs exist: a node whose output is smaller
// than its largest input (a GEMM contracting over tokens, a sum, a reduce_scatter), together
// with the views and elementwise values only such nodes read. Its inputs can then die with their last
// other reader, and what stays alive is the smaller result. Every other node keeps its order,
// recomputed copies (partitioner/recompute_placement.hpp) included.
#pragma once

#include "ir/local_program.hpp"

namespace tessera {

void place_reductions_early(LocalProgram& program);

}  // namespace tessera
