#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include <tessera/tessera.hpp>

#include "partitioner/redistribute_plan.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Every component equals the reference evaluator's block of `global`.
void check_components(const Tensor& t, const Array& global) {
  auto coords = coords_of(t.layout().mesh());
  for (size_t i = 0; i < coords.size(); ++i) {
    CAPTURE(i);
    CHECK(same_array(t.components()[i], reference_component(global, t.layout(), coords[i])));
  }
}

std::map<std::string, int64_t> planned_collectives(const Tensor& t, const Layout& to) {
  std::map<std::string, int64_t> out;
  for (const auto& step : plan_redistribute(t.shape(), t.dtype(), t.layout(), to))
    if (is_collective(step.kind)) out[std::string(redistribute_kind_name(step.kind))] += 1;
  return out;
}

// Runs relayout under CommDebugMode and checks components, gathered value and collective counts.
void check_relayout(const Array& global, const Layout& from, const Layout& to,
                    std::map<std::string, int64_t> expected_counts) {
  CAPTURE(from.to_string());
  CAPTURE(to.to_string());
  Tensor t = copy_to_mesh(global, from);
  CommDebugMode comm;
  Tensor moved = relayout(t, to);
  CHECK(!moved.is_computed());  // lazy: nothing runs until looked at or counted
  CHECK(comm.counts() == expected_counts);  // reading the counts computes it
  moved.components();  // so looking at it runs nothing more
  CHECK(comm.counts() == expected_counts);
  check_components(moved, global);
  CHECK(same_array(moved.full_tensor(), global));
}

Array iota(std::vector<int64_t> shape, DType dtype = DType::f32) {
  Array a(shape, dtype);
  for (int64_t i = 0; i < a.numel(); ++i) store_from_double(a.mutable_bytes(), dtype, i, double(i));
  return a;
}

}  // namespace

TEST_CASE("each single-dim transition uses exactly its collective") {
  Mesh mesh = create_mesh({{"x", 4}});
  for (std::vector<int64_t> shape : {std::vector<int64_t>{8, 6}, {7, 5}, {3, 2}, {0, 3}, {1, 1}}) {
    CAPTURE(shape[0]);
    Array a = iota(shape);
    Layout rows({"x", UNSHARDED}, mesh), cols({UNSHARDED, "x"}, mesh), rep = Layout::replicated(mesh, 2);
    check_relayout(a, rows, rep, {{"all_gather", 1}});
    check_relayout(a, rows, cols, {{"all_to_all", 1}});
    check_relayout(a, cols, rows, {{"all_to_all", 1}});
    check_relayout(a, rep, rows, {});
    check_relayout(a, rep, cols, {});
  }
}

