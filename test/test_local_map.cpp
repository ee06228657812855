// local_map and the functional collectives: the PyTorch reference's example, every collective
// against the reference evaluator (which simulates every device's block), gradients against
// central finite differences in f64 eagerly and inside jit, and the typed errors.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <numeric>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "random_arrays.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// A local_map case: global inputs (shape, placements per mesh) and a function of Tensors that
// applies a local_map'ed function to them.
struct LocalCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  std::function<std::vector<Placement>(size_t input, const Mesh&)> placements;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

// The first mesh dim is "x"; on a 2-D mesh the second is "y".
std::vector<Placement> on(const Mesh& mesh, Placement x, Placement y = Replicate{}) {
  if (mesh.ndim() == 1) return {x};
  return {x, y};
}

std::vector<LocalCase> cases() {
  using S = std::vector<int64_t>;
  std::vector<LocalCase> out;
  // PyTorch's example: column-sharded W times row-sharded X, partial products all_reduced.
  out.push_back({"mm_allreduce", {S{12, 8}, S{8, 16}},
                 [](size_t i, const Mesh& m) { return on(m, i == 0 ? Placement{Shard{1}} : Placement{Shard{0}}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   std::vector<Placement> w = on(mesh, Shard{1}), x = on(mesh, Shard{0});
                   auto f = local_map([](const Tensor& a, const Tensor& b) { return all_reduce(matmul(a, b), ReduceOp::Sum, "x"); },
                                      {on(mesh, Replicate{})}, {w, x}, mesh);
                   return f(in[0], in[1]);
                 }});
  // An invariant (Replicate) value used with a varying one: its adjoint is summed over "x".
  out.push_back({"invariant_times_varying", {S{4, 6}, S{8, 6}},
                 [](size_t i, const Mesh& m) { return on(m, i == 0 ? Placement{Replicate{}} : Placement{Shard{0}}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& r, const Tensor& s) {
                     Tensor per_device = tanh(r) * reduce_sum(s, {0}, true);
                     return all_reduce(per_device, ReduceOp::Sum, "x") * r;
                   }, {on(mesh, Replicate{})}, {on(mesh, Replicate{}), on(mesh, Shard{0})}, mesh);
                   return f(in[0], in[1]);
                 }});
  out.push_back({"all_gather_reduce_scatter", {S{8, 4}},
                 [](size_t, const Mesh& m) { return on(m, Shard{0}, Shard{1}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& a) {
                     Tensor gathered = all_gather(a, "x", 0);  // the whole column block
                     return reduce_scatter(exp(gathered) * 3.0, ReduceOp::Sum, "x", 0) + square(a);
                   }, {on(mesh, Shard{0}, Shard{1})}, {on(mesh, Shard{0}, Shard{1})}, mesh);
                   return f(in[0]);
                 }});
  out.push_back({"all_to_all", {S{8, 4}},
                 [](size_t, const Mesh& m) { return on(m, Shard{0}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& a) { return square(all_to_all(tanh(a), "x", 1, 0)); },
                                      {on(mesh, Shard{1})}, {on(mesh, Shard{0})}, mesh);
                   return f(in[0]);
                 }});
  out.push_back({"shift_and_axis_index", {S{8, 3}},
                 [](size_t, const Mesh& m) { return on(m, Shard{0}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& a) {
                     Tensor rank = cast(axis_index("x"), DType::f64);
                     return shift(a * (rank + 1.0), "x", 1) * a + shift(square(a), "x", -1);
                   }, {on(mesh, Shard{0})}, {on(mesh, Shard{0})}, mesh);
                   return f(in[0]);
                 }});
  // The reflection i -> n-1-i over x (the identity on one device, a swap on two).
  out.push_back({"permute_and_axis_index", {S{8, 3}},
                 [](size_t, const Mesh& m) { return on(m, Shard{0}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   std::vector<int64_t> reflection;
                   for (int64_t i = mesh.shape()[0] - 1; i >= 0; --i) reflection.push_back(i);
                   auto f = local_map([reflection](const Tensor& a) {
                     Tensor rank = cast(axis_index("x"), DType::f64);
                     return permute(tanh(a) * (rank + 1.0), "x", reflection) * a;
                   }, {on(mesh, Shard{0})}, {on(mesh, Shard{0})}, mesh);
                   return f(in[0]);
                 }});
  out.push_back({"all_reduce_max_avg", {S{4, 8}},
                 [](size_t, const Mesh& m) { return on(m, Shard{1}, Shard{0}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& a) {
                     return all_reduce(a, ReduceOp::Max, "x") + all_reduce(a * a, ReduceOp::Avg, "x");
                   }, {on(mesh, Replicate{}, Shard{0})}, {on(mesh, Shard{1}, Shard{0})}, mesh);
                   return f(in[0]);
                 }});
  // A Partial output: the devices' terms are summed where the value is looked at; the adjoint
  // of the replicated input counts every device's term.
  out.push_back({"partial_output", {S{4, 4}, S{8, 4}},
                 [](size_t i, const Mesh& m) { return on(m, i == 0 ? Placement{Replicate{}} : Placement{Shard{0}}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& r, const Tensor& s) { return tanh(r) + reduce_sum(s, {0}, true) * r; },
                                      {on(mesh, Partial{})}, {on(mesh, Replicate{}), on(mesh, Shard{0})}, mesh);
                   return f(in[0], in[1]);
                 }});
  return out;
}

