// all_to_all_v: rows moved by run-time split sizes (MPI_Alltoallv), for mixture-of-experts
// dispatch and combine. Values against the hand rule (device j receives, from devices 0..n-1
// in order, the consecutive rows each addressed to it, then zeros up to the bound) and the
// reference evaluator, on 1-D
// meshes of 2, 3 and 4 devices and over each dim of a 2-D mesh; the round trip; gradients;
// the collectives counted; one compilation for every set of counts; the run-time errors.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <map>

#include <tessera/tessera.hpp>

#include "jit/driver.hpp"
#include "reference_evaluator.hpp"

using namespace tessera;

namespace {

// counts[b][j]: rows the device holding block b sends to member j of its group.
using Counts = std::vector<std::vector<int64_t>>;

constexpr int64_t kFeatures = 3;

// The devices' row blocks, back to back ([blocks * rows, kFeatures]); every value distinct and
// nonzero, so a misplaced row or a row that should be zero shows.
Array numbered_rows(int64_t blocks, int64_t rows) {
  std::vector<double> v;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < kFeatures; ++k) v.push_back(double(1000 * (b + 1) + 10 * r + k));
  return Array::from<double>(v, {blocks * rows, kFeatures});
}

Array flat_counts(const Counts& counts) {
  std::vector<int64_t> v;
  for (const auto& row : counts) v.insert(v.end(), row.begin(), row.end());
  return Array::from<int64_t>(v, {int64_t(v.size())});
}

// The devices of a group: member m of group g holds block group_block(g, m).
struct Groups {
  int64_t count, members;
  std::function<int64_t(int64_t, int64_t)> block;
};

// What every block receives: [blocks * bound, kFeatures] and the received counts [blocks * n].
std::pair<Array, Array> expected_dispatch(const Array& rows, const Counts& counts, const Groups& groups, int64_t rows_per_block,
                                          int64_t bound) {
  const int64_t blocks = groups.count * groups.members;
  Array out({blocks * bound, kFeatures}, DType::f64);
  Array recv({blocks * groups.members}, DType::i64);
  for (int64_t g = 0; g < groups.count; ++g)
    for (int64_t j = 0; j < groups.members; ++j) {
      const int64_t dst = groups.block(g, j);
      int64_t at = 0;
      for (int64_t i = 0; i < groups.members; ++i) {
        const int64_t src = groups.block(g, i);
        int64_t start = 0;
        for (int64_t k = 0; k < j; ++k) start += counts[size_t(src)][size_t(k)];
        for (int64_t r = 0; r < counts[size_t(src)][size_t(j)]; ++r, ++at)
          for (int64_t f = 0; f < kFeatures; ++f)
            out.mutable_data<double>()[(dst * bound + at) * kFeatures + f] =
                rows.data<double>()[(src * rows_per_block + start + r) * kFeatures + f];
        recv.mutable_data<int64_t>()[dst * groups.members + i] = counts[size_t(src)][size_t(j)];
      }
    }
  return {out, recv};
}

bool same(const Array& a, const Array& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  return std::memcmp(a.bytes(), b.bytes(), size_t(a.nbytes())) == 0;
}

// The dispatch as a local_map over `dim` of `mesh`, every tensor sharded on axis 0 over all
// mesh dims (block b on the device of flat index b).
auto dispatch_over(const Mesh& mesh, std::string dim, std::optional<int64_t> bound) {
  const std::vector<Placement> sharded(size_t(mesh.ndim()), Shard{0});
  return local_map(
      [dim, bound](const Tensor& rows, const Tensor& counts) {
        auto [received, recv_counts] = all_to_all_v(rows, counts, dim, bound);
        return std::make_tuple(received, recv_counts);
      },
      {sharded, sharded}, {sharded, sharded}, mesh);
}

// The test's reference evaluator (test/reference_evaluator.hpp) agrees: it simulates every
// device's all_to_all_v from the counts matrix, sharing no code with the communicators.
void check_with_reference(const Tensor& received, const Tensor& received_counts) {
  CHECK(testing::compare_with_reference(received.full_tensor(), testing::reference_eval(received), 0) == "");
  CHECK(testing::compare_with_reference(received_counts.full_tensor(), testing::reference_eval(received_counts), 0) == "");
}

Groups one_group(int64_t n) { return {1, n, [](int64_t, int64_t m) { return m; }}; }

