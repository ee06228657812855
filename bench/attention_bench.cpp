// Causal self-attention, forward and backward (dq, dk, dv), on one core: Tessera's fused flash
// kernel, Tessera's math backend (matmul, mask, softmax, matmul: the [T, T] scores stored), and
// libtorch 1.13 computing the same math with autograd (it has no fused CPU attention). f32,
// 4 sequences x 4 heads x 32 features; the sequence length grows.
//   ./build/bench/attention_bench [--lengths 128,512,1024,2048]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cmath>
#include <random>
#include <vector>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "bench_util.hpp"

#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

using namespace tessera;

namespace {

constexpr int64_t kBatch = 4, kHeads = 4, kFeatures = 32;

Array random_array(const std::vector<int64_t>& shape, std::mt19937& rng) {
  Array a(shape, DType::f32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = normal(rng);
  return a;
}

// Seconds per forward + backward step through `backend`.
double tessera_seconds(SdpBackend backend, const std::vector<Array>& qkvw, const Mesh& mesh) {
  SdpaKernel only({backend});
  std::vector<Tensor> t;
  for (const Array& a : qkvw) t.push_back(distribute_tensor(a, mesh, {Replicate{}}));
  auto step = jit([](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w) {
    return gradients(reduce_sum(scaled_dot_product_attention(q, k, v, true) * w), {q, k, v});
  });
  return bench::median_seconds([&] {
    for (const Tensor& g : step(t[0], t[1], t[2], t[3])) (void)g.to_local();
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {128, 512, 1024, 2048};
  CLI::App app{"Causal attention forward + backward: flash kernel, math backend, libtorch"};
  app.add_option("--lengths", lengths)->delimiter(',');
  CLI11_PARSE(app, argc, argv);

  set_cores_per_device(1);
#if TESSERA_BENCH_TORCH
  torch::set_num_threads(1);
#endif
  const Mesh mesh = create_mesh({{"x", 1}});
  fmt::print("causal attention fwd+bwd, f32, {} x {} heads x T x {}, 1 core; the scores alone are {} x {} x T x T floats\n", kBatch,
             kHeads, kFeatures, kBatch, kHeads);
  fmt::print("{:>6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12}\n", "T", "flash ms", "math ms", "libtorch ms", "vs math",
             "vs torch", "scores MB");
  std::mt19937 rng(1);
  for (int64_t length : lengths) {
    const std::vector<int64_t> shape = {kBatch, kHeads, length, kFeatures};
    const std::vector<Array> qkvw = {random_array(shape, rng), random_array(shape, rng), random_array(shape, rng),
                                     random_array(shape, rng)};
    const double flash = tessera_seconds(SdpBackend::Flash, qkvw, mesh);
    const double math = tessera_seconds(SdpBackend::Math, qkvw, mesh);
    double torch_s = 0;
#if TESSERA_BENCH_TORCH
    {
      auto leaf = [&](const Array& a) {
        return torch::from_blob(const_cast<float*>(a.data<float>()), shape, torch::kFloat32).clone().requires_grad_(true);
      };
      torch::Tensor q = leaf(qkvw[0]), k = leaf(qkvw[1]), v = leaf(qkvw[2]);
      torch::Tensor w = leaf(qkvw[3]).detach();
      torch::Tensor mask = torch::ones({length, length}, torch::kBool).triu(1);
      torch_s = bench::median_seconds([&] {
        torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(kFeatures)));
        scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
        torch::Tensor out = torch::matmul(torch::softmax(scores, -1), v);
        auto grads = torch::autograd::grad({(out * w).sum()}, {q, k, v});
        (void)grads[0].data_ptr<float>();
      });
    }
#endif
    const double scores_mb = double(kBatch * kHeads * length * length * 4) / 1e6;
    fmt::print("{:>6} {:>12.2f} {:>12.2f} {:>12.2f} {:>9.2f}x {:>9.2f}x {:>12.1f}\n", length, flash * 1e3, math * 1e3, torch_s * 1e3,
               math / flash, torch_s > 0 ? torch_s / flash : 0.0, scores_mb);
  }
  set_cores_per_device(0);
  return 0;
}
