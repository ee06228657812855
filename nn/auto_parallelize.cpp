#include "nn/auto_parallelize.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "nn/gpt.hpp"
#include "nn/gpt_training_step.hpp"
#include "nn/pipelined_gpt_training_step.hpp"

namespace tessera {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// `a` + (depth - 1) x (b - a): a model of `depth` blocks from plans of one block (a) and two (b).
PlanReport extrapolated(const PlanReport& a, const PlanReport& b, int64_t depth) {
  PlanReport r = b;
  const double more = double(depth - 1);
  auto line = [&](double one, double two) { return one + more * (two - one); };
  // A peak is a maximum over the step, not a sum: one block's may exceed two blocks' (what holds
  // it moves), and the line through them would then fall with depth, below zero at GPT-3's. A
  // deeper model holds at least what two blocks do.
  auto peak_line = [&](int64_t one, int64_t two) { return std::max(two, int64_t(line(double(one), double(two)))); };
  r.peak_bytes = peak_line(a.peak_bytes, b.peak_bytes);
  r.flops = line(a.flops, b.flops);
  r.collective_bytes = int64_t(line(double(a.collective_bytes), double(b.collective_bytes)));
  r.predicted_seconds = line(a.predicted_seconds, b.predicted_seconds);
  r.input_bytes = int64_t(line(double(a.input_bytes), double(b.input_bytes)));
  r.output_bytes = int64_t(line(double(a.output_bytes), double(b.output_bytes)));
  r.arena_bytes = peak_line(a.arena_bytes, b.arena_bytes);
  return r;
}

std::string bytes_gib(int64_t bytes) { return bytes_text(double(bytes)); }

}  // namespace

std::string ParallelCandidate::name() const {
  std::string out;
  for (const auto& [dim, size] : mesh) out += (out.empty() ? "" : ",") + dim + "=" + std::to_string(size);
  if (sequence_parallel) out += " +seq-parallel";
  if (fsdp) out += " +fsdp";
  if (activation_checkpointing) out += std::string(" +recompute-") + checkpoint_policy_name(*activation_checkpointing);
  if (pipelined()) out += " +1f1b x" + std::to_string(microbatches);
  return out;
}

PlanReport plan_gpt_training_step(const GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp, int64_t global_batch) {
  GptTrainingStep step(config, mesh, sequence_parallel, fsdp);
  const Layout batch = GptTrainingStep::batch_layout(mesh);
  return step.plan(zeros({global_batch, config.context}, batch, DType::i32), zeros({global_batch, config.context}, batch, DType::i32));
}

PlanReport plan_pipelined_gpt_training_step(const GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                            int64_t global_batch, int64_t microbatches) {
  PipelinedGptTrainingStep step(config, mesh, microbatches, PipelineSchedule::OneFOneB, fsdp, sequence_parallel);
  const Layout batch = GptTrainingStep::batch_layout(mesh);
  return step.plan(zeros({global_batch, config.context}, batch, DType::i32), zeros({global_batch, config.context}, batch, DType::i32));
}

namespace {

// Pipelined candidates: P stages of whole blocks (L a multiple of P, at least two blocks a
// stage, so one and two blocks a stage screen it); tp the widest that fits a node and the rest
// of the devices (pipelines are used where a model outgrows tp inside a node), with Megatron's
// sequence parallelism; dp what is left;
// 1F1B over as many microbatches as fill the pipeline twice (2P: the bubble (P - 1) / (3P - 1)),
// fewer where a replica's sequences do not split so. At most 16 stages: a plan's cost grows
// with its ticks. No FSDP: over pp it raised the peak (the GPT-3 shape on 1,024 H100s, pp=8:
// 84 GiB without, 103 with), so the search does not spend plans on it.
void search_pipelines(const GptConfig& config, int64_t devices, const Hardware& hardware, int64_t memory_bytes_per_device,
                      int64_t global_batch, int64_t devices_per_node, std::vector<ParallelCandidate>& candidates) {
  constexpr int64_t kMostStages = 16;
  for (int64_t pp : divisors(devices)) {
    if (pp < 2 || pp > kMostStages || config.layers % pp != 0 || config.layers / pp < 2) continue;
    int64_t tp = 1;
    for (int64_t t : divisors(devices / pp))
      if (t <= devices_per_node && config.heads % t == 0) tp = t;
    const int64_t dp = devices / (pp * tp);
    if (dp > global_batch || global_batch % dp != 0) continue;
    const int64_t sequences = global_batch / dp;  // per replica
    int64_t microbatches = 1;
    for (int64_t m : divisors(sequences))
      if (m <= 2 * pp) microbatches = m;
    std::vector<std::pair<std::string, int64_t>> dims = {{"pp", pp}};
    for (const auto& [dim, size] : {std::pair{"dp", dp}, std::pair{"tp", tp}})
      if (size > 1) dims.emplace_back(dim, size);
    const Mesh mesh = abstract_mesh(dims, hardware, devices_per_node);
    ParallelCandidate c;
    c.mesh = dims;
    c.microbatches = microbatches;
    c.sequence_parallel = tp > 1;  // as Megatron runs tp: it only saves memory and moves less
    GptConfig one_block = config, two_blocks = config;
    one_block.layers = pp, two_blocks.layers = 2 * pp;
    auto plan = [&](const GptConfig& blocks) {
      return plan_pipelined_gpt_training_step(blocks, mesh, c.sequence_parallel, false, global_batch, microbatches);
    };
    c.report = extrapolated(plan(one_block), plan(two_blocks), config.layers / pp);
    c.exact = config.layers == 2 * pp;
    c.fits = c.report.peak_bytes <= memory_bytes_per_device;
    candidates.push_back(std::move(c));
  }
}

}  // namespace

