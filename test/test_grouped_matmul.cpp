// grouped_matmul (torch._grouped_mm, dsl/grouped_matmul.hpp) against per-group products computed
// here in double loops: forward, dx and dw on one device and on 1-D and 2-D meshes in every
// supported layout and one that must be redistributed, with uneven groups, an expert given no
// rows, every row to one expert and padding rows; bf16; local_map with each device's own tokens
// and experts; one compiled program for every set of sizes; the run-time size checks; the same
// values from ordinary ops where a target has no grouped GEMM.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <tessera/tessera.hpp>

#include "backend/cpu/orc_engine.hpp"
#include "dsl/determinism.hpp"
#include "jit/backend_registry.hpp"
#include "jit/driver.hpp"
#include "jit/library_fallback.hpp"
#include "reference_evaluator.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

constexpr int64_t kRows = 20, kK = 6, kF = 8, kExperts = 4;

// The sizes the cases route by: uneven with an empty expert and 4 padding rows; every row to one
// expert; uneven summing to every row.
std::vector<std::vector<int64_t>> size_cases() { return {{5, 0, 9, 2}, {0, 0, kRows, 0}, {7, 1, 3, 9}}; }

struct GroupedProducts {
  std::vector<double> out, dx, dw;  // out [N, F]; for loss = sum(out * r): dx [N, K], dw [E, K, F]
};

// Per-group products with the group bounds taken from the sizes directly.
GroupedProducts dense_grouped(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& r,
                    const std::vector<int64_t>& sizes, int64_t rows) {
  GroupedProducts d{std::vector<double>(size_t(rows * kF)), std::vector<double>(size_t(rows * kK)), std::vector<double>(size_t(kExperts * kK * kF))};
  int64_t begin = 0;
  for (int64_t e = 0; e < int64_t(sizes.size()); ++e) {
    for (int64_t i = begin; i < begin + sizes[size_t(e)]; ++i)
      for (int64_t j = 0; j < kK; ++j)
        for (int64_t c = 0; c < kF; ++c) {
          const double wv = w[size_t((e * kK + j) * kF + c)], xv = x[size_t(i * kK + j)], rv = r[size_t(i * kF + c)];
          d.out[size_t(i * kF + c)] += xv * wv;
          d.dx[size_t(i * kK + j)] += rv * wv;
          d.dw[size_t((e * kK + j) * kF + c)] += xv * rv;
        }
    begin += sizes[size_t(e)];
  }
  return d;
}

double max_error(const Array& got, const std::vector<double>& want) {
  const Array f = got.dtype() == DType::f32 ? got : Tensor(cast(distribute_tensor(got, create_mesh({{"x", 1}})), DType::f32)).full_tensor();
  const std::vector<float> g = f.to_vector<float>();
  REQUIRE(g.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(double(g[i]) - want[i]));
  return worst;
}

Array uniform_f32(const std::vector<int64_t>& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  Array a = Array::uninitialized(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = u(rng);
  return a;
}

// Whether an explain() text has a grouped GEMM step ("gemm  grouped_dot (20, 6) ...").
bool runs_grouped_gemm(const std::string& plan) {
  return plan.find("grouped_dot (") != std::string::npos || plan.find("grouped_weight_grad (") != std::string::npos;
}

Array sizes_array(const std::vector<int64_t>& sizes) { return Array::from<int64_t>(sizes, {int64_t(sizes.size())}); }

struct Operands {
  Array x, w, r;
};
Operands random_operands(unsigned seed) {
  std::mt19937 rng(seed);
  return {uniform_f32({kRows, kK}, rng), uniform_f32({kExperts, kK, kF}, rng), uniform_f32({kRows, kF}, rng)};
}

// A layout case: placements (one per mesh dim) of x, w and r (dy's layout), and what the forward
// must give without any collective.
struct LayoutCase {
  std::string name;
  Mesh mesh;
  std::vector<Placement> x, w, r;
  std::vector<Placement> out;  // empty: not checked (redistributed first)
};

std::vector<LayoutCase> layout_cases() {
  const Mesh one = create_mesh({{"x", 1}}), two = create_mesh({{"x", 2}}), four = create_mesh({{"x", 4}});
  const Mesh grid = create_mesh({{"x", 2}, {"y", 2}});
  const Placement R = Replicate{}, S0 = Shard{0}, S1 = Shard{1}, S2 = Shard{2}, P = Partial{ReduceOp::Sum};
  return {
      {"one device", one, {R}, {R}, {R}, {R}},
      {"replicated on 2", two, {R}, {R}, {R}, {R}},
      {"w split on F (column parallel) on 4", four, {R}, {S2}, {S1}, {S1}},
      {"w and x split on K (row parallel) on 2", two, {S1}, {S1}, {R}, {P}},
      {"x split on rows (uneven over 4: 5 rows each)", four, {S0}, {R}, {S0}, {S0}},
      {"w split on experts: redistributed", two, {R}, {S0}, {R}, {}},
      {"2x2: rows on x, F on y", grid, {S0, R}, {R, S2}, {S0, S1}, {S0, S1}},
      {"2x2: K on x, F on y", grid, {S1, R}, {S1, S2}, {R, S1}, {P, S1}},
  };
}

}  // namespace

