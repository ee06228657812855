// The ops real models need beyond the basics, each against values computed here independently
// (std::stable_sort, running sums, loops), on 1-D and 2-D meshes with uneven shards, the
// operated axis sharded or not, and gradients: sort / argsort / topk, cumsum, take_along_axis
// (torch.gather), scatter_add, index_select, embedding's padding_idx, integer random_uniform
// (torch.randint) and multinomial, both the same on every layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::vector<Mesh> meshes() { return {create_mesh({{"x", 1}}), create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}; }

// Axis `axis` split over the mesh's first dim (and axis 1 - axis over the second, if any).
std::vector<Placement> split(const Mesh& mesh, int64_t axis) {
  std::vector<Placement> p(size_t(mesh.ndim()), Replicate{});
  p[0] = Shard{axis};
  if (mesh.ndim() > 1) p[1] = Shard{1 - axis};
  return p;
}

// [rows, cols] with ties and (optionally) NaNs.
Array tied(int64_t rows, int64_t cols, bool nans) {
  Array a({rows, cols}, DType::f32);
  std::mt19937 rng(11);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(int(rng() % 7)) - 3.0f;
  if (nans) a.mutable_data<float>()[3] = a.mutable_data<float>()[cols + 1] = std::numeric_limits<float>::quiet_NaN();
  return a;
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace

TEST_CASE("sort, argsort and topk along either axis match a stable sort (NaN largest), sharded or not") {
  const Array a = tied(5, 7, true);
  for (const Mesh& mesh : meshes())
    for (int64_t axis : {0, 1})
      for (bool descending : {false, true}) {
        CAPTURE(mesh.to_string());
        CAPTURE(axis);
        CAPTURE(descending);
        Tensor x = distribute_tensor(a, mesh, split(mesh, axis));
        auto [values, indices] = sort(x, axis, descending);
        CHECK(indices.dtype() == DType::i64);
        const Array v = values.full_tensor(), i = indices.full_tensor();
        const int64_t n = a.shape()[size_t(axis)], lines = a.numel() / n;
        for (int64_t line = 0; line < lines; ++line) {
          auto at = [&](int64_t k) { return axis == 1 ? line * 7 + k : k * 7 + line; };
          std::vector<int64_t> order(static_cast<size_t>(n));
          std::iota(order.begin(), order.end(), 0);
          auto key = [&](int64_t k) { return a.data<float>()[at(k)]; };
          std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
            const float x = key(p), y = key(q);
            if (std::isnan(x) || std::isnan(y)) return descending ? std::isnan(x) && !std::isnan(y) : !std::isnan(x) && std::isnan(y);
            return descending ? x > y : x < y;
          });
          for (int64_t k = 0; k < n; ++k) {
            CHECK(i.data<int64_t>()[at(k)] == order[size_t(k)]);
            CHECK(same_float(v.data<float>()[at(k)], key(order[size_t(k)])));
          }
        }
        CHECK(same_array(argsort(x, axis, descending).full_tensor(), i));
      }
  Mesh mesh = create_mesh({{"x", 3}});
  Tensor x = distribute_tensor(tied(4, 6, false), mesh, {Shard{1}});
  auto [top, where_top] = topk(x, 2, 1);
  auto [all, where_all] = sort(x, 1, true);
  CHECK(same_array(top.full_tensor(), slice(all, {0, 0}, {4, 2}).full_tensor()));
  CHECK(same_array(where_top.full_tensor(), slice(where_all, {0, 0}, {4, 2}).full_tensor()));
  CHECK_THROWS_WITH_AS(topk(x, 7, 1), doctest::Contains("k = 7"), ShapeError);
  for (int64_t n : {6, 2000}) {  // k = 0: empty results, short and long rows
    auto [none, where_none] = topk(distribute_tensor(Array({2, n}, DType::f32), mesh, {Shard{1}}), 0, 1);
    CHECK(none.shape() == std::vector<int64_t>{2, 0});
    CHECK(where_none.dtype() == DType::i64);
    CHECK(where_none.full_tensor().numel() == 0);
  }
  // The gradient of the sorted values reaches each element once.
  Tensor g = gradients(reduce_sum(sort(x, 1).first * 2.0f), {x})[0];
  for (float e : g.full_tensor().to_vector<float>()) CHECK(e == 2.0f);
}

namespace {

// The first k positions of a stable descending sort of `row` (NaN largest, ties by position).
std::vector<int64_t> reference_top(const std::vector<double>& row, int64_t k) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
    const double x = row[size_t(p)], y = row[size_t(q)];
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;
  });
  order.resize(size_t(k));
  return order;
}

}  // namespace

