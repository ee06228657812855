// auto_parallelize: the fastest way to train a model on `devices` devices of `hardware` within a
// memory budget, chosen by planning (plan/plan_report.hpp), nothing run. It searches the mesh
// factorizations dp x sp x tp and dp x cp x tp (tp and sp inside a node; cp: ring attention,
// dsl/ring_attention.hpp), Megatron's sequence parallelism on tp,
// fully sharded parameters over dp and the precision (the model's, and bf16 mixed precision
// where the model is f32), planning the training step (forward, loss, backward, gradient
// clipping, AdamW) of each on an abstract mesh (abstract_mesh). A candidate that does not fit
// is planned again with its blocks' activations recomputed (dsl/checkpoint.hpp): selectively,
// then fully; and with gradient accumulation over 2, then about twice as many microbatches;
// both only add time, so they are tried only where memory asks for them, and not where the
// candidate is no faster than the fastest plan that fits without them (ParallelPlanSearch::pruned
// counts those). Pipeline stages over a pp dim
// (nn/pipelined_transformer.hpp) are searched too, with the 1F1B schedule, whose peak holds the stage
// inputs of the microbatches in flight rather than every microbatch's, over 2P microbatches and,
// for the few whose bubble may hide a faster plan, up to 4P. Transformer blocks
// repeat, so each candidate is screened from plans of one- and two-block models (what one more
// block adds, times the depth; with pp, one and two blocks per stage; one block alone where it
// already exceeds the budget); the front runners are then planned at full depth until one
// fits, and the winner is the fastest that fits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsl/checkpoint.hpp"
#include "dsl/hardware.hpp"
#include "dsl/mesh.hpp"
#include "plan/plan_report.hpp"
#include "nn/mixed_precision_policy.hpp"
#include "nn/module.hpp"

