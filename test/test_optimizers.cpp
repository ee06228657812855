// AdamW, clip_grad_norm and the warmup + cosine schedule: against direct formulas, on one device
// and on sharded meshes (gradients Partial or sharded), eagerly and inside jit.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include <tessera/tessera.hpp>

#include "jit/driver.hpp"
#include "random_arrays.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// PyTorch's AdamW on plain arrays, for comparison.
struct DirectAdamW {
  std::vector<double> m, v;
  int64_t t = 0;
  void step(std::vector<double>& w, const std::vector<double>& g, double lr, double wd) {
    if (m.empty()) m.assign(w.size(), 0.0), v.assign(w.size(), 0.0);
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] *= 1 - lr * wd;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, double(t))), vh = v[i] / (1 - std::pow(0.999, double(t)));
      w[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
    }
  }
};

std::vector<double> values(const Tensor& t) {
  Array a = t.full_tensor();
  return std::vector<double>(a.data<double>(), a.data<double>() + a.numel());
}

}  // namespace

TEST_CASE("AdamW matches PyTorch's update on every mesh, eagerly and in jit, with a schedule setting the rate") {
  std::mt19937 rng(1);
  const Array w0 = random_f64({5, 3}, rng, -1.0, 1.0), x = random_f64({4, 5}, rng, -1.0, 1.0);
  const std::vector<double> rates = {0.1, 0.05, 0.02};
  // loss = sum(tanh(x w)^2): gradients by hand for the direct update.
  auto grad_of = [&](const std::vector<double>& w) {
    std::vector<double> g(w.size(), 0.0);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 3; ++c) {
        double s = 0;
        for (int64_t k = 0; k < 5; ++k) s += x.data<double>()[r * 5 + k] * w[size_t(k * 3 + c)];
        const double y = std::tanh(s), dy = 2 * y * (1 - y * y);
        for (int64_t k = 0; k < 5; ++k) g[size_t(k * 3 + c)] += dy * x.data<double>()[r * 5 + k];
      }
    return g;
  };
  std::vector<double> want(w0.data<double>(), w0.data<double>() + w0.numel());
  DirectAdamW direct;
  for (double lr : rates) direct.step(want, grad_of(want), lr, 0.01);

  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> rows(size_t(mesh.ndim()), Replicate{});
    rows[0] = Shard{0};  // w's rows over "x": x w contracts a sharded axis (Partial products)
    for (bool traced : {false, true}) {
      CAPTURE(traced);
      Variable w(distribute_tensor(w0, mesh, rows));
      Tensor xs = distribute_tensor(x, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
      AdamW opt({w}, rates[0]);
      auto step = [&](const Tensor& input) {
        std::vector<Tensor> g = gradients(reduce_sum(square(tanh(matmul(input, w)))), {w.value()});
        opt.apply(g);
        return g[0];
      };
      auto jitted = jit(step);
      for (double lr : rates) {
        opt.set_learning_rate(lr);
        (void)(traced ? jitted(xs) : step(xs)).full_tensor();
      }
      const std::vector<double> got = values(w.value());
      for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-10));
      CHECK(opt.learning_rate() == rates.back());
    }
  }
}