// Dispatches `counts` on a 1-D mesh of counts.size() devices and checks the hand rule.
void check_1d(const Counts& counts, int64_t rows_per_block, std::optional<int64_t> bound = std::nullopt) {
  const int64_t n = int64_t(counts.size());
  CAPTURE(n);
  Mesh mesh = create_mesh({{"x", n}});
  const Array rows = numbered_rows(n, rows_per_block);
  const int64_t b = bound.value_or(rows_per_block * n);
  auto [want, want_counts] = expected_dispatch(rows, counts, one_group(n), rows_per_block, b);
  auto [got, got_counts] = dispatch_over(mesh, "x", bound)(distribute_tensor(rows, mesh, {Shard{0}}),
                                                           distribute_tensor(flat_counts(counts), mesh, {Shard{0}}));
  CHECK(got.shape() == std::vector<int64_t>{n * b, kFeatures});
  CHECK(same(got.full_tensor(), want));
  CHECK(same(got_counts.full_tensor(), want_counts));
  check_with_reference(got, got_counts);
}

}  // namespace

TEST_CASE("all_to_all_v on two devices: the received rows and counts, written out by hand") {
  Mesh mesh = create_mesh({{"x", 2}});
  // Device 0 holds rows a0..a2, device 1 rows b0..b2 (one feature each); device 0 sends one row
  // to itself and two to device 1, device 1 sends all three to device 0.
  Array rows = Array::from<double>({1, 2, 3, 4, 5, 6}, {6, 1});
  Array counts = Array::from<int64_t>({1, 2, 3, 0}, {4});
  auto f = local_map([](const Tensor& r, const Tensor& c) { return all_to_all_v(r, c, "x"); }, {{Shard{0}}, {Shard{0}}},
                     {{Shard{0}}, {Shard{0}}}, mesh);
  auto [got, got_counts] = f(distribute_tensor(rows, mesh, {Shard{0}}), distribute_tensor(counts, mesh, {Shard{0}}));
  // Each device's block has the worst-case extent 3 * 2: device 0 gets a0 then b0 b1 b2, device 1 gets a1 a2.
  CHECK(same(got.full_tensor(), Array::from<double>({1, 4, 5, 6, 0, 0, 2, 3, 0, 0, 0, 0}, {12, 1})));
  CHECK(same(got_counts.full_tensor(), Array::from<int64_t>({1, 3, 2, 0}, {4})));
}

TEST_CASE("all_to_all_v on 1-D meshes of 2, 3 and 4 devices: uneven counts, silent devices, all rows to one device") {
  // Uneven, every pair talking.
  check_1d({{1, 2}, {3, 1}}, 4);
  check_1d({{2, 0, 3}, {1, 1, 1}, {0, 4, 1}}, 5);
  check_1d({{1, 0, 2, 1}, {0, 3, 1, 0}, {2, 2, 0, 1}, {1, 1, 1, 1}}, 5);
  // Device 1 sends nothing; device 2 receives nothing.
  check_1d({{2, 1, 0}, {0, 0, 0}, {3, 2, 0}}, 5);
  // Every row of every device to device 3 (its block full: the worst case the bound allows).
  check_1d({{0, 0, 0, 4}, {0, 0, 0, 4}, {0, 0, 0, 4}, {0, 0, 0, 4}}, 4);
  // Nothing moves at all: every block zero.
  check_1d({{0, 0}, {0, 0}}, 3);
  // A bound below the worst case: the received blocks have that extent.
  check_1d({{1, 2, 0}, {0, 1, 2}, {2, 0, 1}}, 4, 3);
}

