// The ops PyTorch DTensor users reach as torch.topk, torch.cumsum, torch.gather
// (take_along_axis), Tensor.scatter_add, torch.index_select and torch.multinomial, checked as
// PyTorch's own DTensor tests check theirs: on 1-D and 2-D meshes (3 devices, 2x2, and 4 devices
// over an axis of 3 so that one block is empty), uneven shards, the operated axis sharded,
// another axis sharded, or nothing; each result against the reference evaluator (exact for
// integers), its placements, and the collectives computing it runs, counted by CommDebugMode.
// Where Tessera's plan differs from PyTorch's sharding strategy, the case says how.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

using Placements = std::vector<Placement>;
using Counts = std::map<std::string, int64_t>;

const Placement R = Replicate{};
const Placement P = Partial{};
Placement S(int64_t dim) { return Shard{dim}; }

// One layout of an op's operands and what it must give.
struct OpCase {
  Mesh mesh;
  std::vector<int64_t> shape;  // x's (probs' for multinomial)
  Placements x;
  Placements index;  // the indices' (and src's) placements
  Placements out;    // the result's (each result's, for topk)
  Counts collectives;  // run while computing the result, before anything reads it
};

struct Meshes {
  Mesh three = create_mesh({{"x", 3}});
  Mesh grid = create_mesh({{"x", 2}, {"y", 2}});
  Mesh four = create_mesh({{"x", 4}});  // over an axis of 3: the last block is empty
};

std::string text(const Placements& placements) {
  std::string out;
  for (const Placement& p : placements) out += (out.empty() ? "" : ", ") + placement_string(p);
  return "[" + out + "]";
}

std::string text(const Counts& counts) {
  std::string out;
  for (const auto& [kind, n] : counts) out += (out.empty() ? "" : ", ") + kind + " " + std::to_string(n);
  return "{" + out + "}";
}

std::string describe(const OpCase& c) {
  std::string shape;
  for (int64_t e : c.shape) shape += (shape.empty() ? "" : "x") + std::to_string(e);
  return c.mesh.to_string().substr(0, c.mesh.to_string().find('|', 1) + 1) + " " + shape + " x " + text(c.x) +
         (c.index.empty() ? "" : " index " + text(c.index));
}

// Builds the results inside a CommDebugMode, whose counts compute them (in one program) before
// anything reads them; then each result's placements.
template <class Build>
std::vector<Tensor> computed_as_expected(const OpCase& c, Build build) {
  CommDebugMode comm;
  const std::vector<Tensor> results = build();
  const Counts ran = comm.get_comm_counts();
  INFO(comm.generate_comm_debug_tracing_table());
  CHECK(text(ran) == text(c.collectives));
  for (const Tensor& r : results) CHECK(text(r.placements()) == text(c.out));
  return results;
}

void matches_reference(const Tensor& result, const std::map<const Node*, Array>& leaves, double float_tolerance = 1e-5) {
  CHECK(compare_with_reference(result.full_tensor(), reference_eval(result, leaves), float_tolerance) == "");
}

// f32 values in [-1.5, 1.5) that are not integers: sums round.
Array fractions(const std::vector<int64_t>& shape, std::mt19937& rng) {
  Array out(shape, DType::f32);
  std::uniform_real_distribution<float> value(-1.5f, 1.5f);
  for (int64_t i = 0; i < out.numel(); ++i) out.mutable_data<float>()[i] = value(rng);
  return out;
}

// Indices in [0, extent), repeats included.
Array indices(const std::vector<int64_t>& shape, int64_t extent, std::mt19937& rng) {
  Array out(shape, DType::i64);
  for (int64_t i = 0; i < out.numel(); ++i) out.mutable_data<int64_t>()[i] = int64_t(rng() % uint64_t(extent));
  return out;
}

}  // namespace

