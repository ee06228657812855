// Lowering one fused group (a root value and the values inlined into it) to kernel IR.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "codegen/kernel_ir.hpp"
#include "ir/local_program.hpp"

namespace tessera {

// Why a group is not one kernel: the inlined value `node` (a reduce that cannot be computed once
// per iteration of the root's loops, a collective's result, ...) must live in a buffer of its
// own. The scheduler then materialises it and lowers the group again.
struct FusionRefusal {
  int node = -1;
  std::string why;
};

// `materialised[i]`: node i lives in a buffer (read with loads); other nodes reachable from the
// roots are computed inline. Several roots (elementwise, same local shape) share one loop nest
// and are stored to buffers 0..k-1. buffer_nodes receives the node bound to each kernel buffer.
//
// `target` chooses between loop structures where the targets want different ones, never the
// result: a column reduction (a bias gradient) streams its input in memory order through one
// running output row on a CPU, and runs one GPU thread per output element on CUDA (adjacent
// threads read adjacent columns), each adding its column in the same order, so the bits agree.
// The kernel, or why the group cannot be one.
std::variant<kir::Kernel, FusionRefusal> lower_group(const LocalProgram& program, const std::vector<int>& roots,
                                                     const std::vector<bool>& materialised, std::vector<int>& buffer_nodes,
                                                     kir::LoopTarget target);

}  // namespace tessera