TEST_CASE("all_to_all_v over each dim of a 2-D mesh") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 3}});
  constexpr int64_t rows_per_block = 4;
  const Array rows = numbered_rows(6, rows_per_block);
  // Block b lies on the device (b / 3, b % 3).
  SUBCASE("over y: groups of three") {
    const Counts counts = {{1, 2, 0}, {0, 0, 0}, {3, 1, 0}, {2, 2, 0}, {1, 0, 3}, {0, 4, 0}};
    const Groups groups{2, 3, [](int64_t x, int64_t y) { return x * 3 + y; }};
    auto [want, want_counts] = expected_dispatch(rows, counts, groups, rows_per_block, rows_per_block * 3);
    auto [got, got_counts] = dispatch_over(mesh, "y", std::nullopt)(distribute_tensor(rows, mesh, {Shard{0}, Shard{0}}),
                                                                    distribute_tensor(flat_counts(counts), mesh, {Shard{0}, Shard{0}}));
    CHECK(same(got.full_tensor(), want));
    CHECK(same(got_counts.full_tensor(), want_counts));
    check_with_reference(got, got_counts);
  }
  SUBCASE("over x: groups of two") {
    const Counts counts = {{1, 3}, {0, 2}, {4, 0}, {2, 1}, {0, 0}, {1, 1}};
    const Groups groups{3, 2, [](int64_t y, int64_t x) { return x * 3 + y; }};
    auto [want, want_counts] = expected_dispatch(rows, counts, groups, rows_per_block, rows_per_block * 2);
    auto [got, got_counts] = dispatch_over(mesh, "x", std::nullopt)(distribute_tensor(rows, mesh, {Shard{0}, Shard{0}}),
                                                                    distribute_tensor(flat_counts(counts), mesh, {Shard{0}, Shard{0}}));
    CHECK(same(got.full_tensor(), want));
    CHECK(same(got_counts.full_tensor(), want_counts));
    check_with_reference(got, got_counts);
  }
}

TEST_CASE("all_to_all_v round trip: dispatch, then combine with the returned counts, gives the rows back") {
  Mesh mesh = create_mesh({{"x", 3}});
  constexpr int64_t rows_per_block = 5;
  const Counts counts = {{2, 0, 3}, {1, 1, 1}, {0, 4, 0}};  // device 1 keeps rows 3 and 4; device 2 row 4
  const Array rows = numbered_rows(3, rows_per_block);
  auto round_trip = local_map(
      [](const Tensor& r, const Tensor& c) {
        auto [dispatched, recv_counts] = all_to_all_v(r, c, "x");
        auto [combined, back_counts] = all_to_all_v(dispatched * 2.0, recv_counts, "x", 5);
        return std::make_tuple(combined, back_counts);
      },
      {{Shard{0}}, {Shard{0}}}, {{Shard{0}}, {Shard{0}}}, mesh);
  auto [back, back_counts] = round_trip(distribute_tensor(rows, mesh, {Shard{0}}), distribute_tensor(flat_counts(counts), mesh, {Shard{0}}));
  Array want = Array({3 * rows_per_block, kFeatures}, DType::f64);
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t sent = counts[size_t(b)][0] + counts[size_t(b)][1] + counts[size_t(b)][2];
    for (int64_t r = 0; r < sent; ++r)
      for (int64_t f = 0; f < kFeatures; ++f) {
        const int64_t i = (b * rows_per_block + r) * kFeatures + f;
        want.mutable_data<double>()[i] = 2 * rows.data<double>()[i];
      }
  }
  CHECK(same(back.full_tensor(), want));                   // rows past the sent total come back zero
  CHECK(same(back_counts.full_tensor(), flat_counts(counts)));  // what each device sent, returned
}

TEST_CASE("all_to_all_v gradients: each received row's gradient lands on the row it came from, eagerly and in jit") {
  Mesh mesh = create_mesh({{"x", 3}});
  constexpr int64_t rows_per_block = 4, bound = 12;
  const Counts counts = {{1, 0, 2}, {2, 2, 0}, {0, 1, 0}};  // rows past each device's sent total get no gradient
  const Array rows = numbered_rows(3, rows_per_block);
  std::vector<double> w(size_t(3 * bound * kFeatures));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + double(i);
  const Array weights = Array::from<double>(w, {3 * bound, kFeatures});
  // loss = sum(received * weights): the gradient of a sent row is the weight row where it landed.
  Array want({3 * rows_per_block, kFeatures}, DType::f64);
  for (int64_t src = 0; src < 3; ++src) {
    int64_t start = 0;
    for (int64_t dst = 0; dst < 3; ++dst) {
      int64_t at = 0;
      for (int64_t i = 0; i < src; ++i) at += counts[size_t(i)][size_t(dst)];
      for (int64_t r = 0; r < counts[size_t(src)][size_t(dst)]; ++r)
        for (int64_t f = 0; f < kFeatures; ++f)
          want.mutable_data<double>()[((src * rows_per_block) + start + r) * kFeatures + f] = w[size_t(((dst * bound) + at + r) * kFeatures + f)];
      start += counts[size_t(src)][size_t(dst)];
    }
  }
  auto dispatch = dispatch_over(mesh, "x", std::nullopt);
  Tensor x = distribute_tensor(rows, mesh, {Shard{0}}), c = distribute_tensor(flat_counts(counts), mesh, {Shard{0}});
  Tensor wt = distribute_tensor(weights, mesh, {Shard{0}});
  auto loss_of = [&](const Tensor& a, const Tensor& cc, const Tensor& ww) { return reduce_sum(std::get<0>(dispatch(a, cc)) * ww); };
  CHECK(same(gradients(loss_of(x, c, wt), {x})[0].full_tensor(), want));
  auto step = jit([&](const Tensor& a, const Tensor& cc, const Tensor& ww) { return gradients(loss_of(a, cc, ww), {a}); });
  CHECK(same(step(x, c, wt)[0].full_tensor(), want));
}

