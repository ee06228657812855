#include "plan/plan_search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <thread>

#include "dsl/error.hpp"
#include "dsl/logging.hpp"
#include "jit/device_workers.hpp"

namespace tessera {

// n's divisors in increasing order, found in pairs (d, n / d) up to sqrt(n): a loop to n itself
// took 2^40 iterations for 2^40 devices, and the planner seemed to hang.
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      small.push_back(d);
      if (d != n / d) large.push_back(n / d);
    }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

void check_search_arguments(int64_t devices, int64_t devices_per_node, int64_t memory_bytes_per_device, int64_t global_batch) {
  if (devices < 1 || devices_per_node < 1 || memory_bytes_per_device < 1)
    throw Error(fmt::format("auto_parallelize: devices ({}), devices_per_node ({}) and the memory budget ({} bytes) must be positive",
                            devices, devices_per_node, memory_bytes_per_device));
  // Every candidate is planned on an abstract mesh of all the devices.
  if (devices > kMaxAbstractMeshDevices)
    throw MeshError(fmt::format("auto_parallelize: {} devices is more than an abstract mesh may have (2^20 = {})", devices,
                                kMaxAbstractMeshDevices));
  if (global_batch < 0) throw Error("auto_parallelize: global_batch must be positive, got " + std::to_string(global_batch));
}

namespace {


// TESSERA_PLAN_THREADS: how many threads the search plans on (default: one a core).
size_t planning_threads(size_t cores) {
  const char* text = std::getenv("TESSERA_PLAN_THREADS");
  if (!text || !*text) return cores;
  char* end = nullptr;
  const long threads = std::strtol(text, &end, 10);
  if (*end || threads < 1) throw Error(std::string("TESSERA_PLAN_THREADS must be a positive count of threads, got '") + text + "'");
  return size_t(threads);
}

// How long screening `c` takes, relatively: a pipeline's program holds every tick (m + P - 1
// of them) of its schedule, an unpipelined step one pass.
int64_t screening_work(const ParallelCandidate& c) {
  return c.pipelined() ? c.microbatches + c.mesh.front().second - 1 : 0;
}

// Runs `step` on every candidate, on as many threads as there are cores: plans are independent
// (each traces its own step on its own abstract mesh), and the screening is most of the search.
// The costliest are taken first, so no thread is left with one at the end.
void on_every_core(std::vector<ParallelCandidate*> candidates, const std::function<void(ParallelCandidate&)>& step) {
  const size_t threads = std::max<size_t>(1, std::min<size_t>(planning_threads(size_t(machine_cores())), candidates.size()));
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const ParallelCandidate* a, const ParallelCandidate* b) { return screening_work(*a) > screening_work(*b); });
  std::atomic<size_t> next = 0;
  std::vector<std::exception_ptr> failures(threads);
  auto work = [&](size_t thread) {
    try {
      for (size_t i = next++; i < candidates.size(); i = next++) {
        const auto started = std::chrono::steady_clock::now();
        step(*candidates[i]);
        // TESSERA_LOG=trace: what each screening plan cost.
        component_logger("planning").trace("auto_parallelize: screened {} in {:.3f} s", candidates[i]->name(),
                                           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    } catch (...) {
      failures[thread] = std::current_exception();
      next = candidates.size();  // the others stop at their next candidate
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& failure : failures)
    if (failure) std::rethrow_exception(failure);
}

std::vector<ParallelCandidate*> pointers_to(std::vector<ParallelCandidate>& candidates) {
  std::vector<ParallelCandidate*> out;
  for (ParallelCandidate& c : candidates) out.push_back(&c);
  return out;
}

void screen_all(const CandidatePlanner& planner, std::vector<ParallelCandidate>& candidates) {
  on_every_core(pointers_to(candidates), [&](ParallelCandidate& c) { planner.screen(c); });
}

// Screens every candidate in the planner's two steps (CandidatePlanner::screen_first): the first
// everywhere, then the rest fastest least_seconds first, a wave a planning thread, each wave's
// fits lowering the bar (from `fastest_fit`); what a plan that fits already beats is left at its
// first plan. Returns the fastest fit.
double screen_in_two_steps(const CandidatePlanner& planner, std::vector<ParallelCandidate>& candidates,
                           double fastest_fit = std::numeric_limits<double>::infinity()) {
  std::vector<char> screened(candidates.size(), 0);
  on_every_core(pointers_to(candidates), [&](ParallelCandidate& c) { screened[size_t(&c - candidates.data())] = planner.screen_first(c); });
  std::vector<ParallelCandidate*> rest;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!screened[i]) rest.push_back(&candidates[i]);
    else if (candidates[i].fits) fastest_fit = std::min(fastest_fit, candidates[i].report.predicted_seconds);
  }
  std::stable_sort(rest.begin(), rest.end(), [](const ParallelCandidate* a, const ParallelCandidate* b) { return a->least_seconds < b->least_seconds; });
  const size_t wave_size = planning_threads(size_t(machine_cores()));
  for (size_t at = 0; at < rest.size();) {
    std::vector<ParallelCandidate*> wave;
    for (; at < rest.size() && wave.size() < wave_size; ++at) {
      ParallelCandidate& c = *rest[at];
      if (c.least_seconds > 0 && c.least_seconds >= fastest_fit) {
        c.slower = true;
        c.fits = false;  // not known: one block's peak is only a lower bound
        c.report.predicted_seconds = c.least_seconds;
        continue;
      }
      wave.push_back(&c);
    }
    on_every_core(wave, [&](ParallelCandidate& c) { planner.screen_rest(c); });
    for (const ParallelCandidate* c : wave)
      if (c->fits) fastest_fit = std::min(fastest_fit, c->report.predicted_seconds);
  }
  return fastest_fit;
}

