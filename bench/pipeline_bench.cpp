// Pipeline parallelism's cost on this machine (nn/pipeline.hpp): the GPT training step (forward,
// backward, clipping, AdamW) pipelined over pp=2 virtual devices with the gpipe, 1f1b,
// looped-bfs and interleaved-1f1b schedules, at 1, 2, 4 and 8 microbatches of a fixed size, next to dp=2 and one
// device at the same global batch; step times and the memory plan's peak bytes per device.
//
// The bubble: every tick costs the same (in one SPMD program an idle stage computes on zeros),
// so the step time is T(M) = a + tau * ticks(M), a being what runs outside the pipeline
// (embeddings, head, loss, optimizer). A least-squares fit over the microbatch counts gives tau;
// the measured bubble is the idle device-ticks' time over the step, (ticks - M V) tau / T(M),
// printed beside the analytic (P - 1) / (M V + P - 1) of the ticks alone.
// Then the planned peak alone at 4 to 32 microbatches, and 1F1B's host loop of tick programs
// (what the training step runs) against the same schedule traced as one program.
// Usage: pipeline_bench [--width C] [--layers L] [--context T] [--microbatch-size B] [--schedules gpipe,1f1b,...]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"
#include "nn/training_step_adamw.hpp"

using namespace tessera;

