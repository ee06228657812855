#include "plan/parallelizable_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "nn/clip_grad_norm.hpp"
#include "nn/training_step_adamw.hpp"
#include "plan/plan_search.hpp"

namespace tessera {
namespace {

constexpr const char* kSearchedDims[] = {"dp", "ep", "sp", "cp", "tp"};

bool inside_a_node(std::string_view dim) { return dim == "tp" || dim == "sp"; }

// Every split of `devices` over `dims` (in their order; dims of size 1 left out), tp and sp
// inside a node, dp x ep no more than the batch's samples.
void meshes(const std::vector<std::string>& dims, size_t next, int64_t devices, int64_t devices_per_node, int64_t global_batch,
            std::vector<std::pair<std::string, int64_t>>& prefix, std::vector<std::vector<std::pair<std::string, int64_t>>>& out) {
  if (next == dims.size()) {
    if (devices != 1) return;
    int64_t replicas = 1;
    for (const auto& [dim, size] : prefix)
      if (dim == "dp" || dim == "ep") replicas *= size;
    if (replicas <= global_batch) out.push_back(prefix.empty() ? std::vector<std::pair<std::string, int64_t>>{{dims.front(), 1}} : prefix);
    return;
  }
  for (int64_t size : divisors(devices)) {
    if (inside_a_node(dims[next]) && size > devices_per_node) break;
    if (size > 1) prefix.emplace_back(dims[next], size);
    meshes(dims, next + 1, devices / size, devices_per_node, global_batch, prefix, out);
    if (size > 1) prefix.pop_back();
  }
}

// A ParallelizableModel's candidates are exact: each is its whole step, planned.
class WholeStepPlanner final : public CandidatePlanner {
 public:
  WholeStepPlanner(const ParallelizableModel& model, Hardware hardware, int64_t devices_per_node, int64_t memory_bytes_per_device,
                   int64_t global_batch)
      : model_(model), hardware_(std::move(hardware)), devices_per_node_(devices_per_node),
        memory_bytes_per_device_(memory_bytes_per_device), global_batch_(global_batch) {}
  void screen(ParallelCandidate& c) const override { plan_whole(c); }
  void plan_whole(ParallelCandidate& c) const override {
    c.report = plan_training_step(model_, c, hardware_, devices_per_node_, global_batch_);
    c.exact = true;
    c.lower_bound = false;
    c.fits = c.report.peak_bytes <= memory_bytes_per_device_;
  }

 private:
  const ParallelizableModel& model_;
  Hardware hardware_;
  int64_t devices_per_node_, memory_bytes_per_device_, global_batch_;
};

// The model built on `mesh` and split as `c` says.
std::unique_ptr<Module> built(const ParallelizableModel& spec, const ParallelCandidate& c, const Mesh& mesh) {
  spec.check();
  std::unique_ptr<Module> model = spec.build(mesh, c);
  if (!model) throw Error("ParallelizableModel: build returned no model for " + c.name());
  if (spec.parallelize) spec.parallelize(*model, mesh, c);
  return model;
}

}  // namespace

void ParallelizableModel::check() const {
  std::string missing;
  for (const auto& [name, present] : {std::pair{"build", bool(build)}, std::pair{"batch", bool(batch)}, std::pair{"loss", bool(loss)}})
    if (!present) missing += std::string(missing.empty() ? "" : ", ") + name;
  if (!missing.empty()) throw Error("ParallelizableModel: no " + missing + " function given");
  if (mesh_dims.empty()) throw Error("ParallelizableModel: mesh_dims is empty; name at least \"dp\"");
  for (size_t i = 0; i < mesh_dims.size(); ++i) {
    const std::string& dim = mesh_dims[i];
    if (std::find(std::begin(kSearchedDims), std::end(kSearchedDims), dim) == std::end(kSearchedDims))
      throw Error(fmt::format("ParallelizableModel: mesh dim '{}' is not one the search splits over (dp, ep, sp, cp, tp){}", dim,
                              dim == "pp" ? "; pipelines are planned for Transformers (nn/pipelined_transformer.hpp)" : ""));
    if (std::find(mesh_dims.begin(), mesh_dims.begin() + ptrdiff_t(i), dim) != mesh_dims.begin() + ptrdiff_t(i))
      throw Error(fmt::format("ParallelizableModel: mesh dim '{}' is named twice", dim));
  }
  const bool splits = mesh_dims != std::vector<std::string>{"dp"} || fsdp || sequence_parallel || mixed_precision;
  if (splits && !parallelize)
    throw Error("ParallelizableModel: no parallelize function, but the model says it splits over more than dp (mesh_dims, fsdp, "
                "sequence_parallel or mixed_precision)");
}

ModelTrainingStep::ModelTrainingStep(const ParallelizableModel& spec, const ParallelCandidate& c, const Mesh& mesh)
    : spec_(spec), model_(built(spec_, c, mesh)), params_(model_->parameters()), optimizer_(training_step_adamw(params_)) {}

std::vector<Tensor> ModelTrainingStep::trace(const std::vector<Tensor>& batch) {
  Tensor loss = spec_.loss(*model_, batch);
  std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params_.begin(), params_.end()));
  (void)clip_grad_norm(grads, 1.0);
  optimizer_.apply(grads);
  return {loss};
}