TEST_CASE("all_to_all_v of rows the same on every device: their gradient sums what each device's copy received") {
  Mesh mesh = create_mesh({{"x", 2}});
  // Device 0 sends row 0 to itself and row 1 to device 1; device 1 sends rows 0 and 1 to itself.
  Tensor x = distribute_tensor(Array::from<double>({10, 20, 30}, {3, 1}), mesh, {Replicate{}});
  Tensor c = distribute_tensor(Array::from<int64_t>({1, 1, 0, 2}, {4}), mesh, {Shard{0}});
  Tensor w = distribute_tensor(Array::from<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {12, 1}), mesh, {Shard{0}});
  auto dispatch = local_map([](const Tensor& r, const Tensor& k) { return std::get<0>(all_to_all_v(r, k, "x")); }, {{Shard{0}}},
                            {{Replicate{}}, {Shard{0}}}, mesh);
  // Device 0's copy: row 0 landed at weight 1, row 1 at weight 7; device 1's: rows 0 and 1 at 8 and 9.
  const Array want = Array::from<double>({1 + 8, 7 + 9, 0}, {3, 1});
  Tensor g = gradients(reduce_sum(dispatch(x, c) * w), {x})[0];
  CHECK(g.placements() == std::vector<Placement>{Replicate{}});
  CHECK(same(g.full_tensor(), want));
  auto step = jit([&](const Tensor& a, const Tensor& k, const Tensor& ww) { return gradients(reduce_sum(dispatch(a, k) * ww), {a}); });
  CHECK(same(step(x, c, w)[0].full_tensor(), want));
}

TEST_CASE("all_to_all_v is counted as one all_gather of the counts and one all_to_all_v of the rows; the plan costs it at its bound") {
  Mesh mesh = create_mesh({{"x", 2}});
  const Array rows = numbered_rows(2, 4);
  Tensor x = distribute_tensor(rows, mesh, {Shard{0}}), c = distribute_tensor(flat_counts({{1, 2}, {3, 0}}), mesh, {Shard{0}});
  auto dispatch = dispatch_over(mesh, "x", std::nullopt);
  {
    CommDebugMode comm;
    auto [got, got_counts] = dispatch(x, c);  // computed when the mode's counts are read
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 1}, {"all_to_all_v", 1}});
    // Bytes received from the other device: device 0 gets b's 3 rows, device 1 gets a's 2.
    CHECK(comm.bytes_by_kind().at("all_to_all_v") == (3 + 2) * kFeatures * 8);
  }
  auto step = jit([&](const Tensor& a, const Tensor& cc) {
    auto [got, got_counts] = dispatch(a, cc);
    return std::vector<Tensor>{got, got_counts};
  });
  const PlanReport plan = step.plan(x, c);
  // As an all_to_all of the bound (8 rows): half of it from the other device.
  CHECK(plan.collective_bytes >= 8 * kFeatures * 8 / 2);
  CHECK(explain(std::get<0>(dispatch(x, c))).find("all_to_all_v") != std::string::npos);
}

