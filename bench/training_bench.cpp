// One training step of the MNIST MLP (batch 128, 784-700-500-10, ReLU, Adam) in Tessera next to
// libtorch 1.13 in its best 1-thread configuration (flush-to-zero, one OpenBLAS thread), in one
// process; data-parallel samples/s on 2 devices; cold and warm compile time of the step.
// Usage: training_bench          (the warm-start probe re-runs this binary with --compile-probe DIR)
#include <cblas.h>
#include <fmt/core.h>
#include <xmmintrin.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "bench_util.hpp"
#include "mnist_mlp.hpp"
#include "backend/cpu/orc_engine.hpp"

#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

using namespace tessera;
using tessera::bench::median_seconds;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kBatch = 128;

using Model = tessera::bench::MnistMlp;

std::pair<Tensor, Tensor> batch(const Mesh& mesh, int64_t rows) {
  return {random_uniform({rows, 784}, 7, Layout::batch_sharded(mesh, "batch", 2)),
          cast(random_uniform({rows}, 8, Layout::batch_sharded(mesh, "batch", 1), 0, 9.99), DType::i32)};
}

// A compiled training step on `devices` devices (each owning one core) with its batch.
struct StepOn {
  Mesh mesh;
  Model model;
  std::function<void()> run;
  explicit StepOn(int devices) : mesh(create_mesh({{"batch", devices}})), model(mesh) {
    auto [x, y] = batch(mesh, kBatch);
    Tensor xs = copy_to_mesh(x.full_tensor(), x.layout()), ys = copy_to_mesh(y.full_tensor(), y.layout());
    run = [step = model.step(), xs, ys]() mutable { step(xs, ys); };
    run();  // trace and compile
  }
};

// Seconds per step on 1 and on 2 devices. The two are timed in alternation (rounds of 20 steps
// each, medians over the rounds) so that this shared machine's slow spells hit both alike.
std::pair<double, double> tessera_steps() {
  set_cores_per_device(1);
  StepOn one(1), two(2);
  std::vector<double> t1, t2;
  for (int round = 0; round < 9; ++round) {
    t1.push_back(median_seconds(one.run, 1, 20));
    t2.push_back(median_seconds(two.run, 1, 20));
  }
  set_cores_per_device(0);
  std::sort(t1.begin(), t1.end());
  std::sort(t2.begin(), t2.end());
  return {t1[t1.size() / 2], t2[t2.size() / 2]};
}

int compile_probe(const std::string& dir) {
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  Mesh mesh = create_mesh({{"batch", 1}});
  Model model(mesh);
  auto step = model.step();
  auto [x, y] = batch(mesh, kBatch);
  Tensor xs = copy_to_mesh(x.full_tensor(), x.layout()), ys = copy_to_mesh(y.full_tensor(), y.layout());
  auto start = Clock::now();
  step.executable(xs, ys);  // trace + partition + compile (or load), nothing runs
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("%.2f %lld %lld\n", ms, (long long)compile_stats().compiled_modules, (long long)compile_stats().disk_hits);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--compile-probe") return compile_probe(argv[2]);
  fmt::print("MNIST MLP training step: batch {}, 784-700-500-10, ReLU, Adam\n", kBatch);
  const auto [one, two] = tessera_steps();
  fmt::print("{:<44} {:8.3f} ms\n", "Tessera, 1 device (1 core)", one * 1e3);
#if TESSERA_BENCH_TORCH
  {
    _mm_setcsr(_mm_getcsr() | 0x8040);  // flush-to-zero: libtorch's best setting here
    torch::set_num_threads(1);
    openblas_set_num_threads(1);
    torch::manual_seed(0);
    auto net = torch::nn::Sequential(torch::nn::Linear(784, 700), torch::nn::ReLU(), torch::nn::Linear(700, 500), torch::nn::ReLU(),
                                     torch::nn::Linear(500, 10));
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
    auto x = torch::rand({kBatch, 784}), y = torch::randint(0, 10, {kBatch}, torch::kLong);
    double torch_step = median_seconds([&] {
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
    }, 7, 20);
    fmt::print("{:<44} {:8.3f} ms   Tessera / libtorch = {:.2f}x the time\n", "libtorch 1.13, 1 thread, flush-to-zero", torch_step * 1e3,
               one / torch_step);
  }
#endif
  fmt::print("{:<44} {:8.3f} ms   {:.0f} vs {:.0f} samples/s: {:.2f}x\n", "Tessera, 2 devices data-parallel (1 core each)", two * 1e3,
             kBatch / two, kBatch / one, one / two);

  auto runs = tessera::bench::cold_and_warm(argv[0], "--compile-probe");
  if (!runs) return 1;
  for (const auto& [phase, r] : {std::pair{"cold", runs->first}, std::pair{"warm", runs->second}})
    fmt::print("compile of the training step, {}: {:.1f} ms (LLVM compilations {}, disk cache hits {})\n", phase, r.ms, r.compiled,
               r.disk_hits);
  return 0;
}