// The same kinds of functions on shapes that do not divide: blocks differ in extent between
// devices (7 rows over 4 devices: 2, 2, 2, 1; 5 columns: 2, 2, 1, 0), yet one program runs.
std::vector<LocalCase> uneven_cases() {
  using S = std::vector<int64_t>;
  std::vector<LocalCase> out;
  // The even cases whose functions take any block: the same functions on shapes that do not divide.
  const std::map<std::string, std::vector<S>> uneven_shapes = {{"mm_allreduce", {S{5, 7}, S{7, 6}}},
                                                               {"all_gather_reduce_scatter", {S{7, 5}}},
                                                               {"all_to_all", {S{7, 5}}},
                                                               {"partial_output", {S{4, 4}, S{7, 4}}}};
  for (LocalCase c : cases())
    if (auto it = uneven_shapes.find(c.name); it != uneven_shapes.end()) {
      c.name = "uneven_" + c.name;
      c.shapes = it->second;
      out.push_back(std::move(c));
    }
  // Broadcasts against uneven blocks (a bias row, a scalar, a reduction over the uneven axis)
  // and a softmax along the other axis.
  out.push_back({"uneven_softmax_bias", {S{7, 5}, S{5}},
                 [](size_t i, const Mesh& m) { return i == 0 ? on(m, Shard{0}, Shard{1}) : on(m, Replicate{}, Shard{0}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& a, const Tensor& b) {
                     return softmax(a, -1) + a * b + reduce_sum(a, {0}) * 0.5 + 2.0;
                   }, {on(mesh, Shard{0}, Shard{1})}, {on(mesh, Shard{0}, Shard{1}), on(mesh, Replicate{}, Shard{0})}, mesh);
                   return f(in[0], in[1]);
                 }});
  out.push_back({"uneven_local_chunk", {S{7, 3}},
                 [](size_t, const Mesh& m) { return on(m, Replicate{}); },
                 [](const std::vector<Tensor>& in) {
                   const Mesh mesh = in[0].device_mesh();
                   auto f = local_map([](const Tensor& a) { return local_chunk(tanh(a), "x", 0) * 2.0; },
                                      {on(mesh, Shard{0})}, {on(mesh, Replicate{})}, mesh);
                   return f(in[0]);
                 }});
  return out;
}

std::vector<LocalCase> all_cases() {
  std::vector<LocalCase> out = cases();
  for (LocalCase& c : uneven_cases()) out.push_back(std::move(c));
  return out;
}

}  // namespace

namespace {

struct Setup {
  std::vector<Array> arrays;
  std::vector<Tensor> inputs;
  std::map<const Node*, Array> leaves;
};

Setup make_inputs(const LocalCase& c, const Mesh& mesh, std::mt19937& rng) {
  Setup s;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    s.arrays.push_back(random_f64(c.shapes[i], rng));
    s.inputs.push_back(distribute_tensor(s.arrays.back(), mesh, c.placements(i, mesh)));
    s.leaves[s.inputs.back().node().get()] = s.arrays.back();
  }
  return s;
}

std::vector<Mesh> local_map_meshes() { return {create_mesh({{"x", 1}}), create_mesh({{"x", 4}}), create_mesh({{"x", 2}, {"y", 2}})}; }

}  // namespace

TEST_CASE("the PyTorch reference's local_map example matches the global matmul, eagerly and inside jit") {
  std::mt19937 rng(7);
  Array w = random_f64({12, 8}, rng), x = random_f64({8, 16}, rng);
  Mesh mesh = create_mesh({{"x", 4}});
  auto mm_allreduce_forward = local_map(
      [](const Mesh&, const Tensor& w_local, const Tensor& x_local) {
        CHECK(w_local.shape() == std::vector<int64_t>{12, 2});  // fn sees each device's block
        CHECK(x_local.shape() == std::vector<int64_t>{2, 16});
        return all_reduce(matmul(w_local, x_local), ReduceOp::Sum, "x");
      },
      {{Replicate{}}}, {{Shard{1}}, {Shard{0}}}, mesh);
  Tensor w_dt = distribute_tensor(w, mesh, {Shard{1}}), x_dt = distribute_tensor(x, mesh, {Shard{0}});
  Tensor want = distribute_tensor(w, mesh, {Replicate{}});
  Array expected = matmul(want, distribute_tensor(x, mesh, {Replicate{}})).full_tensor();
  {
    CommDebugMode comm;
    Tensor y_dt = mm_allreduce_forward(mesh, w_dt, x_dt);
    CHECK(y_dt.shape() == std::vector<int64_t>{12, 16});
    CHECK(y_dt.placements() == std::vector<Placement>{Replicate{}});
    CHECK(compare_with_reference(y_dt.full_tensor(), ref_from_array(expected), 1e-12) == "");
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
  }
  auto step = jit([&](const Tensor& a, const Tensor& b) { return mm_allreduce_forward(mesh, a, b); });
  CHECK(compare_with_reference(step(w_dt, x_dt).full_tensor(), ref_from_array(expected), 1e-12) == "");
  CHECK(explain(mm_allreduce_forward(mesh, w_dt, x_dt)).find("all_reduce") != std::string::npos);
}