TEST_CASE("all_to_all_v compiles once: other counts run the same program") {
  Mesh mesh = create_mesh({{"x", 3}});
  constexpr int64_t rows_per_block = 4;
  const Array rows = numbered_rows(3, rows_per_block);
  auto dispatch = dispatch_over(mesh, "x", std::nullopt);
  auto step = jit([&](const Tensor& a, const Tensor& cc) {
    auto [got, got_counts] = dispatch(a, cc);
    return std::vector<Tensor>{got, got_counts};
  });
  Tensor x = distribute_tensor(rows, mesh, {Shard{0}});
  int64_t built = -1;
  for (const Counts& counts : {Counts{{1, 2, 1}, {0, 0, 4}, {2, 2, 0}}, Counts{{4, 0, 0}, {0, 1, 3}, {1, 1, 1}},
                               Counts{{0, 0, 0}, {0, 0, 0}, {0, 0, 4}}}) {
    auto [want, want_counts] = expected_dispatch(rows, counts, one_group(3), rows_per_block, rows_per_block * 3);
    std::vector<Tensor> got = step(x, distribute_tensor(flat_counts(counts), mesh, {Shard{0}}));
    CHECK(same(got[0].full_tensor(), want));
    CHECK(same(got[1].full_tensor(), want_counts));
    if (built >= 0) CHECK(driver_stats().executables_built == built);
    built = driver_stats().executables_built;
  }
  CHECK(step.traces() == 1);
}

TEST_CASE("all_to_all_v: bad counts stop the step with an IndexError on every device, and the next step runs") {
  Mesh mesh = create_mesh({{"x", 2}});
  constexpr int64_t rows_per_block = 4;
  const Array rows = numbered_rows(2, rows_per_block);
  Tensor x = distribute_tensor(rows, mesh, {Shard{0}});
  auto run = [&](const Counts& counts, std::optional<int64_t> bound) {
    auto step = jit([&, bound](const Tensor& a, const Tensor& cc) {
      auto [got, got_counts] = dispatch_over(mesh, "x", bound)(a, cc);
      return std::vector<Tensor>{got, got_counts};
    });
    return step(x, distribute_tensor(flat_counts(counts), mesh, {Shard{0}}))[0].full_tensor();
  };
  CHECK_THROWS_WITH_AS(run({{1, -1}, {0, 0}}, std::nullopt), doctest::Contains("all_to_all_v: send count -1 is outside"), IndexError);
  CHECK_THROWS_WITH_AS(run({{1, 1}, {5, 0}}, std::nullopt), doctest::Contains("all_to_all_v: send count 5 is outside the valid range [0, 5)"),
                       IndexError);
  CHECK_THROWS_WITH_AS(run({{1, 1}, {3, 2}}, std::nullopt), doctest::Contains("all_to_all_v: a device's total of send counts 5"), IndexError);
  CHECK_THROWS_WITH_AS(run({{0, 3}, {0, 2}}, 4), doctest::Contains("all_to_all_v: a device's total of received rows"), IndexError);
  // The same compiled program with good counts: the failure left nothing behind.
  auto [want, want_counts] = expected_dispatch(rows, {{0, 3}, {0, 1}}, one_group(2), rows_per_block, 4);
  CHECK(same(run({{0, 3}, {0, 1}}, 4), want));
}

TEST_CASE("all_to_all_v checks its operands while tracing") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = distribute_tensor(numbered_rows(2, 4), mesh, {Shard{0}});
  auto call = [&](Tensor counts, std::string dim, std::optional<int64_t> bound) {
    return local_map([&](const Tensor& r, const Tensor& c) { return std::get<0>(all_to_all_v(r, c, dim, bound)); }, {{Shard{0}}},
                     {{Shard{0}}, {Shard{0}}}, mesh)(x, counts);
  };
  Tensor good = distribute_tensor(flat_counts({{1, 1}, {1, 1}}), mesh, {Shard{0}});
  CHECK_THROWS_AS(call(distribute_tensor(Array({4}, DType::f64), mesh, {Shard{0}}), "x", std::nullopt), DTypeError);
  CHECK_THROWS_WITH_AS(call(distribute_tensor(Array({6}, DType::i64), mesh, {Shard{0}}), "x", std::nullopt),
                       doctest::Contains("send_counts must have shape [2]"), ShapeError);
  CHECK_THROWS_AS(call(good, "y", std::nullopt), MeshError);
  CHECK_THROWS_AS(call(good, "x", -1), ShapeError);
  CHECK_THROWS_AS(all_to_all_v(x, good, "x"), LayoutError);  // global values, outside local_map
}
