#include "plan/auto_parallelize.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dsl/error.hpp"
#include "dsl/mesh_dims_text.hpp"
#include "dsl/ops.hpp"
#include "nn/gpt.hpp"
#include "nn/gpt_training_step.hpp"
#include "nn/transformer_training_step.hpp"
#include "nn/pipelined_transformer_training_step.hpp"
#include "plan/plan_search.hpp"

namespace tessera {
namespace {

// `a` + (depth - 1) x (b - a): a model of `depth` blocks from plans of one block (a) and two (b),
// on devices of `memory_bytes` (the profile's, as PlanReport::fits). Every sum is drawn so: the
// totals, the lists of collectives and parts (matched by name; one block's missing ones count
// 0) and the per-device figures, so a report's details add up to its totals. Its list of steps
// is left empty: that is a program's, and no program of `depth` blocks was planned.
PlanReport extrapolated(const PlanReport& a, const PlanReport& b, int64_t depth, int64_t memory_bytes) {
  PlanReport r = b;
  const double more = double(depth - 1);
  auto line = [&](double one, double two) { return one + more * (two - one); };
  auto int_line = [&](int64_t one, int64_t two) { return int64_t(std::llround(line(double(one), double(two)))); };
  // A peak is a maximum over the step, not a sum: one block's may exceed two blocks' (what holds
  // it moves), and the line through them would then fall with depth, below zero at GPT-3's. A
  // deeper model holds at least what two blocks do.
  auto peak_line = [&](int64_t one, int64_t two) { return std::max(two, int_line(one, two)); };
  r.peak_bytes = peak_line(a.peak_bytes, b.peak_bytes);
  r.flops = line(a.flops, b.flops);
  r.collective_bytes = int_line(a.collective_bytes, b.collective_bytes);
  r.predicted_seconds = line(a.predicted_seconds, b.predicted_seconds);
  r.input_bytes = int_line(a.input_bytes, b.input_bytes);
  r.output_bytes = int_line(a.output_bytes, b.output_bytes);
  r.arena_bytes = peak_line(a.arena_bytes, b.arena_bytes);
  r.fits = r.peak_bytes <= memory_bytes;
  if (a.device_ids == b.device_ids)
    for (size_t d = 0; d < r.device_ids.size(); ++d) {
      r.device_peak_bytes[d] = peak_line(a.device_peak_bytes[d], b.device_peak_bytes[d]);
      r.device_collective_bytes[d] = int_line(a.device_collective_bytes[d], b.device_collective_bytes[d]);
      r.output_bytes_per_device[d] = int_line(a.output_bytes_per_device[d], b.output_bytes_per_device[d]);
    }
  for (PlanReport::Collective& c : r.collectives) {
    PlanReport::Collective one;
    for (const PlanReport::Collective& o : a.collectives)
      if (o.kind == c.kind && o.mesh_dim == c.mesh_dim) one = o;
    c.calls = int_line(one.calls, c.calls);
    c.bytes = int_line(one.bytes, c.bytes);
    c.seconds = line(one.seconds, c.seconds);
  }
  for (auto [parts, one_parts] : {std::pair{&r.by_op_kind, &a.by_op_kind}, std::pair{&r.by_module, &a.by_module}})
    for (PlanReport::Part& part : *parts) {
      PlanReport::Part one;
      for (const PlanReport::Part& o : *one_parts)
        if (o.name == part.name) one = o;
      part.steps = int_line(one.steps, part.steps);
      part.flops = line(one.flops, part.flops);
      part.bytes = int_line(one.bytes, part.bytes);
      part.seconds = line(one.seconds, part.seconds);
    }
  r.steps.clear();
  return r;
}


// "bf16", as samples/gpt's --precision names it.
std::string precision_name(DType param_dtype) {
  switch (param_dtype) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    default: return std::string(dtype_name(param_dtype));
  }
}

}  // namespace

int64_t ParallelCandidate::size(std::string_view dim) const {
  for (const auto& [name, extent] : mesh)
    if (name == dim) return extent;
  return 1;
}