TEST_CASE("grouped_matmul: forward, dx and dw equal per-group products on 1 device and 1-D and 2-D meshes in several layouts") {
  const Operands o = random_operands(3);
  for (const LayoutCase& c : layout_cases())
    for (const std::vector<int64_t>& sizes : size_cases()) {
      CAPTURE(c.name);
      CAPTURE(sizes[0]);
      CAPTURE(sizes[2]);
      const GroupedProducts want = dense_grouped(o.x.to_vector<float>(), o.w.to_vector<float>(), o.r.to_vector<float>(), sizes, kRows);
      const Tensor x = distribute_tensor(o.x, c.mesh, c.x), w = distribute_tensor(o.w, c.mesh, c.w);
      const Tensor r = distribute_tensor(o.r, c.mesh, c.r);
      const Tensor s = distribute_tensor(sizes_array(sizes), c.mesh);
      const Tensor out = grouped_matmul(x, w, s);
      CHECK(out.shape() == std::vector<int64_t>{kRows, kF});
      // Deterministic runs gather a split K instead of summing partial products (avoid_partial_sum).
      const bool partial = std::any_of(c.out.begin(), c.out.end(), [](const Placement& p) { return is_partial(p); });
      if (!c.out.empty() && !(partial && deterministic_mode())) {
        CommDebugMode comm;
        (void)out.to_local();
        CHECK(comm.get_total_counts() == 0);  // computed where the operands lie
        CHECK(out.placements() == c.out);
      }
      CHECK(max_error(out.full_tensor(), want.out) < 1e-5);
      const std::vector<Tensor> g = gradients(reduce_sum(out * r), {x, w});
      CHECK(max_error(g[0].full_tensor(), want.dx) < 1e-5);
      CHECK(max_error(g[1].full_tensor(), want.dw) < 1e-5);
      // The reference evaluator (which shares no code with the kernels) agrees on all three.
      for (const Tensor& t : {out, g[0], g[1]}) CHECK(compare_with_reference(t.full_tensor(), reference_eval(t), 1e-4) == "");
    }
}

TEST_CASE("grouped_matmul: the sharded layouts' collectives: none forward, one reduction where K or the rows are split") {
  if (deterministic_mode()) return;  // partial sums are gathered instead: other collectives by design
  const Operands o = random_operands(4);
  const Mesh two = create_mesh({{"x", 2}});
  const Tensor s = distribute_tensor(sizes_array({5, 0, 9, 2}), two);
  {  // column parallel: the output and dw stay split on F, dx is a Partial sum over F's shards
    const Tensor x = distribute_tensor(o.x, two, {Replicate{}}), w = distribute_tensor(o.w, two, {Shard{2}});
    const Tensor r = distribute_tensor(o.r, two, {Shard{1}});
    const std::vector<Tensor> g = gradients(reduce_sum(grouped_matmul(x, w, s) * r), {x, w});
    CommDebugMode comm;
    (void)g[1].to_local();
    CHECK(comm.get_total_counts() == 0);
    CHECK(g[1].placements() == std::vector<Placement>{Shard{2}});
    (void)g[0].full_tensor();
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
  }
  {  // row parallel: Partial output, reduced once when looked at whole
    const Tensor x = distribute_tensor(o.x, two, {Shard{1}}), w = distribute_tensor(o.w, two, {Shard{1}});
    const Tensor out = grouped_matmul(x, w, s);
    CommDebugMode comm;
    (void)out.full_tensor();
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
  }
  {  // tokens split (data parallel): each device's dw is its rows' term, summed by one all_reduce
    const Tensor x = distribute_tensor(o.x, two, {Shard{0}}), w = distribute_tensor(o.w, two, {Replicate{}});
    const Tensor r = distribute_tensor(o.r, two, {Shard{0}});
    const Tensor dw = gradients(reduce_sum(grouped_matmul(x, w, s) * r), {w})[0];
    CommDebugMode comm;
    (void)dw.to_local();
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
    CHECK(dw.placements() == std::vector<Placement>{Replicate{}});
  }
}

