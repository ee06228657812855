// The transformer's ops (activations, normalisations, gather / embedding, masking, split,
// dropout, attention): their values against direct formulas, on one device and on meshes with
// uneven shards, the communication their sharded forms need, and typed errors. Their gradients
// are in test_autodiff's finite-difference suite.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "random_arrays.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// One device, 3 devices and 2x2: 5x7 tensors split unevenly on each.
std::vector<Mesh> meshes() { return {create_mesh({{"x", 1}}), create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}; }

std::vector<Placement> rows_and_columns(const Mesh& mesh) {
  if (mesh.ndim() == 1) return {Shard{0}};
  return {Shard{0}, Shard{1}};
}

double at(const Array& a, int64_t i) { return a.data<double>()[i]; }

}  // namespace

TEST_CASE("erf, gelu and silu match their formulas on every mesh") {
  std::mt19937 rng(1);
  const Array x = random_f64({5, 7}, rng, -4.0, 4.0);
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor t = distribute_tensor(x, mesh, rows_and_columns(mesh));
    const Array e = erf(t).full_tensor(), g = gelu(t).full_tensor(), gt = gelu(t, true).full_tensor(), s = silu(t).full_tensor();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = at(x, i);
      CHECK(at(e, i) == doctest::Approx(std::erf(v)).epsilon(0).scale(1.0).epsilon(2e-7));
      CHECK(std::fabs(at(g, i) - 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))) < 1e-6);
      CHECK(at(gt, i) == doctest::Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))).epsilon(1e-12));
      CHECK(at(s, i) == doctest::Approx(v / (1 + std::exp(-v))).epsilon(1e-12));
    }
  }
}

TEST_CASE("layer_norm and rms_norm over a sharded last axis: values, and one all_reduce per statistic") {
  std::mt19937 rng(2);
  const Array x = random_f64({5, 7}, rng, -2.0, 2.0), w = random_f64({7}, rng, -2.0, 2.0), b = random_f64({7}, rng, -2.0, 2.0);
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor t = distribute_tensor(x, mesh, rows_and_columns(mesh));
    std::vector<Placement> column(size_t(mesh.ndim()), Replicate{});
    column.back() = Shard{0};
    Tensor tw = distribute_tensor(w, mesh, column), tb = distribute_tensor(b, mesh, column);
    const Array ln = layer_norm(t, tw, tb, 1e-5).full_tensor(), rn = rms_norm(t, tw, 1e-6).full_tensor();
    for (int64_t r = 0; r < 5; ++r) {
      double mean = 0, var = 0, ms = 0;
      for (int64_t c = 0; c < 7; ++c) mean += at(x, r * 7 + c) / 7;
      for (int64_t c = 0; c < 7; ++c) {
        var += (at(x, r * 7 + c) - mean) * (at(x, r * 7 + c) - mean) / 7;
        ms += at(x, r * 7 + c) * at(x, r * 7 + c) / 7;
      }
      for (int64_t c = 0; c < 7; ++c) {
        const double v = at(x, r * 7 + c);
        CHECK(at(ln, r * 7 + c) == doctest::Approx((v - mean) / std::sqrt(var + 1e-5) * at(w, c) + at(b, c)).epsilon(1e-12));
        CHECK(at(rn, r * 7 + c) == doctest::Approx(v / std::sqrt(ms + 1e-6) * at(w, c)).epsilon(1e-12));
      }
    }
  }
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor t = distribute_tensor(x, mesh, {Shard{1}});
  CommDebugMode comm;
  (void)rms_norm(t).full_tensor();
  const auto counts = comm.get_comm_counts();
  CHECK(counts.count("all_reduce"));  // the row statistic, summed over the column shards
  CHECK(!counts.count("all_to_all"));
  CHECK_THROWS_WITH_AS(layer_norm(t, distribute_tensor(w, mesh, {Replicate{}}), distribute_tensor(random_f64({5}, rng, -2.0, 2.0), mesh, {Replicate{}})),
                       doctest::Contains("bias has shape (5,)"), ShapeError);
}