ParallelPlanSearch auto_parallelize(Module& model, int64_t devices, Hardware hardware, int64_t memory_bytes_per_device,
                                    int64_t global_batch, int64_t devices_per_node) {
  const auto started = std::chrono::steady_clock::now();
  const Gpt* gpt = dynamic_cast<const Gpt*>(&model);
  if (!gpt) throw Error("auto_parallelize: plans Gpt models (nn/gpt.hpp) so far; this module is not one");
  if (devices < 1 || devices_per_node < 1 || memory_bytes_per_device < 1)
    throw Error(fmt::format("auto_parallelize: devices ({}), devices_per_node ({}) and the memory budget ({} bytes) must be positive",
                            devices, devices_per_node, memory_bytes_per_device));
  const GptConfig config = gpt->config();
  if (global_batch == 0) global_batch = devices;
  if (global_batch < 1) throw Error("auto_parallelize: global_batch must be positive, got " + std::to_string(global_batch));
  GptConfig one = config, two = config;
  one.layers = 1;
  two.layers = std::min<int64_t>(2, config.layers);

  ParallelPlanSearch search;
  for (int64_t tp : divisors(devices)) {
    if (tp > devices_per_node || config.heads % tp != 0) continue;  // whole heads per device, tp inside a node
    for (int64_t sp : divisors(devices / tp)) {
      if (sp > 1 && (config.context % sp != 0 || sp > devices_per_node)) continue;
      const int64_t dp = devices / (tp * sp);
      if (dp > global_batch) continue;  // a replica without a sequence
      std::vector<std::pair<std::string, int64_t>> dims;
      for (const auto& [dim, size] : {std::pair{"dp", dp}, std::pair{"sp", sp}, std::pair{"tp", tp}})
        if (size > 1) dims.emplace_back(dim, size);
      if (dims.empty()) dims.emplace_back("dp", 1);
      const Mesh mesh = abstract_mesh(dims, hardware, devices_per_node);
      for (bool fsdp : {false, true}) {
        if (fsdp && dp == 1) continue;
        for (bool sequence_parallel : {false, true}) {
          if (sequence_parallel && tp == 1) continue;
          // Without recomputation first; a candidate that does not fit is tried again with it.
          for (const std::optional<CheckpointPolicy> recompute :
               {std::optional<CheckpointPolicy>{}, std::optional{CheckpointPolicy::Selective}, std::optional{CheckpointPolicy::Full}}) {
            ParallelCandidate c;
            c.mesh = dims;
            c.sequence_parallel = sequence_parallel;
            c.fsdp = fsdp;
            c.activation_checkpointing = recompute;
            GptConfig one_block = one, two_blocks = two;
            one_block.activation_checkpointing = two_blocks.activation_checkpointing = recompute;
            const PlanReport a = plan_gpt_training_step(one_block, mesh, sequence_parallel, fsdp, global_batch);
            c.report = config.layers == 1 ? a
                                          : extrapolated(a, plan_gpt_training_step(two_blocks, mesh, sequence_parallel, fsdp, global_batch),
                                                         config.layers);
            c.exact = config.layers <= 2;
            c.fits = c.report.peak_bytes <= memory_bytes_per_device;
            const bool fits = c.fits;
            search.candidates.push_back(std::move(c));
            if (fits) break;
          }
        }
      }
    }
  }
  search_pipelines(config, devices, hardware, memory_bytes_per_device, global_batch, devices_per_node, search.candidates);
  auto faster = [](const ParallelCandidate& a, const ParallelCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.report.predicted_seconds < b.report.predicted_seconds : a.report.peak_bytes < b.report.peak_bytes;
  };
  std::sort(search.candidates.begin(), search.candidates.end(), faster);
  // The screened front runners, planned whole: the choice rests on exact bytes and the full model.
  // A pipelined one stays screened: its full program repeats every stage's blocks each tick.
  constexpr size_t kPlannedWhole = 3;
  for (size_t i = 0; i < search.candidates.size() && i < kPlannedWhole; ++i) {
    ParallelCandidate& c = search.candidates[i];
    if (c.exact || c.pipelined()) continue;
    GptConfig whole = config;
    whole.activation_checkpointing = c.activation_checkpointing;
    c.report = plan_gpt_training_step(whole, abstract_mesh(c.mesh, hardware, devices_per_node), c.sequence_parallel, c.fsdp, global_batch);
    c.exact = true;
    c.fits = c.report.peak_bytes <= memory_bytes_per_device;
  }
  std::stable_sort(search.candidates.begin(), search.candidates.end(), faster);
  search.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (search.candidates.empty()) throw InternalError("auto_parallelize: no candidate mesh for " + std::to_string(devices) + " devices");
  search.best = search.candidates.front();
  const ParallelCandidate& best = search.best;
  if (!best.fits) {
    search.why = fmt::format("no plan fits {} per device: the smallest peak is {} with {}; add devices or memory, shrink the batch, "
                             "or recompute activations",
                             bytes_gib(memory_bytes_per_device), bytes_gib(best.report.peak_bytes), best.name());
    return search;
  }
  search.why = fmt::format("{}: predicted {} per step with {} of {} per device", best.name(), seconds_text(best.report.predicted_seconds),
                           bytes_gib(best.report.peak_bytes), bytes_gib(memory_bytes_per_device));
  if (search.candidates.size() > 1) {
    const ParallelCandidate& next = search.candidates[1];
    search.why += fmt::format("; the runner-up, {}, {}", next.name(),
                              next.fits ? fmt::format("is {:.1f}% slower", 100.0 * (next.report.predicted_seconds / best.report.predicted_seconds - 1))
                                        : fmt::format("needs {}", bytes_gib(next.report.peak_bytes)));
    if (best.activation_checkpointing)
      search.why += fmt::format("; it recomputes activations ({}) because no plan fits without", checkpoint_policy_name(*best.activation_checkpointing));
    int64_t too_big = 0;
    for (const auto& c : search.candidates) too_big += !c.fits;
    if (too_big) search.why += fmt::format("; {} of {} candidates do not fit", too_big, search.candidates.size());
  }
  return search;
}

