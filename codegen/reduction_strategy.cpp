#include "codegen/reduction_strategy.hpp"

namespace tessera {
namespace {

using kir::Type;

bool is_float_sum(const ReductionFacts& f) {
  return is_float(f.compute) && (f.op == ReduceOp::Sum || f.op == ReduceOp::Avg);
}

// Types a warp's shuffles and a block's shared memory combine.
bool lanes_combine(Type t) { return t == Type::F32 || t == Type::F64 || t == Type::I32 || t == Type::I64; }

// A float column sum over more than this many elements is lowered as a row reduction: each
// output element's accumulator adds its column in blocked partial sums, with strided reads,
// instead of streaming rows into one running sum per column, whose error grows with the row
// count (a running f32 sum of ones stops at 2^24). Shorter columns (a bias gradient over a
// batch) keep the streaming loop and its contiguous reads.
constexpr int64_t kLongColumnSum = int64_t(1) << 16;
bool long_column_sum(const ReductionFacts& f) { return is_float_sum(f) && f.reduced_elements > kLongColumnSum; }

// A column reduction lowered like a row reduction, one accumulator per output element, where
// each output element is one thread of the grid and streaming would run in one thread. Its
// loops visit the reduced elements in the order streaming adds them (lexicographic) with one
// running sum, so the bits are the CPU's. Outputs stored narrower than they are computed (bf16,
// f16) keep streaming: it rounds every partial sum to storage, a register would not.
bool column_by_output(const ReductionFacts& f, const LoopCapabilities& target) {
  return target.thread_per_iteration && f.storage == f.compute;
}

// Outside deterministic mode, a reduction over at least kWarpReduceMinimum elements runs a warp
// per output element. A thread per output left a bias gradient over 4096 rows with 700 threads,
// each walking 4096 dependent adds (0.18 ms on an H100). Deterministic mode keeps the thread per
// output and its running order (the CPU's bits). Kernels with per-row preludes keep it too
// (every lane would repeat them), as do types the warp shuffles do not carry.
constexpr int64_t kWarpReduceMinimum = 64;
bool warp_per_output(const ReductionFacts& f, const LoopCapabilities& target) {
  return target.lanes && !f.ordered && lanes_combine(f.compute) && !f.has_preludes && f.reduced_elements >= kWarpReduceMinimum;
}

// Outside deterministic mode, few outputs each reducing many elements (a loss, a whole-array
// sum, a bias gradient) run a block per output element: its 256 threads split the outermost
// reduced loop, each adding its share in one running value, and combine them. A warp per
// output left most of the GPU idle there: the MNIST loss, a scalar reduce over the batch, ran in
// one thread (its kernel has a prelude) for 0.1 ms at batch 4096. Preludes are allowed: every
// thread computes them, which costs a block's threads no more time than one. The threads split
// the outermost reduced axis alone (the combine must follow the whole share), so that axis
// must give each of them work.
constexpr int64_t kBlockReduceMinimum = 2048, kBlockReduceMaxOutputs = 1024, kBlockThreads = 256, kWarpLanes = 32;

// The fewest leading reduced loops that, run as one, give each of `workers` an iteration (all of
// them where even that falls short).
int loops_to_merge(const ReductionFacts& f, int64_t workers) {
  int loops = 1;
  while (loops < int(f.reduced_extents.size()) && merged_extent(f, loops) < workers) ++loops;
  return loops;
}

bool block_per_output(const ReductionFacts& f, const LoopCapabilities& target) {
  return target.lanes && !f.ordered && lanes_combine(f.compute) && merged_extent(f, loops_to_merge(f, kBlockThreads)) >= kBlockThreads &&
         f.reduced_elements >= kBlockReduceMinimum && f.output_elements <= kBlockReduceMaxOutputs;
}

// In deterministic mode, few outputs that each sum many floats in a cascade (at most kSumFanIn
// top-level blocks) run a warp per output element, a lane per top-level block, and the lanes'
// partial sums fold in lane order: the CPU's order, so its bits (but a NaN's payload: the GPU's
// arithmetic gives its canonical NaN), at up to 16x one thread's speed.
bool ordered_warp_per_output(const ReductionFacts& f, const LoopCapabilities& target, bool cascade) {
  if (!target.lanes || !f.ordered || !cascade) return false;
  if ((f.compute != Type::F32 && f.compute != Type::F64) || (f.op != ReduceOp::Sum && f.op != ReduceOp::Avg)) return false;
  // The outermost reduced loop is then the cascade's top level.
  return merged_extent(f, 1) > kSumBlock && f.output_elements <= kBlockReduceMaxOutputs;
}

}  // namespace

int64_t merged_extent(const ReductionFacts& f, int loops) {
  int64_t extent = 1;
  for (int l = 0; l < loops && l < int(f.reduced_extents.size()); ++l) extent *= f.reduced_extents[size_t(l)];
  return f.reduced_extents.empty() ? 0 : extent;
}

ReductionStrategy reduction_strategy(const ReductionFacts& f, const LoopCapabilities& target) {
  const bool long_column = !f.reduces_innermost_axis && long_column_sum(f);
  ReductionStrategy s;
  s.per_output = f.reduces_innermost_axis || long_column || column_by_output(f, target);
  if (!s.per_output) return s;
  s.cascade = f.reduces_innermost_axis || long_column;
  s.threads = block_per_output(f, target)                     ? ReductionThreads::Block
              : ordered_warp_per_output(f, target, s.cascade) ? ReductionThreads::OrderedWarp
              : warp_per_output(f, target)                    ? ReductionThreads::Warp
                                                              : ReductionThreads::One;
  // Outside deterministic mode only: merging changes which lane adds which elements. (An
  // ordered warp's lanes take the cascade's top-level blocks of the outermost loop as they are.)
  if (s.threads == ReductionThreads::Block) s.merged_loops = loops_to_merge(f, kBlockThreads);
  if (s.threads == ReductionThreads::Warp) s.merged_loops = loops_to_merge(f, kWarpLanes);
  return s;
}

// A long reduce inlined into a kernel runs serially in every thread that reads it (a scalar's in
// every thread: the GPT's gradient-norm kernel summed every parameter's squares so, 0.5 ms a
// step); as its own kernel it runs a warp or a block per output, and its consumer a thread per
// element. Kept inline where it is stored narrower than computed: its own kernel would round it
// to storage, where inline it stays in a register (deterministic mode's bits).
bool reduce_runs_alone(const ReductionFacts& f, const LoopCapabilities& target) {
  return target.thread_per_iteration && f.storage == f.compute && f.reduced_elements >= kBlockReduceMinimum;
}

}  // namespace tessera