TEST_CASE("gather and embedding pick rows; a vocabulary-sharded table is used where it lies") {
  std::mt19937 rng(3);
  const Array table = random_f64({11, 6}, rng, -2.0, 2.0);
  const Array ids = Array::from<int32_t>({3, 0, 10, 7, 3, 12, -1, 5}, {2, 4});  // 12 and -1 are outside the table
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> vocab(size_t(mesh.ndim()), Replicate{});
    vocab[0] = Shard{0};
    Tensor t = distribute_tensor(table, mesh, vocab);
    Tensor i = distribute_tensor(ids, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    CommDebugMode comm;
    const Array e = embedding(i, t).full_tensor();
    if (mesh.size() > 1) CHECK(!comm.get_comm_counts().count("all_gather"));  // partial sums, never the whole table
    REQUIRE(e.shape() == std::vector<int64_t>{2, 4, 6});
    for (int64_t k = 0; k < 8; ++k) {
      const int32_t id = ids.data<int32_t>()[k];
      for (int64_t d = 0; d < 6; ++d) CHECK(at(e, k * 6 + d) == (id >= 0 && id < 11 ? at(table, id * 6 + d) : 0.0));
    }
    // Along a middle axis: x[2, 11, 3] at indices [4] -> [2, 4, 3].
    const Array x = random_f64({2, 11, 3}, rng, -2.0, 2.0);
    const Array g = gather(distribute_tensor(x, mesh, rows_and_columns(mesh)), distribute_tensor(Array::from<int64_t>({1, 9, 9, 0}, {4}), mesh,
                           std::vector<Placement>(size_t(mesh.ndim()), Replicate{})), 1).full_tensor();
    REQUIRE(g.shape() == std::vector<int64_t>{2, 4, 3});
    const int64_t picks[] = {1, 9, 9, 0};
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t k = 0; k < 4; ++k)
        for (int64_t c = 0; c < 3; ++c) CHECK(at(g, (a * 4 + k) * 3 + c) == at(x, (a * 11 + picks[k]) * 3 + c));
  }
  Tensor t = distribute_tensor(table, create_mesh({{"x", 1}}), {Replicate{}});
  CHECK_THROWS_AS(gather(t, t, 0), DTypeError);
  CHECK_THROWS_AS(gather(t, distribute_tensor(ids, create_mesh({{"x", 1}}), {Replicate{}}), 2), ShapeError);
  CHECK_THROWS_AS(embedding(distribute_tensor(ids, create_mesh({{"x", 1}}), {Replicate{}}), reshape(t, {66})), ShapeError);
}

TEST_CASE("masked_fill, split and chunk") {
  std::mt19937 rng(4);
  const Array x = random_f64({5, 7}, rng, -2.0, 2.0);
  for (const Mesh& mesh : meshes()) {
    Tensor t = distribute_tensor(x, mesh, rows_and_columns(mesh));
    const Array filled = masked_fill(t, t > 0.5, -9.0).full_tensor();
    for (int64_t i = 0; i < x.numel(); ++i) CHECK(at(filled, i) == (at(x, i) > 0.5 ? -9.0 : at(x, i)));
    std::vector<Tensor> parts = split(t, {2, 4, 1}, 1);
    REQUIRE(parts.size() == 3);
    CHECK(parts[1].shape() == std::vector<int64_t>{5, 4});
    CHECK(at(parts[1].full_tensor(), 0) == at(x, 2));
    std::vector<Tensor> chunks = chunk(t, 3, 0);  // torch.chunk: 2, 2, 1 rows
    REQUIRE(chunks.size() == 3);
    CHECK(chunks[2].shape() == std::vector<int64_t>{1, 7});
    CHECK(at(chunks[2].full_tensor(), 3) == at(x, 4 * 7 + 3));
    CHECK(chunk(t, 4, 0).size() == 3);  // ceil(5 / 4) = 2 rows each: only three pieces
  }
  Tensor t = distribute_tensor(x, create_mesh({{"x", 1}}), {Replicate{}});
  CHECK_THROWS_WITH_AS(split(t, {2, 2}, 0), doctest::Contains("add up to 4"), ShapeError);
  CHECK_THROWS_AS(chunk(t, 0, 0), ShapeError);
  CHECK_THROWS_AS(masked_fill(t, t, 1.0), DTypeError);
}