std::string ParallelCandidate::name() const {
  std::string out;
  for (const auto& [dim, size] : mesh) out += (out.empty() ? "" : ",") + dim + "=" + std::to_string(size);
  if (sequence_parallel) out += " +seq-parallel";
  if (fsdp) out += " +fsdp";
  if (activation_checkpointing) out += std::string(" +recompute-") + checkpoint_policy_name(*activation_checkpointing);
  if (mixed_precision) out += " +" + precision_name(mixed_precision->param_dtype);
  if (pipelined()) out += " +1f1b x" + std::to_string(microbatches);
  else if (microbatches > 1) out += " +accumulate x" + std::to_string(microbatches);
  return out;
}

PlanReport plan_gpt_training_step(const GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp, int64_t global_batch) {
  return plan_transformer_training_step(gpt_transformer_config(config), mesh, sequence_parallel, fsdp, global_batch);
}

PlanReport plan_transformer_training_step(const TransformerConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                          int64_t global_batch, int64_t microbatches) {
  TransformerTrainingStep step(config, mesh, sequence_parallel, fsdp, microbatches);
  const Layout batch = TransformerTrainingStep::batch_layout(mesh);
  return step.plan(zeros({global_batch, config.max_seq}, batch, DType::i32), zeros({global_batch, config.max_seq}, batch, DType::i32));
}

PlanReport plan_pipelined_gpt_training_step(const GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                            int64_t global_batch, int64_t microbatches) {
  return plan_pipelined_transformer_training_step(gpt_transformer_config(config), mesh, sequence_parallel, fsdp, global_batch, microbatches);
}

PlanReport plan_pipelined_transformer_training_step(const TransformerConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                                    int64_t global_batch, int64_t microbatches) {
  PipelinedTransformerTrainingStep step(config, mesh, microbatches, PipelineSchedule::OneFOneB, fsdp, sequence_parallel);
  const Layout batch = TransformerTrainingStep::batch_layout(mesh);
  return step.plan(zeros({global_batch, config.max_seq}, batch, DType::i32), zeros({global_batch, config.max_seq}, batch, DType::i32));
}

namespace {

// What the search plans with: the model, the hardware, the budget. Each candidate is screened
// from plans of one and two blocks (a stage, with pp); where one block already exceeds the
// budget, the second plan is skipped: a deeper model holds at least what one block does.
struct Screening final : CandidatePlanner {
  Screening(TransformerConfig config, Hardware hardware, int64_t devices_per_node, int64_t memory_bytes_per_device, int64_t global_batch)
      : config(std::move(config)), hardware(std::move(hardware)), devices_per_node(devices_per_node),
        memory_bytes_per_device(memory_bytes_per_device), global_batch(global_batch) {}

  TransformerConfig config;
  Hardware hardware;
  int64_t devices_per_node;
  int64_t memory_bytes_per_device;
  int64_t global_batch;

  // `c` planned with `blocks_a_stage` blocks on each of its stages (one stage unpipelined).
  PlanReport plan(const ParallelCandidate& c, int64_t blocks_a_stage) const {
    const Mesh mesh = abstract_mesh(c.mesh, hardware, devices_per_node);
    TransformerConfig blocks = config;
    blocks.layers = blocks_a_stage * stages(c);
    blocks.activation_checkpointing = c.activation_checkpointing;
    blocks.mixed_precision = c.mixed_precision;
    if (c.pipelined())
      return plan_pipelined_transformer_training_step(blocks, mesh, c.sequence_parallel, c.fsdp, global_batch, c.microbatches);
    return plan_transformer_training_step(blocks, mesh, c.sequence_parallel, c.fsdp, global_batch, c.microbatches);
  }

  void screen(ParallelCandidate& c) const override {
    if (!screen_first(c)) screen_rest(c);
  }

  // One block a stage. Screened already where that is the model, or already over the budget.
  bool screen_first(ParallelCandidate& c) const override {
    // One and two blocks extrapolate a model whose blocks repeat from the second on: not one
    // with several leading dense layers, or MoE layers only every k-th (planned whole).
    if (config.moe && (config.moe->first_dense_layers > 1 || config.moe->every > 1)) {
      plan_whole(c);
      return true;
    }
    const int64_t depth = config.layers / stages(c);  // blocks a stage
    c.report = plan(c, 1);
    c.lower_bound = depth > 1 && c.report.peak_bytes > memory_bytes_per_device;
    c.exact = depth == 1;
    c.fits = c.report.peak_bytes <= memory_bytes_per_device && !c.lower_bound;
    // Every further block runs its block's kernels, GEMMs and collectives again: the first
    // block's share of the step, less a margin for what blocks share (small all-reduces bucketed
    // together, cache residency). A pipeline's ticks are not blocks: no bound. Nor where two
    // blocks are the model: its plan is exact, and costs one more block.
    if (depth > 2 && !c.pipelined())
      c.least_seconds = c.report.predicted_seconds + double(depth - 1) * kBlockTimeShare * first_block_seconds(c.report);
    return depth == 1 || c.lower_bound;
  }