namespace {

struct Setup {
  int64_t width = 128, layers = 4, heads = 4, context = 64, microbatch_size = 4, vocab = 96;
};

Array random_tokens(int64_t batch, int64_t time, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Array a({batch, time}, DType::i32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<int32_t>()[i] = int32_t(rng() % uint32_t(vocab));
  return a;
}

// The GPT sample's batch layout: sequences over dp, positions over sp.
std::vector<Placement> batch_placements(const Mesh& mesh) { return GptTrainingStep::batch_layout(mesh).placements(); }
struct Measured {
  double seconds = 0;       // median step
  int64_t peak_bytes = 0;   // the memory plan's, most loaded device
};

// One training step of `microbatches` microbatches on `mesh` under `schedule`; only planned
// (no time) unless `timed`.
Measured measure(const Setup& s, const Mesh& mesh, int64_t microbatches, PipelineSchedule schedule, bool timed = true) {
  GptConfig c;
  c.vocab = s.vocab, c.context = s.context, c.layers = s.layers, c.width = s.width, c.heads = s.heads;
  PipelinedGptTrainingStep step(c, mesh, microbatches, schedule);
  const int64_t batch = microbatches * s.microbatch_size;
  const Tensor ids = distribute_tensor(random_tokens(batch, s.context, s.vocab, 1), mesh, batch_placements(mesh));
  const Tensor targets = distribute_tensor(random_tokens(batch, s.context, s.vocab, 2), mesh, batch_placements(mesh));
  auto run = [&] { (void)step(ids, targets).full_tensor(); };
  Measured m;
  if (timed) {
    bench::warm_up(run);
    m.seconds = bench::median_seconds(run, 5);
  }
  m.peak_bytes = step.plan(ids, targets).peak_bytes;
  return m;
}

// The same 1F1B step with the whole schedule traced as one program (run_pipeline_1f1b through
// PipelinedTransformer::loss_and_gradients), as PipelinedGptTrainingStep ran it before its host
// loop of tick programs (nn/pipeline_tick_loop.hpp): its median step and its planned peak.
Measured measure_one_program(const Setup& s, const Mesh& mesh, int64_t microbatches) {
  GptConfig c;
  c.vocab = s.vocab, c.context = s.context, c.layers = s.layers, c.width = s.width, c.heads = s.heads;
  PipelinedGpt model(c, mesh);
  distribute_pipelined_gpt(model, mesh, false);
  const std::vector<Variable> params = model.parameters();
  AdamW optimizer = training_step_adamw(params);
  auto step = jit([&](const Tensor& ids, const Tensor& targets) {
    auto [loss, grads] = model.loss_and_gradients(ids, targets, microbatches, PipelineSchedule::OneFOneB);
    (void)clip_grad_norm(grads, model.gradient_squares(grads), 1.0);
    optimizer.apply(grads);
    return loss;
  });
  const int64_t batch = microbatches * s.microbatch_size;
  const Tensor ids = distribute_tensor(random_tokens(batch, s.context, s.vocab, 1), mesh, batch_placements(mesh));
  const Tensor targets = distribute_tensor(random_tokens(batch, s.context, s.vocab, 2), mesh, batch_placements(mesh));
  auto run = [&] { (void)step(ids, targets).full_tensor(); };
  bench::warm_up(run);
  return {bench::median_seconds(run, 5), step.plan(ids, targets).peak_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  init(argc, argv);
  Setup s;
  CLI::App app{"Pipeline parallelism: bubble and step time against dp and one device"};
  app.add_option("--width", s.width);
  app.add_option("--layers", s.layers);
  app.add_option("--context", s.context);
  app.add_option("--microbatch-size", s.microbatch_size, "sequences per microbatch");
  std::vector<std::string> schedule_names = {"gpipe", "1f1b", "looped-bfs", "interleaved-1f1b"};
  app.add_option("--schedules", schedule_names, "which schedules to run")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  std::vector<PipelineSchedule> schedules;
  for (const std::string& name : schedule_names) schedules.push_back(parse_pipeline_schedule(name));

  const Mesh pp = create_mesh({{"pp", 2}}), dp = create_mesh({{"dp", 2}}), one = create_mesh({{"x", 1}});
  const std::vector<int64_t> counts = {1, 2, 4, 8};
  fmt::print("GPT width {}, {} layers, {} heads, context {}; microbatches of {} sequences; 2 devices of this machine\n\n", s.width, s.layers,
             s.heads, s.context, s.microbatch_size);
  fmt::print("{:<17} {:>4} {:>6} {:>10} {:>10} {:>10} {:>12} {:>10} {:>11} {:>11}\n", "schedule", "M", "ticks", "pp=2 ms", "dp=2 ms",
             "1 dev ms", "bubble meas", "analytic", "pp=2 peak", "dp=2 peak");
  for (const PipelineSchedule schedule : schedules) {
    const std::string name = pipeline_schedule_name(schedule);
    const int64_t virtual_stages = pipeline_schedule_loops(schedule) ? 2 : 1;
    std::vector<double> ticks, times;
    std::vector<Measured> runs;
    for (int64_t m : counts) {
      ticks.push_back(double(PipelineTimetable(2, virtual_stages, m).ticks()));
      runs.push_back(measure(s, pp, m, schedule));
      times.push_back(runs.back().seconds);
    }
    // Least squares T = a + tau * ticks.
    double mt = 0, my = 0;
    for (size_t i = 0; i < ticks.size(); ++i) mt += ticks[i], my += times[i];
    mt /= double(ticks.size()), my /= double(ticks.size());
    double sxy = 0, sxx = 0;
    for (size_t i = 0; i < ticks.size(); ++i) sxy += (ticks[i] - mt) * (times[i] - my), sxx += (ticks[i] - mt) * (ticks[i] - mt);
    const double tau = sxy / sxx;
    for (size_t i = 0; i < counts.size(); ++i) {
      const int64_t m = counts[i];
      const PipelineTimetable table(2, virtual_stages, m);
      const double idle = (ticks[i] - double(m * virtual_stages)) * tau / times[i];
      // dp=2 and one device at the same global batch, as gradient accumulation over the same
      // microbatches (once, on the gpipe rows).
      std::optional<Measured> dp_run, one_run;
      if (schedule == PipelineSchedule::GPipe) dp_run = measure(s, dp, m, schedule), one_run = measure(s, one, m, schedule);
      auto ms = [](const std::optional<Measured>& r) { return r ? fmt::format("{:.2f}", r->seconds * 1e3) : std::string("-"); };
      auto mib = [](int64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20)); };
      fmt::print("{:<17} {:>4} {:>6} {:>10.2f} {:>10} {:>10} {:>11.1f}% {:>9.1f}% {:>11} {:>11}\n", name, m, table.ticks(), times[i] * 1e3,
                 ms(dp_run), ms(one_run), 100 * idle, 100 * table.bubble_fraction(), mib(runs[i].peak_bytes),
                 dp_run ? mib(dp_run->peak_bytes) : std::string("-"));
    }
    fmt::print("{:<17} fit: {:.2f} ms per tick, {:.2f} ms outside the pipeline\n\n", name, tau * 1e3, (my - tau * mt) * 1e3);
  }
  // Memory against the microbatch count, planned only: GPipe keeps every microbatch's
  // activations, the 1F1B schedules the stage inputs of those in flight.
  const std::vector<int64_t> planned_counts = {4, 8, 16, 32};
  fmt::print("planned peak per device on pp=2 (MiB) at M =");
  for (int64_t m : planned_counts) fmt::print(" {:>7}", m);
  fmt::print("\n");
  for (const PipelineSchedule schedule : schedules) {
    fmt::print("{:<41}", pipeline_schedule_name(schedule));
    for (int64_t m : planned_counts) fmt::print(" {:>7.1f}", double(measure(s, pp, m, schedule, false).peak_bytes) / (1 << 20));
    fmt::print("\n");
  }

  // 1F1B as the training step runs it (a host loop of warm-up, steady and cool-down tick
  // programs) against the whole schedule as one program.
  fmt::print("\n1f1b on pp=2: host loop of tick programs against one program over every tick\n");
  fmt::print("{:>4} {:>14} {:>14} {:>7} {:>14} {:>14}\n", "M", "host loop ms", "one prog. ms", "ratio", "loop peak", "one peak");
  for (int64_t m : counts) {
    const Measured loop = measure(s, pp, m, PipelineSchedule::OneFOneB), whole = measure_one_program(s, pp, m);
    fmt::print("{:>4} {:>14.2f} {:>14.2f} {:>6.2f}x {:>10.1f} MiB {:>10.1f} MiB\n", m, loop.seconds * 1e3, whole.seconds * 1e3,
               loop.seconds / whole.seconds, double(loop.peak_bytes) / (1 << 20), double(whole.peak_bytes) / (1 << 20));
  }
  return 0;
}
