// What splitting one device's kernels and GEMMs over its cores buys, by size, next to what the
// time model predicts for it. A device owning 2 cores runs a large enough kernel or GEMM in
// parts on both (jit/device.hpp: kernel_splits_over_cores); the model charges a split step the
// whole machine's rate and nothing for waking the second core and joining it, so small steps
// are predicted faster than they run (docs/PLANNING.md: a width-64 GPT step on one device with
// two cores was predicted 35% fast). This prints, per size, the measured and predicted time on
// 1 core and on 2, and the split's measured and predicted speed-up.
// Usage: split_bench [--rounds N]
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <tuple>
#include <functional>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "bench_util.hpp"
#include "pseudo_random_array.hpp"

using namespace tessera;
using tessera::bench::median_seconds;
using tessera::bench::warm_up;

namespace {


struct Timing {
  double measured = 0, predicted = 0;
};

// One call of `f` on one device owning `cores` cores: the median of its runs (the best median of
// `rounds`), and the plan's prediction for it.
template <class F, size_t N>
Timing time_on_one_device(const F& f, const std::array<Array, N>& inputs, int cores, int rounds) {
  set_cores_per_device(cores);
  const Mesh mesh = create_mesh({{"x", 1}});
  std::array<Tensor, N> t;
  for (size_t i = 0; i < N; ++i) t[i] = copy_to_mesh(inputs[i], Layout::replicated(mesh, int64_t(inputs[i].shape().size())));
  auto step = jit(f);
  auto call = [&] { std::apply([&](const auto&... args) { step(args...).to_local(); }, t); };
  warm_up(call);
  Timing timing;
  timing.measured = 1e30;
  for (int r = 0; r < rounds; ++r) timing.measured = std::min(timing.measured, median_seconds(call, 9));
  timing.predicted = std::apply([&](const auto&... args) { return step.plan(args...).predicted_seconds; }, t);
  set_cores_per_device(0);
  return timing;
}

void print_row(const std::string& name, const Timing& one, const Timing& two) {
  fmt::print("{:<28} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.2f}x {:>9.2f}x\n", name, one.measured * 1e6, one.predicted * 1e6,
             two.measured * 1e6, two.predicted * 1e6, one.measured / two.measured, one.predicted / two.predicted);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A device's kernels and GEMMs split over its 2 cores against 1 core, by size: measured and predicted");
  int rounds = 2;
  app.add_option("--rounds", rounds, "rounds of 9 timed calls per case (the best median is kept)");
  CLI11_PARSE(app, argc, argv);

  fmt::print("one device, 1 core against 2 cores (microseconds per call; this-machine profile)\n");
  fmt::print("{:<28} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}\n", "case", "1c meas.", "1c pred.", "2c meas.", "2c pred.",
             "split x", "pred. x");
  // An elementwise kernel of the GPT's GELU shape: tanh and a few multiply-adds per element.
  for (int64_t elements : {int64_t(1) << 12, int64_t(1) << 14, int64_t(1) << 16, int64_t(1) << 18, int64_t(1) << 20,
                           int64_t(1) << 22}) {
    const std::array<Array, 1> in = {bench::pseudo_random_array({elements}, 3)};
    auto gelu_like = [](const Tensor& x) { return x * (tanh(x * 0.79788 + x * x * x * 0.0356774) + 1.0) * 0.5; };
    print_row(fmt::format("kernel, {} elements", elements), time_on_one_device(gelu_like, in, 1, rounds),
              time_on_one_device(gelu_like, in, 2, rounds));
  }
  // Square f32 GEMMs, and the GPT's [tokens, width] x [width, 4 width] at width 64 and 128.
  struct Gemm {
    int64_t m, k, n;
  };
  for (const Gemm& g : {Gemm{64, 64, 64}, Gemm{128, 128, 128}, Gemm{256, 256, 256}, Gemm{512, 512, 512},
                        Gemm{1024, 64, 256}, Gemm{2048, 128, 512}}) {
    const std::array<Array, 2> in = {bench::pseudo_random_array({g.m, g.k}, 5), bench::pseudo_random_array({g.k, g.n}, 7)};
    auto product = [](const Tensor& a, const Tensor& b) { return matmul(a, b); };
    print_row(fmt::format("gemm {}x{}x{}", g.m, g.k, g.n), time_on_one_device(product, in, 1, rounds),
              time_on_one_device(product, in, 2, rounds));
  }
  return 0;
}