TEST_CASE("every functional collective matches the reference evaluator on 1-D and 2-D meshes, even and uneven") {
  for (const LocalCase& c : all_cases())
    for (const Mesh& mesh : local_map_meshes()) {
      CAPTURE(c.name);
      CAPTURE(mesh.to_string());
      std::mt19937 rng(11);
      Setup s = make_inputs(c, mesh, rng);
      Tensor out = c.fn(s.inputs);
      CHECK(compare_with_reference(out.full_tensor(), reference_eval(out, s.leaves), 1e-10) == "");
    }
}

TEST_CASE("collectives over each dim of a 2-D mesh: all_gather, all_to_all and shift along y") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  std::mt19937 rng(3);
  Array a = random_f64({4, 6}, rng);
  Tensor t = distribute_tensor(a, mesh, {Shard{0}, Shard{1}});
  auto f = local_map([](const Tensor& b) {
    Tensor row = all_gather(b, "y", 1);                   // [2, 6]: this x-block's rows, whole
    Tensor moved = all_to_all(row, "y", 1, 0);            // [4, 3]
    return shift(moved, "y", 1) + cast(axis_index("x"), DType::f64) * 10.0 + cast(axis_index("y"), DType::f64);
  }, {{Shard{0}, Shard{1}}}, {{Shard{0}, Shard{1}}}, mesh);
  Tensor out = f(t);
  CHECK(out.shape() == std::vector<int64_t>{8, 6});
  std::map<const Node*, Array> leaves{{t.node().get(), a}};
  CHECK(compare_with_reference(out.full_tensor(), reference_eval(out, leaves), 1e-12) == "");
}

namespace {

// 0, 1, 2, ... in f64, of `shape`: every element says where it started.
Array counting(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  std::vector<double> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), 0.0);
  return Array::from<double>(values, shape);
}

// `a` (2-D) with its blocks along `axis`, one per device of a mesh dim, moved as permute moves
// them: block i to position destinations[i].
Array blocks_permuted(const Array& a, int64_t axis, const std::vector<int64_t>& destinations) {
  const std::vector<int64_t> shape = a.shape();
  const int64_t block = shape[size_t(axis)] / int64_t(destinations.size());
  Array out = a.clone();
  for (int64_t r = 0; r < shape[0]; ++r)
    for (int64_t c = 0; c < shape[1]; ++c) {
      int64_t to[2] = {r, c};
      to[axis] = destinations[size_t(to[axis] / block)] * block + to[axis] % block;
      out.mutable_data<double>()[to[0] * shape[1] + to[1]] = a.data<double>()[r * shape[1] + c];
    }
  return out;
}

std::string table_text(const std::vector<int64_t>& destinations) {
  std::string out;
  for (int64_t d : destinations) out += (out.empty() ? "" : " ") + std::to_string(d);
  return "[" + out + "]";
}

std::vector<int64_t> inverse_table(const std::vector<int64_t>& destinations) {
  std::vector<int64_t> inverse(destinations.size());
  for (size_t i = 0; i < destinations.size(); ++i) inverse[size_t(destinations[i])] = int64_t(i);
  return inverse;
}

// Rows (and on a 2-D mesh, columns) split over every mesh dim, two per device.
std::vector<Placement> rows_and_columns(const Mesh& mesh) {
  if (mesh.ndim() == 1) return {Shard{0}};
  return {Shard{0}, Shard{1}};
}

std::vector<int64_t> two_per_device(const Mesh& mesh) {
  if (mesh.ndim() == 1) return {2 * mesh.shape()[0], 3};
  return {2 * mesh.shape()[0], 2 * mesh.shape()[1]};
}

// Runs of permute: a mesh, the dim, the table. Reflections (with a fixed point on 3 devices),
// tables that are no rotation, one that is no involution, and each dim of 2-D meshes.
struct PermuteRun {
  Mesh mesh;
  std::string dim;
  std::vector<int64_t> destinations;
};

std::vector<PermuteRun> permute_runs() {
  const Mesh three = create_mesh({{"x", 3}}), four = create_mesh({{"x", 4}});
  const Mesh square = create_mesh({{"x", 2}, {"y", 2}}), wide = create_mesh({{"x", 2}, {"y", 3}});
  return {{three, "x", {2, 1, 0}}, {three, "x", {0, 2, 1}}, {four, "x", {3, 2, 1, 0}}, {four, "x", {2, 0, 3, 1}},
          {square, "x", {1, 0}},   {square, "y", {1, 0}},   {wide, "y", {2, 1, 0}},    {wide, "y", {1, 2, 0}}};
}

}  // namespace

