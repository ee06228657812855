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
// stacked work, the analytic GPipe bubble. With V virtual stages per device (LoopedBFS) the
// microbatches go round the ring V times, P at a time: M V + P - 1 ticks of V times shorter
// work. The backward is autodiff's, in reverse tick order (every forward, then every backward).
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

// torch.distributed.pipelining's schedule names: GPipe (one stage per device; every forward,
// then every backward), 1F1B (one stage per device; each device's backward of a microbatch
// follows its forward 2 (P - 1 - s) ticks later, recomputing the stage), LoopedBFS (several
// virtual stages per device, breadth first: the microbatches loop round the devices once per
// virtual stage, which divides the bubble by the virtual stage count) and Interleaved1F1B
// (LoopedBFS's ticks with 1F1B's recomputing backward).
enum class PipelineSchedule { GPipe, OneFOneB, LoopedBFS, Interleaved1F1B };
// "gpipe", "1f1b", "looped-bfs", "interleaved-1f1b"
const char* pipeline_schedule_name(PipelineSchedule schedule);
// Whether the schedule runs several virtual stages per device.
inline bool pipeline_schedule_loops(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::LoopedBFS || schedule == PipelineSchedule::Interleaved1F1B;
}
PipelineSchedule parse_pipeline_schedule(const std::string& name);  // Error naming the known ones

// The number of pipeline stages on `mesh`: the size of `mesh_dim`, 1 when the mesh has none.
int64_t pipeline_stage_count(const Mesh& mesh, const std::string& mesh_dim = "pp");

// How many of `blocks` each of `stages` stages runs: as even as possible, the first stages
// taking one more when they do not divide (torch's pipeline split of uneven layer counts).
// Error unless 1 <= stages <= blocks.
std::vector<int64_t> split_blocks(int64_t blocks, int64_t stages);

// What device `stage` runs at a tick: microbatch (-1: none, the bubble) at virtual stage v.
struct PipelineSlot {
  int64_t microbatch = -1;
  int64_t virtual_stage = 0;
};

// The looped schedule (GPipe when virtual_stages is 1): microbatch m = r P + i (the i-th of
// round r, P at a time) enters device 0 at tick r V P + i and runs virtual stage v on device s at
// tick r V P + v P + i + s; device P - 1 hands it back to device 0 for the next virtual stage
// (the ring shift's wrap). Model chunk v P + s lives on device s as its virtual stage v.
class PipelineTimetable {
 public:
  PipelineTimetable(int64_t stages, int64_t virtual_stages, int64_t microbatches);
  int64_t stages() const { return stages_; }
  int64_t virtual_stages() const { return virtual_stages_; }
  int64_t microbatches() const { return microbatches_; }
  int64_t ticks() const { return ticks_; }
  // MeshError naming the stage (or tick) and the count for one that does not exist: never an
  // idle slot.
  PipelineSlot slot(int64_t tick, int64_t stage) const;
  // The tick at which device `stage` runs microbatch m's virtual stage v (slot's inverse);
  // MeshError for a stage, virtual stage or microbatch that does not exist.
  int64_t tick_of(int64_t microbatch, int64_t virtual_stage, int64_t stage) const;
  // The tick at which the last virtual stage finishes microbatch m (on device P - 1).
  int64_t finishing_tick(int64_t microbatch) const { return tick_of(microbatch, virtual_stages_ - 1, stages_ - 1); }
  // Idle device-ticks over all device-ticks: (P - 1) / (M + P - 1) for GPipe.
  double bubble_fraction() const;

 private:
  int64_t stages_, virtual_stages_, microbatches_, ticks_;
};

// The layout of a stacked value [P, ...] of rank `rank` on `mesh`: axis 0 over `mesh_dim` (when
// the mesh has it), `batch_axis` over "dp" and "ep" (expert parallelism borrows data-parallel
// ranks) and the axis after it (the sequence) over "sp" and "cp" (when the mesh has them and
// batch_axis >= 0), the rest replicated.
Layout stacked_layout(const Mesh& mesh, int64_t rank, int64_t batch_axis, const std::string& mesh_dim = "pp");

// Each stage's index along the stacked axis, [P] int32, laid out as stacked_layout says. Graph
// nodes are hash-consed (dsl/node.hpp): indices of different `tag`s are different nodes of equal
// values (tagged_iota), and so are the masks built on them, which keeps values selected at
// different ticks apart (see this_tick in nn/pipelined_transformer.cpp) while every tick's
// kernels stay one kernel (the tag is not compiled in).
Tensor stage_indices(const Mesh& mesh, const std::string& mesh_dim = "pp", int64_t tag = 0);