TEST_CASE("Partial transitions for every reduce op") {
  Mesh mesh = create_mesh({{"x", 3}});
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min}) {
    CAPTURE(reduce_op_name(op));
    // Components with mixed signs whose reduction is known exactly.
    std::vector<std::vector<double>> parts;
    std::vector<double> expected;
    switch (op) {
      case ReduceOp::Sum: parts = {{5, -3, 2, 0, 7}, {-4, 8, 1, 1, -7}, {2, -1, -3, 4, 0}}; break;
      case ReduceOp::Avg: parts = {{6, -3, 3, 0, 9}, {-3, 3, 0, 3, -9}, {0, 3, 3, 3, 3}}; break;
      case ReduceOp::Product: parts = {{2, -1, 3, 1, 0}, {-1, -2, 1, 5, 4}, {3, 1, -2, -1, 2}}; break;
      case ReduceOp::Max: case ReduceOp::Min: parts = {{2, -1, 3, 1, 0}, {-1, -2, 1, 5, 4}, {3, 1, -2, -1, 2}}; break;
    }
    for (size_t i = 0; i < 5; ++i) {
      double v = parts[0][i];
      for (int r = 1; r < 3; ++r) {
        double p = parts[r][i];
        switch (op) {
          case ReduceOp::Sum: case ReduceOp::Avg: v += p; break;
          case ReduceOp::Product: v *= p; break;
          case ReduceOp::Max: v = std::max(v, p); break;
          case ReduceOp::Min: v = std::min(v, p); break;
        }
      }
      expected.push_back(op == ReduceOp::Avg ? v / 3 : v);
    }
    for (DType dtype : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16}) {
      CAPTURE(dtype_name(dtype));
      std::vector<Array> comps;
      for (const auto& p : parts) {
        Array a({5}, dtype);
        for (int i = 0; i < 5; ++i) store_from_double(a.mutable_bytes(), dtype, i, p[i]);
        comps.push_back(a);
      }
      Array want({5}, dtype);
      for (int i = 0; i < 5; ++i) store_from_double(want.mutable_bytes(), dtype, i, expected[i]);
      Tensor partial = pack(comps, Layout::from_placements(mesh, {Partial{op}}, 1));
      {
        CommDebugMode comm;
        Tensor replicated = partial.redistribute({Replicate{}});
        CHECK(!replicated.is_computed());  // lazy: nothing runs until looked at or counted
        CHECK(comm.counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});  // reading the counts computes it
        replicated.components();  // so looking at it runs nothing more
        CHECK(comm.counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
        for (const Array& c : replicated.components()) CHECK(same_array(c, want));
      }
      {
        CommDebugMode comm;
        Tensor sharded = partial.redistribute({Shard{0}});
        CHECK(!sharded.is_computed());  // lazy: nothing runs until looked at or counted
        CHECK(comm.counts() == std::map<std::string, int64_t>{{"reduce_scatter", 1}});  // reading the counts computes it
        sharded.components();  // so looking at it runs nothing more
        CHECK(comm.counts() == std::map<std::string, int64_t>{{"reduce_scatter", 1}});
        check_components(sharded, want);
      }
      // Replicate -> Partial is local, and reducing it again gives the value back.
      CommDebugMode comm;
      Tensor again = copy_to_mesh(want, Layout::replicated(mesh, 1)).redistribute({Partial{op}});
      CHECK(comm.total_count() == 0);
      CHECK(same_array(again.full_tensor(), want));
    }
  }
}

TEST_CASE("2-D meshes: per-mesh-dim steps, cheapest order") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 3}});
  Array a = iota({7, 5}, DType::i32);
  check_relayout(a, Layout({"x", "y"}, mesh), Layout({"y", "x"}, mesh), planned_collectives(copy_to_mesh(a, Layout({"x", "y"}, mesh)), Layout({"y", "x"}, mesh)));
  // Shard(0) on x -> Shard(1) on y and replicate x: the free chunk on y runs before the gather on x.
  Layout from({"x", UNSHARDED}, mesh), to({UNSHARDED, "y"}, mesh);
  auto plan = plan_redistribute({7, 5}, DType::i32, from, to);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].kind == RedistributeKind::LocalChunk);
  CHECK(plan[1].kind == RedistributeKind::AllGather);
  check_relayout(a, from, to, {{"all_gather", 1}});
  // Nested axis x+y -> y+x needs the inner dim moved first.
  check_relayout(a, Layout({"x+y", UNSHARDED}, mesh), Layout({"y+x", UNSHARDED}, mesh),
                 planned_collectives(copy_to_mesh(a, Layout({"x+y", UNSHARDED}, mesh)), Layout({"y+x", UNSHARDED}, mesh)));
  check_relayout(a, Layout({"x+y", UNSHARDED}, mesh), Layout({UNSHARDED, "y+x"}, mesh), {{"all_to_all", 2}});
  // Partial on one dim, shard on the other: reduce_scatter onto the free axis.
  Tensor p = pack(std::vector<Array>(6, Array{{1, 2, 3, 4}}), Layout::from_placements(mesh, {Partial{}, Shard{0}}, 2));
  CHECK(p.shape() == std::vector<int64_t>{3, 4});
  CommDebugMode comm;
  Tensor s = p.redistribute({Shard{1}, Shard{0}});
  CHECK(!s.is_computed());  // lazy: nothing runs until looked at or counted
  CHECK(comm.counts() == std::map<std::string, int64_t>{{"reduce_scatter", 1}});  // reading the counts computes it
  s.components();  // so looking at it runs nothing more
  CHECK(comm.counts() == std::map<std::string, int64_t>{{"reduce_scatter", 1}});
  CHECK(same_array(s.full_tensor(), Array{{2, 4, 6, 8}, {2, 4, 6, 8}, {2, 4, 6, 8}}));
}