std::string ParallelPlanSearch::to_string() const {
  std::string out = fmt::format("chose {}\n  {}\n  searched {} candidates in {:.1f} s\n", best.name(), why, candidates.size(), search_seconds);
  out += fmt::format("  {:<54}{:>14}{:>14}{:>20}{:>14}\n", "plan", "step (pred.)", "peak/device", "collectives/device", "FLOP/device");
  for (const ParallelCandidate& c : candidates)
    out += fmt::format("  {:<54}{:>14}{:>14}{:>20}{:>14.3g}  {}{}\n", c.name(), seconds_text(c.report.predicted_seconds),
                       bytes_text(double(c.report.peak_bytes)), bytes_text(double(c.report.collective_bytes)), c.report.flops,
                       c.fits ? "fits" : "too big", c.exact ? "" : " (from 1-2 blocks)");
  return out;
}

std::string ParallelPlanSearch::to_json() const {
  nlohmann::json j = {{"best", best.name()}, {"why", why}, {"search_seconds", search_seconds}};
  j["candidates"] = nlohmann::json::array();
  for (const ParallelCandidate& c : candidates) {
    nlohmann::json mesh = nlohmann::json::object();
    for (const auto& [dim, size] : c.mesh) mesh[dim] = size;
    j["candidates"].push_back({{"name", c.name()}, {"mesh", mesh}, {"sequence_parallel", c.sequence_parallel}, {"fsdp", c.fsdp},
                               {"activation_checkpointing", c.activation_checkpointing ? checkpoint_policy_name(*c.activation_checkpointing) : "none"},
                               {"microbatches", c.microbatches}, {"exact", c.exact}, {"fits", c.fits}, {"predicted_seconds", c.report.predicted_seconds},
                               {"peak_bytes", c.report.peak_bytes}, {"collective_bytes", c.report.collective_bytes},
                               {"flops", c.report.flops}});
  }
  return j.dump(2);
}

}  // namespace tessera