TEST_CASE("grouped_matmul: bf16 operands give bf16 results and gradients close to the products of their values") {
  const Operands o = random_operands(5);
  const std::vector<int64_t> sizes = {5, 0, 9, 2};
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    const std::vector<Placement> rows(size_t(mesh.ndim()), Replicate{});
    std::vector<Placement> by_f = rows;
    by_f.back() = Shard{2};
    const Tensor x = cast(distribute_tensor(o.x, mesh, rows), DType::bf16), w = cast(distribute_tensor(o.w, mesh, by_f), DType::bf16);
    const Tensor r = cast(distribute_tensor(o.r, mesh, rows), DType::bf16);
    auto values = [](const Tensor& t) { return cast(t, DType::f32).full_tensor().to_vector<float>(); };
    const GroupedProducts want = dense_grouped(values(x), values(w), values(r), sizes, kRows);
    const Tensor out = grouped_matmul(x, w, distribute_tensor(sizes_array(sizes), mesh));
    CHECK(out.dtype() == DType::bf16);
    CHECK(max_error(out.full_tensor(), want.out) < 3e-2);
    const std::vector<Tensor> g = gradients(reduce_sum(cast(out, DType::f32) * cast(r, DType::f32)), {x, w});
    CHECK(g[0].dtype() == DType::bf16);
    CHECK(max_error(g[0].full_tensor(), want.dx) < 3e-2);
    CHECK(max_error(g[1].full_tensor(), want.dw) < 3e-2);
  }
}

TEST_CASE("grouped_matmul: one jit'ed function serves every set of group sizes without compiling again") {
  const Operands o = random_operands(6);
  const Mesh two = create_mesh({{"x", 2}});
  const Tensor x = distribute_tensor(o.x, two, {Replicate{}}), w = distribute_tensor(o.w, two, {Shard{2}});
  auto step = jit([](const Tensor& x, const Tensor& w, const Tensor& sizes) { return grouped_matmul(x, w, sizes); });
  const std::vector<std::vector<int64_t>> cases = size_cases();
  (void)step(x, w, distribute_tensor(sizes_array(cases[0]), two)).full_tensor();
  const DriverStats driver_before = driver_stats();
  const CompileStats compiles_before = compile_stats();
  for (const std::vector<int64_t>& sizes : cases) {
    CAPTURE(sizes[0]);
    const Array got = step(x, w, distribute_tensor(sizes_array(sizes), two)).full_tensor();
    CHECK(max_error(got, dense_grouped(o.x.to_vector<float>(), o.w.to_vector<float>(), o.r.to_vector<float>(), sizes, kRows).out) < 1e-5);
  }
  CHECK(step.traces() == 1);
  CHECK(driver_stats().executables_built == driver_before.executables_built);
  CHECK(compile_stats().compiled_modules == compiles_before.compiled_modules);
}

