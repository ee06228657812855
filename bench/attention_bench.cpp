// Causal self-attention, forward and backward (dq, dk, dv): Tessera's fused flash kernel,
// Tessera's math backend (matmul, mask, softmax, matmul: the [T, T] scores stored), and, on CPUs,
// libtorch 1.13 computing the same math with autograd (it has no fused CPU attention). By default
// f32 on one core, 4 sequences x 4 heads x 32 features; the sequence length grows.
//   ./build/bench/attention_bench [--lengths 128,512,1024,2048]
// On a GPU (bench/attention_gpu_peers.py times PyTorch's SDPA on the same shapes):
//   attention_bench --device gpu --batch 2 --heads 8 --features 128 --dtype bf16 --lengths 1024,4096,8192
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
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

Array random_array(const std::vector<int64_t>& shape, std::mt19937& rng) {
  Array a(shape, DType::f32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = normal(rng);
  return a;
}

// Seconds per forward + backward step through `backend`, on q, k, v, w cast to `dtype`. On a GPU
// the gradients stay there: a run ends with its device synchronized, so no copy is timed.
// forward_only: the forward alone, its output the program's (left on the device, not reduced: a
// GPU's fused sum of it to a scalar took 540 ms at T = 8192 on the H200, 2026-12-01).
double tessera_seconds(SdpBackend backend, const std::vector<Array>& qkvw, const Mesh& mesh, DType dtype, bool on_gpu,
                       bool forward_only = false) {
  SdpaKernel only({backend});
  std::vector<Tensor> t;
  for (const Array& a : qkvw) t.push_back(distribute_tensor(a, mesh, {Replicate{}}));
  auto step = jit([dtype, forward_only](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w) {
    const Tensor out = scaled_dot_product_attention(cast(q, dtype), cast(k, dtype), cast(v, dtype), true);
    if (forward_only) return std::vector<Tensor>{out};
    return gradients(reduce_sum(cast(out, DType::f32) * w), {q, k, v});
  });
  return bench::median_seconds([&] {
    const std::vector<Tensor> grads = step(t[0], t[1], t[2], t[3]);
    if (!on_gpu)
      for (const Tensor& g : grads) (void)g.to_local();
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {128, 512, 1024, 2048};
  int64_t batch = 4, heads = 4, features = 32;
  std::string device = "cpu", dtype_text = "f32";
  CLI::App app{"Causal attention forward + backward: flash kernel, math backend, libtorch"};
  app.add_option("--lengths", lengths)->delimiter(',');
  app.add_option("--device", device, "cpu (one core) or gpu (one GPU)")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--batch", batch, "sequences");
  app.add_option("--heads", heads);
  app.add_option("--features", features, "per head");
  app.add_option("--dtype", dtype_text, "q, k and v's dtype")->check(CLI::IsMember({"f32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  const bool on_gpu = device == "gpu";
  const DType dtype = dtype_text == "bf16" ? DType::bf16 : DType::f32;
  if (on_gpu && gpu_devices().empty()) {
    fmt::print("attention_bench: no GPU\n");
    return 1;
  }

  set_cores_per_device(1);
#if TESSERA_BENCH_TORCH
  torch::set_num_threads(1);
#endif
  const Mesh mesh = on_gpu ? create_mesh({{"x", 1}}, gpu_devices(1)) : create_mesh({{"x", 1}});
  fmt::print("causal attention fwd+bwd, {}, {} x {} heads x T x {}, {}; the scores alone are {} x {} x T x T floats\n", dtype_text,
             batch, heads, features, on_gpu ? "1 GPU" : "1 core", batch, heads);
  // On a GPU, bf16's flash kernel runs on tensor cores (backend/cuda/flash_attention_mma.cu); the
  // CUDA cores' kernel (flash_attention.cu) is timed beside it, and the TFLOP/s count FlashAttention's
  // causal work (bench/attention_gpu_peers.py's: 3.5 x 4 B H T^2 D / 2 for forward and backward).
  const bool both_kernels = on_gpu && dtype == DType::bf16;
  fmt::print("{:>6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12} {:>14} {:>9} {:>14}\n", "T", "flash ms", "math ms", "libtorch ms",
             "vs math", "vs torch", "scores MB", both_kernels ? "CUDA cores ms" : "", "TFLOP/s", on_gpu ? "flash fwd ms" : "");
  std::mt19937 rng(1);
  for (int64_t length : lengths) {
    const std::vector<int64_t> shape = {batch, heads, length, features};
    const std::vector<Array> qkvw = {random_array(shape, rng), random_array(shape, rng), random_array(shape, rng),
                                     random_array(shape, rng)};
    const double flash = tessera_seconds(SdpBackend::Flash, qkvw, mesh, dtype, on_gpu);
    const double math = tessera_seconds(SdpBackend::Math, qkvw, mesh, dtype, on_gpu);
    double cuda_cores = 0;
    if (both_kernels) {
      setenv("TESSERA_ATTENTION_TENSOR_CORES", "0", 1);
      cuda_cores = tessera_seconds(SdpBackend::Flash, qkvw, mesh, dtype, on_gpu);
      unsetenv("TESSERA_ATTENTION_TENSOR_CORES");
    }
    const double flops = 3.5 * 4 * double(batch * heads) * double(length) * double(length) * double(features) / 2;
    const double forward = on_gpu ? tessera_seconds(SdpBackend::Flash, qkvw, mesh, dtype, on_gpu, true) : 0;
    double torch_s = 0;
#if TESSERA_BENCH_TORCH
    if (!on_gpu && dtype == DType::f32) {
      auto leaf = [&](const Array& a) {
        return torch::from_blob(const_cast<float*>(a.data<float>()), shape, torch::kFloat32).clone().requires_grad_(true);
      };
      torch::Tensor q = leaf(qkvw[0]), k = leaf(qkvw[1]), v = leaf(qkvw[2]);
      torch::Tensor w = leaf(qkvw[3]).detach();
      torch::Tensor mask = torch::ones({length, length}, torch::kBool).triu(1);
      torch_s = bench::median_seconds([&] {
        torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(features)));
        scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
        torch::Tensor out = torch::matmul(torch::softmax(scores, -1), v);
        auto grads = torch::autograd::grad({(out * w).sum()}, {q, k, v});
        (void)grads[0].data_ptr<float>();
      });
    }
#endif
    const double scores_mb = double(batch * heads * length * length * 4) / 1e6;
    fmt::print("{:>6} {:>12.2f} {:>12.2f} {:>12.2f} {:>9.2f}x {:>9.2f}x {:>12.1f} {:>14} {:>9.1f} {:>14}\n", length, flash * 1e3,
               math * 1e3, torch_s * 1e3, math / flash, torch_s > 0 ? torch_s / flash : 0.0, scores_mb,
               both_kernels ? fmt::format("{:.2f}", cuda_cores * 1e3) : "", flops / flash * 1e-12,
               on_gpu ? fmt::format("{:.2f}", forward * 1e3) : "");
  }
  set_cores_per_device(0);
  return 0;
}
