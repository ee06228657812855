// The 1F1B schedule (nn/pipeline.hpp) run as a host loop over tick programs, as PyTorch's and
// Megatron's pipeline schedules run one action per call rather than the whole step as one graph.
//
// With P stages and M microbatches, call n (0 <= n < M + 2P - 2) runs, on every stage at once,
// forward tick n (while n < M + P - 1) and backward tick n - P + 1 (from n = P - 1 on): each
// backward tick just after the last forward tick it reads, as run_pipeline_1f1b orders them in
// its one program. Three programs serve every call:
//   warm-up   (calls 0 .. P - 2): a forward tick only;
//   steady    (M calls): a forward tick, the loss of the microbatch that tick finishes, and a
//             backward tick fed that loss's cotangent;
//   cool-down (P - 1 calls): a backward tick only.
// Each is traced, compiled and planned once, whatever M: which stages hold a microbatch, which
// microbatch enters and which leaves are computed in the program from a call counter it reads
// and advances (a microbatch chosen at run time: microbatch(batch, index, count)).
//
// Between calls the loop carries, as Variables: the last forward tick's output (which the ring
// shift hands on), the last backward tick's input cotangent, the gradient and loss sums (added
// into in place), and the kept stage inputs. Device s keeps microbatch m's stage input from its
// forward (tick m + s) to its backward (call m + 2P - 2 - s), so the loop keeps the last 2P - 2
// ticks' inputs in slots the host moves on after each call (nothing is copied): at every call
// device s recomputes from slot 2s, the last device from the input its forward just made. A
// device then holds 2P - 2 stage inputs, what the one-program 1F1B's first device holds.
//
// The values are run_pipeline_1f1b's: the same ops in the same order, so under
// TESSERA_DETERMINISTIC=1 the gradients are bitwise the one program's (test_pipeline). One
// virtual stage per device (1F1B, not the interleaved schedule), and stages that read no
// per-tick constants beyond their input (no MoE balancing, which weighs busy stages only).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dsl/variable.hpp"
#include "nn/pipeline.hpp"

namespace tessera {

// What the loop needs of a model: its three parts and how to run them on a microbatch chosen at
// run time.
struct PipelineTickModel {
  std::string mesh_dim = "pp";
  Layout state_layout;  // of the stacked activations the stages hand on
  // Stage 0's input for the microbatch an i32 scalar names (not stacked).
  std::function<Tensor(const Tensor& index)> first;
  // Every stage's blocks on the stacked state; `tick` only keeps the nodes of a program's two
  // ticks apart (0: its forward, 1: its backward's recomputation).
  std::function<Tensor(const Tensor& stacked, int64_t tick)> stages;
  // The loss of the microbatch an i32 scalar names, from the last stage's output.
  std::function<Tensor(const Tensor& last_output, const Tensor& index)> loss;
  std::vector<Tensor> first_parameters, stage_parameters, last_parameters;
};

enum class PipelineTickPhase { WarmUp, Steady, CoolDown };

class PipelineTickLoop {
 public:
  // Error unless stages >= 2 and microbatches >= 1.
  PipelineTickLoop(int64_t stages, int64_t microbatches);
  int64_t stages() const { return stages_; }
  int64_t microbatches() const { return microbatches_; }
  // How many calls of `phase` a step runs: P - 1, M and P - 1.
  int64_t calls(PipelineTickPhase phase) const;
  PipelineTickPhase phase_of_call(int64_t call) const;

  // Makes the carried state, zeros in the layouts the steady program computes it in (a graph
  // built for its layouts, never run): before the first call or plan. Later calls do nothing.
  void prepare(const PipelineTickModel& model);
  bool prepared() const { return carried_.has_value(); }

  // Traces one call of `phase` inside a jit function: reads the carried state, assigns its new
  // values and the counter's, and returns the stage input the call's forward made ({} in the
  // cool-down), which the host hands to advance().
  std::vector<Tensor> call(PipelineTickPhase phase, const PipelineTickModel& model);
  // On the host after each call: the kept inputs move on one slot, the call's (if any) entering.
  void advance(const std::vector<Tensor>& kept_input);
  // The kept-input slots no call reads as they stand (slot 2s is read, for every stage s but
  // the last): held all the same, which a plan of the calls must be told
  // (plan_call_sequence's also_held).
  std::vector<Variable> slots_read_later() const;

  // In the update program: the step's loss (the microbatches' mean) and the gradients of each
  // part in the model's order, handed out as run_pipeline_1f1b hands them out (in each
  // parameter's layout, a sum pending over dp reduced once); `zero_sums` then zeroes the sums
  // for the next step.
  PipelineGradients sums(const std::vector<Tensor>& first_parameters, const std::vector<Tensor>& stage_parameters,
                         const std::vector<Tensor>& last_parameters) const;
  void zero_sums();

 private:
  struct Carried {
    Variable counter;          // i32: the call number within the step
    Variable forward_output;   // the last forward tick's stacked output
    Variable input_cotangent;  // the last backward tick's d stage input
    std::vector<Variable> kept;  // the last 2P - 2 forward ticks' stage inputs, oldest first
    Variable loss_sum;
    std::vector<Variable> first_sums, stage_sums, last_sums;
  };
  struct CallValues;
  // Builds one call's graph from the carried values: the body of call(), and the probe prepare()
  // takes the sums' layouts from.
  CallValues call_values(PipelineTickPhase phase, const PipelineTickModel& model) const;

  int64_t stages_, microbatches_;
  std::optional<Carried> carried_;
};

}  // namespace tessera