TEST_CASE("clip_grad_norm: one global norm over sharded and Partial gradients, as on one device") {
  std::mt19937 rng(2);
  const Array a = random_f64({6, 4}, rng, -1.0, 1.0), b = random_f64({4, 5}, rng, -1.0, 1.0), c = random_f64({3, 5}, rng, -1.0, 1.0);
  std::vector<double> reference_norm;
  std::vector<std::vector<double>> reference_grads;
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 4}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> pa(size_t(mesh.ndim()), Replicate{}), pb(size_t(mesh.ndim()), Replicate{});
    pa[0] = Shard{1};  // the contraction axis: gradients of the product arrive as Partial sums
    pb[0] = Shard{0};
    if (mesh.ndim() == 2) pb[1] = Shard{1};
    Tensor ta = distribute_tensor(a, mesh, pa), tb = distribute_tensor(b, mesh, pb);
    std::vector<Tensor> grads = gradients(reduce_sum(exp(matmul(ta, tb))), {ta, tb});
    // And a gradient that is certainly Partial(sum) over the first mesh dim (its value is c).
    std::vector<Placement> pc(size_t(mesh.ndim()), Replicate{});
    pc[0] = Partial{};
    const Tensor tc = relayout(distribute_tensor(c, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{})),
                               Layout::from_placements(mesh, pc, 2));
    if (mesh.size() > 1) CHECK(std::holds_alternative<Partial>(tc.placements()[0]));
    grads.push_back(tc);
    std::vector<double> before = values(grads[0]);
    Tensor norm = clip_grad_norm(grads, 0.5);
    const double n = norm.full_tensor().data<double>()[0];
    double direct = 0;
    for (const Tensor& g : gradients(reduce_sum(exp(matmul(ta, tb))), {ta, tb}))
      for (double v : values(g)) direct += v * v;
    for (int64_t i = 0; i < c.numel(); ++i) direct += c.data<double>()[i] * c.data<double>()[i];
    CHECK(n == doctest::Approx(std::sqrt(direct)).epsilon(1e-12));
    CHECK(values(grads[0])[0] == doctest::Approx(before[0] * 0.5 / (n + 1e-6)).epsilon(1e-12));
    double clipped = 0;
    for (const Tensor& g : grads)
      for (double v : values(g)) clipped += v * v;
    CHECK(std::sqrt(clipped) == doctest::Approx(0.5).epsilon(1e-5));
    if (reference_norm.empty()) reference_norm.push_back(n);
    else CHECK(n == doctest::Approx(reference_norm[0]).epsilon(1e-12));
  }
  std::vector<Tensor> none;
  CHECK_THROWS_AS(clip_grad_norm(none, 1.0), ShapeError);
  std::vector<Tensor> one = {distribute_tensor(a, create_mesh({{"x", 1}}), {Replicate{}})};
  CHECK_THROWS_AS(clip_grad_norm(one, 0.0), Error);
}

TEST_CASE("warmup then cosine decay") {
  CHECK(warmup_cosine_lr(0, 10, 110, 1.0) == doctest::Approx(0.1));
  CHECK(warmup_cosine_lr(9, 10, 110, 1.0) == doctest::Approx(1.0));
  CHECK(warmup_cosine_lr(10, 10, 110, 1.0, 0.1) == doctest::Approx(1.0));
  CHECK(warmup_cosine_lr(60, 10, 110, 1.0, 0.1) == doctest::Approx(0.55));
  CHECK(warmup_cosine_lr(110, 10, 110, 1.0, 0.1) == doctest::Approx(0.1));
  CHECK(warmup_cosine_lr(500, 10, 110, 1.0, 0.1) == doctest::Approx(0.1));
  CHECK_THROWS_AS(warmup_cosine_lr(0, 20, 10, 1.0), Error);
}

TEST_CASE("a training step with a new learning rate every step compiles nothing and keeps no graph after warm-up") {
  // The GPT sample grew by ~12 KB per step: each new rate was a constant of a freshly compiled
  // program, kept forever. Counters, not memory: programs built, live nodes, table entries.
  std::mt19937 rng(5);
  const Array w0 = random_f64({6, 3}, rng, -1.0, 1.0), x = random_f64({4, 6}, rng, -1.0, 1.0);
  Mesh mesh = create_mesh({{"x", 2}});
  Variable w(distribute_tensor(w0, mesh, {Shard{0}}));
  Tensor xs = distribute_tensor(x, mesh, {Replicate{}});
  AdamW opt({w}, 0.1);
  auto step = jit([&](const Tensor& input) {
    Tensor loss = reduce_sum(square(tanh(matmul(input, w))));
    opt.apply(gradients(loss, {w.value()}));
    return loss;
  });
  auto run = [&](int steps, int from) {
    for (int s = from; s < from + steps; ++s) {
      opt.set_learning_rate(0.1 / (1 + s));  // a schedule: a new rate every step
      (void)step(xs).full_tensor();
    }
  };
  run(3, 0);
  const int64_t built = driver_stats().executables_built;
  const size_t live = live_node_count();
  run(40, 3);
  CHECK(driver_stats().executables_built == built);
  CHECK(live_node_count() == live);
  CHECK(step.traces() == 1);
  // Eager steps make graphs that die: the hash-consing table sweeps their entries.
  for (int s = 0; s < 3000; ++s) (void)(distribute_tensor(x, mesh, {Replicate{}}) * 2.0 + 1.0).node();
  CHECK(node_table_entries() <= 2 * live_node_count() + 4096);
}
