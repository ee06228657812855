// The GPT sample's training step as one object: a Gpt on a mesh, split by the mesh's dims
// (dp: batch, sp: sequence positions, tp: Megatron's plan, with its sequence parallelism if
// asked; fully sharded over dp if asked), AdamW, and the jit'd step (forward, loss, backward,
// gradient clipping at 1.0, AdamW). Planning (nn/auto_parallelize.hpp), the planning benchmark
// and the tests build the same step from it.
#pragma once

#include <functional>
#include <vector>

#include "jit/jit_function.hpp"
#include "nn/adamw.hpp"
#include "nn/gpt.hpp"

namespace tessera {

class GptTrainingStep {
 public:
  GptTrainingStep(const GptConfig& config, const Mesh& mesh, bool sequence_parallel = false, bool fsdp = false);
  GptTrainingStep(const GptTrainingStep&) = delete;
  GptTrainingStep& operator=(const GptTrainingStep&) = delete;

  // One step on a batch of token ids and next-token targets [B, T]; returns the loss.
  Tensor operator()(const Tensor& ids, const Tensor& targets) { return step_(ids, targets); }
  PlanReport plan(const Tensor& ids, const Tensor& targets) { return step_.plan(ids, targets); }
  std::shared_ptr<const Executable> executable(const Tensor& ids, const Tensor& targets) { return step_.executable(ids, targets); }

  // How a batch [B, T] is laid out on `mesh`: over dp by sequence, over sp by position.
  static Layout batch_layout(const Mesh& mesh);
  Gpt& model() { return model_; }

 private:
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  Gpt model_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  JitFunction<Step> step_;
};

}  // namespace tessera
