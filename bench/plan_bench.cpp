// Planning cost at scale: the GPT training step (forward, backward, gradient clipping, AdamW)
// planned on abstract meshes of 8 to 16,384 H100s (dp x tp, 8 GPUs a node), nothing run. Prints,
// per device count, the time to build the model on the mesh and to plan the step, and what the
// plan says (peak memory per device, FLOPs, collective bytes, predicted step time). Compile cost
// must not grow with the device count.
//   ./build/bench/plan_bench [--layers 4 --width 512 --heads 8 --context 256 --batch 8]
// (--pp P --microbatches M plans a 1F1B pipeline of P stages on a pp x dp x tp mesh.)
// With --accuracy it instead predicts the step on real CPU meshes of 1 to 8 devices with the
// this-machine profile, runs it, and prints predicted against measured time and peak memory (also
// with activation checkpointing, against none):
//   ./build/bench/plan_bench --accuracy --layers 4 --width 128 --heads 4 --context 128 --vocab 96 --batch 16
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <chrono>
#include <functional>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <tessera/tessera.hpp>

#include "jit/executable.hpp"
#include "jit/step_profiler.hpp"
#include "gpt_step_timing.hpp"

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Shape {
  int64_t layers = 4, width = 512, heads = 8, context = 256, vocab = 512, tp = 8;
  int64_t batch = 0;  // the global batch, sequences per step (0: 8 a data-parallel replica)
  int64_t pp = 1, microbatches = 1;  // pipeline stages (the mesh's outer dim, 1F1B) and their microbatches
  std::optional<CheckpointPolicy> checkpointing;  // each block's activations recomputed, or none
  bool fsdp = false, sequence_parallel = false, bf16 = false;
};

GptConfig config_of(const Shape& s) {
  GptConfig config;
  config.vocab = s.vocab, config.context = s.context, config.layers = s.layers, config.width = s.width, config.heads = s.heads;
  config.activation_checkpointing = s.checkpointing;
  if (s.bf16) config.mixed_precision = kBf16MixedPrecision;
  return config;
}

struct Planned {
  double build_seconds = 0, plan_seconds = 0;
  PlanReport report;
};

Planned plan_gpt(const Shape& s, int64_t devices, const Hardware& hw) {
  Planned out;
  const auto start = Clock::now();
  const int64_t tp = std::min(s.tp, devices), pp = std::min(s.pp, devices / tp), dp = devices / (tp * pp);
  std::vector<std::pair<std::string, int64_t>> dims = {{"dp", dp}, {"tp", tp}};
  if (pp > 1) dims.insert(dims.begin(), {"pp", pp});
  const Mesh mesh = abstract_mesh(dims, hw, 8);
  const int64_t sequences = s.batch > 0 ? s.batch : 8 * dp;
  if (sequences % dp != 0) throw Error(fmt::format("--batch {}: does not split over dp={} on {} devices", sequences, dp, devices));
  const Layout batch = GptTrainingStep::batch_layout(mesh);
  const Tensor ids = zeros({sequences, s.context}, batch, DType::i32);
  const Tensor targets = zeros({sequences, s.context}, batch, DType::i32);
  auto plan = [&](auto& step) {
    out.build_seconds = seconds_since(start);
    const auto planned = Clock::now();
    out.report = step.plan(ids, targets);
    out.plan_seconds = seconds_since(planned);
  };
  if (pp > 1) {
    PipelinedGptTrainingStep step(config_of(s), mesh, s.microbatches, PipelineSchedule::OneFOneB, s.fsdp, s.sequence_parallel);
    plan(step);
  } else {
    GptTrainingStep step(config_of(s), mesh, s.sequence_parallel, s.fsdp);
    plan(step);
  }
  return out;
}

// The GPT sample's training step on a real CPU mesh: predicted with the this-machine profile,
// then run and timed (median of `steps` after two warm-up steps).
struct Accuracy {
  double predicted = 0, measured = 0;
  int64_t predicted_peak = 0, measured_peak = 0;
  // With --breakdown: per op kind, predicted and measured (device 0's profile) time per step.
  std::map<std::string, std::pair<double, double>> by_op_kind;
  struct Step {
    double predicted = 0, measured = 0, flops = 0;
    int64_t bytes = 0;  // touched
    std::string label;
  };
  std::vector<Step> worst_steps;
};

int64_t device_count(const std::vector<std::pair<std::string, int64_t>>& dims) {
  int64_t devices = 1;
  for (const auto& dim : dims) devices *= dim.second;
  return devices;
}