// Pipelined candidates: P stages of whole blocks (L a multiple of P, at least two blocks a
// stage, so one and two blocks a stage screen it); tp the widest that fits a node and the rest
// of the devices (pipelines are used where a model outgrows tp inside a node), with Megatron's
// sequence parallelism; dp what is left;
// 1F1B over as many microbatches as fill the pipeline twice (2P: the bubble (P - 1) / (3P - 1)),
// fewer where a replica's sequences do not split so (auto_parallelize plans the promising ones
// again with up to 128, or 4P). At most 16 stages. No FSDP: over pp
// it raised the peak (the GPT-3 shape on 1,024 H100s, pp=8: 84 GiB without, 103 with), so the
// search does not spend plans on it.

// The sequences each dp replica of `c` trains on.
int64_t sequences_per_replica(const ParallelCandidate& c, int64_t global_batch) {
  return global_batch / (c.size("dp") * c.size("ep"));
}

// The most microbatches above `c`'s that split a replica's sequences evenly, up to 128 (the
// counts published runs use; 4P where that is more), or 0 for none. A 1F1B step's plan costs the
// same whatever its count (its tick programs are planned once: nn/pipeline_tick_loop.hpp), so the
// search takes the smallest bubble the batch allows.
int64_t more_microbatches(const ParallelCandidate& c, int64_t global_batch) {
  const int64_t stages = c.mesh.front().second, most = std::max<int64_t>(4 * stages, 128);
  int64_t more = 0;
  for (int64_t m : divisors(sequences_per_replica(c, global_batch)))
    if (m > c.microbatches && m <= most) more = m;
  return more;
}

// With 1F1B over m microbatches a stage idles in P - 1 of its m + P - 1 slots, so no count of
// microbatches makes a step faster than m / (m + P - 1) of `c`'s (smaller ones only lower the
// GEMMs' rate).
double fastest_with_any_microbatches(const ParallelCandidate& c) {
  const double m = double(c.microbatches), stages = double(c.mesh.front().second);
  return c.report.predicted_seconds * m / (m + stages - 1);
}

