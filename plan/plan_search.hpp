// The search auto_parallelize runs over candidate plans, whatever the model: each candidate is
// screened by a CandidatePlanner (the model's: a Transformer's extrapolates from one and two
// blocks, any other model plans its whole step), recomputation is tried only where memory asks
// for it, pipelines with room in their bubble get more microbatches, the front runners are
// planned whole, and the fastest that fits wins (plan/auto_parallelize.hpp says how).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/auto_parallelize.hpp"

namespace tessera {

// Plans candidates for the search: screen() fills c.report, c.fits, c.exact and c.lower_bound,
// as cheaply as it can; plan_whole() plans `c` exactly. least_bytes(c): bytes some device holds
// in every plan of `c`, known without planning (0: nothing known); the search plans no candidate
// whose least bytes exceed the budget, unless every candidate's do.
//
// A planner may screen in two steps (a Transformer's: one block, then two): screen_first plans
// cheaply, fills c.report and may set c.least_seconds, and returns whether `c` is screened
// already; screen_rest completes it. The search completes candidates fastest least_seconds
// first and leaves those no plan that fits could lose to (ParallelCandidate::slower).
class CandidatePlanner {
 public:
  virtual ~CandidatePlanner() = default;
  virtual void screen(ParallelCandidate& c) const = 0;
  virtual bool screen_first(ParallelCandidate& c) const {
    screen(c);
    return true;
  }
  virtual void screen_rest(ParallelCandidate& c) const { (void)c; }
  virtual void plan_whole(ParallelCandidate& c) const = 0;
  virtual int64_t least_bytes(const ParallelCandidate& c) const {
    (void)c;
    return 0;
  }
};

struct PlanSearchOptions {
  int64_t memory_bytes_per_device = 0;
  int64_t global_batch = 0;
  // The precisions every shape is planned at (the model's: std::nullopt).
  std::vector<std::optional<MixedPrecisionPolicy>> precisions = {std::nullopt};
  bool recompute = true;    // try selective, then full, activation checkpointing where memory asks
  bool accumulate = false;  // and gradient accumulation (unpipelined candidates' microbatches)
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// Error (MeshError for more devices than an abstract mesh may have) unless the counts are
// positive (global_batch: 0, one sequence a device, or more).
void check_search_arguments(int64_t devices, int64_t devices_per_node, int64_t memory_bytes_per_device, int64_t global_batch);

// n's divisors in increasing order.
std::vector<int64_t> divisors(int64_t n);

// Searches `shapes` (each at every precision of `options`): the winner, every candidate tried,
// and why, as ParallelPlanSearch states them.
ParallelPlanSearch search_plans(const CandidatePlanner& planner, const std::vector<ParallelCandidate>& shapes,
                                const PlanSearchOptions& options);

}  // namespace tessera