// `profile`: the hardware to predict with (none: the mesh's planning profile).
Accuracy measure_gpt(GptConfig config, const std::vector<std::pair<std::string, int64_t>>& dims, bool sequence_parallel,
                     bool fsdp, std::optional<CheckpointPolicy> checkpointing, int64_t batch, int steps, bool breakdown, bool gpu,
                     const std::optional<Hardware>& profile = std::nullopt) {
  config.activation_checkpointing = checkpointing;
  const int64_t devices = device_count(dims);
  const Mesh mesh = create_mesh(dims, gpu ? gpu_devices(int(devices)) : cpu_devices(int(devices)));
  GptTrainingStep train_step(config, mesh, sequence_parallel, fsdp);
  const auto [ids, targets] = bench::synthetic_gpt_batch(mesh, config, batch);
  Accuracy a;
  for (int i = 0; i < 2; ++i) (void)train_step(ids, targets);
  const PlanReport plan = profile ? train_step.plan(*profile, ids, targets) : train_step.plan(ids, targets);
  a.predicted = plan.predicted_seconds;
  a.predicted_peak = plan.peak_bytes;
  reset_peak_memory_stats();
  set_profiling(breakdown);
  reset_profiles();
  a.measured = bench::median_step_seconds(train_step, ids, targets, steps);
  a.measured_peak = memory_stats(mesh).peak_bytes;
  set_profiling(false);
  if (breakdown) {
    const auto profile = train_step.executable(ids, targets)->profile();
    for (size_t i = 0; i < plan.steps.size() && profile; ++i) {
      const std::string& kind = plan.steps[i].name;
      const double measured = profile->seconds(i, 0) / double(profile->runs());
      a.by_op_kind[kind].first += plan.steps[i].seconds;
      a.by_op_kind[kind].second += measured;
      // The steps the model misses most, collectives and other redistributes excepted: their
      // time on device 0 includes waiting for the others.
      if (kind == "kernel" || kind == "gemm" || kind == "attention")
        a.worst_steps.push_back({plan.steps[i].seconds, measured, plan.steps[i].flops, plan.steps[i].bytes, profile->labels()[i]});
    }
    std::sort(a.worst_steps.begin(), a.worst_steps.end(), [](const Accuracy::Step& x, const Accuracy::Step& y) {
      return std::abs(x.predicted - x.measured) > std::abs(y.predicted - y.measured);
    });
    a.worst_steps.resize(std::min<size_t>(a.worst_steps.size(), 8));
  }
  return a;
}

