// What the planning tests share, in one process and under mpirun: the two samples' training
// steps (the MNIST MLP, the GPT) with their batches, and the check that a plan's bytes are the
// bytes a run really holds and moves on each of this client's devices.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::testing {

// The MNIST samples' MLP (784-700-500-10, ReLU, Adam) at batch 128 on a 1-D mesh: weights
// replicated with the batch sharded (mnist_dp), or the hidden units sharded (mnist_tp,
// Megatron's pairing).
class MnistTrainingStep {
 public:
  MnistTrainingStep(const Mesh& mesh, bool tensor_parallel);
  PlanReport plan() { return step_.plan(x_, labels_); }
  void run() { (void)step_(x_, labels_); }

 private:
  Dense l1_, l2_, l3_;
  std::vector<Variable> vars_;
  Adam adam_;
  JitFunction<std::function<Tensor(const Tensor&, const Tensor&)>> step_;
  Tensor x_, labels_;
};

// A batch of `batch` token ids and their next-token targets for the GPT step on `mesh`.
std::pair<Tensor, Tensor> gpt_batch(const Mesh& mesh, const GptConfig& config, int64_t batch);

// Runs `step` once (compiled, arenas allocated, first values replaced), plans it, then runs it
// again and checks, on each of `mesh`'s local devices, that the peak bytes held are the plan's
// and that the collective bytes sum to CommDebugMode's. With run-time split sizes
// (all_to_all_v, planned at its bound: CollectiveBytes::AtMost), the plan's are at least those moved.
enum class CollectiveBytes { Exact, AtMost };
void check_plan_is_measured(const Mesh& mesh, const std::function<PlanReport()>& plan, const std::function<void()>& step,
                            CollectiveBytes bytes = CollectiveBytes::Exact);

}  // namespace tessera::testing