TEST_CASE("permute sends block i to device destinations[i]: reflections and other tables on 3 and 4 devices, each dim of 2-D meshes") {
  for (const PermuteRun& r : permute_runs()) {
    CAPTURE(r.mesh.to_string());
    CAPTURE(r.dim);
    CAPTURE(table_text(r.destinations));
    const std::vector<Placement> placements = rows_and_columns(r.mesh);
    const Array a = counting(two_per_device(r.mesh));
    const Tensor t = distribute_tensor(a, r.mesh, placements);
    auto moved = local_map([&](const Tensor& b) { return permute(b, r.dim, r.destinations); }, {placements}, {placements}, r.mesh);
    const Tensor out = moved(t);
    CHECK(out.full_tensor().to_vector<double>() == blocks_permuted(a, r.dim == "x" ? 0 : 1, r.destinations).to_vector<double>());
    // Mixed with local ops and the device's coordinates, against the reference evaluator.
    auto mixed = local_map([&](const Tensor& b) {
      Tensor rank = cast(axis_index(r.dim), DType::f64);
      return permute(b * (rank + 1.0), r.dim, r.destinations) + b;
    }, {placements}, {placements}, r.mesh);
    const Tensor both = mixed(t);
    const std::map<const Node*, Array> leaves{{t.node().get(), a}};
    CHECK(compare_with_reference(both.full_tensor(), reference_eval(both, leaves), 1e-12) == "");
    CHECK(compare_with_reference(jit([&](const Tensor& x) { return mixed(x); })(t).full_tensor(), reference_eval(both, leaves), 1e-12) == "");
  }
  // The identity moves nothing: the same value back, as shift by 0 gives.
  const Mesh mesh = create_mesh({{"x", 3}});
  const Tensor t = distribute_tensor(counting({6, 3}), mesh, {Shard{0}});
  local_map([](const Tensor& b) {
    CHECK(permute(b, "x", {0, 1, 2}).node() == b.node());
    CHECK(shift(b, "x", 3).node() == b.node());
    CHECK(permute(b, "x", {1, 2, 0}).node() == shift(b, "x", 1).node());  // shift is a rotation's table
    return b;
  }, {{Shard{0}}})(t);
}

TEST_CASE("gradients through permute are exact: each block's adjoint comes back from its destination, eagerly and in jit") {
  for (const PermuteRun& r : permute_runs()) {
    CAPTURE(r.mesh.to_string());
    CAPTURE(r.dim);
    CAPTURE(table_text(r.destinations));
    const std::vector<Placement> placements = rows_and_columns(r.mesh);
    std::mt19937 rng(13);
    const Array a = counting(two_per_device(r.mesh)), weights = random_f64(a.shape(), rng);
    const Tensor t = distribute_tensor(a, r.mesh, placements), w = distribute_tensor(weights, r.mesh, placements);
    auto moved = local_map([&](const Tensor& b) { return permute(b, r.dim, r.destinations); }, {placements}, {placements}, r.mesh);
    // d/da sum(permute(a) * w): block i's adjoint is w's block at destinations[i], i.e. w moved
    // by the inverse permutation.
    const std::vector<double> want = blocks_permuted(weights, r.dim == "x" ? 0 : 1, inverse_table(r.destinations)).to_vector<double>();
    const Tensor g = gradients(reduce_sum(moved(t) * w), {t})[0];
    CHECK(g.placements() == placements);
    CHECK(g.full_tensor().to_vector<double>() == want);
    auto traced = jit([&](const Tensor& x, const Tensor& ww) { return gradients(reduce_sum(moved(x) * ww), {x}); });
    CHECK(traced(t, w)[0].full_tensor().to_vector<double>() == want);
  }
}

TEST_CASE("a permute is one \"shift\" collective in CommDebugMode: its bytes are the blocks that move; the identity is none") {
  const Mesh mesh = create_mesh({{"x", 4}});
  const Tensor t = distribute_tensor(counting({8, 3}), mesh, {Shard{0}});
  const int64_t block_bytes = 2 * 3 * 8;
  auto permuted = [&](std::vector<int64_t> destinations) {
    return local_map([destinations](const Tensor& b) { return permute(b, "x", destinations); }, {{Shard{0}}}, {{Shard{0}}}, mesh);
  };
  {
    CommDebugMode comm;
    const Tensor y = permuted({2, 0, 3, 1})(t);
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"shift", 1}});
    CHECK(comm.bytes_by_kind().at("shift") == 4 * block_bytes);  // every device receives a block
    CHECK(comm.records().at(0).mesh_dim == "x");
  }
  {
    CommDebugMode comm;
    const Tensor y = permuted({0, 2, 1, 3})(t);  // devices 0 and 3 keep their blocks
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"shift", 1}});
    CHECK(comm.bytes_by_kind().at("shift") == 2 * block_bytes);
  }
  {
    // The plan counts what the run moves, device by device (explain's and plan_report's bytes).
    auto step = jit([&](const Tensor& x) { return permuted({0, 2, 1, 3})(x); });
    CHECK(step.plan(t).device_collective_bytes == std::vector<int64_t>{0, block_bytes, block_bytes, 0});
    CHECK(step.explain(t).find("all devices: 0 multiplications, " + std::to_string(2 * block_bytes) + " bytes moved") != std::string::npos);
    CommDebugMode comm;
    const Tensor y = step(t);
    CHECK(comm.total_bytes() == 2 * block_bytes);
  }
  {
    CommDebugMode comm;
    const Tensor y = local_map([](const Tensor& b) { return permute(permute(b, "x", {3, 2, 1, 0}), "x", {1, 0, 3, 2}); },
                               {{Shard{0}}}, {{Shard{0}}}, mesh)(t);
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"shift", 2}});
    CHECK(comm.bytes_by_kind().at("shift") == 8 * block_bytes);
  }
  {
    CommDebugMode comm;
    const Tensor y = permuted({0, 1, 2, 3})(t);
    CHECK(comm.get_total_counts() == 0);
  }
  {
    CommDebugMode comm;  // the loss's permutation, and the gradient's inverse one
    const Tensor loss = reduce_sum(permuted({2, 0, 3, 1})(t) * 2.0);
    const Tensor g = gradients(loss, {t})[0];
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"shift", 2}});
  }
  {
    const Mesh square = create_mesh({{"x", 2}, {"y", 2}});
    const Tensor s = distribute_tensor(counting({4, 4}), square, {Shard{0}, Shard{1}});
    CommDebugMode comm;
    const Tensor y = local_map([](const Tensor& b) { return permute(b, "y", {1, 0}); }, {{Shard{0}, Shard{1}}})(s);
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"shift", 1}});
    CHECK(comm.bytes_by_kind().at("shift") == 4 * (2 * 2 * 8));  // one 2 x 2 block into each device
    CHECK(comm.records().at(0).mesh_dim == "y");
  }
}

