// relu(a*b+c)*0.5+d over 16M f32: Tessera (1 and 2 devices) next to a hand-fused loop built
// -O3 -march=native in this binary, Eigen, and libtorch eager (when built with them). Then an
// Adam update of four parameters written over their old values (Variables, whose buffers a call
// may write over), on one core, next to a hand-fused loop and libtorch's in-place ops.
// Usage: elementwise_bench [elements]
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
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

// Adam's update of kAdamParameters parameters, each with its moments, written over them.
constexpr int kAdamParameters = 4;
constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kRate = 0.001f, kEpsilon = 1e-8f;

__attribute__((noinline)) void hand_fused_adam(float* __restrict p, float* __restrict m, float* __restrict v, const float* __restrict g,
                                               int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = m[i] * kBeta1 + g[i] * (1 - kBeta1);
    v[i] = v[i] * kBeta2 + g[i] * g[i] * (1 - kBeta2);
    p[i] -= m[i] * kRate / (std::sqrt(v[i]) + kEpsilon);
  }
}

double tessera_adam_time(int64_t elements) {
  set_cores_per_device(1);
  const Mesh mesh = create_mesh({{"x", 1}});
  std::vector<Variable> p, m, v, g;  // the gradients too: a jit function takes them as it reads them
  for (int i = 0; i < kAdamParameters; ++i) {
    auto filled = [&](uint64_t seed) { return copy_to_mesh(random_array(elements, seed), Layout::replicated(mesh, 1)); };
    p.emplace_back(filled(31 + i)), m.emplace_back(filled(41 + i) * 0.01), v.emplace_back(filled(51 + i) * filled(51 + i));
    g.emplace_back(filled(61 + i));
  }
  auto update = jit([&] {
    for (int i = 0; i < kAdamParameters; ++i) {
      const Tensor gi = g[size_t(i)];
      const Tensor mi = Tensor(m[i]) * kBeta1 + gi * (1 - kBeta1);
      const Tensor vi = Tensor(v[i]) * kBeta2 + gi * gi * (1 - kBeta2);
      m[i].assign(mi), v[i].assign(vi);
      p[i].assign(Tensor(p[i]) - mi * kRate / (sqrt(vi) + kEpsilon));
    }
    return Tensor(p[0]);
  });
  const double seconds = median_seconds([&] { update().to_local(); });
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

  const int64_t elements = std::max<int64_t>(1, n / 64);
  std::vector<Array> state;  // p, m, v, g of each parameter
  for (int i = 0; i < 4 * kAdamParameters; ++i) {
    state.push_back(random_array(elements, 71 + i));
    if (i % 4 == 2)  // v: a second moment, not negative
      for (int64_t e = 0; e < elements; ++e) state.back().mutable_data<float>()[e] *= state.back().data<float>()[e];
  }
  std::vector<Row> adam;
  adam.push_back({"hand-fused C++ loop (1 thread)", median_seconds([&] {
                    for (int i = 0; i < kAdamParameters; ++i)
                      hand_fused_adam(state[size_t(4 * i)].mutable_data<float>(), state[size_t(4 * i + 1)].mutable_data<float>(),
                                      state[size_t(4 * i + 2)].mutable_data<float>(), state[size_t(4 * i + 3)].data<float>(), elements);
                  })});
  adam.push_back({"Tessera, 1 device (1 core)", tessera_adam_time(elements)});
#if TESSERA_BENCH_TORCH
  {
    auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    std::vector<torch::Tensor> t;
    for (Array& a : state) t.push_back(torch::from_blob(a.mutable_data<float>(), {elements}, opts));
    adam.push_back({"libtorch eager, in place (1 thread)", median_seconds([&] {
                      for (int i = 0; i < kAdamParameters; ++i) {
                        auto &p = t[size_t(4 * i)], &m = t[size_t(4 * i + 1)], &v = t[size_t(4 * i + 2)], &g = t[size_t(4 * i + 3)];
                        m.mul_(kBeta1).add_(g, 1 - kBeta1);
                        v.mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
                        p.addcdiv_(m, v.sqrt().add_(kEpsilon), -kRate);
                      }
                    })});
  }
#endif
  fmt::print("\nAdam's update of {} parameters of {} f32, written over them\n", kAdamParameters, elements);
  fmt::print("{:<34} {:>10} {:>16}\n", "", "time", "Tessera x");
  for (const Row& r : adam) fmt::print("{:<34} {:>8.3f}ms {:>15.2f}x\n", r.name, r.seconds * 1e3, r.seconds / adam[1].seconds);
  return 0;
}