TEST_CASE("topk of long rows (ranked in blocks, then the blocks' candidates) is a stable sort's top k on every mesh") {
  std::mt19937 rng(21);
  for (int64_t n : {1024, 1500, 1031}) {  // a power of 2, a divisor-rich length, a prime (padded)
    for (DType dtype : {DType::f32, DType::i64}) {
      Array a({3, n}, dtype);
      for (int64_t i = 0; i < a.numel(); ++i) {
        double v = double(int(rng() % 50)) - 25.0;  // many ties
        if (dtype == DType::f32 && i % 97 == 5) v = std::numeric_limits<double>::quiet_NaN();
        if (dtype == DType::f32 && i % 89 == 7) v = -std::numeric_limits<double>::infinity();
        if (dtype == DType::i64 && i % 89 == 7) v = double(std::numeric_limits<int64_t>::min());  // ties with the padding
        store_from_double(a.mutable_bytes(), dtype, i, v);
      }
      for (const Mesh& mesh : meshes())
        for (int64_t k : {3, 40}) {
          CAPTURE(n);
          CAPTURE(dtype_name(dtype));
          CAPTURE(mesh.to_string());
          CAPTURE(k);
          auto [values, indices] = topk(distribute_tensor(a, mesh, split(mesh, 1)), k, 1);
          const Array v = values.full_tensor(), i = indices.full_tensor();
          REQUIRE(i.shape() == std::vector<int64_t>{3, k});
          for (int64_t r = 0; r < 3; ++r) {
            std::vector<double> row(static_cast<size_t>(n));
            for (int64_t c = 0; c < n; ++c) row[size_t(c)] = a.element_as_double(r * n + c);
            const std::vector<int64_t> want = reference_top(row, k);
            for (int64_t p = 0; p < k; ++p) {
              CHECK(i.data<int64_t>()[r * k + p] == want[size_t(p)]);
              const double got = v.element_as_double(r * k + p), expected = row[size_t(want[size_t(p)])];
              CHECK(((std::isnan(got) && std::isnan(expected)) || got == expected));
            }
          }
        }
    }
  }
  // Along the first axis, and its gradient: 1 at each chosen element, 0 elsewhere.
  Array b({1500, 2}, DType::f32);
  for (int64_t i = 0; i < b.numel(); ++i) b.mutable_data<float>()[i] = float(int(rng() % 1000));
  Tensor x = distribute_tensor(b, create_mesh({{"x", 3}}), {Shard{0}});
  auto [top, where_top] = topk(x, 5, 0);
  const Array chosen = where_top.full_tensor();
  const Array g = gradients(reduce_sum(top), {x})[0].full_tensor();
  for (int64_t col = 0; col < 2; ++col) {
    std::vector<double> column(1500);
    for (int64_t r = 0; r < 1500; ++r) column[size_t(r)] = b.data<float>()[r * 2 + col];
    const std::vector<int64_t> want = reference_top(column, 5);
    for (int64_t p = 0; p < 5; ++p) CHECK(chosen.data<int64_t>()[p * 2 + col] == want[size_t(p)]);
    for (int64_t r = 0; r < 1500; ++r)
      CHECK(g.data<float>()[r * 2 + col] == (std::find(want.begin(), want.end(), r) != want.end() ? 1.0f : 0.0f));
  }
}