TEST_CASE("grouped_matmul: a negative size or sizes adding up to more than x's rows raise an IndexError when the step runs") {
  const Operands o = random_operands(7);
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}})}) {
    CAPTURE(mesh.to_string());
    const Tensor x = distribute_tensor(o.x, mesh), w = distribute_tensor(o.w, mesh);
    auto step = jit([](const Tensor& x, const Tensor& w, const Tensor& sizes) { return grouped_matmul(x, w, sizes); });
    auto run = [&](const std::vector<int64_t>& sizes) { return step(x, w, distribute_tensor(sizes_array(sizes), mesh)).full_tensor(); };
    CHECK_THROWS_WITH_AS(run({5, -2, 9, 2}), doctest::Contains("grouped_matmul: group size -2 is outside the valid range [0, 21)"), IndexError);
    CHECK_THROWS_WITH_AS(run({5, 10, 9, 2}), doctest::Contains("grouped_matmul: the group sizes add up to more than the 20 rows of x"),
                         IndexError);
    CHECK_THROWS_AS((void)grouped_matmul(x, w, distribute_tensor(sizes_array({21, 0, 0, 0}), mesh)).full_tensor(), IndexError);
    // The same compiled function runs valid sizes afterwards.
    CHECK(max_error(run({0, 0, kRows, 0}),
                    dense_grouped(o.x.to_vector<float>(), o.w.to_vector<float>(), o.r.to_vector<float>(), {0, 0, kRows, 0}, kRows).out) < 1e-5);
  }
}

TEST_CASE("grouped_matmul: wrong ranks, K, expert counts and dtypes are refused while the graph is built") {
  const Operands o = random_operands(8);
  const Mesh one = create_mesh({{"x", 1}});
  const Tensor x = distribute_tensor(o.x, one), w = distribute_tensor(o.w, one), s = distribute_tensor(sizes_array({5, 0, 9, 2}), one);
  CHECK_THROWS_WITH_AS(grouped_matmul(reshape(x, {kRows, kK, 1}), w, s), doctest::Contains("x must be [N, K]"), ShapeError);
  CHECK_THROWS_WITH_AS(grouped_matmul(x, reshape(w, {kExperts * kK, kF}), s), doctest::Contains("w must be [E, K, F]"), ShapeError);
  CHECK_THROWS_WITH_AS(grouped_matmul(x, slice(w, {0, 0, 0}, {kExperts, kK - 1, kF}), s), doctest::Contains("K differs"), ShapeError);
  CHECK_THROWS_WITH_AS(grouped_matmul(x, w, slice(s, {0}, {3})), doctest::Contains("has 4 experts"), ShapeError);
  CHECK_THROWS_WITH_AS(grouped_matmul(x, w, cast(s, DType::f32)), doctest::Contains("group_sizes must be int32 or int64"), DTypeError);
  CHECK_THROWS_WITH_AS(grouped_matmul(x, cast(w, DType::bf16), s), doctest::Contains("different dtypes float32 and bfloat16"), DTypeError);
  CHECK_THROWS_WITH_AS(grouped_matmul(cast(x, DType::i64), cast(w, DType::i64), s), doctest::Contains("must be floating"), DTypeError);
  // int32 sizes are accepted.
  CHECK(max_error(grouped_matmul(x, w, cast(s, DType::i32)).full_tensor(),
                  dense_grouped(o.x.to_vector<float>(), o.w.to_vector<float>(), o.r.to_vector<float>(), {5, 0, 9, 2}, kRows).out) < 1e-5);
}

TEST_CASE("grouped_matmul inside local_map: each device its own tokens (uneven) and its own experts, with gradients") {
  const Mesh ep = create_mesh({{"ep", 2}});
  std::mt19937 rng(9);
  const int64_t rows = 7;  // 4 tokens on device 0, 3 on device 1
  const Array xa = uniform_f32({rows, kK}, rng), wa = uniform_f32({kExperts, kK, kF}, rng), ra = uniform_f32({rows, kF}, rng);
  // Device 0 owns experts 0 and 1 and routes its 4 tokens 1 + 3; device 1 owns 2 and 3 and
  // routes 2 of its 3 tokens (the last is padding).
  const std::vector<int64_t> local_sizes = {1, 3, 2, 0};
  const Tensor x = distribute_tensor(xa, ep, {Shard{0}}), w = distribute_tensor(wa, ep, {Shard{0}});
  const Tensor r = distribute_tensor(ra, ep, {Shard{0}}), s = distribute_tensor(sizes_array(local_sizes), ep, {Shard{0}});
  auto experts = local_map([](const Tensor& x, const Tensor& w, const Tensor& s) { return grouped_matmul(x, w, s); },
                           {{Shard{0}}}, {{Shard{0}}, {Shard{0}}, {Shard{0}}}, ep);
  const Tensor out = experts(x, w, s);
  // Globally: rows 0 | 1-3 | 4-5 go to experts 0 | 1 | 2, row 6 to none.
  const GroupedProducts want = dense_grouped(xa.to_vector<float>(), wa.to_vector<float>(), ra.to_vector<float>(), {1, 3, 2, 0}, rows);
  CHECK(out.placements() == std::vector<Placement>{Shard{0}});
  CHECK(max_error(out.full_tensor(), want.out) < 1e-5);
  const std::vector<Tensor> g = gradients(reduce_sum(out * r), {x, w});
  CHECK(max_error(g[0].full_tensor(), want.dx) < 1e-5);
  CHECK(max_error(g[1].full_tensor(), want.dw) < 1e-5);
}

