// Ring attention (dsl/ring_attention.hpp) on 2 devices against one device's fused attention:
// causal attention forward and backward over a long sequence, [batch, heads, T, head_dim] f32.
// Each virtual CPU device runs on one core, so the ratio is the speedup context parallelism
// gives: ideally 2x, less what the ring's shifts, the merges of the blocks' outputs and the
// head-tail swaps cost. The one-device run is the same fused kernel on the whole sequence.
// Usage: ring_attention_bench [--length 4096] [--heads 4] [--head-dim 64] [--devices 2] [--rounds 3]
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <vector>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "bench_util.hpp"
#include "pseudo_random_array.hpp"

using namespace tessera;
using tessera::bench::median_seconds;
using tessera::bench::warm_up;

int main(int argc, char** argv) {
  CLI::App app{"ring attention over cp devices against one device, causal forward and backward"};
  int64_t length = 4096, heads = 4, head_dim = 64, devices = 2;
  int rounds = 3;
  app.add_option("--length", length);
  app.add_option("--heads", heads);
  app.add_option("--head-dim", head_dim);
  app.add_option("--devices", devices);
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);

  set_cores_per_device(1);
  const std::vector<int64_t> shape = {1, heads, length, head_dim};
  const Array q = bench::pseudo_random_array(shape, 1), k = bench::pseudo_random_array(shape, 2), v = bench::pseudo_random_array(shape, 3);
  // Causal fwd+bwd: 2 (fwd) + 5 (bwd: dS, dq, dk, dv and P again) matmuls of half the [T, T] scores.
  const double flops = 7.0 * 2.0 * double(heads) * double(length) * double(length) * double(head_dim) / 2.0;
  SdpaKernel flash({SdpBackend::Flash});
  auto step_on = [&](const Mesh& mesh, bool ring) {
    const Layout layout = Layout::from_placements(mesh, {Shard{2}}, 4);
    const Tensor tq = copy_to_mesh(q, layout), tk = copy_to_mesh(k, layout), tv = copy_to_mesh(v, layout);
    auto step = jit([ring](const Tensor& a, const Tensor& b, const Tensor& c) {
      const Tensor out = ring ? ring_attention(a, b, c, true, "cp") : scaled_dot_product_attention(a, b, c, true);
      return gradients(reduce_sum(out), {a, b, c});
    });
    return [=]() mutable {
      for (const Tensor& g : step(tq, tk, tv)) (void)g.to_local();
    };
  };
  const std::vector<std::function<void()>> calls = {step_on(create_mesh({{"cp", 1}}), false),
                                                    step_on(create_mesh({{"cp", devices}}), true)};
  // Rounds alternate between the two, each keeping its best median, so load from elsewhere on
  // the machine slows both alike.
  std::vector<double> best(calls.size(), 1e30);
  for (const auto& call : calls) warm_up(call);
  for (int r = 0; r < rounds; ++r)
    for (size_t c = 0; c < calls.size(); ++c) best[c] = std::min(best[c], median_seconds(calls[c], 3));
  fmt::print("ring attention: causal fwd+bwd, [1, {}, {}, {}] f32, one core per device\n", heads, length, head_dim);
  fmt::print("{:<40} {:>10} {:>10}\n", "", "ms", "GFLOP/s");
  fmt::print("{:<40} {:>10.1f} {:>10.1f}\n", "one device, fused attention", best[0] * 1e3, flops / best[0] * 1e-9);
  fmt::print("{:<40} {:>10.1f} {:>10.1f}\n", fmt::format("ring attention, cp={}", devices), best[1] * 1e3, flops / best[1] * 1e-9);
  fmt::print("speedup (one device / ring): {:.2f}x\n", best[0] / best[1]);
  set_cores_per_device(0);
}
