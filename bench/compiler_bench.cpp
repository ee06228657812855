// The compiler's costs next to its peers, in one process:
//  - sgemm 1024^3 and 2048^3 through Tessera vs OpenBLAS called directly (same thread count), and
//    Tessera's bf16 GEMM (f32 sums) on the same shapes and cores, as a multiple of its f32 rate;
//  - host overhead of one call of a compiled 20-op function on tiny tensors;
//  - cold compile of a 20-op program, and a warm start from the disk cache in a fresh process.
// Usage: compiler_bench            (the warm-start probe re-runs this binary with --warm-probe DIR)
#include <cblas.h>
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"
#include "backend/cpu/orc_engine.hpp"

using namespace tessera;
using tessera::bench::median_seconds;
using Clock = std::chrono::steady_clock;

namespace {

Array filled(std::vector<int64_t> shape, float scale) {
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i % 13) * scale;
  return a;
}

// A 20-op program: elementwise chain, two reductions and a softmax.
Tensor twenty_ops(const Tensor& x, const Tensor& y) {
  Tensor t = relu(x * y + 1.0) - x * 0.5;            // 5
  t = tanh(t) + exp(y * 0.1) / (abs(x) + 1.0);       // 7
  t = softmax(t) * reduce_mean(t, {1}, true);        // 6 (softmax is 5 primitives)
  return sqrt(abs(t) + 2.0);                         // 3
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int warm_probe(const std::string& dir) {
  setenv("TESSERA_CACHE_DIR", dir.c_str(), 1);
  Mesh mesh = create_mesh({{"x", 1}});
  Tensor x = copy_to_mesh(filled({8, 16}, 0.1f), Layout::replicated(mesh, 2));
  auto start = Clock::now();
  Array out = twenty_ops(x, x).full_tensor();
  double seconds = seconds_since(start);
  CompileStats s = compile_stats();
  std::printf("%.3f %lld %lld\n", seconds * 1e3, (long long)s.compiled_modules, (long long)s.disk_hits);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--warm-probe") return warm_probe(argv[2]);
  const int threads = int(std::thread::hardware_concurrency());

  fmt::print("== sgemm, 1 device owning {} cores ==\n", threads);
  Mesh one = create_mesh({{"x", 1}});
  for (int64_t n : {1024, 2048}) {
    Array a = filled({n, n}, 0.01f), b = filled({n, n}, 0.02f), c({n, n}, DType::f32);
    Tensor ta = copy_to_mesh(a, Layout::replicated(one, 2)), tb = copy_to_mesh(b, Layout::replicated(one, 2));
    auto mm = jit([](const Tensor& x, const Tensor& y) { return matmul(x, y); });
    tessera::bench::warm_up([&] { mm(ta, tb); });
    double tessera = median_seconds([&] { mm(ta, tb); }, 5);
    openblas_set_num_threads(threads);
    auto blas_call = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, a.data<float>(), int(n),
                  b.data<float>(), int(n), 0.0f, c.mutable_data<float>(), int(n));
    };
    tessera::bench::warm_up(blas_call);
    double blas = median_seconds(blas_call, 5);
    double flops = 2.0 * double(n) * double(n) * double(n);
    fmt::print("{:>5}^3: Tessera {:7.2f} ms ({:6.1f} GFLOP/s)  OpenBLAS {:7.2f} ms ({:6.1f} GFLOP/s)  ratio {:.3f}x\n", n,
               tessera * 1e3, flops / tessera / 1e9, blas * 1e3, flops / blas / 1e9, blas / tessera);
    Tensor ha = cast(ta, DType::bf16), hb = cast(tb, DType::bf16);
    ha.full_tensor();
    hb.full_tensor();
    tessera::bench::warm_up([&] { mm(ha, hb); });
    double bf16 = median_seconds([&] { mm(ha, hb); }, 5);
    fmt::print("{:>5}^3: Tessera bf16 {:7.2f} ms ({:6.1f} GFLOP/s)  {:.2f}x Tessera's f32 rate\n", n, bf16 * 1e3,
               flops / bf16 / 1e9, tessera / bf16);
  }

  fmt::print("\n== host overhead: one call of a compiled 20-op function on 8x16 tensors ==\n");
  Tensor x = copy_to_mesh(filled({8, 16}, 0.1f), Layout::replicated(one, 2));
  auto f = jit(twenty_ops);
  double call = median_seconds([&] { f(x, x); }, 7, 2000);
  fmt::print("{:.2f} us per call ({} kernels)\n", call * 1e6, plan_summary(twenty_ops(x, x)).kernels);

  fmt::print("\n== compile: cold, then warm start from the disk cache in a new process ==\n");
  auto runs = tessera::bench::cold_and_warm(argv[0], "--warm-probe");
  if (!runs) return 1;
  for (const auto& [phase, r] : {std::pair{"cold", runs->first}, std::pair{"warm", runs->second}})
    fmt::print("{}: first force {:.1f} ms (compiled modules {}, disk cache hits {})\n", phase, r.ms, r.compiled, r.disk_hits);
  return 0;
}