Tensor ModelTrainingStep::operator()(const std::vector<Tensor>& batch) {
  return step_.call(batch, [this](const std::vector<Tensor>& traced) { return trace(traced); }).front();
}

PlanReport ModelTrainingStep::plan(const std::vector<Tensor>& batch) {
  return step_.plan(batch, [this](const std::vector<Tensor>& traced) { return trace(traced); });
}

PlanReport plan_training_step(const ParallelizableModel& model, const ParallelCandidate& c, const Hardware& hardware,
                              int64_t devices_per_node, int64_t global_batch) {
  const Mesh mesh = abstract_mesh(c.mesh, hardware, devices_per_node);
  ModelTrainingStep step(model, c, mesh);
  return step.plan(model.batch(mesh, global_batch));
}

ParallelPlanSearch auto_parallelize(const ParallelizableModel& model, int64_t devices, Hardware hardware, int64_t memory_bytes_per_device,
                                    int64_t global_batch, int64_t devices_per_node, bool search_precision) {
  const auto started = std::chrono::steady_clock::now();
  model.check();
  check_search_arguments(devices, devices_per_node, memory_bytes_per_device, global_batch);
  if (global_batch == 0) global_batch = devices;
  std::vector<std::vector<std::pair<std::string, int64_t>>> found;
  std::vector<std::pair<std::string, int64_t>> prefix;
  meshes(model.mesh_dims, 0, devices, devices_per_node, global_batch, prefix, found);
  std::vector<ParallelCandidate> shapes;
  for (const auto& mesh : found)
    for (bool fsdp : {false, true})
      for (bool sequence_parallel : {false, true}) {
        ParallelCandidate c;
        c.mesh = mesh;
        if ((fsdp && (!model.fsdp || c.size("dp") == 1)) || (sequence_parallel && (!model.sequence_parallel || c.size("tp") == 1))) continue;
        c.fsdp = fsdp;
        c.sequence_parallel = sequence_parallel;
        if (!model.accepts || model.accepts(c)) shapes.push_back(std::move(c));
      }
  if (shapes.empty())
    throw Error(fmt::format("auto_parallelize: no mesh of {} devices over {} that the model accepts", devices,
                            fmt::join(model.mesh_dims, " x ")));
  const WholeStepPlanner planner(model, hardware, devices_per_node, memory_bytes_per_device, global_batch);
  PlanSearchOptions options{.memory_bytes_per_device = memory_bytes_per_device, .global_batch = global_batch,
                            .recompute = model.activation_checkpointing, .started = started};
  if (search_precision && model.mixed_precision) options.precisions.push_back(kBf16MixedPrecision);
  return search_plans(planner, shapes, options);
}

}  // namespace tessera