double max_rss_gib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / (1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  std::vector<int64_t> device_counts = {8, 64, 1024, 16384};
  bool print_reports = false, accuracy = false, breakdown = false;
  std::vector<std::string> only;
  CLI::App app{"plan the GPT training step on abstract meshes of H100s"};
  app.add_option("--layers", s.layers);
  app.add_option("--width", s.width);
  app.add_option("--heads", s.heads);
  app.add_option("--context", s.context);
  app.add_option("--vocab", s.vocab);
  app.add_option("--batch", s.batch, "the global batch: sequences per step (default: 8 a data-parallel replica)");
  app.add_option("--tp", s.tp, "tensor-parallel degree (the mesh's inner dim)");
  app.add_option("--pp", s.pp, "planning: pipeline stages (1F1B; the mesh's outer dim)")->check(CLI::PositiveNumber);
  app.add_option("--microbatches", s.microbatches, "planning, with --pp: microbatches a step")->check(CLI::PositiveNumber);
  app.add_option("--devices", device_counts);
  app.add_flag("--report", print_reports, "print each plan's whole report");
  app.add_flag("--accuracy", accuracy, "instead: predict and run the step on CPU meshes of 1 to 8 devices (this-machine profile)");
  app.add_flag("--breakdown", breakdown, "with --accuracy: predicted and measured time by op kind (profiled)");
  app.add_flag("--fsdp", s.fsdp, "planning: parameters, gradients and optimizer state fully sharded over dp");
  app.add_flag("--sequence-parallel", s.sequence_parallel, "planning: Megatron's sequence parallelism on tp");
  app.add_flag("--bf16", s.bf16, "FSDP2's bf16 mixed precision (bf16 parameters and GEMMs, f32 gradient sums)");
  std::string recompute = "none";
  app.add_option("--activation-checkpointing", recompute, "planning: recompute each block's activations (none, full, selective)")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  bool recalibrate = false, gpu = false;
  app.add_flag("--gpu", gpu,
               "with --accuracy: the one-device cases on one GPU, predicted with the h100-sxm profile (a GPU mesh's "
               "planning profile)");
  std::string calibrated_from, save_profile;
  app.add_option("--calibrate-gpu", calibrated_from,
                 "with --gpu: calibrate the GPU first (calibrate_gpu, on this published profile: h100-sxm, h200, ...) and "
                 "predict with the measured profile instead")
      ->check(CLI::IsMember(published_hardware_names()));
  app.add_option("--save-profile", save_profile, "with --calibrate-gpu: write the measured profile to this JSON file");
  int rounds = 1;
  app.add_option("--rounds", rounds,
                 "with --accuracy: run the cases this many times, interleaved (with --recalibrate, each round after a "
                 "calibration of its own: a shared machine's speed moves within minutes), and report each case's round "
                 "of median error and the spread of its measured steps")
      ->check(CLI::PositiveNumber);
  app.add_flag("--recalibrate", recalibrate,
               "with --accuracy: measure this machine's profile again first, so it is predicted with what it does now");
  app.add_option("--case", only, "with --accuracy: run only these cases (by name: \"1 device\", \"dp=2\", ...)");
  CLI11_PARSE(app, argc, argv);
  if (recompute != "none") s.checkpointing = recompute == "full" ? CheckpointPolicy::Full : CheckpointPolicy::Selective;
  if (accuracy) {
    const GptConfig config = config_of(s);
    const int64_t batch = s.batch > 0 ? s.batch : 8;
    if (gpu && gpu_devices().empty()) {
      fmt::print("plan_bench --gpu: no GPU in this process\n");
      return 1;
    }
    std::optional<Hardware> profile;
    if (!calibrated_from.empty()) {
      if (!gpu) {
        fmt::print("plan_bench: --calibrate-gpu needs --gpu\n");
        return 2;
      }
      profile = calibrate_gpu(published_hardware(calibrated_from));
      fmt::print("{}: {}\n", profile->name, hardware_to_json(*profile));
      if (!save_profile.empty()) std::ofstream(save_profile) << hardware_to_json(*profile) << "\n";
    }
    fmt::print("GPT {} layers, width {}, {} heads, context {}, vocabulary {}, batch {}: predicted ({}) vs measured\n", s.layers,
               s.width, s.heads, s.context, s.vocab, batch, profile ? profile->name : gpu ? "h100-sxm" : "this-machine");
    if (!recalibrate && !gpu) fmt::print("this-machine profile: {}\n", hardware_to_json(hardware_profile("this-machine")));
    struct Case {
      std::vector<std::pair<std::string, int64_t>> dims;
      bool sequence_parallel = false, fsdp = false;
      std::string name;
      std::optional<CheckpointPolicy> checkpointing = std::nullopt;
    };
    const std::vector<Case> cases = {Case{{{"dp", 1}}, false, false, "1 device"}, Case{{{"dp", 2}}, false, false, "dp=2"},
                          Case{{{"tp", 2}}, false, false, "tp=2"}, Case{{{"tp", 2}}, true, false, "tp=2 +seq-parallel"},
                          Case{{{"sp", 2}}, false, false, "sp=2"}, Case{{{"dp", 2}}, false, true, "dp=2 +fsdp"},
                          Case{{{"dp", 4}}, false, false, "dp=4"}, Case{{{"dp", 2}, {"tp", 2}}, false, false, "dp=2,tp=2"},
                          Case{{{"dp", 8}}, false, false, "dp=8"},
                          Case{{{"dp", 1}}, false, false, "1 device +full checkpointing", CheckpointPolicy::Full},
                          Case{{{"dp", 1}}, false, false, "1 device +selective checkpointing", CheckpointPolicy::Selective},
                          Case{{{"dp", 2}}, false, false, "dp=2 +full checkpointing", CheckpointPolicy::Full}};
    std::vector<std::vector<Accuracy>> runs(cases.size());
    for (int round = 0; round < rounds; ++round) {
      if (recalibrate && !gpu) {
        const Hardware now = recalibrate_this_machine();
        fmt::print("round {}: this-machine measured now: GEMM {:.0f} GFLOP/s, kernels {:.0f} GFLOP/s, memory {:.1f} GB/s\n", round + 1,
                   now.gemm_rate(DType::f32) / 1e9, now.vector_rate(DType::f32) / 1e9, now.memory_bytes_per_second / 1e9);
      }
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
        // Several of a mesh's devices on one GPU would share it, which the H100's profile does not know.
        if (gpu && device_count(c.dims) > 1) continue;
        runs[i].push_back(measure_gpt(config, c.dims, c.sequence_parallel, c.fsdp, c.checkpointing, batch, 7, breakdown, gpu, profile));
      }
    }
    auto error_of = [](const Accuracy& a) { return a.predicted / a.measured - 1; };
    fmt::print("{:<34} {:>12} {:>12} {:>8} {:>14} {:>14} {:>22}\n", "mesh", "predicted", "measured", "error", "peak pred.", "peak meas.",
               "measured, every round");
    int within = 0, within_bar = 0, measured_cases = 0;
    double worst = 0, absolute_errors = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (runs[i].empty()) continue;
      const Case& c = cases[i];
      std::sort(runs[i].begin(), runs[i].end(), [&](const Accuracy& x, const Accuracy& y) { return error_of(x) < error_of(y); });
      const Accuracy& a = runs[i][runs[i].size() / 2];
      const double error = error_of(a);
      ++measured_cases;
      within += std::abs(error) <= 0.15;
      within_bar += std::abs(error) <= 0.10;
      absolute_errors += std::abs(error);
      if (std::abs(error) > std::abs(worst)) worst = error;
      // The spread of the measured step over the rounds: this machine's own noise, the floor
      // under any prediction's error.
      auto [fastest, slowest] = std::minmax_element(runs[i].begin(), runs[i].end(),
                                                    [](const Accuracy& x, const Accuracy& y) { return x.measured < y.measured; });
      fmt::print("{:<34} {:>9.2f} ms {:>9.2f} ms {:>+7.1f}% {:>14} {:>14} {:>11.1f}-{:.1f} ms\n", c.name, a.predicted * 1e3,
                 a.measured * 1e3, 100.0 * (a.predicted / a.measured - 1), a.predicted_peak, a.measured_peak, fastest->measured * 1e3,
                 slowest->measured * 1e3);
      for (const auto& [kind, times] : a.by_op_kind)
        fmt::print("    {:<30} {:>9.2f} ms {:>9.2f} ms {:>+7.1f}%\n", kind, times.first * 1e3, times.second * 1e3,
                   100.0 * (times.first / times.second - 1));
      for (const Accuracy::Step& step : a.worst_steps)
        fmt::print("      {:>8.3f} ms {:>8.3f} ms {:>9.3g} FLOP {:>10}  {:.110}\n", step.predicted * 1e3, step.measured * 1e3, step.flops,
                   bytes_text(double(step.bytes)), step.label);
    }
    fmt::print("{} of {} cases within 15% (each the round of median error of {}); the worst {:+.1f}%\n", within, measured_cases,
               rounds, 100.0 * worst);
    // The planner's bar: every case within 10%, and 5% on average.
    fmt::print("{} of {} within 10%; mean absolute error {:.1f}%\n", within_bar, measured_cases,
               measured_cases ? 100.0 * absolute_errors / measured_cases : 0.0);
    return 0;
  }
  const Hardware h100 = hardware_profile("h100-sxm");
  fmt::print("GPT {} layers, width {}, {} heads, context {}, vocabulary {}, {}; tp={}{} on H100 SXM, 8 a node{}\n",
             s.layers, s.width, s.heads, s.context, s.vocab,
             s.batch > 0 ? fmt::format("{} sequences a step", s.batch) : std::string("8 sequences a data-parallel replica"), s.tp,
             s.pp > 1 ? fmt::format(", pp={} (1F1B over {} microbatches)", s.pp, s.microbatches) : "",
             s.checkpointing ? fmt::format("; {} activation checkpointing", checkpoint_policy_name(*s.checkpointing)) : "");
  fmt::print("{:>8} {:>10} {:>10} {:>14} {:>12} {:>14} {:>12}\n", "devices", "build s", "plan s", "peak/device", "GFLOP/dev",
             "coll MiB/dev", "step ms");
  for (int64_t devices : device_counts) {
    const Planned p = plan_gpt(s, devices, h100);
    fmt::print("{:>8} {:>10.3f} {:>10.3f} {:>11.3f} GiB {:>12.2f} {:>14.2f} {:>12.3f}\n", devices, p.build_seconds, p.plan_seconds,
               double(p.report.peak_bytes) / double(1 << 30), p.report.flops / 1e9, double(p.report.collective_bytes) / double(1 << 20),
               p.report.predicted_seconds * 1e3);
    if (print_reports) fmt::print("{}\n", p.report.to_string());
  }
  fmt::print("max resident memory of this process: {:.2f} GiB\n", max_rss_gib());
  return 0;
}
