// grouped_matmul (dsl/grouped_matmul.hpp) next to one GEMM of the same FLOPs: a dropless MoE
// layer's tokens, unevenly routed to E experts, against all tokens times one weight by OpenBLAS's
// sgemm, both on one thread. The grouped op runs one GEMM per group through the same library, so
// the ratio is what the groups' smaller, uneven products and the op's run-time size checks cost.
// Usage: grouped_matmul_bench [--experts 8] [--tokens 4096] [--k 512] [--f 1408] [--rounds 5]
// On a GPU (--device gpu [--dtype bf16]) the grouped op runs backend/cuda/grouped_gemm.cu, one
// kernel whatever the groups, against Tessera's matmul of the same FLOPs (cuBLAS), forward and
// forward + backward (dx by the grouped GEMM, dw by the grouped weight-gradient GEMM).
#include <cblas.h>
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <numeric>
#include <vector>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "bench_util.hpp"
#include "pseudo_random_array.hpp"

using namespace tessera;
using tessera::bench::median_seconds;
using tessera::bench::warm_up;

namespace {


// An uneven routing of every token: expert e's share grows with (e * 5) % 7 + 1, so the largest
// group is seven times the smallest; the remainder goes to the last expert.
std::vector<int64_t> uneven_sizes(int64_t experts, int64_t tokens) {
  std::vector<int64_t> weight(static_cast<size_t>(experts)), sizes(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) weight[size_t(e)] = (e * 5) % 7 + 1;
  const int64_t total = std::accumulate(weight.begin(), weight.end(), int64_t(0));
  for (int64_t e = 0; e < experts; ++e) sizes[size_t(e)] = tokens * weight[size_t(e)] / total;
  sizes.back() += tokens - std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  return sizes;
}

// The GPU's comparison: grouped_matmul against one matmul of every token by one weight (cuBLAS),
// both through jit on one GPU, forward alone and with the gradients of x and w. A run ends with
// its device synchronized, and results stay on the GPU, so no copy is timed.
int run_on_gpu(int64_t experts, int64_t tokens, int64_t k, int64_t f, int rounds, DType dtype) {
  if (gpu_devices().empty()) {
    fmt::print("grouped_matmul_bench: no GPU\n");
    return 1;
  }
  const std::vector<int64_t> sizes = uneven_sizes(experts, tokens);
  const Mesh mesh = create_mesh({{"x", 1}}, gpu_devices(1));
  const Tensor tx = cast(copy_to_mesh(bench::pseudo_random_array({tokens, k}, 1), Layout::replicated(mesh, 2)), dtype);
  const Tensor tw = cast(copy_to_mesh(bench::pseudo_random_array({experts, k, f}, 2), Layout::replicated(mesh, 3)), dtype);
  const Tensor tw0 = cast(copy_to_mesh(bench::pseudo_random_array({k, f}, 3), Layout::replicated(mesh, 2)), dtype);
  const Tensor ts = copy_to_mesh(Array::from<int64_t>(sizes, {experts}), Layout::replicated(mesh, 1));
  auto grouped = jit([](const Tensor& x, const Tensor& w, const Tensor& s) { return grouped_matmul(x, w, s); });
  auto one = jit([](const Tensor& x, const Tensor& w) { return matmul(x, w); });
  auto grouped_grads = jit([](const Tensor& x, const Tensor& w, const Tensor& s) {
    return gradients(reduce_sum(cast(grouped_matmul(x, w, s), DType::f32)), {x, w});
  });
  auto one_grads = jit([](const Tensor& x, const Tensor& w) { return gradients(reduce_sum(cast(matmul(x, w), DType::f32)), {x, w}); });
  const std::vector<std::function<void()>> calls = {
      [&] { (void)grouped(tx, tw, ts); }, [&] { (void)one(tx, tw0); }, [&] { (void)grouped_grads(tx, tw, ts); },
      [&] { (void)one_grads(tx, tw0); }};
  std::vector<double> best(calls.size(), 1e30);
  for (const auto& call : calls) warm_up(call);
  for (int r = 0; r < rounds; ++r)
    for (size_t c = 0; c < calls.size(); ++c) best[c] = std::min(best[c], median_seconds(calls[c], 7));
  const double flops = 2.0 * double(tokens) * double(k) * double(f);
  fmt::print("grouped_matmul on 1 GPU: E={} experts, N={} tokens (groups {}), K={}, F={}, {}\n", experts, tokens,
             fmt::join(sizes, " "), k, f, dtype_name(dtype));
  fmt::print("{:<40} {:>10} {:>10}\n", "", "ms", "TFLOP/s");
  const char* names[] = {"tessera grouped_matmul, forward", "tessera matmul (cuBLAS), forward",
                         "tessera grouped_matmul, fwd + bwd", "tessera matmul (cuBLAS), fwd + bwd"};
  for (size_t c = 0; c < calls.size(); ++c) {
    const double work = c < 2 ? flops : 3 * flops;
    fmt::print("{:<40} {:>10.3f} {:>10.1f}\n", names[c], best[c] * 1e3, work / best[c] * 1e-12);
  }
  fmt::print("ratio (grouped / one GEMM rate): forward {:.3f}, fwd + bwd {:.3f}\n", best[1] / best[0], best[3] / best[2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"grouped_matmul against one GEMM of the same FLOPs, one thread"};
  int64_t experts = 8, tokens = 4096, k = 512, f = 1408;
  int rounds = 5;
  std::string device = "cpu", dtype_text = "f32";
  app.add_option("--device", device, "cpu (one thread, OpenBLAS) or gpu (one GPU, cuBLAS)")->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--dtype", dtype_text, "on a GPU: the operands' dtype")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--experts", experts);
  app.add_option("--tokens", tokens);
  app.add_option("--k", k);
  app.add_option("--f", f);
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);
  if (device == "gpu") return run_on_gpu(experts, tokens, k, f, rounds, dtype_text == "bf16" ? DType::bf16 : DType::f32);

  set_cores_per_device(1);
  openblas_set_num_threads(1);
  const std::vector<int64_t> sizes = uneven_sizes(experts, tokens);
  const double flops = 2.0 * double(tokens) * double(k) * double(f);
  const Array x = bench::pseudo_random_array({tokens, k}, 1), w = bench::pseudo_random_array({experts, k, f}, 2), w0 = bench::pseudo_random_array({k, f}, 3);
  const Mesh mesh = create_mesh({{"x", 1}});
  const Tensor tx = copy_to_mesh(x, Layout::replicated(mesh, 2)), tw = copy_to_mesh(w, Layout::replicated(mesh, 3));
  const Tensor ts = copy_to_mesh(Array::from<int64_t>(sizes, {experts}), Layout::replicated(mesh, 1));
  auto step = jit([](const Tensor& x, const Tensor& w, const Tensor& s) { return grouped_matmul(x, w, s); });
  Array out({tokens, f}, DType::f32);
  const std::vector<std::function<void()>> calls = {
      [&] { (void)step(tx, tw, ts).to_local(); },
      [&] {  // one GEMM of every token by one weight
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(tokens), blasint(f), blasint(k), 1.0f, x.data<float>(),
                    blasint(k), w0.data<float>(), blasint(f), 0.0f, out.mutable_data<float>(), blasint(f));
      },
      [&] {  // the groups' own GEMMs called directly: what grouping costs before anything Tessera adds
        int64_t first = 0;
        for (int64_t e = 0; e < experts; ++e) {
          const int64_t rows = sizes[size_t(e)];
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(rows), blasint(f), blasint(k), 1.0f,
                      x.data<float>() + first * k, blasint(k), w.data<float>() + e * k * f, blasint(f), 0.0f,
                      out.mutable_data<float>() + first * f, blasint(f));
          first += rows;
        }
      }};
  // Rounds alternate between the three, each keeping its best median, so load from elsewhere on
  // the machine slows all of them alike.
  std::vector<double> best(calls.size(), 1e30);
  for (const auto& call : calls) warm_up(call);
  for (int r = 0; r < rounds; ++r)
    for (size_t c = 0; c < calls.size(); ++c) best[c] = std::min(best[c], median_seconds(calls[c], 7));
  const double grouped = best[0], gemm = best[1], per_group = best[2];

  fmt::print("grouped_matmul: E={} experts, N={} tokens (groups {}), K={}, F={}, f32, one thread\n", experts, tokens,
             fmt::join(sizes, " "), k, f);
  fmt::print("{:<34} {:>10} {:>10}\n", "", "ms", "GFLOP/s");
  fmt::print("{:<34} {:>10.2f} {:>10.1f}\n", "tessera grouped_matmul (jit)", grouped * 1e3, flops / grouped * 1e-9);
  fmt::print("{:<34} {:>10.2f} {:>10.1f}\n", "one OpenBLAS sgemm, same FLOPs", gemm * 1e3, flops / gemm * 1e-9);
  fmt::print("{:<34} {:>10.2f} {:>10.1f}\n", "OpenBLAS sgemm per group (direct)", per_group * 1e3, flops / per_group * 1e-9);
  fmt::print("ratio (grouped / one GEMM rate): {:.3f}\n", gemm / grouped);
  set_cores_per_device(0);
}