TEST_CASE("topk over a sharded axis gathers the row once and returns it Replicate there, as PyTorch; other axes keep their shards") {
  const Meshes m;
  const Counts none, gather{{"all_gather", 1}};
  // Along axis 1 (k = 2), and once along axis 0. PyTorch's topk strategy replicates the topk dim
  // and keeps every other placement: the same plan and placements here.
  const std::vector<std::pair<OpCase, int64_t>> cases = {
      {{m.three, {5, 7}, {S(1)}, {}, {R}, gather}, 1},                 // 7 over 3: 3, 3, 1
      {{m.three, {5, 7}, {S(0)}, {}, {S(0)}, none}, 1},                // rows 2, 2, 1
      {{m.three, {5, 7}, {R}, {}, {R}, none}, 1},
      {{m.three, {5, 7}, {S(0)}, {}, {R}, gather}, 0},                 // along the sharded rows
      {{m.grid, {5, 7}, {S(1), S(0)}, {}, {R, S(0)}, gather}, 1},
      {{m.grid, {5, 7}, {S(0), S(1)}, {}, {S(0), R}, gather}, 1},
      {{m.grid, {5, 7}, {S(1), S(1)}, {}, {R, R}, {{"all_gather", 2}}}, 1},  // one per mesh dim
      {{m.grid, {5, 7}, {R, R}, {}, {R, R}, none}, 1},
      {{m.four, {5, 3}, {S(1)}, {}, {R}, gather}, 1},                  // 1, 1, 1, 0
      {{m.four, {5, 3}, {S(0)}, {}, {S(0)}, none}, 1},                 // rows 2, 2, 1, 0
  };
  std::mt19937 rng(31);
  for (const auto& [c, axis] : cases) {
    CAPTURE(describe(c));
    CAPTURE(axis);
    const Array a = random_array(c.shape, DType::f32, rng);  // integers in [-50, 50]: ties
    const Tensor x = distribute_tensor(a, c.mesh, c.x);
    const std::vector<Tensor> top = computed_as_expected(c, [&] {
      auto [values, where] = topk(x, 2, axis);
      return std::vector<Tensor>{values, where};
    });
    CHECK(top[1].dtype() == DType::i64);
    for (const Tensor& t : top) matches_reference(t, {{x.node().get(), a}});
  }
  // A long row, ranked in blocks that fall on the 3 shards (12 of 125), each device ranking its
  // own: only the blocks' candidates (and whether they are NaN) are gathered, and the picks are
  // reduced to Replicate, one all_reduce each for values and indices. Cheaper than PyTorch's
  // plan, which gathers the row.
  const OpCase long_row{m.three, {2, 1500}, {S(1)}, {}, {R}, {{"all_gather", 2}, {"all_reduce", 2}}};
  CAPTURE(describe(long_row));
  const Array a = random_array(long_row.shape, DType::f32, rng);
  const Tensor x = distribute_tensor(a, long_row.mesh, long_row.x);
  CommDebugMode comm;
  const std::vector<Tensor> top = computed_as_expected(long_row, [&] {
    auto [values, where] = topk(x, 4, 1);
    return std::vector<Tensor>{values, where};
  });
  const int64_t row_gathered = 3 * 2 * 1000 * 4;  // each device receiving the 1000 f32 it lacks, per row
  CHECK(comm.total_bytes() * 10 < row_gathered);
  for (const Tensor& t : top) matches_reference(t, {{x.node().get(), a}});
}

TEST_CASE("cumsum along a sharded axis is Partial(sum) with no collective (PyTorch: all_gather, Replicate); along another axis it keeps the shards") {
  const Meshes m;
  const Counts none;
  const std::vector<std::pair<OpCase, int64_t>> cases = {
      // PyTorch gathers the axis (Replicate). Here each device sums its block into every later
      // element, a Partial(sum) that costs nothing until read (one all_reduce per mesh dim).
      {{m.three, {5, 7}, {S(1)}, {}, {P}, none}, 1},
      {{m.three, {5, 7}, {S(0)}, {}, {S(0)}, none}, 1},
      {{m.three, {5, 7}, {R}, {}, {R}, none}, 1},
      {{m.three, {5, 7}, {S(0)}, {}, {P}, none}, 0},
      {{m.grid, {5, 7}, {S(1), S(0)}, {}, {P, S(0)}, none}, 1},
      {{m.grid, {5, 7}, {S(0), S(1)}, {}, {S(0), P}, none}, 1},
      {{m.grid, {5, 7}, {S(1), S(1)}, {}, {P, P}, none}, 1},
      {{m.grid, {5, 7}, {R, R}, {}, {R, R}, none}, 1},
      {{m.four, {5, 3}, {S(1)}, {}, {P}, none}, 1},
      {{m.four, {5, 3}, {S(0)}, {}, {S(0)}, none}, 1},
  };
  std::mt19937 rng(37);
  for (const auto& [c, axis] : cases)
    for (DType dtype : {DType::i64, DType::f32}) {
      CAPTURE(describe(c));
      CAPTURE(axis);
      CAPTURE(dtype_name(dtype));
      const Array a = dtype == DType::f32 ? fractions(c.shape, rng) : random_array(c.shape, dtype, rng);
      const Tensor x = distribute_tensor(a, c.mesh, c.x);
      const Tensor sums = computed_as_expected(c, [&] { return std::vector<Tensor>{cumsum(x, axis)}; })[0];
      matches_reference(sums, {{x.node().get(), a}});
    }
}

