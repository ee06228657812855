// How a reduction runs: the choices kernel lowering (codegen/lower_kernel.cpp) makes from a
// reduction's sizes, the program's mode and the target's capabilities (loop_capabilities.hpp),
// kept apart from the index arithmetic that builds the loops. Sizes are global extents: every
// device lowers the same kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/kernel_ir.hpp"
#include "codegen/loop_capabilities.hpp"
#include "dsl/placement.hpp"  // ReduceOp

namespace tessera {

// A float sum over more than kSumBlock elements adds in a cascade (PyTorch's cascade sum,
// numpy's pairwise sum): blocks of kSumBlock elements, then groups of kSumFanIn such partial
// sums, level by level up to the whole axis (lower_kernel.cpp's blocked_sum).
constexpr int64_t kSumBlock = 256, kSumFanIn = 16;

struct ReductionFacts {
  ReduceOp op = ReduceOp::Sum;  // argmax: Max
  kir::Type compute = kir::Type::F32, storage = kir::Type::F32;  // the output's
  int64_t reduced_elements = 1;          // elements each output combines
  int64_t output_elements = 1;
  std::vector<int64_t> reduced_extents;  // the reduced axes' global extents, outermost first
  bool reduces_innermost_axis = false;   // a row reduction: its inner loop reads contiguous memory
  bool ordered = false;                  // deterministic mode: sums in source order
  bool has_preludes = false;             // work computed once per row before the reduction
};

// Who combines each output element's values.
enum class ReductionThreads {
  One,          // one running value in one thread (the CPU, deterministic GPU sums of few elements)
  Warp,         // a warp's lanes split the outermost reduced loop and combine by a butterfly
  Block,        // a block's threads split it and combine through shared memory
  OrderedWarp,  // a lane per top-level cascade block, folded in lane order (deterministic)
};

struct ReductionStrategy {
  bool per_output = false;  // an accumulator per output element; else the input streams into the output
  bool cascade = false;     // its float sums in blocked partial sums
  ReductionThreads threads = ReductionThreads::One;
  // The leading reduced loops run as one flat loop, the one a warp's lanes or a block's threads
  // split: as many as give every lane or thread work (a sum of [2, 8, 8192, 128] split its
  // outermost axis of 2 over 256 threads, and ran 536 ms on an H200).
  int merged_loops = 1;
};

// The extent of the first `loops` reduced loops run as one.
int64_t merged_extent(const ReductionFacts& facts, int loops);

// How a reduce that is its kernel's root runs.
ReductionStrategy reduction_strategy(const ReductionFacts& facts, const LoopCapabilities& target);

// Whether a reduce read by other ops must be a kernel of its own rather than inlined into
// theirs: on a thread-per-iteration target a long one would run serially in every thread that
// reads it.
bool reduce_runs_alone(const ReductionFacts& facts, const LoopCapabilities& target);

}  // namespace tessera
