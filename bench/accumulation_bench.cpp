// What gradient accumulation costs a training step (nn/transformer_training_step.hpp): the GPT
// step on dp=2 over one batch, in one pass and accumulated over 2, 4 and 8 microbatches, each a
// host loop of the microbatch program and the update. Prints the step time, its ratio to one
// pass, the planned peak per device, and how long planning the step takes (the same for any
// microbatch count: each program is planned once, plan/call_sequence_plan.hpp).
// Usage: accumulation_bench [--width C] [--layers L] [--context T] [--batch B] [--microbatches 2,4,8]
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <vector>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"

using namespace tessera;

int main(int argc, char** argv) {
  CLI::App app("gradient accumulation's step time and plan cost against one pass");
  GptConfig config;
  config.vocab = 96, config.context = 64, config.layers = 4, config.width = 128, config.heads = 4;
  int64_t batch = 16;
  std::vector<int64_t> counts{2, 4, 8};
  app.add_option("--width", config.width);
  app.add_option("--layers", config.layers);
  app.add_option("--context", config.context);
  app.add_option("--batch", batch);
  app.add_option("--microbatches", counts)->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  const Mesh mesh = create_mesh({{"dp", 2}}, cpu_devices(2));
  std::vector<int32_t> tokens(size_t(batch * config.context));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % size_t(config.vocab));
  const Tensor ids = distribute_tensor(Array::from<int32_t>(tokens, {batch, config.context}), mesh,
                                       GptTrainingStep::batch_layout(mesh).placements());
  fmt::print("GPT {} layers, width {}, context {}, batch {} on dp=2 (CPU)\n", config.layers, config.width, config.context, batch);
  fmt::print("{:>13} {:>10} {:>12} {:>14} {:>10}\n", "microbatches", "step", "vs one pass", "peak/device", "plan");
  double one_pass = 0;
  counts.insert(counts.begin(), 1);
  for (int64_t count : counts) {
    GptTrainingStep step(config, mesh, false, false, count);
    const auto start = std::chrono::steady_clock::now();
    const PlanReport plan = step.plan(ids, ids);
    const double planning = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto run = [&] { (void)step(ids, ids).full_tensor(); };
    bench::warm_up(run);
    const double seconds = bench::median_seconds(run, 9);
    if (count == 1) one_pass = seconds;
    fmt::print("{:>13} {:>8.2f} ms {:>11.2f}x {:>14} {:>8.3f} s\n", count, seconds * 1e3, seconds / one_pass,
               bytes_text(double(plan.peak_bytes)), planning);
  }
}