Mesh random_mesh(std::mt19937& rng) {
  static const std::vector<std::vector<int64_t>> shapes = {{1}, {2}, {3}, {4}, {5}, {8}, {2, 2}, {2, 3}, {3, 2},
                                                           {1, 4}, {4, 2}, {2, 1, 2}, {2, 2, 2}, {1, 3, 2}};
  const auto& shape = shapes[std::uniform_int_distribution<size_t>(0, shapes.size() - 1)(rng)];
  std::vector<std::pair<std::string, int64_t>> dims;
  const char* names[] = {"a", "b", "c"};
  for (size_t i = 0; i < shape.size(); ++i) dims.emplace_back(names[i], shape[i]);
  return create_mesh(dims);
}

std::vector<int64_t> random_shape(std::mt19937& rng, int64_t max_rank, int64_t max_extent) {
  std::vector<int64_t> shape(std::uniform_int_distribution<int64_t>(1, max_rank)(rng));
  for (int64_t& extent : shape) extent = std::uniform_int_distribution<int64_t>(0, max_extent)(rng);
  return shape;
}

TEST_CASE("property: relayout(copy_to_mesh(A, L1), L2) == copy_to_mesh(A, L2), bitwise") {
  std::mt19937 rng(20261121);
  const DType dtypes[] = {DType::f32, DType::i32, DType::f64, DType::u8, DType::bf16, DType::i64, DType::f16};
  for (int trial = 0; trial < 400; ++trial) {
    CAPTURE(trial);
    Mesh mesh = random_mesh(rng);
    const std::vector<int64_t> shape = random_shape(rng, 3, 9);
    const int64_t rank = int64_t(shape.size());
    DType dtype = dtypes[trial % 7];
    Array global = random_array(shape, dtype, rng);
    Layout l1 = random_layout(mesh, rank, rng), l2 = random_layout(mesh, rank, rng);
    Tensor t1 = copy_to_mesh(global, l1);
    check_components(t1, global);
    auto planned = planned_collectives(t1, l2);
    CommDebugMode comm;
    Tensor t2 = relayout(t1, l2);
    CHECK(!t2.is_computed());  // lazy: nothing runs until looked at or counted
    CHECK(comm.counts() == planned);  // reading the counts computes it
    t2.components();  // so looking at it runs nothing more
    CHECK(comm.counts() == planned);
    Tensor direct = copy_to_mesh(global, l2);
    for (size_t i = 0; i < direct.components().size(); ++i) CHECK(same_array(t2.components()[i], direct.components()[i]));
    CHECK(same_array(t2.full_tensor(), global));
  }
}

