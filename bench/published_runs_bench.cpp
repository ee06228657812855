// The planner against published training runs on H100s: each row is a job someone ran and
// timed (the published figures are data), planned here on the h100-sxm profile with the same
// model, mesh, batch and microbatches (the prediction is computed). Prints the published and the
// predicted time per step, their ratio, and where the predicted time goes: GEMMs, attention,
// other kernels, collectives over tp and over dp (never overlapped with compute: Tessera's
// executor overlaps nothing, where the published runs overlap their data-parallel reductions
// and gathers with the backward and forward). docs/PLANNING.md explains each difference.
//   ./build/bench/published_runs_bench [--rows megatron-1.7b,torchtitan-8b-8]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <tessera/tessera.hpp>

using namespace tessera;

namespace {

struct PublishedRun {
  std::string name, source;
  std::optional<GptConfig> gpt;  // a GPT of these dims, else the preset below
  std::string preset;            // transformer_preset's name
  int64_t context = 0;
  std::vector<std::pair<std::string, int64_t>> mesh;
  int64_t global_batch = 0, microbatches = 1;
  bool fsdp = false;
  std::optional<CheckpointPolicy> recompute;
  double published_seconds = 0;  // per step, from the published figure
  std::string published_figure;  // the figure as published
};

// Megatron-LM's model FLOPs per step of a GPT (its training.py num_floating_point_operations
// without gated MLPs or grouped queries; Narayanan et al. 2021, eq. 3, without the recomputed
// forward): 72 B s L h^2 (1 + s / (6 h) + V / (12 L h)). Its README's TFLOP/s per GPU are these
// FLOPs over the step time and the GPU count.
double megatron_model_flops(int64_t batch, int64_t seq, int64_t layers, int64_t width, int64_t vocab) {
  const double b = double(batch), s = double(seq), l = double(layers), h = double(width), v = double(vocab);
  return 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
}

// A row of the Megatron-LM README's H100 table (images/model_table.png in NVIDIA/Megatron-LM):
// sequence 4096, vocabulary 131072, dp 48, one sequence a microbatch.
PublishedRun megatron_row(const std::string& name, int64_t layers, int64_t width, int64_t heads, int64_t tp, int64_t pp,
                          int64_t batch, double tflops_per_gpu) {
  PublishedRun run;
  run.name = name;
  run.source = "Megatron-LM README, H100 table";
  GptConfig c;
  c.layers = layers, c.width = width, c.heads = heads, c.context = 4096, c.vocab = 131072;
  c.mixed_precision = kBf16MixedPrecision;
  run.gpt = c;
  run.context = 4096;
  if (pp > 1) run.mesh.push_back({"pp", pp});
  run.mesh.push_back({"dp", 48});
  if (tp > 1) run.mesh.push_back({"tp", tp});
  run.global_batch = batch;
  run.microbatches = batch / 48;
  const int64_t gpus = 48 * tp * pp;
  run.published_seconds = megatron_model_flops(batch, 4096, layers, width, 131072) / (tflops_per_gpu * 1e12 * double(gpus));
  run.published_figure = fmt::format("{:.1f} TFLOP/s per GPU on {} GPUs", tflops_per_gpu, gpus);
  return run;
}

// torchtitan's Llama 3.1 8B rows on H100 (benchmarks/llama3_h100_202412_torchtitan.md in
// pytorch/torchtitan): FSDP, bf16, selective activation checkpointing, local batch 2 of 8192
// tokens, without torch.compile; tokens per second per GPU.
PublishedRun torchtitan_8b(int64_t gpus, double tokens_per_second_per_gpu) {
  PublishedRun run;
  run.name = fmt::format("torchtitan-8b-{}", gpus);
  run.source = "torchtitan llama3_h100_202412";
  run.preset = "llama3-8b";
  run.context = 8192;
  run.mesh = {{"dp", gpus}};
  run.global_batch = 2 * gpus;
  run.fsdp = true;
  run.recompute = CheckpointPolicy::Selective;
  run.published_seconds = 2.0 * 8192.0 / tokens_per_second_per_gpu;
  run.published_figure = fmt::format("{:.0f} tokens/s per GPU on {} GPUs", tokens_per_second_per_gpu, gpus);
  return run;
}

std::vector<PublishedRun> published_runs() {
  return {
      megatron_row("megatron-1.7b", 24, 2048, 16, 1, 1, 192, 408.8),
      megatron_row("megatron-7.1b", 30, 4096, 32, 2, 1, 192, 465.9),
      megatron_row("megatron-16b", 32, 6144, 48, 4, 1, 192, 489.1),
      megatron_row("megatron-32b", 48, 7168, 56, 8, 1, 192, 459.6),
      megatron_row("megatron-70b", 84, 8192, 64, 8, 2, 384, 419.7),
      torchtitan_8b(8, 5762),
      torchtitan_8b(128, 5605),
  };
}

PlanReport::Part part_of(const PlanReport& r, const std::string& kind) {
  for (const PlanReport::Part& part : r.by_op_kind)
    if (part.name == kind) return part;
  return {};
}
double seconds_of(const PlanReport& r, const std::string& kind) { return part_of(r, kind).seconds; }

// The rate of cuDNN's fused attention (PyTorch's SDPA backend) measured beside Tessera's kernel
// on an H200 (docs/GPU.md, 2026-11-30: forward and gradients at T = 8192, causal, 2.1 ms where
// FlashAttention-2's 3.8 ms is 254 TFLOP/s): the tensor-core attention the published runs use
// (Transformer Engine calls cuDNN's).
constexpr double kCudnnAttentionFlops = 254e12 * 3.8 / 2.1;

double collective_seconds_over(const PlanReport& r, const std::string& dim) {
  double seconds = 0;
  for (const PlanReport::Collective& c : r.collectives)
    if (c.mesh_dim == dim) seconds += c.seconds;
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the planner against published H100 training runs"};
  std::vector<std::string> only;
  app.add_option("--rows", only, "row names to plan (default: all)")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const Hardware h100 = hardware_profile("h100-sxm");
  // "cuDNN attn": the prediction with attention at cuDNN's rate instead of Tessera's kernel's.
  fmt::print("{:<18} {:>9} {:>9} {:>6} {:>10} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>7}  {}\n", "run", "published", "predicted",
             "ratio", "cuDNN attn", "ratio", "gemm", "attn", "kernels", "tp comm", "dp comm", "fits", "plan s", "published figure");
  for (const PublishedRun& run : published_runs()) {
    if (!only.empty() && std::find(only.begin(), only.end(), run.name) == only.end()) continue;
    const auto started = std::chrono::steady_clock::now();
    const Mesh where = abstract_mesh({{"dp", 1}}, h100, 8);
    TransformerConfig config;
    if (run.gpt) {
      const Gpt gpt(*run.gpt, where);
      config = static_cast<const Transformer&>(gpt).config();  // the Transformer it is
    } else {
      config = transformer_preset(run.preset);
      config.max_seq = run.context;
      config.mixed_precision = kBf16MixedPrecision;
    }
    ParallelCandidate plan;
    plan.mesh = run.mesh;
    plan.microbatches = run.microbatches;
    plan.fsdp = run.fsdp;
    plan.activation_checkpointing = run.recompute;
    plan.mixed_precision = kBf16MixedPrecision;
    const ParallelCandidate planned = evaluate_plan(config, plan, h100, h100.memory_bytes, run.global_batch);
    const PlanReport& r = planned.report;
    const double plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const PlanReport::Part attention = part_of(r, "attention");
    const double with_cudnn = r.predicted_seconds - attention.seconds + attention.flops / kCudnnAttentionFlops +
                              double(attention.steps) * h100.launch_seconds;
    fmt::print("{:<18} {:>8.3f}s {:>8.3f}s {:>5.2f}x {:>9.3f}s {:>5.2f}x {:>7.3f}s {:>7.3f}s {:>7.3f}s {:>7.3f}s {:>7.3f}s {:>6} {:>7.1f}  {} ({})\n",
               run.name, run.published_seconds, r.predicted_seconds, r.predicted_seconds / run.published_seconds, with_cudnn,
               with_cudnn / run.published_seconds, seconds_of(r, "gemm"),
               seconds_of(r, "attention"), seconds_of(r, "kernel"), collective_seconds_over(r, "tp"),
               collective_seconds_over(r, "dp") + collective_seconds_over(r, "pp"), planned.fits ? "yes" : "no", plan_seconds,
               run.published_figure, run.source);
  }
  return 0;
}
