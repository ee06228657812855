// auto_parallelize against every hand plan, measured: the GPT sample's training step (forward,
// loss, backward, clipping, AdamW) on 2, 4 and 8 virtual CPU devices of this machine. For each
// device count it asks auto_parallelize (with this machine's profile, shared by that many
// devices) for a plan, then runs every candidate it considered (every dp x sp x tp mesh, with
// and without sequence parallelism and FSDP, and pipelines over pp where the depth allows: the
// hand plans) and prints predicted against
// measured step time, and the chosen plan's measured step against the best one's.
//   ./build/bench/auto_parallel_bench [--layers 2 --width 64 --heads 4 --context 64 --vocab 96 --batch 16]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <tessera/tessera.hpp>

#include "gpt_step_timing.hpp"

using namespace tessera;

namespace {

// The median of `steps` timed steps after two warm-up steps.
double measure_step(GptConfig config, const ParallelCandidate& c, int64_t devices, int64_t batch, int steps) {
  const auto dims = c.mesh.empty() ? std::vector<std::pair<std::string, int64_t>>{{"dp", 1}} : c.mesh;
  const Mesh mesh = create_mesh(dims, cpu_devices(int(devices)));
  config.activation_checkpointing = c.activation_checkpointing;  // the candidate's recomputation, if any
  config.mixed_precision = c.mixed_precision;                    // and precision (f32 or bf16 mixed)
  const auto [ids, targets] = bench::synthetic_gpt_batch(mesh, config, batch);
  auto timed = [&](auto& train_step) {
    for (int i = 0; i < 2; ++i) (void)train_step(ids, targets).full_tensor();
    return bench::median_step_seconds(train_step, ids, targets, steps);
  };
  if (c.pipelined()) {
    PipelinedGptTrainingStep train_step(config, mesh, c.microbatches, PipelineSchedule::OneFOneB, c.fsdp, c.sequence_parallel);
    return timed(train_step);
  }
  GptTrainingStep train_step(config, mesh, c.sequence_parallel, c.fsdp);
  return timed(train_step);
}

}  // namespace

int main(int argc, char** argv) {
  GptConfig config;
  config.layers = 2, config.width = 64, config.heads = 4, config.context = 64, config.vocab = 96;
  int64_t batch = 16;
  int steps = 7, rounds = 2;
  std::vector<int64_t> device_counts = {2, 4, 8};
  CLI::App app{"auto_parallelize's choice against every hand plan, measured on virtual CPU devices"};
  app.add_option("--layers", config.layers);
  app.add_option("--width", config.width);
  app.add_option("--heads", config.heads);
  app.add_option("--context", config.context);
  app.add_option("--vocab", config.vocab);
  app.add_option("--batch", batch, "sequences per step (global)");
  app.add_option("--devices", device_counts);
  app.add_option("--steps", steps, "timed steps per plan and round (their median)");
  app.add_option("--rounds", rounds, "rounds over all plans (the best median of each plan is kept)");
  CLI11_PARSE(app, argc, argv);
  fmt::print("GPT {} layers, width {}, {} heads, context {}, vocabulary {}, batch {}\n", config.layers, config.width, config.heads,
             config.context, config.vocab, batch);
  for (int64_t devices : device_counts) {
    const Hardware hw = this_machine_device(devices);
    Gpt model(config, abstract_mesh({{"dp", 1}}, hw, devices));
    const ParallelPlanSearch search = auto_parallelize(model, devices, hw, hw.memory_bytes, batch, devices);
    std::vector<double> measured(search.candidates.size(), 1e30);
    // Rounds over all plans, so a slow spell of the machine does not land on one plan only.
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < search.candidates.size(); ++i)
        measured[i] = std::min(measured[i], measure_step(config, search.candidates[i], devices, batch, steps));
    size_t best = 0, chosen = 0;
    for (size_t i = 0; i < measured.size(); ++i) {
      if (measured[i] < measured[best]) best = i;
      if (search.candidates[i].name() == search.best.name()) chosen = i;
    }
    fmt::print("\n{} devices ({}): searched {} plans in {:.2f} s\n", devices, hw.name, search.candidates.size(), search.search_seconds);
    fmt::print("{:<28} {:>12} {:>12} {:>8}\n", "plan", "predicted", "measured", "error");
    for (size_t i = 0; i < measured.size(); ++i) {
      const ParallelCandidate& c = search.candidates[i];
      fmt::print("{:<28} {:>9.2f} ms {:>9.2f} ms {:>+7.1f}%{}{}\n", c.name(), c.report.predicted_seconds * 1e3, measured[i] * 1e3,
                 100.0 * (c.report.predicted_seconds / measured[i] - 1), i == chosen ? "  <- chosen" : "", i == best ? "  <- fastest measured" : "");
    }
    fmt::print("chosen {} measured {:.2f} ms; fastest measured {} {:.2f} ms: chosen / fastest = {:.3f}\n", search.best.name(),
               measured[chosen] * 1e3, search.candidates[best].name(), measured[best] * 1e3, measured[chosen] / measured[best]);
  }
  return 0;
}