// A variant of a candidate that does not fit, planned to hold less: recomputation (selective,
// then full) or gradient accumulation over `microbatches`.
struct MemorySaving {
  enum class Kind { Selective, Full, Accumulate };
  ParallelCandidate plain;
  Kind kind;
  int64_t microbatches;
  double at_least;  // the step without this variant's extra work
  ParallelCandidate variant() const {
    ParallelCandidate c = plain;
    if (kind == Kind::Accumulate) c.microbatches = microbatches;
    else c.activation_checkpointing = kind == Kind::Full ? CheckpointPolicy::Full : CheckpointPolicy::Selective;
    return c;
  }
};

// The microbatch count gradient accumulation tries after `m` for unpipelined `c`: the smallest
// divisor of a replica's sequences at least 2m (2 first), up to kMostAccumulated; 0: none.
constexpr int64_t kMostAccumulated = 16;
int64_t accumulation_after(const ParallelCandidate& c, int64_t m, const PlanSearchOptions& options) {
  if (!options.accumulate || c.pipelined() || c.lower_bound) return 0;
  for (int64_t d : divisors(sequences_per_replica(c, options.global_batch)))
    if (d >= 2 * m) return d <= kMostAccumulated ? d : 0;
  return 0;
}

}  // namespace

int64_t collective_calls(const PlanReport& r) {
  int64_t calls = 0;
  for (const PlanReport::Collective& c : r.collectives) calls += c.calls;
  return calls;
}

// Each call waits for the slowest device of its group, a cost the time model does not see: one
// core of a shared VM ran the same GEMMs 10-15% slower than its neighbour, and the other waited
// the difference out in the next collective. FSDP's gathers buy memory a tie does not need.
std::optional<ParallelCandidate> prefer_fewer_collective_calls(std::vector<ParallelCandidate>& sorted) {
  if (sorted.empty() || !sorted.front().fits || !sorted.front().exact || sorted.front().pipelined()) return std::nullopt;
  const double limit = sorted.front().report.predicted_seconds * (1 + kPlanTie);
  size_t chosen = 0;
  for (size_t i = 1; i < sorted.size() && sorted[i].fits && sorted[i].report.predicted_seconds <= limit; ++i)
    if (sorted[i].exact && !sorted[i].pipelined() && collective_calls(sorted[i].report) < collective_calls(sorted[chosen].report)) chosen = i;
  if (chosen == 0) return std::nullopt;
  std::rotate(sorted.begin(), sorted.begin() + ptrdiff_t(chosen), sorted.begin() + ptrdiff_t(chosen) + 1);
  return sorted[1];
}