TEST_CASE("dropout drops the same elements on every mesh, at the given rate") {
  const Array x = Array::from<float>(std::vector<float>(4000, 1.0f), {40, 100});
  Array first;
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    Tensor t = distribute_tensor(x, mesh, mesh.ndim() == 1 ? std::vector<Placement>{Shard{1}} : std::vector<Placement>{Shard{1}, Shard{0}});
    const Array d = dropout(t, 0.25, 42).full_tensor();
    int64_t dropped = 0;
    for (int64_t i = 0; i < d.numel(); ++i) {
      const float v = d.data<float>()[i];
      CHECK((v == 0.0f || v == doctest::Approx(1.0f / 0.75f)));
      dropped += v == 0.0f;
    }
    CHECK(dropped > 850);  // 1000 expected
    CHECK(dropped < 1150);
    if (first.numel() == 0) first = d;
    else CHECK(std::memcmp(first.bytes(), d.bytes(), size_t(d.nbytes())) == 0);
  }
  Tensor t = distribute_tensor(x, create_mesh({{"x", 1}}), {Replicate{}});
  CHECK(std::memcmp(dropout(t, 0.25, 7).full_tensor().bytes(), first.bytes(), size_t(first.nbytes())) != 0);  // another seed
  CHECK_THROWS_AS(dropout(t, 1.0, 1), Error);
}

TEST_CASE("scaled_dot_product_attention matches the formula; heads sharded over a mesh dim need no communication") {
  std::mt19937 rng(5);
  const int64_t heads = 4, len = 5, dim = 3;
  const Array q = random_f64({heads, len, dim}, rng, -2.0, 2.0), k = random_f64({heads, len, dim}, rng, -2.0, 2.0), v = random_f64({heads, len, dim}, rng, -2.0, 2.0);
  for (bool causal : {false, true})
    for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}}), create_mesh({{"x", 4}})}) {
      CAPTURE(causal);
      CAPTURE(mesh.to_string());
      auto on = [&](const Array& a) { return distribute_tensor(a, mesh, {Shard{0}}); };
      CommDebugMode comm;
      const Array out = scaled_dot_product_attention(on(q), on(k), on(v), causal).full_tensor();
      CHECK(comm.get_total_counts() == (mesh.size() > 1 ? 1 : 0));  // only full_tensor's gather of the result
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < len; ++i) {
          std::vector<double> w(size_t(len), 0.0);
          double top = -1e300, total = 0;
          for (int64_t j = 0; j < len; ++j) {
            if (causal && j > i) continue;
            double s = 0;
            for (int64_t e = 0; e < dim; ++e) s += at(q, (h * len + i) * dim + e) * at(k, (h * len + j) * dim + e);
            w[size_t(j)] = s / std::sqrt(double(dim));
            top = std::max(top, w[size_t(j)]);
          }
          for (int64_t j = 0; j < len; ++j) {
            w[size_t(j)] = causal && j > i ? 0.0 : std::exp(w[size_t(j)] - top);
            total += w[size_t(j)];
          }
          for (int64_t e = 0; e < dim; ++e) {
            double want = 0;
            for (int64_t j = 0; j < len; ++j) want += w[size_t(j)] / total * at(v, (h * len + j) * dim + e);
            CHECK(at(out, (h * len + i) * dim + e) == doctest::Approx(want).epsilon(1e-12));
          }
        }
    }
  Tensor t = distribute_tensor(q, create_mesh({{"x", 1}}), {Replicate{}});
  CHECK_THROWS_AS(scaled_dot_product_attention(t, reshape(t, {heads * len, dim}), t), ShapeError);
}

TEST_CASE("cross_entropy over vocabulary-sharded logits never gathers them (loss parallel)") {
  std::mt19937 rng(6);
  const int64_t rows = 6, vocab = 13;
  const Array logits = random_f64({rows, vocab}, rng, -2.0, 2.0);
  const Array labels = Array::from<int32_t>({0, 12, 5, 5, 7, 1}, {rows});
  double want = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double top = -1e300, total = 0;
    for (int64_t c = 0; c < vocab; ++c) top = std::max(top, at(logits, r * vocab + c));
    for (int64_t c = 0; c < vocab; ++c) total += std::exp(at(logits, r * vocab + c) - top);
    want += (std::log(total) + top - at(logits, r * vocab + labels.data<int32_t>()[r])) / double(rows);
  }
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> by_vocab(size_t(mesh.ndim()), Replicate{});
    by_vocab.back() = Shard{1};
    Tensor l = distribute_tensor(logits, mesh, by_vocab);
    Tensor y = distribute_tensor(labels, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    CommDebugMode comm;
    Tensor loss = cross_entropy(l, y);
    CHECK(loss.full_tensor().data<double>()[0] == doctest::Approx(want).epsilon(1e-12));
    for (const CollectiveRecord& r : comm.records()) {
      CAPTURE(r.kind);
      CHECK(r.kind == "all_reduce");
      CHECK(r.bytes <= rows * 8 * mesh.size() * 2);  // per-row statistics, never the [6, 13] logits
    }
  }
}
