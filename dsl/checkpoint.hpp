// Activation checkpointing (torch.utils.checkpoint, jax.checkpoint): checkpoint(fn) returns fn
// wrapped so that the values its ops compute are not kept for the backward pass but computed
// again there from fn's inputs. Tessera builds a graph, so nothing is "kept" or "freed" by the
// wrapper itself: the ops fn builds are marked with their region, and gradients()
// (dsl/autodiff.hpp) reads a marked value through a copy of it made for the backward pass. The
// forward's own values then die after their last forward use, the memory plan frees them, and
// the copies are computed where the backward needs them (partitioner/recompute_placement.hpp
// moves each to just before its first reader). Values fn's ops compute are bitwise those of the
// forward: the same ops on the same inputs.
//
// Policies (torch.utils.checkpoint's and torchtitan's): Full recomputes every op of fn;
// Selective keeps what is costly to compute again (GEMMs, attention, collectives' results) and
// recomputes the rest (pointwise ops, reductions, movement), which the fuser folds into the
// backward kernels that read them.
#pragma once

#include <memory>
#include <utility>

namespace tessera {

struct Node;

enum class CheckpointPolicy { Full, Selective };
const char* checkpoint_policy_name(CheckpointPolicy policy);  // "full", "selective"

// One call of a checkpointed function: the ops built during it.
struct CheckpointRegion {
  CheckpointPolicy policy = CheckpointPolicy::Full;
  // Whether the backward computes `node` (built in this region) again rather than keeping it.
  bool recomputes(const Node& node) const;
};

// Marks the ops this thread builds, while it lives, as one region's.
class CheckpointScope {
 public:
  explicit CheckpointScope(CheckpointPolicy policy);
  ~CheckpointScope();
  CheckpointScope(const CheckpointScope&) = delete;
  CheckpointScope& operator=(const CheckpointScope&) = delete;

 private:
  std::shared_ptr<const CheckpointRegion> previous_;
};

// The region this thread is building ops in (null: none).
std::shared_ptr<const CheckpointRegion> current_checkpoint_region();

// fn, wrapped: every call builds fn's ops in a region of its own.
template <class F>
auto checkpoint(F fn, CheckpointPolicy policy = CheckpointPolicy::Full) {
  return [fn = std::move(fn), policy](auto&&... args) {
    CheckpointScope scope(policy);
    return fn(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace tessera