// A [P] bool mask broadcast to `shape` ([P, ...]): stage s is selected when selected[s];
// `indices` are stage_indices(..).
Tensor stage_mask(const Tensor& indices, const std::vector<bool>& selected, const std::vector<int64_t>& shape);

// A [P] bool tensor computed in the program (which stages a tick program runs, from a counter
// it reads: nn/pipeline_tick_loop.hpp) broadcast to `shape` ([P, ...]).
Tensor stage_mask(const Tensor& selected, const std::vector<int64_t>& shape);

// [P, shape...] with `value` in every stage's slot.
Tensor on_every_stage(const Tensor& value, int64_t stages);

// Stage `stage`'s slot of a stacked value, on every device. Over a `mesh_dim` sharding the
// stages it is the sum over stages of the value kept on that stage only: a Partial sum that one
// all_reduce of one slot completes (about 2 slots received per device), where slicing the stacked
// value gathered every stage's slot (P - 1 of them). Adding zeros keeps the slot's bits.
Tensor stage_slot(const Tensor& stacked, int64_t stage, const std::string& mesh_dim = "pp");

// The stacked value with every stage's block moved to the next stage (the last one's to stage
// 0): a shift on `mesh_dim`, one point-to-point transfer per device. The identity with no such dim.
Tensor shift_to_next_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim = "pp");
// The other way round: every stage's block to the stage before (the first one's to the last).
Tensor shift_to_previous_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim = "pp");

struct PipelineSpec {
  std::string mesh_dim = "pp";
  int64_t microbatches = 1;
  int64_t virtual_stages = 1;
  // Stage 0's input for microbatch m (an embedding, say), not stacked.
  std::function<Tensor(int64_t microbatch)> first;
  // Tick `tick`'s work: every device's blocks on the stacked state [P, first's shape...], device
  // s running its virtual stage slots[s].virtual_stage on microbatch slots[s].microbatch (-1:
  // idle, the bubble, computing on whatever its state holds). The 1F1B schedules' recomputing
  // backward calls it again with ticks numbered from ticks() on.
  std::function<Tensor(const Tensor& stacked, int64_t tick, const std::vector<PipelineSlot>& slots)> stages;
  // Layout of the stacked state (stacked_layout with the batch axis over dp, typically).
  Layout state_layout;
};

// The last virtual stage's output for each microbatch, in microbatch order, after the looped
// schedule of PipelineTimetable (GPipe with one virtual stage). Differentiable: autodiff gives
// the backward, every tick's in reverse.
std::vector<Tensor> run_pipeline(const PipelineSpec& spec);

// The 1F1B schedules' loss and gradients (Interleaved1F1B with virtual stages), built by the
// schedule itself: autodiff alone would order every backward after every forward. The forward
// ticks are GPipe's (LoopedBFS's); the backward runs the same timetable on the ring reversed, so
// device s works on the microbatch whose cotangent the device after it (the loss, on the last
// device's last virtual stage) handed on. As that microbatch's forward on device s was at a
// tick of its own (different for each device), the backward recomputes the stage from the stage
// input the forward kept (activation checkpointing per stage): the forward keeps only stage
// inputs, the backward one tick's activations. With one stage (gradient accumulation, no pp) a
// microbatch's backward follows its forward at once and differentiates it: nothing recomputed. Gradient terms are added in microbatch order on
// every device, so any stage count gives one device's bits (not GPipe's: its order differs).
struct PipelineLoss {
  // Microbatch m's loss from the last stage's output; the step's loss is their mean.
  std::function<Tensor(const Tensor& last_output, int64_t microbatch)> loss;
  std::vector<Tensor> first_parameters, stage_parameters, last_parameters;
};
struct PipelineGradients {
  Tensor loss;
  std::vector<Tensor> first, stages, last;  // gradients of each group, in the given order
};
PipelineGradients run_pipeline_1f1b(const PipelineSpec& spec, const PipelineLoss& loss);

// The microbatch `m` of `count` of a batch whose axis 0 holds the examples: every count-th
// example from m on (examples m, m + count, ...), so each dp shard cuts its own examples and
// nothing moves. Error unless count divides the batch.
Tensor microbatch(const Tensor& batch, int64_t m, int64_t count);
// The same microbatch chosen at run time: `index` is an i32 scalar holding m, so one program
// serves every microbatch (a host loop over them, nn/transformer_training_step.hpp). The other
// microbatches are masked to zeros and summed away, which keeps every value exact.
Tensor microbatch(const Tensor& batch, const Tensor& index, int64_t count);

}  // namespace tessera
