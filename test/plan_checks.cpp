#include "plan_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include "dsl/memory_counter.hpp"

namespace tessera::testing {
namespace {

Layout weight_layout(const Mesh& mesh, bool tensor_parallel, bool rows) {
  if (!tensor_parallel) return Layout::replicated(mesh, 2);
  return rows ? Layout({"model", UNSHARDED}, mesh) : Layout({UNSHARDED, "model"}, mesh);
}

}  // namespace

MnistTrainingStep::MnistTrainingStep(const Mesh& mesh, bool tp)
    : l1_(784, 700, weight_layout(mesh, tp, false), 1, [](const Tensor& x) { return relu(x); }),
      l2_(700, 500, weight_layout(mesh, tp, true), 2, [](const Tensor& x) { return relu(x); }),
      l3_(500, 10, weight_layout(mesh, tp, false), 3),
      vars_{l1_.weight(), l1_.bias(), l2_.weight(), l2_.bias(), l3_.weight(), l3_.bias()},
      adam_(vars_, 1e-3),
      step_([this](const Tensor& x, const Tensor& y) {
        Tensor loss = reduce_mean(sparse_softmax_cross_entropy_with_logits(y, l3_(l2_(l1_(x)))));
        adam_.apply(grad(loss, vars_));
        return loss;
      }) {
  const std::string data = mesh.dim_names().front();
  x_ = random_normal({128, 784}, 5, tp ? Layout::replicated(mesh, 2) : Layout::batch_sharded(mesh, data, 2));
  std::vector<int32_t> labels(128);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 10);
  labels_ = distribute_tensor(Array::from<int32_t>(labels, {128}), mesh, {tp ? Placement{Replicate{}} : Placement{Shard{0}}});
}

std::pair<Tensor, Tensor> gpt_batch(const Mesh& mesh, const GptConfig& config, int64_t batch) {
  const std::vector<Placement> placements = GptTrainingStep::batch_layout(mesh).placements();
  std::vector<int32_t> tokens(size_t(batch * config.context));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % size_t(config.vocab));
  const Tensor ids = distribute_tensor(Array::from<int32_t>(tokens, {batch, config.context}), mesh, placements);
  std::rotate(tokens.begin(), tokens.begin() + 1, tokens.end());
  return {ids, distribute_tensor(Array::from<int32_t>(tokens, {batch, config.context}), mesh, placements)};
}

void check_plan_is_measured(const Mesh& mesh, const std::function<PlanReport()>& plan_step, const std::function<void()>& step,
                            CollectiveBytes bytes) {
  step();  // compiled; the first step's values replaced
  const PlanReport plan = plan_step();
  REQUIRE(plan.device_ids == mesh.local_device_ids());  // a client plans its own devices
  reset_peak_memory_stats();
  CHECK(memory_stats(mesh).current_bytes == plan.input_bytes);  // the step's inputs, and nothing else
  CommDebugMode comm;
  step();
  for (size_t i = 0; i < plan.device_ids.size(); ++i) {
    CAPTURE(plan.device_ids[i]);
    CHECK(memory_counter(mesh.local_devices()[i]).peak.load() == plan.device_peak_bytes[i]);
  }
  CHECK(memory_stats(mesh).peak_bytes == plan.peak_bytes);
  int64_t planned = 0;
  for (int64_t b : plan.device_collective_bytes) planned += b;
  if (bytes == CollectiveBytes::Exact) CHECK(planned == comm.total_bytes());
  else CHECK(planned >= comm.total_bytes());
}

}  // namespace tessera::testing