TEST_CASE("take_along_axis (torch.gather): sharded along the gathered axis, each device picks from its block (Partial); indices sharded elsewhere keep their shards") {
  const Meshes m;
  const Counts none;
  // x [5, 7] (or [5, 3]) and indices [5, 4] along axis 1. With x sharded along the axis PyTorch
  // gathers x and the result follows the indices; here each device picks from its block (a
  // Partial(sum): one term is the value, the others zero), after at most an all_to_all of the
  // [5, 4, 7] bool matches (the indices' shards meeting x's).
  const std::vector<OpCase> cases = {
      {m.three, {5, 7}, {S(1)}, {S(1)}, {P}, {{"all_to_all", 1}}},
      {m.three, {5, 7}, {S(1)}, {R}, {P}, none},
      {m.three, {5, 7}, {R}, {S(1)}, {S(1)}, none},  // PyTorch's index sharding, the same
      {m.three, {5, 7}, {S(0)}, {S(0)}, {S(0)}, none},
      {m.three, {5, 7}, {R}, {R}, {R}, none},
      {m.grid, {5, 7}, {S(1), S(0)}, {S(1), S(0)}, {P, S(0)}, {{"all_to_all", 1}}},
      {m.grid, {5, 7}, {S(0), S(1)}, {S(0), S(1)}, {S(0), P}, {{"all_to_all", 1}}},
      {m.grid, {5, 7}, {S(1), S(1)}, {S(1), S(1)}, {P, P}, {{"all_gather", 1}, {"all_to_all", 1}}},
      {m.grid, {5, 7}, {R, R}, {S(1), S(0)}, {S(1), S(0)}, none},
      {m.four, {5, 3}, {S(1)}, {S(1)}, {P}, {{"all_to_all", 1}}},
      {m.four, {5, 3}, {S(0)}, {S(0)}, {S(0)}, none},
  };
  std::mt19937 rng(41);
  for (const OpCase& c : cases) {
    CAPTURE(describe(c));
    const Array a = random_array(c.shape, DType::f32, rng), picks = indices({c.shape[0], 4}, c.shape[1], rng);
    const Tensor x = distribute_tensor(a, c.mesh, c.x), where = distribute_tensor(picks, c.mesh, c.index);
    const Tensor taken = computed_as_expected(c, [&] { return std::vector<Tensor>{take_along_axis(x, where, 1)}; })[0];
    matches_reference(taken, {{x.node().get(), a}, {where.node().get(), picks}});
  }
}

TEST_CASE("scatter_add along a sharded axis keeps x's shards, the added rows reduce_scattered once per sharding mesh dim (PyTorch: Replicate)") {
  const Meshes m;
  const Counts none, scattered{{"reduce_scatter", 1}};
  // x [5, 7] (or [5, 3]); indices and src [5, 4], along axis 1. PyTorch shards scatter_add only
  // along the other axes, and gathers everything else (Replicate).
  const std::vector<OpCase> cases = {
      {m.three, {5, 7}, {S(1)}, {S(1)}, {S(1)}, scattered},
      {m.three, {5, 7}, {S(1)}, {R}, {S(1)}, none},
      {m.three, {5, 7}, {R}, {S(1)}, {P}, none},  // device 0 adds x, every device its src: no collective
      {m.three, {5, 7}, {S(0)}, {S(0)}, {S(0)}, none},
      {m.three, {5, 7}, {R}, {R}, {R}, none},
      {m.grid, {5, 7}, {S(1), S(0)}, {S(1), S(0)}, {S(1), S(0)}, scattered},
      {m.grid, {5, 7}, {S(0), S(1)}, {S(0), S(1)}, {S(0), S(1)}, scattered},
      {m.grid, {5, 7}, {S(1), S(1)}, {S(1), S(1)}, {S(1), S(1)}, {{"reduce_scatter", 2}}},
      {m.grid, {5, 7}, {R, R}, {S(1), S(0)}, {P, S(0)}, none},
      {m.four, {5, 3}, {S(1)}, {S(1)}, {S(1)}, scattered},
      {m.four, {5, 3}, {S(0)}, {S(0)}, {S(0)}, none},
  };
  std::mt19937 rng(43);
  for (const OpCase& c : cases) {
    CAPTURE(describe(c));
    const Array a = random_array(c.shape, DType::f32, rng), added = random_array({c.shape[0], 4}, DType::f32, rng);
    const Array at = indices({c.shape[0], 4}, c.shape[1], rng);
    const Tensor x = distribute_tensor(a, c.mesh, c.x), where = distribute_tensor(at, c.mesh, c.index);
    const Tensor src = distribute_tensor(added, c.mesh, c.index);
    const Tensor sum = computed_as_expected(c, [&] { return std::vector<Tensor>{scatter_add(x, 1, where, src)}; })[0];
    matches_reference(sum, {{x.node().get(), a}, {where.node().get(), at}, {src.node().get(), added}});
  }
}

