// relu(a*b+c)*0.5+d over 16M f32: Tessera (1 and 2 devices) next to a hand-fused loop built
// -O3 -march=native in this binary, Eigen, and libtorch eager (when built with them).
// Usage: elementwise_bench [elements]
#include <fmt/core.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <tessera/tessera.hpp>

#include "jit/device_workers.hpp"

#include "bench_util.hpp"

#if TESSERA_BENCH_EIGEN
#include <Eigen/Core>
#endif
#if TESSERA_BENCH_TORCH
#include <torch/torch.h>
#endif

using namespace tessera;
using tessera::bench::median_seconds;

namespace {

__attribute__((noinline)) void hand_fused(const float* a, const float* b, const float* c, const float* d, float* out,
                                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::max(a[i] * b[i] + c[i], 0.0f) * 0.5f + d[i];
}

Array random_array(int64_t n, uint64_t seed) {
  Array a({n}, DType::f32);
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    a.mutable_data<float>()[i] = float(int64_t(s >> 40) % 2001 - 1000) / 500.0f;
  }
  return a;
}

double tessera_time(const std::vector<Array>& inputs, int devices, int cores_per_device) {
  set_cores_per_device(cores_per_device);
  Mesh mesh = create_mesh({{"x", devices}});
  Layout layout({"x"}, mesh);
  std::vector<Tensor> t;
  for (const Array& a : inputs) t.push_back(copy_to_mesh(a, layout));
  auto f = jit([](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) { return relu(a * b + c) * 0.5 + d; });
  double seconds = median_seconds([&] { f(t[0], t[1], t[2], t[3]); });
  set_cores_per_device(0);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::stoll(argv[1]) : int64_t(16) << 20;
  std::vector<Array> in;
  for (int i = 0; i < 4; ++i) in.push_back(random_array(n, 11 + i));
  Array out({n}, DType::f32);
  const float *a = in[0].data<float>(), *b = in[1].data<float>(), *c = in[2].data<float>(), *d = in[3].data<float>();

  struct Row { std::string name; double seconds; };
  std::vector<Row> rows;
  rows.push_back({"hand-fused C++ loop (1 thread)", median_seconds([&] { hand_fused(a, b, c, d, out.mutable_data<float>(), n); })});
  rows.push_back({"Tessera, 1 device (1 core)", tessera_time(in, 1, 1)});
  rows.push_back({"Tessera, 2 devices (1 core each)", tessera_time(in, 2, 1)});
  rows.push_back({"Tessera, 1 device owning 2 cores", tessera_time(in, 1, 2)});
#if TESSERA_BENCH_EIGEN
  {
    Eigen::Map<const Eigen::ArrayXf> ea(a, n), eb(b, n), ec(c, n), ed(d, n);
    Eigen::Map<Eigen::ArrayXf> eo(out.mutable_data<float>(), n);
    rows.push_back({"Eigen ArrayXf (1 thread)", median_seconds([&] { eo = (ea * eb + ec).max(0.0f) * 0.5f + ed; })});
  }
#endif
#if TESSERA_BENCH_TORCH
  {
    torch::set_num_threads(1);
    auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    auto ta = torch::from_blob(const_cast<float*>(a), {n}, opts), tb = torch::from_blob(const_cast<float*>(b), {n}, opts),
         tc = torch::from_blob(const_cast<float*>(c), {n}, opts), td = torch::from_blob(const_cast<float*>(d), {n}, opts);
    rows.push_back({"libtorch eager (1 thread)", median_seconds([&] { auto r = torch::relu(ta * tb + tc) * 0.5 + td; })});
  }
#endif
  const double one_device = rows[1].seconds;
  fmt::print("relu(a*b+c)*0.5+d over {} f32 ({} hardware threads)\n", n, std::thread::hardware_concurrency());
  fmt::print("{:<34} {:>10} {:>16}\n", "", "time", "Tessera 1-dev x");
  for (const Row& r : rows) fmt::print("{:<34} {:>8.2f}ms {:>15.2f}x\n", r.name, r.seconds * 1e3, r.seconds / one_device);
  fmt::print("2 devices / 1 device speed-up: {:.2f}x\n", one_device / rows[2].seconds);
  return 0;
}