TEST_CASE("permute: a table that is not a permutation of the mesh dim's devices is a LayoutError naming it") {
  const Mesh mesh = create_mesh({{"x", 3}});
  const Tensor t = distribute_tensor(counting({6, 3}), mesh, {Shard{0}});
  auto with = [&](std::vector<int64_t> destinations) {
    return local_map([destinations](const Tensor& b) { return permute(b, "x", destinations); }, {{Shard{0}}})(t);
  };
  CHECK_THROWS_WITH_AS(with({1, 0}), doctest::Contains("destinations [1, 0] are not a permutation of the 3 devices of mesh dim 'x': 2 entries for 3 devices"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(with({0, 1, 2, 3}), doctest::Contains("destinations [0, 1, 2, 3] are not a permutation"), LayoutError);
  CHECK_THROWS_WITH_AS(with({2, 0, 2}), doctest::Contains("destinations [2, 0, 2] are not a permutation of the 3 devices of mesh dim 'x': device 2 is named twice"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(with({0, 3, 1}), doctest::Contains("destinations [0, 3, 1] are not a permutation of the 3 devices of mesh dim 'x': 3 is out of range [0, 3)"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(with({-1, 0, 1}), doctest::Contains("destinations [-1, 0, 1]"), LayoutError);
  CHECK_THROWS_WITH_AS(with({}), doctest::Contains("destinations [] are not a permutation"), LayoutError);
  // As the other collectives: local values only, known dims.
  CHECK_THROWS_WITH_AS(permute(t, "x", {0, 1, 2}), doctest::Contains("permute: functional collectives take local values"), LayoutError);
  CHECK_THROWS_AS(local_map([](const Tensor& b) { return permute(b, "z", {0, 1, 2}); }, {{Shard{0}}})(t), MeshError);
}

TEST_CASE("permute: programs traced with different tables are different programs, in jit and eagerly") {
  const Mesh mesh = create_mesh({{"x", 4}});
  const Array a = counting({8, 3});
  const Tensor t = distribute_tensor(a, mesh, {Shard{0}});
  const std::vector<std::vector<int64_t>> tables = {{2, 0, 3, 1}, {3, 2, 1, 0}, {1, 0, 3, 2}, {0, 3, 1, 2}, {1, 2, 3, 0}};
  std::vector<std::function<Tensor(const Tensor&)>> steps;  // one jit function per table
  for (const std::vector<int64_t>& table : tables) {
    auto moved = local_map([table](const Tensor& b) { return permute(b * 2.0, "x", table); }, {{Shard{0}}}, {{Shard{0}}}, mesh);
    steps.push_back([step = jit([moved](const Tensor& x) { return moved(x); })](const Tensor& x) { return step(x); });
  }
  auto want = [&](size_t k) {
    std::vector<double> v = blocks_permuted(a, 0, tables[k]).to_vector<double>();
    for (double& e : v) e *= 2.0;
    return v;
  };
  for (int round = 0; round < 2; ++round)  // the second round from each one's cached program
    for (size_t k = 0; k < tables.size(); ++k) {
      CAPTURE(round);
      CAPTURE(k);
      CHECK(steps[k](t).full_tensor().to_vector<double>() == want(k));
      const Tensor eager = local_map([&](const Tensor& b) { return permute(b * 2.0, "x", tables[k]); }, {{Shard{0}}}, {{Shard{0}}}, mesh)(t);
      CHECK(eager.full_tensor().to_vector<double>() == want(k));
    }
}

TEST_CASE("gradients through local_map and every functional collective match finite differences, eagerly and in jit") {
  for (const LocalCase& c : all_cases())
    for (const Mesh& mesh : local_map_meshes()) {
      CAPTURE(c.name);
      CAPTURE(mesh.to_string());
      std::mt19937 rng(5);
      Setup s = make_inputs(c, mesh, rng);
      Tensor out = c.fn(s.inputs);
      Array weights = random_f64(out.shape(), rng);
      Tensor w = distribute_tensor(weights, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
      s.leaves[w.node().get()] = weights;
      Tensor loss = reduce_sum(out * w);
      std::vector<Tensor> grads = gradients(loss, s.inputs);
      std::vector<Tensor> traced;
      if (s.inputs.size() == 1)
        traced = jit([&](const Tensor& a, const Tensor& ww) { return gradients(reduce_sum(c.fn({a}) * ww), {a}); })(s.inputs[0], w);
      else
        traced = jit([&](const Tensor& a, const Tensor& b, const Tensor& ww) {
          return gradients(reduce_sum(c.fn({a, b}) * ww), {a, b});
        })(s.inputs[0], s.inputs[1], w);
      for (size_t k = 0; k < s.inputs.size(); ++k) {
        CAPTURE(k);
        CHECK(grads[k].placements() == s.inputs[k].placements());
        Array g = grads[k].full_tensor(), g_traced = traced[k].full_tensor();
        for (int64_t i = 0; i < s.arrays[k].numel(); ++i) {
          const double h = 1e-6, x0 = s.arrays[k].data<double>()[i];
          auto loss_at = [&](double v) {
            Array moved = s.arrays[k].clone();
            moved.mutable_data<double>()[i] = v;
            std::map<const Node*, Array> l = s.leaves;
            l[s.inputs[k].node().get()] = moved;
            return reference_eval(loss, l).data[0];
          };
          const double numeric = (loss_at(x0 + h) - loss_at(x0 - h)) / (2 * h);
          CHECK(g.data<double>()[i] == doctest::Approx(numeric).epsilon(1e-5).scale(1.0));
          CHECK(g_traced.data<double>()[i] == doctest::Approx(numeric).epsilon(1e-5).scale(1.0));
        }
      }
    }
}

TEST_CASE("local_map pins a pending argument it is asked to redistribute: moved once, or not at all where laid out so") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 3}});
  std::vector<float> values(7 * 6);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i);
  // Uneven over y (rows 3, 3, 1), whole over x.
  Tensor rows = distribute_tensor(Array::from<float>(values, {7, 6}), mesh, {Replicate{}, Shard{0}});
  auto doubled = [](const Tensor& t) { return t * 2.0f; };
  {
    CommDebugMode comm;
    const Tensor pending = rows + 1.0f;  // not computed: its layout is not asked
    Tensor whole = local_map(doubled, {{Replicate{}, Replicate{}}}, {{Replicate{}, Replicate{}}}, mesh, true)(pending);
    const Array out = whole.full_tensor();
    for (size_t i = 0; i < values.size(); ++i) CHECK(out.data<float>()[i] == 2.0f * (values[i] + 1.0f));
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 1}});
  }
  {
    CommDebugMode comm;
    Tensor same = local_map(doubled, {{Replicate{}, Shard{0}}}, {{Replicate{}, Shard{0}}}, mesh, true)(rows + 1.0f);
    CHECK(same.placements() == std::vector<Placement>{Replicate{}, Shard{0}});
    CHECK(comm.get_total_counts() == 0);  // before full_tensor, which gathers
    CHECK(same.full_tensor().data<float>()[41] == 2.0f * 42.0f);
  }
  // Extents compared on a 2-D mesh: rows split 3, 3, 1 over y against 3, 3, 3 disagree.
  Tensor even = distribute_tensor(Array::from<float>(std::vector<float>(9 * 6, 1.0f), {9, 6}), mesh, {Replicate{}, Shard{0}});
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& a, const Tensor& b) { return a + b; }, {{Replicate{}, Shard{0}}})(rows, even),
                       doctest::Contains("extents [3, 3, 1, 3, 3, 1] and 3 on every device"), ShapeError);
}