TEST_CASE("property: Partial inputs split with mixed signs reduce for every op") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    CAPTURE(trial);
    Mesh mesh = random_mesh(rng);
    const std::vector<int64_t> shape = random_shape(rng, 2, 7);
    const int64_t rank = int64_t(shape.size());
    // One Partial mesh dim (op chosen at random), the others random shard / replicate.
    int64_t pdim = std::uniform_int_distribution<int64_t>(0, mesh.ndim() - 1)(rng);
    ReduceOp op = ReduceOp(trial % 5);
    Layout base = random_layout(mesh, rank, rng).with_placement(pdim, Replicate{});
    Layout from = base.with_placement(pdim, Partial{op});
    Layout to = random_layout(mesh, rank, rng);
    const DType dtype = op == ReduceOp::Avg ? DType::f64 : DType::i32;
    Array global = random_array(shape, dtype, rng);
    // Split each element into k parts with mixed signs that reduce exactly to it.
    const int64_t k = mesh.shape()[pdim];
    std::vector<Array> components;
    auto coords = coords_of(mesh);
    for (size_t i = 0; i < coords.size(); ++i) {
      Array c = reference_component(global, base, coords[i]);
      const int64_t r = coords[i][pdim];
      // Deterministic per (position in the group, element offset) so every group splits alike.
      for (int64_t e = 0; e < c.numel(); ++e) {
        double v = c.element_as_double(e), noise = double((e * 7 + 3) % 11) - 5.0, part = v;
        bool last = r == k - 1;
        switch (op) {
          case ReduceOp::Sum: part = last ? v - noise * double(k - 1) : noise; break;
          case ReduceOp::Avg: part = last ? v - noise * double(k - 1) : v + noise; break;
          case ReduceOp::Product: part = (r == 0) ? (k % 2 == 0 ? -v : v) : (k % 2 == 0 && r == 1 ? -1.0 : 1.0); break;
          case ReduceOp::Max: part = last ? v : v - std::abs(noise) - 1; break;
          case ReduceOp::Min: part = last ? v : v + std::abs(noise) + 1; break;
        }
        if (op == ReduceOp::Avg && last) part = v * double(k) - (v + noise) * double(k - 1);
        store_from_double(c.mutable_bytes(), dtype, e, part);
      }
      components.push_back(c);
    }
    Tensor partial = pack(components, from);
    auto planned = planned_collectives(partial, to);
    CommDebugMode comm;
    Tensor moved = relayout(partial, to);
    CHECK(!moved.is_computed());  // lazy: nothing runs until looked at
    CHECK(comm.counts() == planned);  // reading the counts computes what was built in the mode
    CHECK(moved.is_computed());
    moved.components();
    CHECK(comm.counts() == planned);
    check_components(moved, global);
  }
}

// The global twin of local_map's collective-then-reshape case: a value moved by an all_to_all
// (Shard(a) -> Shard(b)) and then reshaped with size-1 axes around the moved ones reads every
// element where it lies, eagerly and in jit, on even and uneven splits.
TEST_CASE("an all_to_all redistribute followed by a reshape with size-1 axes keeps every element") {
  struct Case {
    std::vector<int64_t> shape;
    int64_t from, to;
    std::vector<std::vector<int64_t>> reshapes;
  };
  const std::vector<Case> cases = {
      {{4, 1, 2}, 2, 0, {{8}, {4, 2}, {2, 1, 2, 2}, {1, 8}, {8, 1}, {2, 4}}},
      {{2, 1, 4}, 2, 0, {{8}, {2, 4}, {2, 1, 2, 2}, {1, 2, 4}}},
      {{1, 4, 2}, 2, 1, {{8}, {4, 2}, {4, 1, 2}, {2, 2, 2}}},
      {{4, 2, 1}, 1, 0, {{8}, {4, 2}, {2, 2, 2}, {8, 1, 1}}},
      {{6, 1, 3}, 2, 0, {{18}, {6, 3}, {3, 2, 3}, {2, 3, 1, 3}}},  // uneven over 4
  };
  for (const Mesh& mesh : {create_mesh({{"x", 2}}), create_mesh({{"x", 4}})})
    for (const Case& c : cases) {
      int64_t n = 1;
      for (int64_t e : c.shape) n *= e;
      std::vector<double> values(static_cast<size_t>(n));
      std::iota(values.begin(), values.end(), 1.0);
      const Tensor x = distribute_tensor(Array::from<double>(values, c.shape), mesh, {Shard{c.from}});
      for (const auto& to_shape : c.reshapes) {
        CAPTURE(mesh.to_string());
        CAPTURE(c.shape);
        CAPTURE(to_shape);
        auto f = [&](const Tensor& t) { return reshape(t.redistribute({Shard{c.to}}), to_shape); };
        CommDebugMode comm;
        const Tensor eager = f(x);
        const bool even = c.shape[size_t(c.from)] % mesh.size() == 0 && c.shape[size_t(c.to)] % mesh.size() == 0;
        if (even) CHECK(comm.counts() == std::map<std::string, int64_t>{{"all_to_all", 1}});
        CHECK(eager.full_tensor().to_vector<double>() == values);
        CHECK(eager.shape() == to_shape);
        CHECK(jit(f)(x).full_tensor().to_vector<double>() == values);
      }
    }
}