TEST_CASE("topk over a sharded row moves only the blocks' candidates, never the row") {
  Mesh mesh = create_mesh({{"x", 4}});
  Array a({4, 4096}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float((i * 7919) % 1000);
  Tensor x = distribute_tensor(a, mesh, {Shard{1}});
  CommDebugMode comm;
  Tensor indices = topk(x, 8, 1).second;
  indices.components();
  // Gathering the row whole would move 3/4 of it to each of 4 devices: 4 * 3 * 16384 bytes.
  const int64_t whole_row_gather = 4 * 3 * 4 * 4096 * 4 / 4;
  CAPTURE(comm.generate_comm_debug_tracing_table());
  CHECK(comm.get_comm_counts().count("all_to_all") == 0);
  CHECK(comm.total_bytes() * 4 < whole_row_gather);
  CHECK(indices.placements() == std::vector<Placement>{Replicate{}});
}

TEST_CASE("cumsum matches running sums (exact for integers) on sharded axes, and its gradient is the reversed running sum") {
  std::mt19937 rng(5);
  Array f({4, 9}, DType::f64), k({4, 9}, DType::i64);
  for (int64_t i = 0; i < f.numel(); ++i) {
    f.mutable_data<double>()[i] = double(int(rng() % 100)) / 8.0 - 6.0;
    k.mutable_data<int64_t>()[i] = int64_t(rng() % 1000) - 500;
  }
  for (const Mesh& mesh : meshes())
    for (int64_t axis : {0, 1}) {
      CAPTURE(mesh.to_string());
      CAPTURE(axis);
      const Array cf = cumsum(distribute_tensor(f, mesh, split(mesh, axis)), axis).full_tensor();
      const Array ck = cumsum(distribute_tensor(k, mesh, split(mesh, axis)), axis).full_tensor();
      for (int64_t r = 0; r < 4; ++r)
        for (int64_t c = 0; c < 9; ++c) {
          double sf = 0;
          int64_t sk = 0;
          for (int64_t t = 0; t <= (axis == 1 ? c : r); ++t) {
            const int64_t at = axis == 1 ? r * 9 + t : t * 9 + c;
            sf += f.data<double>()[at];
            sk += k.data<int64_t>()[at];
          }
          CHECK(cf.data<double>()[r * 9 + c] == doctest::Approx(sf).epsilon(1e-12));
          CHECK(ck.data<int64_t>()[r * 9 + c] == sk);
        }
      Tensor x = distribute_tensor(f, mesh, split(mesh, axis));
      Tensor w = distribute_tensor(f, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
      const Array g = gradients(reduce_sum(cumsum(x, axis) * w), {x})[0].full_tensor();
      for (int64_t r = 0; r < 4; ++r)
        for (int64_t c = 0; c < 9; ++c) {
          double want = 0;
          for (int64_t t = axis == 1 ? c : r; t < (axis == 1 ? 9 : 4); ++t) want += f.data<double>()[axis == 1 ? r * 9 + t : t * 9 + c];
          CHECK(g.data<double>()[r * 9 + c] == doctest::Approx(want).epsilon(1e-12));
        }
    }
}

TEST_CASE("take_along_axis, scatter_add and index_select match loops; indices out of range are IndexErrors") {
  std::mt19937 rng(7);
  Array x({5, 6}, DType::f64), src({5, 4}, DType::f64), ids({5, 4}, DType::i64);
  for (int64_t i = 0; i < x.numel(); ++i) x.mutable_data<double>()[i] = double(i) * 0.5 - 3;
  for (int64_t i = 0; i < src.numel(); ++i) {
    src.mutable_data<double>()[i] = double(int(rng() % 50)) / 4.0;
    ids.mutable_data<int64_t>()[i] = int64_t(rng() % 6);  // repeats within rows
  }
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor tx = distribute_tensor(x, mesh, split(mesh, 1)), ti = distribute_tensor(ids, mesh, split(mesh, 0));
    Tensor ts = distribute_tensor(src, mesh, split(mesh, 0));
    const Array taken = take_along_axis(tx, ti, 1).full_tensor();
    const Array added = scatter_add(tx, 1, ti, ts).full_tensor();
    Array want_added = x.clone();
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t j = 0; j < 4; ++j) {
        const int64_t e = ids.data<int64_t>()[r * 4 + j];
        CHECK(taken.data<double>()[r * 4 + j] == x.data<double>()[r * 6 + e]);
        want_added.mutable_data<double>()[r * 6 + e] += src.data<double>()[r * 4 + j];
      }
    CHECK(compare_with_reference(added, ref_from_array(want_added), 1e-12) == "");
    // Gradients: take_along_axis scatters g back; scatter_add passes g to x and picks it for src.
    Tensor gx = gradients(reduce_sum(take_along_axis(tx, ti, 1) * 3.0), {tx})[0];
    Array want_gx({5, 6}, DType::f64);
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t j = 0; j < 4; ++j) want_gx.mutable_data<double>()[r * 6 + ids.data<int64_t>()[r * 4 + j]] += 3.0;
    CHECK(compare_with_reference(gx.full_tensor(), ref_from_array(want_gx), 1e-12) == "");
    Tensor weights = distribute_tensor(x, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    std::vector<Tensor> gs = gradients(reduce_sum(scatter_add(tx, 1, ti, ts) * weights), {tx, ts});
    CHECK(compare_with_reference(gs[0].full_tensor(), ref_from_array(x), 1e-12) == "");
    CHECK(compare_with_reference(gs[1].full_tensor(), ref_from_array(taken), 1e-12) == "");
    // index_select: whole rows.
    Tensor pick = distribute_tensor(Array::from<int64_t>({4, 0, 4}, {3}), mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    const Array rows = index_select(tx, 0, pick).full_tensor();
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t c = 0; c < 6; ++c) CHECK(rows.data<double>()[k * 6 + c] == x.data<double>()[pick.full_tensor().data<int64_t>()[k] * 6 + c]);
    Array bad = ids.clone();
    bad.mutable_data<int64_t>()[5] = 6;
    Tensor tb = distribute_tensor(bad, mesh, split(mesh, 0));
    CHECK_THROWS_WITH_AS(take_along_axis(tx, tb, 1).full_tensor(), doctest::Contains("take_along_axis: index 6 is outside the valid range [0, 6)"), IndexError);
    CHECK_THROWS_WITH_AS(scatter_add(tx, 1, tb, ts).full_tensor(), doctest::Contains("scatter_add: index 6"), IndexError);
  }
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor tx = distribute_tensor(x, mesh, {Shard{0}});
  CHECK_THROWS_WITH_AS(take_along_axis(tx, distribute_tensor(Array({4, 4}, DType::i64), mesh, {Replicate{}}), 1),
                       doctest::Contains("differ on axis 0"), ShapeError);
  CHECK_THROWS_AS(index_select(tx, 0, distribute_tensor(Array({2, 2}, DType::i64), mesh, {Replicate{}})), ShapeError);
}