TEST_CASE("grouped_matmul inside local_map over uneven blocks: a device's sizes past its own rows are an IndexError, not dropped rows") {
  const Mesh ep = create_mesh({{"ep", 2}});
  std::mt19937 rng(10);
  const int64_t rows = 7;  // 4 tokens on device 0, 3 on device 1
  const Array xa = uniform_f32({rows, kK}, rng), wa = uniform_f32({kExperts, kK, kF}, rng);
  const Tensor x = distribute_tensor(xa, ep, {Shard{0}}), w = distribute_tensor(wa, ep, {Shard{0}});
  auto experts = local_map([](const Tensor& x, const Tensor& w, const Tensor& s) { return grouped_matmul(x, w, s); },
                           {{Shard{0}}}, {{Shard{0}}, {Shard{0}}, {Shard{0}}}, ep);
  // Device 1 routes 2 + 2 rows but holds 3: within the largest block's 4, so only a check of
  // its own rows sees it.
  const Tensor s = distribute_tensor(sizes_array({1, 3, 2, 2}), ep, {Shard{0}});
  CHECK_THROWS_WITH_AS((void)experts(x, w, s).full_tensor(),
                       doctest::Contains("a device's group sizes add up to 1 more rows than its block of x holds (blocks of up to 4 rows)"),
                       IndexError);
  // At the bound it runs: device 1's 3 rows all routed.
  const Tensor fits = distribute_tensor(sizes_array({1, 3, 2, 1}), ep, {Shard{0}});
  const GroupedProducts want = dense_grouped(xa.to_vector<float>(), wa.to_vector<float>(), std::vector<float>(size_t(rows * kF), 1.0f),
                                             {1, 3, 2, 1}, rows);
  CHECK(max_error(experts(x, w, fits).full_tensor(), want.out) < 1e-5);
}

TEST_CASE("grouped_matmul from ordinary ops, for targets without the grouped GEMM, gives the grouped GEMM's values") {
  const Operands o = random_operands(10);
  Target gemms_only = target_for(DeviceKind::CPU, false);
  gemms_only.library = LibraryOpSet();
  gemms_only.library.insert(LibraryOp::Gemm);
  const Mesh two = create_mesh({{"x", 2}});
  const Tensor x = distribute_tensor(o.x, two, {Shard{0}}), w = distribute_tensor(o.w, two, {Shard{2}});
  const Tensor r = distribute_tensor(o.r, two, {Shard{0}});
  const Tensor out = grouped_matmul(x, w, distribute_tensor(sizes_array({5, 0, 9, 2}), two));
  std::vector<Tensor> fused = gradients(reduce_sum(out * r), {x, w});
  fused.insert(fused.begin(), out);
  std::vector<NodeRef> nodes;
  for (const Tensor& t : fused) nodes.push_back(t.node());
  const FallbackGraph parts = with_library_fallbacks(nodes, gemms_only);
  CHECK(with_library_fallbacks(nodes, target_for(DeviceKind::CPU, false)).outputs == nodes);  // the CPU runs them
  for (size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);  // out, dx, dw
    const Tensor from_parts(parts.outputs[i]);
    CHECK(!runs_grouped_gemm(explain(from_parts)));
    CHECK(runs_grouped_gemm(explain(fused[i])));
    const Array a = from_parts.full_tensor(), b = fused[i].full_tensor();
    const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
    CHECK(max_error(a, std::vector<double>(vb.begin(), vb.end())) < 1e-5);
  }
}