// PyTorch's test_local_map_with_non_tensor_output and a local_map with no DTensor argument
// (device_mesh given): None placements for outputs that are not tensors, passed back as they are.
TEST_CASE("local_map: outputs that are not tensors take std::nullopt; with no tensor argument the mesh says where fn runs") {
  for (const Mesh& mesh : {create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> rows(size_t(mesh.ndim()), Replicate{});
    rows[0] = Shard{0};
    Tensor t = distribute_tensor(Array::from<float>({1, 2, 3, 4, 5}, {5}), mesh, rows);  // uneven: 2, 2, 1 or 3, 2
    auto [doubled, seen, name] = local_map([](const Tensor& block, int extra) { return std::tuple{block * 2.0f, block.rank() + extra, std::string("ok")}; },
                                           {rows, std::nullopt, std::nullopt})(t, 10);
    CHECK(doubled.placements() == rows);
    CHECK(doubled.full_tensor().to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10});
    CHECK(seen == 11);
    CHECK(name == "ok");
    // A lone non-tensor output.
    CHECK(local_map([](const Tensor& block) { return block.rank(); }, {std::nullopt})(t) == 1);
    // No tensor argument: each device's coordinate along x, gathered into a global [n] tensor.
    auto coordinates = local_map([]() { return reshape(cast(axis_index("x"), DType::f32), {1}); }, {rows}, {}, mesh);
    Tensor where = coordinates();
    CHECK(where.placements() == rows);
    std::vector<float> expected;
    for (int64_t i = 0; i < mesh.shape()[0]; ++i) expected.push_back(float(i));
    CHECK(where.full_tensor().to_vector<float>() == expected);
    {
      CommDebugMode comm;
      (void)unpack(coordinates());
      (void)unpack(local_map([](const Tensor& block) { return block * 2.0f; }, {rows})(t));
      CHECK(comm.get_total_counts() == 0);
    }
    // Typed errors: placements for a non-tensor output, std::nullopt for a tensor one, no mesh.
    CHECK_THROWS_WITH_AS(local_map([](const Tensor& b) { return std::pair{b, 1}; }, {rows, rows})(t),
                         doctest::Contains("output 1 is not a tensor"), LayoutError);
    CHECK_THROWS_WITH_AS(local_map([](const Tensor& b) { return std::pair{b, 1}; }, {std::nullopt, std::nullopt})(t),
                         doctest::Contains("output 0 is a tensor but its out_placements entry is std::nullopt"), LayoutError);
    CHECK_THROWS_WITH_AS(local_map([]() { return reshape(cast(axis_index("x"), DType::f32), {1}); }, {rows})(),
                         doctest::Contains("no mesh"), LayoutError);
  }
}