TEST_CASE("embedding with padding_idx: the same rows forward, no gradient into the padding row") {
  const Array table = Array::from<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor t = distribute_tensor(table, mesh, split(mesh, 0));
    Tensor ids = distribute_tensor(Array::from<int32_t>({1, 0, 1, 3}, {4}), mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    CHECK(same_array(embedding(ids, t, 1).full_tensor(), embedding(ids, t).full_tensor()));
    const std::vector<float> g = gradients(reduce_sum(embedding(ids, t, 1)), {t})[0].full_tensor().to_vector<float>();
    CHECK(g == std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1});
    CHECK(gradients(reduce_sum(embedding(ids, t, -3)), {t})[0].full_tensor().to_vector<float>() == g);
    CHECK_THROWS_AS(embedding(ids, t, 4), ShapeError);
  }
}

TEST_CASE("integer random_uniform (randint) and multinomial are the same on every layout and follow their distributions") {
  std::vector<Array> ints, draws;
  Array probs = Array::from<float>({0.1f, 0, 0.6f, 0.3f, 2, 2, 0, 4}, {2, 4});  // rows need not be normalised
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    for (DType dtype : {DType::i32, DType::i64}) {
      Tensor r = random_uniform({600, 2}, 9, Layout::from_placements(mesh, split(mesh, 0), 2), -3, 4, dtype);
      CHECK(r.dtype() == dtype);
      ints.push_back(cast(r, DType::i64).full_tensor());
    }
    Tensor p = distribute_tensor(probs, mesh, split(mesh, 1));
    draws.push_back(multinomial(p, 4000, 21).full_tensor());
  }
  for (const Array& a : ints) CHECK(same_array(a, ints.front()));
  for (const Array& a : draws) CHECK(same_array(a, draws.front()));
  std::vector<int64_t> seen(7, 0);
  for (int64_t v : ints.front().to_vector<int64_t>()) {
    REQUIRE(v >= -3);
    REQUIRE(v < 4);
    ++seen[size_t(v + 3)];
  }
  for (int64_t count : seen) CHECK(count > 100);  // 1200 draws over 7 values: about 171 each
  const std::vector<int64_t> d = draws.front().to_vector<int64_t>();
  for (int64_t row = 0; row < 2; ++row) {
    std::vector<double> freq(4, 0.0);
    for (int64_t k = 0; k < 4000; ++k) freq[size_t(d[size_t(row * 4000 + k)])] += 1.0 / 4000;
    double total = 0;
    for (int64_t c = 0; c < 4; ++c) total += probs.data<float>()[row * 4 + c];
    for (int64_t c = 0; c < 4; ++c) {
      const double want = probs.data<float>()[row * 4 + c] / total;
      CHECK(std::abs(freq[size_t(c)] - want) < 0.03);
      if (want == 0) CHECK(freq[size_t(c)] == 0);
    }
  }
  Mesh mesh = create_mesh({{"x", 1}});
  CHECK_THROWS_AS(random_uniform({3}, 1, Layout::replicated(mesh, 1), 2, 2, DType::i32), ShapeError);
}
