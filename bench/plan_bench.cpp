// Planning cost at scale: the GPT training step (forward, backward, gradient clipping, AdamW)
// planned on abstract meshes of 8 to 16,384 H100s (dp x tp, 8 GPUs a node), nothing run. Prints,
// per device count, the time to build the model on the mesh and to plan the step, and what the
// plan says (peak memory per device, FLOPs, collective bytes, predicted step time). Compile cost
// must not grow with the device count.
//   ./build/bench/plan_bench [--layers 4 --width 512 --heads 8 --context 256 --batch 8]
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <sys/resource.h>

#include <chrono>
#include <functional>
#include <tessera/tessera.hpp>

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Shape {
  int64_t layers = 4, width = 512, heads = 8, context = 256, vocab = 512, batch_per_replica = 8, tp = 8;
};

struct Planned {
  double build_seconds = 0, plan_seconds = 0;
  PlanReport report;
};

Planned plan_gpt(const Shape& s, int64_t devices, const Hardware& hw) {
  Planned out;
  const auto start = Clock::now();
  const int64_t tp = std::min(s.tp, devices), dp = devices / tp;
  const Mesh mesh = abstract_mesh({{"dp", dp}, {"tp", tp}}, hw, 8);
  GptConfig config;
  config.vocab = s.vocab;
  config.context = s.context;
  config.layers = s.layers;
  config.width = s.width;
  config.heads = s.heads;
  Gpt model(config, mesh);
  parallelize_module(model, mesh, gpt_tensor_parallel_plan(config), "tp");
  std::vector<Variable> params = model.parameters();
  AdamW optimizer(params, 3e-4, 0.9, 0.95, 1e-8, 0.1);
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  JitFunction<Step> train_step(Step([&](const Tensor& ids, const Tensor& targets) {
    Tensor loss = gpt_loss(model(ids), targets);
    std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
    (void)clip_grad_norm(grads, 1.0);
    optimizer.apply(grads);
    return loss;
  }));
  const Layout batch_layout({"dp", "unsharded"}, mesh);
  const Tensor ids = zeros({s.batch_per_replica * dp, s.context}, batch_layout, DType::i32);
  const Tensor targets = zeros({s.batch_per_replica * dp, s.context}, batch_layout, DType::i32);
  out.build_seconds = seconds_since(start);
  const auto planned = Clock::now();
  out.report = train_step.plan(ids, targets);
  out.plan_seconds = seconds_since(planned);
  return out;
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
  bool print_reports = false;
  CLI::App app{"plan the GPT training step on abstract meshes of H100s"};
  app.add_option("--layers", s.layers);
  app.add_option("--width", s.width);
  app.add_option("--heads", s.heads);
  app.add_option("--context", s.context);
  app.add_option("--vocab", s.vocab);
  app.add_option("--batch", s.batch_per_replica, "sequences per data-parallel replica");
  app.add_option("--tp", s.tp, "tensor-parallel degree (the mesh's inner dim)");
  app.add_option("--devices", device_counts);
  app.add_flag("--report", print_reports, "print each plan's whole report");
  CLI11_PARSE(app, argc, argv);
  const Hardware h100 = hardware_profile("h100-sxm");
  fmt::print("GPT {} layers, width {}, {} heads, context {}, vocabulary {}, {} sequences per replica; tp={} on H100 SXM, 8 a node\n",
             s.layers, s.width, s.heads, s.context, s.vocab, s.batch_per_replica, s.tp);
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