namespace tessera {

struct ParallelCandidate {
  std::vector<std::pair<std::string, int64_t>> mesh;  // dims of size > 1, "pp", "dp", "ep", "sp" or "cp", "tp" in that order
  int64_t microbatches = 1;                           // with pp: the 1F1B schedule over this many; without: gradient accumulation
  bool sequence_parallel = false;                     // Megatron's, on tp
  bool fsdp = false;                                  // parameters fully sharded over dp
  std::optional<CheckpointPolicy> activation_checkpointing;  // each block's, or none
  std::optional<MixedPrecisionPolicy> mixed_precision;       // the GPT's (GptConfig::mixed_precision)
  PlanReport report;                                  // extrapolated from one and two blocks (no steps listed), or exact
  bool exact = false;                                 // planned at full depth
  bool lower_bound = false;                           // one block's plan only: over the budget already
  bool fits = false;                                  // peak bytes within the budget
  // A step time no plan of it beats, known from a first, cheaper plan (one block's: its blocks'
  // share of that step, times the model's blocks); 0: not known.
  double least_seconds = 0;
  // Left at that first plan: least_seconds was already no faster than a plan that fits, so its
  // report is the first plan's, with least_seconds as its time (both lower bounds).
  bool slower = false;
  bool pipelined() const { return !mesh.empty() && mesh.front().first == "pp"; }
  int64_t size(std::string_view dim) const;  // the mesh dim's size; 1 where the mesh has no such dim
  std::string name() const;  // "dp=16,tp=8 +seq-parallel +fsdp +recompute-full +bf16", "pp=8,dp=16,tp=8 +1f1b x16"
};

// Plans predicted within this fraction of the fastest are a tie: the time model's own error is
// several times larger (docs/PLANNING.md), and on 4 virtual devices dp=4 +fsdp, predicted 0.2%
// faster than dp=4, ran 3-11% slower (bench/auto_parallel_bench.cpp).
inline constexpr double kPlanTie = 0.01;

// The routing imbalance an MoE plan's peak is also reported at (ParallelPlanSearch).
inline constexpr double kReportedImbalance = 1.25;

// Bytes the device holding the most holds in every training step of `config` planned as `c`,
// known without planning: when the optimizer steps, the f32 parameters (master weights under
// mixed precision), their f32 gradients and AdamW's two f32 moments, 16 bytes a parameter, split
// at most over every dim of c's mesh but dp without FSDP, over every dim with it. The search
// plans no candidate this exceeds the budget with (ParallelPlanSearch::over_memory).
int64_t least_training_bytes(const struct TransformerConfig& config, const ParallelCandidate& c);

// The collective calls of one step on the most loaded device, all kinds together.
int64_t collective_calls(const PlanReport& report);

// Of the fitting candidates planned at full depth (not pipelined) that tie with the fastest, the
// one with the fewest collective calls goes first. `sorted`: fitting ones fastest first, as
// auto_parallelize sorts them. Returns the fastest when it was passed over.
std::optional<ParallelCandidate> prefer_fewer_collective_calls(std::vector<ParallelCandidate>& sorted);

struct ParallelPlanSearch {
  // The fastest candidate that fits (of those at full depth predicted within 1% of it, a tie
  // for the time model, the one with the fewest collective calls); when none fits, the one with
  // the smallest peak, with best.fits false and `why` saying so.
  ParallelCandidate best;
  std::vector<ParallelCandidate> candidates;  // every one tried: best first, then fastest first
  std::string why;                            // why the winner won
  int64_t pruned = 0;                         // recomputing candidates not planned: they could not win
  int64_t left_slower = 0;                    // candidates left at their first plan (ParallelCandidate::slower)
  // Candidates not planned: their parameters, gradients and optimizer state alone exceed the budget
  // (CandidatePlanner::least_bytes), so neither they nor their recomputing variants could fit.
  std::vector<std::string> over_memory;
  double search_seconds = 0;
  // MoE models planned with expert parallelism: the routing imbalance the best plan is planned
  // at again (the busiest device's experts receiving this multiple of one device's share of the
  // assignments) and its peak there; 0 otherwise.
  double routing_imbalance = 0;
  int64_t peak_at_imbalance = 0;
  std::string to_string() const;              // the table
  // The search as JSON; with `breakdown`, the chosen plan's report (PlanReport::to_json) as the
  // key "breakdown" (samples/plan --json --breakdown).
  std::string to_json(bool breakdown = false) const;
};

// The plan of the GPT sample's training step (forward, loss, backward, gradient clipping at
// 1.0, AdamW) of a model of `config` (its activation checkpointing included) on `mesh` (dims
// named dp, sp or cp, tp), a batch of
// `global_batch` sequences of config.context tokens split over dp by sequence and over sp by
// position.
PlanReport plan_gpt_training_step(const struct GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                  int64_t global_batch);

// The same for any Transformer configuration (nn/transformer_training_step.hpp), its batch of
// config.max_seq tokens a sequence, dp and ep splitting the sequences; microbatches > 1:
// gradient accumulation over that many.
PlanReport plan_transformer_training_step(const struct TransformerConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                          int64_t global_batch, int64_t microbatches = 1);

// The same with the blocks in stages over the mesh's pp dim (Megatron's sequence parallelism on
// tp if asked), trained by the 1F1B schedule over `microbatches`
// (nn/pipelined_transformer_training_step.hpp); without a pp dim, one stage of it.
PlanReport plan_pipelined_transformer_training_step(const struct TransformerConfig& config, const Mesh& mesh, bool sequence_parallel,
                                                    bool fsdp, int64_t global_batch, int64_t microbatches);
// The GPT's (its TransformerConfig's).
PlanReport plan_pipelined_gpt_training_step(const struct GptConfig& config, const Mesh& mesh, bool sequence_parallel, bool fsdp,
                                            int64_t global_batch, int64_t microbatches);

// "pp=8,dp=16,tp=8": a plan's mesh dims, each named pp, dp, ep, sp, cp or tp once and sized at
// least 1, dims of size 1 left out (none at all: {"dp", 1}). Error naming what is wrong.
std::vector<std::pair<std::string, int64_t>> parse_plan_mesh(const std::string& text);

// Exactly the plan `plan` of a Transformer configuration (the samples/plan command line's
// --plan): its training step planned whole on an abstract mesh of `hardware`, over
// plan.microbatches microbatches (1F1B with a pp dim, gradient accumulation without one), its
// recomputation and precision, `global_batch` sequences a step; `fits` against the budget. MoE
// routing as auto_parallelize assumes it. Error naming the dim when the plan cannot run the
// model (pp not dividing the layers, tp the heads or kv heads, ep without MoE layers or not
// dividing the experts, the batch not splitting over dp x ep or into the microbatches).
ParallelCandidate evaluate_plan(const struct TransformerConfig& config, ParallelCandidate plan, const Hardware& hardware,
                                int64_t memory_bytes_per_device, int64_t global_batch, int64_t devices_per_node = 8);

struct ParallelizableModel;  // plan/parallelizable_model.hpp

// `model` must be a Transformer (nn/transformer.hpp; the Gpt is one): its configuration is
// planned on each candidate mesh, tp keeping whole query and key/value heads on each device.
// Pipelined candidates (nn/pipelined_transformer.hpp) too. A model with MoE layers is also
// planned with ep borrowing dp ranks, its routing balanced unless its moe.receive_capacity says
// otherwise, and the winner's peak at kReportedImbalance reported. global_batch: sequences per step (0: one per device). devices_per_node: how many
// devices share the fast links (tp stays inside a node). search_precision: where the model is
// f32, try FSDP2's bf16 mixed precision (kBf16MixedPrecision) too; false keeps the model's.
// MeshError for more devices than an abstract mesh may have (kMaxAbstractMeshDevices).
ParallelPlanSearch auto_parallelize(Module& model, int64_t devices, Hardware hardware, int64_t memory_bytes_per_device,
                                    int64_t global_batch = 0, int64_t devices_per_node = 8, bool search_precision = true);

// Any other model, described by its functions (plan/parallelizable_model.hpp): every mesh of
// `devices` over the dims it names (tp and sp within a node, dp x ep no more than the batch's
// samples, those model.accepts), with each option it supports (fsdp on dp > 1, sequence
// parallelism on tp > 1; bf16 mixed precision if search_precision; recomputation where memory
// asks), each planned whole: its plans are exact, none extrapolated.
ParallelPlanSearch auto_parallelize(const ParallelizableModel& model, int64_t devices, Hardware hardware, int64_t memory_bytes_per_device,
                                    int64_t global_batch = 0, int64_t devices_per_node = 8, bool search_precision = true);

}  // namespace tessera