ParallelPlanSearch search_plans(const CandidatePlanner& planner, const std::vector<ParallelCandidate>& shapes,
                                const PlanSearchOptions& options) {
  const auto started = options.started;
  const int64_t global_batch = options.global_batch, memory_bytes_per_device = options.memory_bytes_per_device;
  // TESSERA_LOG=planning: what each phase of the search planned, and when.
  spdlog::logger& log = component_logger("planning");
  auto phase_done = [&](std::string_view phase, size_t candidates) {
    log.debug("auto_parallelize: {} ({} candidates) done at {:.1f} s", phase, candidates,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  };
  ParallelPlanSearch search;
  for (const auto& precision : options.precisions)
    for (ParallelCandidate c : shapes) {
      c.mixed_precision = precision;
      search.candidates.push_back(std::move(c));
    }
  // What cannot fit whatever its activations cost is not planned (a dp x tp plan of GPT-3 without
  // FSDP holds 325 GiB of parameters, gradients and optimizer state a device), unless nothing could fit:
  // then every candidate is planned, so the report names the smallest peak.
  std::vector<ParallelCandidate> could_fit;
  for (ParallelCandidate& c : search.candidates) {
    if (planner.least_bytes(c) > memory_bytes_per_device) search.over_memory.push_back(c.name());
    else could_fit.push_back(std::move(c));
  }
  if (could_fit.empty()) search.over_memory.clear();
  else search.candidates = std::move(could_fit);
  double fastest_fit = screen_in_two_steps(planner, search.candidates);
  phase_done("screening without recomputation", search.candidates.size());
  // Recomputation and gradient accumulation only add work, so they are tried only where memory
  // asks for them (selective, then full recomputation; accumulation over 2, then about twice as
  // many microbatches, each of a replica's sequences at most one microbatch), fastest first, and
  // not where the candidate without them is already no faster than the fastest that fits: it
  // cannot win. In waves of one candidate a planning thread: each wave's fits lower the bar the
  // next wave is pruned against.
  std::deque<MemorySaving> pending;
  for (const ParallelCandidate& c : search.candidates) {
    if (c.fits || c.slower) continue;
    if (options.recompute) pending.push_back({c, MemorySaving::Kind::Selective, 1, c.report.predicted_seconds});
    if (const int64_t m = accumulation_after(c, 1, options); m > 0)
      pending.push_back({c, MemorySaving::Kind::Accumulate, m, c.report.predicted_seconds});
  }
  std::stable_sort(pending.begin(), pending.end(), [](const MemorySaving& a, const MemorySaving& b) { return a.at_least < b.at_least; });
  const size_t wave_size = planning_threads(size_t(machine_cores()));
  while (!pending.empty()) {
    std::vector<MemorySaving> planned;
    std::vector<ParallelCandidate> wave;
    while (!pending.empty() && wave.size() < wave_size) {
      MemorySaving r = std::move(pending.front());
      pending.pop_front();
      if (r.at_least >= fastest_fit) {  // neither this variant nor the ones after it can win
        search.pruned += r.kind == MemorySaving::Kind::Selective ? 2 : 1;
        continue;
      }
      wave.push_back(r.variant());
      planned.push_back(std::move(r));
    }
    fastest_fit = screen_in_two_steps(planner, wave, fastest_fit);
    std::vector<MemorySaving> further;  // did not fit: the next variant of its kind, before the rest
    for (size_t i = 0; i < wave.size(); ++i) {
      ParallelCandidate& c = wave[i];
      const MemorySaving& r = planned[i];
      if (c.fits || c.slower) {
        // Full recomputation is not needed, or (left slower) no faster than selective.
        search.pruned += r.kind == MemorySaving::Kind::Selective;
      } else if (r.kind == MemorySaving::Kind::Selective) {
        further.push_back({r.plain, MemorySaving::Kind::Full, 1, c.report.predicted_seconds});
      } else if (r.kind == MemorySaving::Kind::Accumulate) {
        if (const int64_t m = accumulation_after(r.plain, r.microbatches, options); m > 0)
          further.push_back({r.plain, MemorySaving::Kind::Accumulate, m, c.report.predicted_seconds});
      }
      search.candidates.push_back(std::move(c));
    }
    pending.insert(pending.begin(), std::make_move_iterator(further.begin()), std::make_move_iterator(further.end()));
  }
  phase_done("recomputation and accumulation where memory asks", search.candidates.size());
  // Pipelines whose bubble may hide a plan faster than the fastest that fits are planned again
  // with more microbatches (their activations in flight smaller too, so some may fit without
  // recomputing), the most promising kMoreMicrobatches of them, on every core.
  constexpr size_t kMoreMicrobatches = 4;
  std::vector<ParallelCandidate> more;
  for (const ParallelCandidate& c : search.candidates)
    if (c.pipelined() && !c.lower_bound && more_microbatches(c, global_batch) > 0 && fastest_with_any_microbatches(c) < fastest_fit)
      more.push_back(c);
  std::sort(more.begin(), more.end(), [](const ParallelCandidate& a, const ParallelCandidate& b) {
    return fastest_with_any_microbatches(a) < fastest_with_any_microbatches(b);
  });
  if (more.size() > kMoreMicrobatches) more.resize(kMoreMicrobatches);
  for (ParallelCandidate& c : more) c.microbatches = more_microbatches(c, global_batch);
  screen_all(planner, more);
  for (ParallelCandidate& c : more) search.candidates.push_back(std::move(c));
  phase_done("pipelines with more microbatches", search.candidates.size());
  // Fitting ones fastest first, then the rest by peak (those planned one block only last: their
  // peaks are lower bounds).
  auto faster = [](const ParallelCandidate& a, const ParallelCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.report.predicted_seconds < b.report.predicted_seconds;
    if (a.slower != b.slower) return b.slower;
    if (a.slower) return a.report.predicted_seconds < b.report.predicted_seconds;
    if (a.lower_bound != b.lower_bound) return b.lower_bound;
    return a.report.peak_bytes < b.report.peak_bytes;
  };
  std::sort(search.candidates.begin(), search.candidates.end(), faster);
  // The screened front runners, planned whole until one fits: the choice rests on exact bytes
  // and the full model. A pipelined one stays screened: its full program repeats every stage's
  // blocks each tick.
  constexpr size_t kPlannedWhole = 3;
  for (size_t i = 0; i < search.candidates.size() && i < kPlannedWhole; ++i) {
    ParallelCandidate& c = search.candidates[i];
    if (!c.exact && !c.pipelined() && !c.lower_bound && !c.slower) planner.plan_whole(c);
    if (c.fits) break;
  }
  std::stable_sort(search.candidates.begin(), search.candidates.end(), faster);
  const std::optional<ParallelCandidate> passed_over = prefer_fewer_collective_calls(search.candidates);
  phase_done("front runners planned whole", search.candidates.size());
  search.left_slower = std::count_if(search.candidates.begin(), search.candidates.end(), [](const ParallelCandidate& c) { return c.slower; });
  search.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (search.candidates.empty()) throw InternalError("auto_parallelize: no candidate to search");
  search.best = search.candidates.front();
  const ParallelCandidate& best = search.best;
  if (!best.fits) {
    search.why = fmt::format("no plan fits {} per device: the smallest peak is {} with {}; add devices or memory, shrink the batch, "
                             "or recompute activations",
                             bytes_text(double(memory_bytes_per_device)), bytes_text(double(best.report.peak_bytes)), best.name());
  } else {
    search.why = fmt::format("{}: predicted {} per step with {} of {} per device", best.name(), seconds_text(best.report.predicted_seconds),
                             bytes_text(double(best.report.peak_bytes)), bytes_text(double(memory_bytes_per_device)));
    if (search.candidates.size() > 1) {
      const ParallelCandidate& next = search.candidates[1];
      if (passed_over)
        search.why += fmt::format("; chosen over {} (predicted {:.2f}% faster, within the model's resolution) for {} fewer collective calls a step",
                                  passed_over->name(), 100.0 * (1 - passed_over->report.predicted_seconds / best.report.predicted_seconds),
                                  collective_calls(passed_over->report) - collective_calls(best.report));
      else
        search.why += fmt::format("; the runner-up, {}, {}", next.name(),
                                  next.fits ? fmt::format("is {:.1f}% slower", 100.0 * (next.report.predicted_seconds / best.report.predicted_seconds - 1))
                                            : fmt::format("needs {}", bytes_text(double(next.report.peak_bytes))));
      if (best.activation_checkpointing)
        search.why += fmt::format("; it recomputes activations ({}) because no plan fits without", checkpoint_policy_name(*best.activation_checkpointing));
      if (!best.pipelined() && best.microbatches > 1)
        search.why += fmt::format("; it accumulates gradients over {} microbatches because no plan fits without", best.microbatches);
      int64_t too_big = 0;
      for (const auto& c : search.candidates) too_big += !c.fits && !c.slower;
      if (too_big) search.why += fmt::format("; {} of {} candidates do not fit", too_big, search.candidates.size());
      if (search.left_slower)
        search.why += fmt::format("; {} were left at a first plan (one block): it already makes their step no faster than a plan that fits",
                                  search.left_slower);
      if (search.pruned)
        search.why += fmt::format("; {} recomputing or accumulating variants were not planned, slower than the winner without them", search.pruned);
    }
  }
  if (!search.over_memory.empty())
    search.why += fmt::format("; {} more were not planned: their parameters, gradients and optimizer state alone need more than {} a device",
                              search.over_memory.size(), bytes_text(double(memory_bytes_per_device)));
  return search;
}

}  // namespace tessera
