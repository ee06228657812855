// Any model auto_parallelize can plan, described as torchtitan's TrainSpec describes one: how to
// build it on a mesh, its parallelize function (tensor parallelism with parallelize_module,
// fully_shard, mixed precision: whatever the candidate asks), a batch and the loss. The search
// needs nothing else from the model's class: it plans the training step (the loss, its gradients,
// clipped at 1.0, AdamW) on every candidate mesh over the dims the model says it supports, with
// the options it supports, and picks as for a Transformer (plan/auto_parallelize.hpp).
//
//   ParallelizableModel mlp{.mesh_dims = {"dp", "tp"}, .fsdp = true,
//                           .build = [](const Mesh& m, const ParallelCandidate&) { return std::make_unique<Mlp>(m); },
//                           .parallelize = [](Module& model, const Mesh& m, const ParallelCandidate& c) {
//                             if (c.size("tp") > 1) parallelize_module(model, m, {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}}, "tp");
//                             if (c.fsdp) fully_shard(model, m, "dp");
//                           },
//                           .batch = ..., .loss = ...};
//   ParallelPlanSearch search = auto_parallelize(mlp, 64, hardware_profile("h100-sxm"), 80 * GiB, 512);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jit/jit_function.hpp"
#include "nn/adamw.hpp"
#include "plan/auto_parallelize.hpp"

namespace tessera {

struct ParallelizableModel {
  // The mesh dims the model can be split over, in the order its meshes list them, from "dp",
  // "ep", "sp", "cp" and "tp" (tp and sp stay inside a node; dp and ep split the batch).
  // Pipelines are the Transformer's (nn/pipelined_transformer.hpp).
  std::vector<std::string> mesh_dims = {"dp"};
  // The options the model's functions honour, searched only where they do.
  bool fsdp = false;                      // parallelize shards parameters over dp if c.fsdp
  bool sequence_parallel = false;         // parallelize applies c.sequence_parallel on tp
  bool activation_checkpointing = false;  // build recomputes as c.activation_checkpointing says
  bool mixed_precision = false;           // parallelize applies c.mixed_precision (bf16 with f32 masters)

  // The model on `mesh` (an abstract one while planning: nothing is allocated), for candidate `c`.
  std::function<std::unique_ptr<Module>(const Mesh& mesh, const ParallelCandidate& c)> build;
  // Splits the built model as `c` says (torchtitan's parallelize_fn); may be empty for a model
  // searched over dp alone.
  std::function<void(Module& model, const Mesh& mesh, const ParallelCandidate& c)> parallelize;
  // One step's batch of `global_batch` samples laid out on `mesh` (dp and ep splitting samples).
  std::function<std::vector<Tensor>(const Mesh& mesh, int64_t global_batch)> batch;
  // The loss of `model` on `batch`.
  std::function<Tensor(Module& model, const std::vector<Tensor>& batch)> loss;
  // Optional: false drops a candidate the model cannot run (tp not dividing its heads, say).
  std::function<bool(const ParallelCandidate& c)> accepts;

  // Error naming what is missing or not understood.
  void check() const;
};

// The training step of a ParallelizableModel split as candidate `c` on `mesh` (a real mesh or an
// abstract one): the loss on a batch, its gradients, clipped at 1.0, and an AdamW update (the
// Transformer's optimizer settings, nn/transformer_training_step.hpp).
class ModelTrainingStep {
 public:
  ModelTrainingStep(const ParallelizableModel& spec, const ParallelCandidate& c, const Mesh& mesh);
  ModelTrainingStep(const ModelTrainingStep&) = delete;
  ModelTrainingStep& operator=(const ModelTrainingStep&) = delete;

  Tensor operator()(const std::vector<Tensor>& batch);  // one step; returns the loss
  PlanReport plan(const std::vector<Tensor>& batch);
  Module& model() { return *model_; }

 private:
  std::vector<Tensor> trace(const std::vector<Tensor>& batch);
  ParallelizableModel spec_;
  std::unique_ptr<Module> model_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  detail::TraceCache step_;
};

// The plan of one training step of `model` split as `c` (its mesh built on `hardware`) on a batch
// of `global_batch` samples.
PlanReport plan_training_step(const ParallelizableModel& model, const ParallelCandidate& c, const Hardware& hardware,
                              int64_t devices_per_node, int64_t global_batch);

}  // namespace tessera