TEST_CASE("local_map checks its inputs and outputs with typed errors") {
  Mesh mesh = create_mesh({{"x", 4}});
  Tensor sharded = distribute_tensor(Array::from<float>(std::vector<float>(8, 1.0f), {8}), mesh, {Shard{0}});
  Tensor uneven = distribute_tensor(Array::from<float>(std::vector<float>(7, 1.0f), {7}), mesh, {Shard{0}});
  auto identity = [](const Tensor& t) { return t * 2.0f; };

  // Uneven blocks run (fn is traced with the first device's block), but devices must agree.
  CHECK(local_map(identity, {{Shard{0}}})(uneven).full_tensor().data<float>()[6] == 2.0f);
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& t) { return shift(t, "x", 1); }, {{Shard{0}}})(uneven),
                       doctest::Contains("split over mesh dim 'x'"), ShapeError);
  Tensor eight = distribute_tensor(Array::from<float>(std::vector<float>(8, 1.0f), {8}), mesh, {Shard{0}});
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& a, const Tensor& b) { return a + b; }, {{Shard{0}}})(uneven, eight),
                       doctest::Contains("extents [2, 2, 2, 1] and 2 on every device"), ShapeError);
  Tensor rows = distribute_tensor(Array::from<float>(std::vector<float>(14, 1.0f), {7, 2}), mesh, {Shard{0}});
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& t) { return reshape(t, {-1}); }, {{Shard{0}}})(rows),
                       doctest::Contains("reshape inside local_map"), ShapeError);
  CHECK_THROWS_WITH_AS(local_map(identity, {{Shard{1}}})(rows), doctest::Contains("out_placements"), ShapeError);
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& t) { return slice(t, {1, 0}, {1, 2}); }, {{Shard{0}}})(rows),
                       doctest::Contains("taken whole"), ShapeError);
  // in_placements differ: an error, unless redistribute_inputs moves the argument.
  CHECK_THROWS_WITH_AS(local_map(identity, {{Shard{0}}}, {{Replicate{}}}, mesh)(sharded),
                       doctest::Contains("in_placements asks for [Replicate()]"), LayoutError);
  Tensor moved = local_map(identity, {{Replicate{}}}, {{Replicate{}}}, mesh, true)(sharded);
  CHECK(moved.full_tensor().data<float>()[7] == 2.0f);
  // A Replicate output that differs per device.
  CHECK_THROWS_WITH_AS(local_map(identity, {{Replicate{}}})(sharded), doctest::Contains("mesh dim 'x'"), LayoutError);
  CHECK_THROWS_AS(local_map(identity, {{Shard{0}}, {Shard{0}}})(sharded), LayoutError);  // out_placements count
  // A global tensor captured inside fn, collectives outside, unknown dims, axis_index outside.
  Tensor block_sized = distribute_tensor(Array::from<float>({1.0f, 2.0f}, {2}), mesh, {Replicate{}});
  CHECK_THROWS_WITH_AS(local_map([&](const Tensor& t) { return t + block_sized; }, {{Shard{0}}})(sharded),
                       doctest::Contains("mixes a local value"), LayoutError);
  CHECK_THROWS_AS(all_reduce(sharded, ReduceOp::Sum, "x"), LayoutError);
  CHECK_THROWS_AS(local_map([](const Tensor& t) { return all_gather(t, "z", 0); }, {{Shard{0}}})(sharded), MeshError);
  CHECK_THROWS_AS(axis_index("x"), LayoutError);
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& t) { return local_chunk(t, "x", 0); }, {{Shard{0}}})(sharded),
                       doctest::Contains("differs between the devices"), LayoutError);
  CHECK_THROWS_AS(local_map([](const Tensor& t) { return all_to_all(t, "x", 0, 0); }, {{Shard{0}}})(sharded), ShapeError);
  // Looking at a local value inside fn.
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& t) { (void)t.full_tensor(); return t; }, {{Shard{0}}})(sharded),
                       doctest::Contains("local_map"), ConcretizationError);
  // Meshes of the arguments must agree.
  Tensor elsewhere = distribute_tensor(Array::from<float>(std::vector<float>(8, 1.0f), {8}), create_mesh({{"x", 2}}), {Shard{0}});
  CHECK_THROWS_WITH_AS(local_map([](const Tensor& a, const Tensor& b) { return a + b; }, {{Shard{0}}})(sharded, elsewhere),
                       doctest::Contains("mismatched meshes"), LayoutError);
}