  void screen_rest(ParallelCandidate& c) const override {
    const int64_t depth = config.layers / stages(c);
    const PlanReport one = c.report;
    c.exact = depth == 2;
    c.report = extrapolated(one, plan(c, 2), depth, hardware.memory_bytes);
    c.fits = c.report.peak_bytes <= memory_bytes_per_device;
  }

  // The share of the first block's time least_seconds counts for each further block. What a
  // block adds, drawn from two blocks' plans, was 0.98-1.07 of it over GPT-3's search on 1,024
  // H100s (the bound at most 0.92 of the step); test_planning checks the bound on its searches.
  static constexpr double kBlockTimeShare = 0.9;

  // The time of the first block's modules ("0", "0.attention.wq", ...) in a plan.
  static double first_block_seconds(const PlanReport& r) {
    double seconds = 0;
    for (const PlanReport::Part& part : r.by_module)
      if (part.name == "0" || part.name.starts_with("0.")) seconds += part.seconds;
    return seconds;
  }

  int64_t least_bytes(const ParallelCandidate& c) const override { return least_training_bytes(config, c); }

  // `c` planned at the model's full depth: exact bytes.
  void plan_whole(ParallelCandidate& c) const override {
    c.report = plan(c, config.layers / stages(c));
    c.exact = true;
    c.fits = c.report.peak_bytes <= memory_bytes_per_device;
  }

  static int64_t stages(const ParallelCandidate& c) { return c.pipelined() ? c.mesh.front().second : 1; }
};

}  // namespace

// The device holding the most holds at least the average (test_planning checks the bound against
// planned peaks).
int64_t least_training_bytes(const TransformerConfig& config, const ParallelCandidate& c) {
  int64_t shards = 1;
  for (const auto& [dim, size] : c.mesh)
    if (c.fsdp || dim != "dp") shards *= size;
  return 16 * (parameter_count(config) / shards);
}

