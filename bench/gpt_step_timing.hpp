// What the planning benchmarks share to time the GPT sample's training step on a real mesh: a
// synthetic batch of token ids with their next-token targets, and the median of timed steps.
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::bench {

// `batch` sequences of config.context ids (a fixed pseudo-random pattern) and the same ids
// shifted by one, laid out as GptTrainingStep::batch_layout(mesh) says.
inline std::pair<Tensor, Tensor> synthetic_gpt_batch(const Mesh& mesh, const GptConfig& config, int64_t batch) {
  const std::vector<Placement> placements = GptTrainingStep::batch_layout(mesh).placements();
  std::vector<int32_t> tokens(size_t(batch * config.context));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919 + 13) % size_t(config.vocab));
  const Tensor ids = distribute_tensor(Array::from<int32_t>(tokens, {batch, config.context}), mesh, placements);
  std::rotate(tokens.begin(), tokens.begin() + 1, tokens.end());
  return {ids, distribute_tensor(Array::from<int32_t>(tokens, {batch, config.context}), mesh, placements)};
}

// The median of `steps` timed steps, each waited for (its loss read back).
// `step`: a GptTrainingStep or a PipelinedGptTrainingStep.
template <typename Step>
double median_step_seconds(Step& step, const Tensor& ids, const Tensor& targets, int steps) {
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    (void)step(ids, targets).full_tensor();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace tessera::bench
