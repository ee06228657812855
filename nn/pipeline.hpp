// Pipeline parallelism on a `pp` mesh dim, as one SPMD program (GSPMD's and praxis's circular
// pipeline, torch.distributed.pipelining's GPipe schedule).
//
// A model's repeated part is split into stages by blocks; stage s's blocks hold their
// parameters stacked along a leading axis of extent P (the pp dim's size), sharded over pp, so
// each device holds its own stage's weights. The batch is cut into microbatches. At every tick
// each stage runs its blocks on the microbatch it holds (one stacked computation over the
// leading axis: no device waits for another inside a tick), then hands its output to the next
// stage, a ring shift on the pp dim (point-to-point transfers of one activation). Stage 0 takes
// a new microbatch at each of the first M ticks; the last stage's output of microbatch m
// appears at tick m + P - 1. M + P - 1 ticks in all: the bubble is (P - 1) / (M + P - 1) of the
// stacked work, the analytic GPipe bubble. The backward is autodiff's, in reverse tick order
// (GPipe: every forward, then every backward).
//
// The whole schedule is traced into the step's one program, so a rank runs all its
// microbatches, transfers and collectives from one executable. The other mesh dims (dp, tp)
// keep their meaning: the stacked state's batch axis is sharded over dp and stage blocks may
// shard their weights over tp, in global view, as anywhere else.
//
// The same code on a mesh with no pp dim runs one stage (P = 1): gradient accumulation over
// the microbatches. Under TESSERA_DETERMINISTIC=1 its losses and gradients are bitwise those of
// every pp mesh with the same microbatches (test_pipeline).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

// torch.distributed.pipelining's schedule names. GPipe only so far (docs/PLANNING.md names
// what the others need).
enum class PipelineSchedule { GPipe };
const char* pipeline_schedule_name(PipelineSchedule schedule);  // "gpipe"
PipelineSchedule parse_pipeline_schedule(const std::string& name);  // Error naming the known ones

// The number of pipeline stages on `mesh`: the size of `mesh_dim`, 1 when the mesh has none.
int64_t pipeline_stage_count(const Mesh& mesh, const std::string& mesh_dim = "pp");

// How many of `blocks` each of `stages` stages runs: as even as possible, the first stages
// taking one more when they do not divide (torch's pipeline split of uneven layer counts).
// Error unless 1 <= stages <= blocks.
std::vector<int64_t> split_blocks(int64_t blocks, int64_t stages);

// The layout of a stacked value [P, ...] of rank `rank` on `mesh`: axis 0 over `mesh_dim` (when
// the mesh has it), `batch_axis` over "dp" (when it has one and batch_axis >= 0), the rest
// replicated.
Layout stacked_layout(const Mesh& mesh, int64_t rank, int64_t batch_axis, const std::string& mesh_dim = "pp");

// Each stage's index along the stacked axis, [P] int32, laid out as stacked_layout says.
Tensor stage_indices(const Mesh& mesh, const std::string& mesh_dim = "pp");

// A [P] bool mask broadcast to `shape` ([P, ...]): stage s is selected when lo <= s <= hi.
Tensor stage_mask(const Tensor& indices, int64_t lo, int64_t hi, const std::vector<int64_t>& shape);

// The stacked value with every stage's block moved to the next stage (the last one's to stage
// 0): a shift on `mesh_dim`, one point-to-point transfer per device. The identity with no such dim.
Tensor shift_to_next_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim = "pp");

struct PipelineSpec {
  std::string mesh_dim = "pp";
  int64_t microbatches = 1;
  // Stage 0's input for microbatch m (an embedding, say), not stacked.
  std::function<Tensor(int64_t microbatch)> first;
  // Every stage's blocks on the stacked state [P, first's shape...]: one tick of work.
  std::function<Tensor(const Tensor& stacked)> stages;
  // Layout of the stacked state (stacked_layout with the batch axis over dp, typically).
  Layout state_layout;
};

// The last stage's output for each microbatch, in microbatch order, after the GPipe schedule:
// M + P - 1 ticks, stage 0 fed at the first M, the last stage's output taken at the last M.
std::vector<Tensor> run_pipeline(const PipelineSpec& spec);

// The microbatch `m` of `count` of a batch whose axis 0 holds the examples: every count-th
// example from m on (examples m, m + count, ...), so each dp shard cuts its own examples and
// nothing moves. Error unless count divides the batch.
Tensor microbatch(const Tensor& batch, int64_t m, int64_t count);

}  // namespace tessera