namespace {

std::vector<ParallelCandidate> pipelined_candidates(const TransformerConfig& config, int64_t devices, int64_t global_batch,
                                                    int64_t devices_per_node) {
  constexpr int64_t kMostStages = 16;
  std::vector<ParallelCandidate> out;
  for (int64_t pp : divisors(devices)) {
    if (pp < 2 || pp > kMostStages || config.layers % pp != 0 || config.layers / pp < 2) continue;
    int64_t tp = 1;
    for (int64_t t : divisors(devices / pp))
      if (t <= devices_per_node && config.heads % t == 0 && config.kv_heads % t == 0) tp = t;
    const int64_t dp = devices / (pp * tp);
    if (dp > global_batch || global_batch % dp != 0) continue;
    const int64_t sequences = global_batch / dp;  // per replica
    int64_t microbatches = 1;
    for (int64_t m : divisors(sequences))
      if (m <= 2 * pp) microbatches = m;
    ParallelCandidate c;
    c.mesh = {{"pp", pp}};
    for (const auto& [dim, size] : {std::pair{"dp", dp}, std::pair{"tp", tp}})
      if (size > 1) c.mesh.emplace_back(dim, size);
    c.microbatches = microbatches;
    c.sequence_parallel = tp > 1;  // as Megatron runs tp: it only saves memory and moves less
    out.push_back(std::move(c));
  }
  return out;
}

// The unpipelined meshes dp x sp x tp and dp x cp x tp (tp and sp inside a node, whole heads and
// whole sequence blocks per device, a sequence for every replica; cp, ring attention, where the
// sequence splits into 2 chunks per device for its causal balance, over at most
// kMostContextParallel devices), each with and without FSDP over dp and Megatron's sequence
// parallelism on tp; nothing recomputed yet.
//
// Why the cap: a ring is traced step by step, so its plan costs its length (cp=512 of a GPT-3
// block: 30 s, against 0.1 s for dp x tp), and rings longer than any published run's only
// search shapes nobody runs: Llama 3 405B's 128K-token training used cp=16 (Meta, "The Llama 3
// Herd of Models", 2024, table 4). Without it, rings of 32 to 1,024 devices took most of the
// GPT-3 175B search on 1,024 H100s.
constexpr int64_t kMostContextParallel = 16;

std::vector<ParallelCandidate> unpipelined_candidates(const TransformerConfig& config, int64_t devices, int64_t global_batch,
                                                      int64_t devices_per_node) {
  std::vector<ParallelCandidate> out;
  for (int64_t tp : divisors(devices)) {
    // Whole query and key/value heads on each device (grouped-query attention's kv heads too).
    if (tp > devices_per_node || config.heads % tp != 0 || config.kv_heads % tp != 0) continue;
    for (int64_t positions : divisors(devices / tp))
      for (const std::string sequence_dim : {"sp", "cp"}) {
        // positions: the devices a sequence is split over, by sp (keys and values gathered) or
        // by cp (ring attention, which needs 2 chunks per device and may leave the node).
        if (positions == 1 && sequence_dim == "cp") continue;  // sp's mesh
        if (positions > 1 && sequence_dim == "sp" && (config.max_seq % positions != 0 || positions > devices_per_node)) continue;
        if (sequence_dim == "cp" && (config.max_seq % (2 * positions) != 0 || positions > kMostContextParallel)) continue;
        const int64_t dp = devices / (tp * positions);
        if (dp > global_batch) continue;
        std::vector<std::pair<std::string, int64_t>> dims;
        for (const auto& [dim, size] : {std::pair{std::string("dp"), dp}, std::pair{sequence_dim, positions}, std::pair{std::string("tp"), tp}})
          if (size > 1) dims.emplace_back(dim, size);
        if (dims.empty()) dims.emplace_back("dp", 1);
        for (bool fsdp : {false, true})
          for (bool sequence_parallel : {false, true}) {
            if ((fsdp && dp == 1) || (sequence_parallel && tp == 1)) continue;
            ParallelCandidate c;
            c.mesh = dims;
            c.fsdp = fsdp;
            c.sequence_parallel = sequence_parallel;
            out.push_back(std::move(c));
          }
      }
  }
  return out;
}

// For a model with MoE layers, each candidate again with expert parallelism: ep borrowing e of
// its dp ranks (torchtitan's dp2ep: the tokens stay split over dp x ep, the experts split over
// ep), for every e > 1 dividing dp and the experts.
std::vector<ParallelCandidate> with_expert_parallelism(std::vector<ParallelCandidate> candidates, const TransformerConfig& config) {
  if (!config.moe) return candidates;
  std::vector<ParallelCandidate> out = candidates;
  for (const ParallelCandidate& c : candidates) {
    const auto dp = std::find_if(c.mesh.begin(), c.mesh.end(), [](const auto& d) { return d.first == "dp"; });
    if (dp == c.mesh.end()) continue;
    for (int64_t e : divisors(dp->second)) {
      if (e == 1 || config.moe->num_experts % e != 0 || (c.fsdp && dp->second == e)) continue;
      ParallelCandidate with_ep = c;
      auto at = with_ep.mesh.begin() + (dp - c.mesh.begin());
      if (dp->second == e) at = with_ep.mesh.erase(at);
      else (at++)->second = dp->second / e;
      with_ep.mesh.insert(at, {"ep", e});
      out.push_back(std::move(with_ep));
    }
  }
  return out;
}

// MoE routing as the plans assume it: as the model bounds it, or, where it leaves the bound at
// the worst case (receive_capacity 0), balanced (each device's experts receive one device's
// share of the assignments). True where it was left at the worst case.
bool assume_balanced_routing(TransformerConfig& config) {
  if (!config.moe || config.moe->receive_capacity != 0) return false;
  config.moe->receive_capacity = 1.0;
  return true;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> parse_plan_mesh(const std::string& text) {
  static const std::vector<std::string> known = {"pp", "dp", "ep", "sp", "cp", "tp"};
  std::vector<std::pair<std::string, int64_t>> dims = parse_mesh_dims(text, known, "plan");
  std::erase_if(dims, [](const auto& d) { return d.second == 1; });
  // pp outermost and tp innermost, as the search lists them (tp's devices share a node).
  std::stable_sort(dims.begin(), dims.end(), [&](const auto& a, const auto& b) {
    return std::find(known.begin(), known.end(), a.first) < std::find(known.begin(), known.end(), b.first);
  });
  if (dims.empty()) dims.emplace_back("dp", 1);
  return dims;
}

ParallelCandidate evaluate_plan(const TransformerConfig& model, ParallelCandidate plan, const Hardware& hardware, int64_t memory_bytes_per_device,
                                int64_t global_batch, int64_t devices_per_node) {
  int64_t devices = 1;
  for (const auto& [dim, size] : plan.mesh) devices *= size;
  check_search_arguments(devices, devices_per_node, memory_bytes_per_device, global_batch);
  if (global_batch < 1) throw Error("evaluate_plan: the batch must be at least one sequence");
  const std::string name = plan.name();
  auto refuse = [&](const std::string& why) { throw Error("plan " + name + ": " + why); };
  const int64_t pp = plan.size("pp"), tp = plan.size("tp"), ep = plan.size("ep"), replicas = plan.size("dp") * ep;
  if (model.layers % pp != 0) refuse(fmt::format("pp={} does not divide the model's {} layers", pp, model.layers));
  if (model.heads % tp != 0 || model.kv_heads % tp != 0)
    refuse(fmt::format("tp={} does not divide the {} heads and {} kv heads", tp, model.heads, model.kv_heads));
  if (ep > 1 && !model.moe) refuse("ep needs a model with MoE layers");
  if (ep > 1 && model.moe->num_experts % ep != 0) refuse(fmt::format("ep={} does not divide the {} experts", ep, model.moe->num_experts));
  if (global_batch % replicas != 0) refuse(fmt::format("the batch of {} sequences does not split over dp x ep = {}", global_batch, replicas));
  if (plan.microbatches < 1 || (global_batch / replicas) % plan.microbatches != 0)
    refuse(fmt::format("a replica's {} sequences do not split into {} microbatches", global_batch / replicas, plan.microbatches));
  if (plan.fsdp && plan.size("dp") == 1) refuse("fsdp shards over dp, and the plan has no dp");
  if (plan.sequence_parallel && tp == 1) refuse("sequence parallelism runs on tp, and the plan has no tp");
  TransformerConfig config = model;
  assume_balanced_routing(config);
  Screening(config, hardware, devices_per_node, memory_bytes_per_device, global_batch).plan_whole(plan);
  return plan;
}

ParallelPlanSearch auto_parallelize(Module& model, int64_t devices, Hardware hardware, int64_t memory_bytes_per_device,
                                    int64_t global_batch, int64_t devices_per_node, bool search_precision) {
  const auto started = std::chrono::steady_clock::now();
  const Transformer* transformer = dynamic_cast<const Transformer*>(&model);
  if (!transformer)
    throw Error("auto_parallelize: this module is not a Transformer (nn/transformer.hpp); describe any other model by its build, "
                "parallelize, batch and loss functions and plan that (ParallelizableModel, plan/parallelizable_model.hpp)");
  check_search_arguments(devices, devices_per_node, memory_bytes_per_device, global_batch);
  TransformerConfig config = transformer->config();
  const bool assumes_balanced_routing = assume_balanced_routing(config);
  if (global_batch == 0) global_batch = devices;
  const Screening screening{config, hardware, devices_per_node, memory_bytes_per_device, global_batch};
  PlanSearchOptions options{.memory_bytes_per_device = memory_bytes_per_device, .global_batch = global_batch, .accumulate = true,
                            .started = started};
  // The model's precision, and where that is f32, FSDP2's bf16 policy too (f32 master weights,
  // f32 gradient sums): bf16 halves activations and runs GEMMs at the matrix units' bf16 rate.
  options.precisions = {config.mixed_precision};
  if (search_precision && !config.mixed_precision) options.precisions.push_back(kBf16MixedPrecision);
  // Stages of blocks (nn/pipelined_transformer.hpp) beside the unpipelined shapes; with MoE
  // layers, each again with ep borrowing dp ranks.
  std::vector<ParallelCandidate> shapes = unpipelined_candidates(config, devices, global_batch, devices_per_node);
  for (ParallelCandidate& c : pipelined_candidates(config, devices, global_batch, devices_per_node)) shapes.push_back(std::move(c));
  shapes = with_expert_parallelism(std::move(shapes), config);
  ParallelPlanSearch search = search_plans(screening, shapes, options);
  const ParallelCandidate& best = search.best;
  if (best.fits && config.moe && std::any_of(best.mesh.begin(), best.mesh.end(), [](const auto& d) { return d.first == "ep"; })) {
    // The routing the plan assumed, and the peak where the busiest device's experts receive
    // kReportedImbalance times their share.
    Screening unbalanced = screening;
    unbalanced.config.moe->receive_capacity = std::max(config.moe->receive_capacity, kReportedImbalance);
    ParallelCandidate at_imbalance = best;
    unbalanced.plan_whole(at_imbalance);
    search.routing_imbalance = kReportedImbalance;
    search.peak_at_imbalance = at_imbalance.report.peak_bytes;
    search.why += fmt::format("; MoE routing {}: at {:.2f}x that on the busiest device the peak is {}",
                              assumes_balanced_routing ? "assumed balanced (each device's experts receive one device's share)"
                                                       : fmt::format("bounded at {:.2f}x a device's share (moe.receive_capacity)",
                                                                     config.moe->receive_capacity),
                              unbalanced.config.moe->receive_capacity, bytes_text(double(search.peak_at_imbalance)));
    search.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  return search;
}

std::string ParallelPlanSearch::to_string() const {
  std::string out = fmt::format("chose {}\n  {}\n  searched {} candidates in {:.1f} s{}\n", best.name(), why, candidates.size(), search_seconds,
                                over_memory.empty() ? "" : fmt::format(" ({} more over memory, not planned)", over_memory.size()));
  out += fmt::format("  {:<54}{:>14}{:>14}{:>20}{:>14}\n", "plan", "step (pred.)", "peak/device", "collectives/device", "FLOP/device");
  for (const ParallelCandidate& c : candidates)
    out += fmt::format("  {:<54}{:>14}{:>14}{:>20}{:>14.3g}  {}{}\n", c.name(), seconds_text(c.report.predicted_seconds),
                       bytes_text(double(c.report.peak_bytes)), bytes_text(double(c.report.collective_bytes)), c.report.flops,
                       c.fits ? "fits" : c.slower ? "slower" : "too big",
                       c.exact ? "" : c.lower_bound || c.slower ? " (at least: one block)" : " (from 1-2 blocks)");
  return out;
}

std::string ParallelPlanSearch::to_json(bool breakdown) const {
  nlohmann::json j = {{"best", best.name()}, {"why", why}, {"search_seconds", search_seconds}, {"pruned", pruned}, {"left_slower", left_slower}, {"over_memory", over_memory}};
  if (routing_imbalance > 0) j["moe_routing"] = {{"imbalance", routing_imbalance}, {"peak_bytes", peak_at_imbalance}};
  j["candidates"] = nlohmann::json::array();
  for (const ParallelCandidate& c : candidates) {
    nlohmann::json mesh = nlohmann::json::object();
    for (const auto& [dim, size] : c.mesh) mesh[dim] = size;
    j["candidates"].push_back({{"name", c.name()}, {"mesh", mesh}, {"sequence_parallel", c.sequence_parallel}, {"fsdp", c.fsdp},
                               {"activation_checkpointing", c.activation_checkpointing ? checkpoint_policy_name(*c.activation_checkpointing) : "none"},
                               {"precision", c.mixed_precision ? precision_name(c.mixed_precision->param_dtype) : "f32"},
                               {"microbatches", c.microbatches}, {"exact", c.exact}, {"lower_bound", c.lower_bound}, {"slower", c.slower}, {"fits", c.fits}, {"predicted_seconds", c.report.predicted_seconds},
                               {"peak_bytes", c.report.peak_bytes}, {"collective_bytes", c.report.collective_bytes},
                               {"flops", c.report.flops}});
  }
  if (breakdown) j["breakdown"] = nlohmann::json::parse(best.report.to_json());
  return j.dump(2);
}

}  // namespace tessera