namespace {

// Reshapes of every functional collective's result on 2 devices of "ep", each device holding 4
// (or 8) consecutive values of 1..8 (1..16). A collective's step cuts its blocks from another
// virtual value than the one its result's extents describe (all_to_all, reduce_scatter,
// local_chunk): a reshape paired its axes by that value's extents and read past the block.
template <typename T>
void check_collective_then_reshape() {
  CAPTURE(dtype_name(dtype_of<T>()));
  const Mesh mesh = create_mesh({{"ep", 2}});
  auto values = [&](int64_t n) {
    std::vector<T> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), T(1));
    return distribute_tensor(Array::from<T>(v, {n}), mesh, {Shard{0}});
  };
  const Tensor eight = values(8), sixteen = values(16);
  auto run = [&](const std::string& what, const Tensor& in, Placement out, auto fn, std::vector<T> want) {
    CAPTURE(what);
    auto f = local_map(fn, {{out}}, {{Shard{0}}}, mesh);
    CHECK(f(in).full_tensor().template to_vector<T>() == want);
    CHECK(jit([&](const Tensor& x) { return f(x); })(in).full_tensor().template to_vector<T>() == want);
  };
  // Device 0's [[ [1,2] ], [ [3,4] ]]: row j to device j, received rows concatenated along axis 1.
  run("all_to_all, size-1 axis in the middle", eight, Shard{0},
      [](const Tensor& c) { return reshape(all_to_all(reshape(c, {2, 1, 2}), "ep", 0, 1), {4}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  run("all_to_all, size-1 axis last", eight, Shard{0},
      [](const Tensor& c) { return reshape(all_to_all(reshape(c, {2, 2, 1}), "ep", 0, 1), {4}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  run("all_to_all, size-1 axis first", eight, Shard{0},
      [](const Tensor& c) { return reshape(all_to_all(reshape(c, {1, 2, 2}), "ep", 1, 0), {4}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  run("all_to_all, size-1 received axis kept", eight, Shard{0},
      [](const Tensor& c) { return reshape(all_to_all(reshape(c, {2, 1, 2}), "ep", 0, 1), {1, 4}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  run("all_to_all, no size-1 axis, the result split", eight, Shard{0},
      [](const Tensor& c) { return reshape(all_to_all(reshape(c, {4, 1}), "ep", 0, 1), {2, 2}); },
      std::vector<T>{1, 5, 2, 6, 3, 7, 4, 8});
  // [2, 4] received per device: its rows split in two; the split axis's extents (4 then 2)
  // equal the first output axes' product, so the old pairing matched them.
  run("all_to_all, no size-1 axis, rows regrouped", sixteen, Shard{0},
      [](const Tensor& c) { return reshape(all_to_all(reshape(c, {4, 2}), "ep", 0, 1), {2, 2, 2}); },
      std::vector<T>{1, 2, 9, 10, 3, 4, 11, 12, 5, 6, 13, 14, 7, 8, 15, 16});
  run("reduce_scatter", eight, Shard{0},
      [](const Tensor& c) { return reshape(reduce_scatter(reshape(c, {2, 1, 2}), ReduceOp::Sum, "ep", 0), {2}); },
      std::vector<T>{6, 8, 10, 12});
  run("all_gather", eight, Replicate{},
      [](const Tensor& c) { return reshape(all_gather(reshape(c, {2, 1, 2}), "ep", 1), {8}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  run("local_chunk of an all_gather", eight, Shard{0},
      [](const Tensor& c) { return reshape(local_chunk(all_gather(reshape(c, {2, 1, 2}), "ep", 1), "ep", 0), {2, 2}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  run("shift", eight, Shard{0},
      [](const Tensor& c) { return reshape(shift(reshape(c, {2, 1, 2}), "ep", 1), {4}); },
      std::vector<T>{5, 6, 7, 8, 1, 2, 3, 4});
  // Collectives chained, then a reshape: the second reads the first's buffer, the reshape its own view.
  run("all_to_all then all_gather", eight, Replicate{},
      [](const Tensor& c) { return reshape(all_gather(all_to_all(reshape(c, {2, 1, 2}), "ep", 0, 1), "ep", 0), {8}); },
      std::vector<T>{1, 2, 5, 6, 3, 4, 7, 8});
  // all_to_all_v: device 0 sends rows 1 2 to itself and 3 4 to device 1; device 1 sends 5 to
  // device 0 and 6 7 8 to itself. Each receives up to 8 rows of [1, 1], zero past its count.
  auto f = local_map([](const Tensor& r, const Tensor& k) { return reshape(std::get<0>(all_to_all_v(reshape(r, {4, 1, 1}), k, "ep")), {2, 4}); },
                     {{Shard{0}}}, {{Shard{0}}, {Shard{0}}}, mesh);
  const Tensor counts = distribute_tensor(Array::from<int64_t>({2, 2, 1, 3}, {4}), mesh, {Shard{0}});
  CHECK(f(eight, counts).full_tensor().template to_vector<T>() == std::vector<T>{1, 2, 5, 0, 0, 0, 0, 0, 3, 4, 6, 7, 8, 0, 0, 0});
}

}  // namespace

TEST_CASE("a reshape of a functional collective's result reads that result: size-1 axes, every collective, f64 and i64") {
  check_collective_then_reshape<double>();
  check_collective_then_reshape<int64_t>();
}