TEST_CASE("index_select from a sharded axis reads each block where it lies (Partial, no collective; PyTorch: all_gather); sharded indices shard the result") {
  const Meshes m;
  const Counts none;
  // x [5, 7] (or [5, 3]), 4 indices along axis 1 (once along axis 0). PyTorch gathers x sharded
  // along the axis; here each device picks the indices its block holds: Partial(sum).
  const std::vector<std::pair<OpCase, int64_t>> cases = {
      {{m.three, {5, 7}, {S(1)}, {R}, {P}, none}, 1},
      {{m.three, {5, 7}, {S(1)}, {S(0)}, {P}, {{"all_gather", 1}}}, 1},  // of the 4 indices (PyTorch: of x, Shard(1))
      {{m.three, {5, 7}, {R}, {S(0)}, {S(1)}, none}, 1},
      {{m.three, {5, 7}, {S(0)}, {R}, {S(0)}, none}, 1},
      {{m.three, {5, 7}, {R}, {R}, {R}, none}, 1},
      {{m.three, {5, 7}, {S(0)}, {R}, {P}, none}, 0},
      {{m.grid, {5, 7}, {S(1), S(0)}, {R, R}, {P, S(0)}, none}, 1},
      {{m.grid, {5, 7}, {S(0), S(1)}, {R, R}, {S(0), P}, none}, 1},
      {{m.grid, {5, 7}, {S(1), S(1)}, {R, R}, {P, P}, none}, 1},
      {{m.grid, {5, 7}, {R, R}, {S(0), R}, {S(1), R}, none}, 1},
      // One block empty: the table is gathered instead (take_rows reads only non-empty blocks).
      {{m.four, {5, 3}, {S(1)}, {R}, {R}, {{"all_gather", 1}}}, 1},
      {{m.four, {5, 3}, {S(0)}, {R}, {S(0)}, none}, 1},
  };
  std::mt19937 rng(47);
  for (const auto& [c, axis] : cases) {
    CAPTURE(describe(c));
    CAPTURE(axis);
    const Array a = random_array(c.shape, DType::f32, rng), picks = indices({4}, c.shape[size_t(axis)], rng);
    const Tensor x = distribute_tensor(a, c.mesh, c.x), which = distribute_tensor(picks, c.mesh, c.index);
    const Tensor picked = computed_as_expected(c, [&] { return std::vector<Tensor>{index_select(x, axis, which)}; })[0];
    matches_reference(picked, {{x.node().get(), a}, {which.node().get(), picks}});
  }
  // A few rows of a large table, the table and the indices sharded by one mesh dim: the indices
  // are gathered (PyTorch's embedding plan) and the table read where it lies, never gathered.
  const OpCase few_rows{m.three, {1000, 8}, {S(0)}, {S(0)}, {P}, {{"all_gather", 1}}};
  CAPTURE(describe(few_rows));
  const Array a = random_array(few_rows.shape, DType::f32, rng), picks = indices({4}, 1000, rng);
  const Tensor x = distribute_tensor(a, few_rows.mesh, few_rows.x), which = distribute_tensor(picks, few_rows.mesh, few_rows.index);
  CommDebugMode comm;
  const Tensor picked = computed_as_expected(few_rows, [&] { return std::vector<Tensor>{index_select(x, 0, which)}; })[0];
  const std::vector<CollectiveRecord> moved = comm.records();
  REQUIRE(moved.size() == 1);
  CHECK(moved[0].dtype == "int64");
  CHECK(moved[0].bytes <= 3 * 4 * 8);  // each device receives at most the 4 indices
  matches_reference(picked, {{x.node().get(), a}, {which.node().get(), picks}});
}

namespace {

// Weights that are whole numbers (sums are exact in every order, so the reference's draws are
// Tessera's), some zero.
Array whole_weights(const std::vector<int64_t>& shape) {
  Array out(shape, DType::f64);
  for (int64_t i = 0; i < out.numel(); ++i) out.mutable_data<double>()[i] = double((i * 7 + 3) % 5);
  return out;
}

}  // namespace

TEST_CASE("multinomial gathers a row of weights sharded over its categories once (Replicate there) and draws the same samples on every mesh and layout") {
  const Meshes m;
  const Counts none, gather{{"all_gather", 1}};
  // probs [5, 7] (or [5, 3]), 8 draws per row. PyTorch's DTensor has no multinomial strategy
  // (its random ops are uniform_, normal_, bernoulli and dropout): these are Tessera's.
  const std::vector<OpCase> cases = {
      {m.three, {5, 7}, {S(1)}, {}, {R}, gather},
      {m.three, {5, 7}, {S(0)}, {}, {S(0)}, none},
      {m.three, {5, 7}, {R}, {}, {R}, none},
      {m.grid, {5, 7}, {S(1), S(0)}, {}, {R, S(0)}, gather},
      {m.grid, {5, 7}, {S(0), S(1)}, {}, {S(0), R}, gather},
      {m.grid, {5, 7}, {S(1), S(1)}, {}, {R, R}, {{"all_gather", 2}}},
      {m.grid, {5, 7}, {R, R}, {}, {R, R}, none},
      {m.four, {5, 3}, {S(1)}, {}, {R}, gather},
      {m.four, {5, 3}, {S(0)}, {}, {S(0)}, none},
  };
  const Mesh one = create_mesh({{"x", 1}});
  for (const OpCase& c : cases) {
    CAPTURE(describe(c));
    const Array weights = whole_weights(c.shape);
    const Tensor probs = distribute_tensor(weights, c.mesh, c.x);
    const Tensor draws = computed_as_expected(c, [&] { return std::vector<Tensor>{multinomial(probs, 8, 1234)}; })[0];
    const Array got = draws.full_tensor();
    REQUIRE(got.shape() == std::vector<int64_t>{5, 8});
    CHECK(got.dtype() == DType::i64);
    CHECK(compare_with_reference(got, reference_eval(draws, {{probs.node().get(), weights}})) == "");
    const int64_t categories = c.shape[1];
    for (int64_t row = 0; row < 5; ++row)
      for (int64_t k = 0; k < 8; ++k) {
        const int64_t drawn = got.data<int64_t>()[row * 8 + k];
        REQUIRE(drawn >= 0);
        REQUIRE(drawn < categories);
        CHECK(weights.data<double>()[row * categories + drawn] > 0);
      }
    // The seed's samples, whatever the layout: those of one device.
    CHECK(same_array(got, multinomial(distribute_tensor(weights, one, {R}), 8, 1234).full_tensor()));
  }
  // bf16 weights round their running sums coarsely: split over devices (a Partial sum), the
  // sums, and so the draws near a category's edge, depended on the layout.
  std::mt19937 rng(53);
  std::uniform_real_distribution<double> fraction(0.0, 1.0);
  Array coarse({6, 7}, DType::bf16);
  for (int64_t i = 0; i < coarse.numel(); ++i) store_from_double(coarse.mutable_bytes(), DType::bf16, i, fraction(rng) * (i % 3 == 0 ? 1000 : 1));
  const Array single = multinomial(distribute_tensor(coarse, one, {R}), 3000, 17).full_tensor();
  for (const OpCase& c : {cases[0], cases[4], cases[5], cases[7]}) {
    CAPTURE(describe(c));
    CHECK(same_array(multinomial(distribute_tensor(coarse, c.mesh, c.x), 3000, 17).full_tensor(), single));
  }
}
