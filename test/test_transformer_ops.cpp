// The transformer's ops (activations, normalisations, gather / embedding, masking, split,
// dropout, attention): their values against direct formulas, on one device and on meshes with
// uneven shards, the communication their sharded forms need, and typed errors. Their gradients
// are in test_autodiff's finite-difference suite; flash attention's also against the math
// backend's here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include <tessera/tessera.hpp>

#include "jit/backend_registry.hpp"
#include "jit/library_fallback.hpp"
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
  CHECK_THROWS_WITH_AS(layer_norm(t, std::vector<int64_t>{5, 6}), doctest::Contains("not the trailing extents"), ShapeError);
}

TEST_CASE("f32 layer_norm over a sharded last axis: both statistics in one all_reduce, exact far from zero too") {
  // Rows with mean 100 and spread 0.01 (|mean| / std = 1e4): a one-pass E[x^2] - E[x]^2 in f32
  // would lose every digit of the variance; the f64 accumulation keeps it.
  std::mt19937 rng(4);
  Array x({6, 11}, DType::f32);
  std::normal_distribution<double> spread(0.0, 0.01);
  for (int64_t i = 0; i < x.numel(); ++i) store_from_double(x.mutable_bytes(), DType::f32, i, (i % 11 == 0 ? -3.0 : 100.0) + spread(rng));
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 4}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> columns(size_t(mesh.ndim()), Replicate{});
    columns.back() = Shard{1};  // 11 over 4 or 2: uneven
    Tensor t = distribute_tensor(x, mesh, columns);
    CommDebugMode comm;
    const Array got = layer_norm(t, std::vector<int64_t>{11}, std::nullopt, std::nullopt, 1e-12).full_tensor();
    std::map<std::string, int64_t> want;
    if (mesh.size() > 1) want = {{"all_reduce", 1}, {"all_gather", 1}};  // the statistics; full_tensor's gather
    CAPTURE(comm.generate_comm_debug_tracing_table());
    CHECK(comm.get_comm_counts() == want);
    for (int64_t r = 0; r < 6; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < 11; ++c) mean += x.element_as_double(r * 11 + c) / 11;
      for (int64_t c = 0; c < 11; ++c) var += std::pow(x.element_as_double(r * 11 + c) - mean, 2) / 11;
      for (int64_t c = 0; c < 11; ++c) {
        CAPTURE(r * 11 + c);
        CHECK(std::fabs(got.element_as_double(r * 11 + c) - (x.element_as_double(r * 11 + c) - mean) / std::sqrt(var)) < 2e-5);
      }
    }
  }
}

TEST_CASE("layer_norm over several trailing axes (PyTorch's normalized_shape), the axes sharded or not") {
  std::mt19937 rng(9);
  const Array x = random_f64({3, 4, 5}, rng, -2.0, 2.0), w = random_f64({4, 5}, rng, 0.5, 1.5), b = random_f64({4, 5}, rng, -1.0, 1.0);
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> p(size_t(mesh.ndim()), Replicate{}), q(size_t(mesh.ndim()), Replicate{});
    p[0] = Shard{1};  // a normalised axis split (uneven over 3)
    q[0] = Shard{0};
    if (mesh.ndim() > 1) p[1] = Shard{2};
    Tensor t = distribute_tensor(x, mesh, p), tw = distribute_tensor(w, mesh, q), tb = distribute_tensor(b, mesh, q);
    const Array got = layer_norm(t, tw, tb, 1e-5).full_tensor();
    const Array plain = layer_norm(t, std::vector<int64_t>{4, 5}).full_tensor();
    for (int64_t r = 0; r < 3; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < 20; ++c) mean += at(x, r * 20 + c) / 20;
      for (int64_t c = 0; c < 20; ++c) var += (at(x, r * 20 + c) - mean) * (at(x, r * 20 + c) - mean) / 20;
      for (int64_t c = 0; c < 20; ++c) {
        const double n = (at(x, r * 20 + c) - mean) / std::sqrt(var + 1e-5);
        CHECK(at(got, r * 20 + c) == doctest::Approx(n * at(w, c) + at(b, c)).epsilon(1e-12));
        CHECK(at(plain, r * 20 + c) == doctest::Approx(n).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("gather and embedding pick rows; a vocabulary-sharded table is used where it lies") {
  std::mt19937 rng(3);
  const Array table = random_f64({11, 6}, rng, -2.0, 2.0);
  const Array ids = Array::from<int32_t>({3, 0, 10, 7, 3, 1, 9, 5}, {2, 4});
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
      for (int64_t d = 0; d < 6; ++d) CHECK(at(e, k * 6 + d) == at(table, id * 6 + d));
    }
    // An id outside the table stops the step (dsl/index_check.hpp), sharded table or not.
    Tensor outside = distribute_tensor(Array::from<int32_t>({3, 11}, {2}), mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    CHECK_THROWS_WITH_AS(embedding(outside, t).full_tensor(), doctest::Contains("id 11 is outside the valid range [0, 11)"), IndexError);
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

TEST_CASE("embedding of ids sharded along any axis stays so without moving; the table's gradient sums each device's rows once") {
  // The ids keep their shape (no [B*T] flattening), so a sequence-sharded or unevenly
  // batch-sharded embedding reads its own ids' rows where they lie.
  std::mt19937 rng(7);
  const Array table = random_f64({9, 4}, rng, -2.0, 2.0);
  const Array ids = Array::from<int64_t>({3, 0, 8, 3, 1, 2, 7, 7, 0, 5, 4, 6, 1, 1, 2}, {3, 5});
  struct Case {
    Mesh mesh;
    std::vector<Placement> ids;
    int64_t gradient_all_reduces;
  };
  for (const Case& c : {Case{create_mesh({{"x", 3}}), {Shard{1}}, 1},  // 5 positions over 3: 2, 2, 1
                        Case{create_mesh({{"x", 4}}), {Shard{0}}, 1},  // 3 sequences over 4: one empty block
                        Case{create_mesh({{"dp", 2}, {"sp", 2}}), {Shard{0}, Shard{1}}, 2}}) {
    CAPTURE(c.mesh.to_string());
    Tensor t = distribute_tensor(table, c.mesh, std::vector<Placement>(size_t(c.mesh.ndim()), Replicate{}));
    Tensor i = distribute_tensor(ids, c.mesh, c.ids);
    Tensor e = embedding(i, t);
    CHECK(e.placements() == c.ids);
    {
      CommDebugMode comm;
      (void)unpack(e);
      CHECK(comm.get_total_counts() == 0);
    }
    CHECK(compare_with_reference(e.full_tensor(), reference_eval(e), 0) == "");
    Tensor grad = gradients(reduce_sum(e * e), {t})[0];
    CommDebugMode comm;
    (void)unpack(grad);
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", c.gradient_all_reduces}});
    CHECK(compare_with_reference(grad.full_tensor(), reference_eval(grad), 1e-12) == "");
  }
}

TEST_CASE("embedding is an indexed load and its gradient a scatter-add of the rows, on every mesh") {
  std::mt19937 rng(4);
  const Array table = random_f64({11, 6}, rng, -2.0, 2.0);
  const Array ids = Array::from<int64_t>({3, 0, 10, 3, 3, 1, 0, 5}, {2, 4});  // 3 and 0 repeat
  const Array w = random_f64({2, 4, 6}, rng, -2.0, 2.0);
  std::vector<double> want(66, 0.0);  // d/d table of sum(embedding * w): w's rows added at their ids
  for (int64_t k = 0; k < 8; ++k) {
    const int64_t id = ids.data<int64_t>()[k];
    for (int64_t d = 0; d < 6; ++d) want[size_t(id * 6 + d)] += at(w, k * 6 + d);
  }
  // The table by vocabulary (11 rows over 3: uneven) and by columns; the ids by sequence.
  struct Case {
    Mesh mesh;
    std::vector<Placement> table, ids;
  };
  for (const Case& c : {Case{create_mesh({{"x", 1}}), {Replicate{}}, {Replicate{}}},
                        Case{create_mesh({{"x", 3}}), {Shard{0}}, {Replicate{}}},
                        Case{create_mesh({{"x", 2}}), {Replicate{}}, {Shard{0}}},
                        Case{create_mesh({{"x", 2}, {"y", 2}}), {Shard{0}, Shard{1}}, {Replicate{}, Shard{1}}}}) {
    CAPTURE(c.mesh.to_string());
    Tensor t = distribute_tensor(table, c.mesh, c.table), i = distribute_tensor(ids, c.mesh, c.ids);
    Tensor tw = distribute_tensor(w, c.mesh, std::vector<Placement>(size_t(c.mesh.ndim()), Replicate{}));
    Tensor e = embedding(i, t);
    Tensor grad = gradients(reduce_sum(e * tw), {t})[0];
    // No one-hot product either way, on CPU and GPU meshes alike (the gradient of this linear
    // loss needs no forward value).
    CHECK(explain(e).find("take_rows") != std::string::npos);
    CHECK(explain(grad).find("scatter_add_rows") != std::string::npos);
    CHECK(explain(e).find("gemm") == std::string::npos);
    CHECK(explain(grad).find("gemm") == std::string::npos);
    const Array g = grad.full_tensor();
    CHECK(compare_with_reference(g, reference_eval(grad), 1e-12) == "");
    for (int64_t k = 0; k < 66; ++k) CHECK(at(g, k) == doctest::Approx(want[size_t(k)]).epsilon(1e-12));
    CHECK(compare_with_reference(e.full_tensor(), reference_eval(e), 0) == "");
  }
}

TEST_CASE("scaled_dot_product_attention matches the formula; heads sharded over a mesh dim need no communication") {
  std::mt19937 rng(5);
  const int64_t heads = 4, len = 5, dim = 3;
  const Array q = random_f64({heads, len, dim}, rng, -2.0, 2.0), k = random_f64({heads, len, dim}, rng, -2.0, 2.0), v = random_f64({heads, len, dim}, rng, -2.0, 2.0);
  // Both backends: CPU and GPU meshes have the fused kernel.
  const std::vector<SdpBackend> backends = {SdpBackend::Math, SdpBackend::Flash};
  for (SdpBackend backend : backends)
    for (bool causal : {false, true})
      for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}}), create_mesh({{"x", 4}}), create_mesh({{"x", 3}})}) {
        CAPTURE(backend == SdpBackend::Flash);
        CAPTURE(causal);
        CAPTURE(mesh.to_string());
        SdpaKernel only({backend});
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

namespace {

bool bitwise_equal(const Array& a, const Array& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.bytes(), b.bytes(), size_t(a.numel() * dtype_size(a.dtype()))) == 0;
}

struct AttentionLayout {
  Mesh mesh;
  std::vector<Placement> placements;  // of q, k and v: [batch, heads, sequence, features]
};

// Batch, heads (3 over 2: uneven), the sequence (context parallelism, uneven over 3 and 2) and
// the features (gathered: the kernel needs whole rows), on 1-D and 2-D meshes.
std::vector<AttentionLayout> attention_layouts() {
  return {{create_mesh({{"x", 1}}), {Replicate{}}},
          {create_mesh({{"x", 3}}), {Shard{2}}},
          {create_mesh({{"x", 2}, {"y", 2}}), {Shard{0}, Shard{2}}},
          {create_mesh({{"x", 2}, {"y", 2}}), {Shard{1}, Shard{3}}}};
}

}  // namespace

TEST_CASE("flash attention matches the reference and the math backend: values and gradients, on every mesh") {
  // The fused kernel runs on CPU meshes and, under TESSERA_DEVICE_TYPE=GPU (this suite's GPU
  // variant), on GPU meshes (backend/cuda/flash_attention.cu).
  std::mt19937 rng(9);
  struct Case {
    int64_t lq, lk, e, ev;
    bool causal;
  };
  // Self-attention over more than one key tile (64) and query block (32), and cross-attention
  // (lq != lk) with either mask; odd feature sizes take the kernel's padded paths.
  for (const Case c : {Case{70, 70, 8, 8, true}, Case{37, 37, 16, 16, false}, Case{21, 45, 5, 7, false}, Case{45, 21, 5, 7, true}}) {
    const Array q = random_f32({2, 3, c.lq, c.e}, rng), k = random_f32({2, 3, c.lk, c.e}, rng), v = random_f32({2, 3, c.lk, c.ev}, rng);
    const Array w = random_f32({2, 3, c.lq, c.ev}, rng);
    for (const AttentionLayout& at : attention_layouts()) {
      CAPTURE(c.lq);
      CAPTURE(c.lk);
      CAPTURE(c.causal);
      CAPTURE(at.mesh.to_string());
      auto on = [&](const Array& a) { return distribute_tensor(a, at.mesh, at.placements); };
      const Tensor tq = on(q), tk = on(k), tv = on(v), tw = on(w);
      auto run = [&](SdpBackend backend) {
        SdpaKernel only({backend});
        Tensor out = scaled_dot_product_attention(tq, tk, tv, c.causal, 0.4);
        std::vector<Tensor> grads = gradients(reduce_sum(out * tw), {tq, tk, tv});
        grads.insert(grads.begin(), out);
        return grads;
      };
      const std::vector<Tensor> flash = run(SdpBackend::Flash), math = run(SdpBackend::Math);
      CHECK(explain(flash[0]).find("attention  forward") != std::string::npos);
      CHECK(explain(math[0]).find("attention ") == std::string::npos);
      for (size_t i = 0; i < flash.size(); ++i) {
        CAPTURE(i);  // out, dq, dk, dv
        const Array got = flash[i].full_tensor();
        CHECK(compare_with_reference(got, reference_eval(flash[i]), 2e-5) == "");
        CHECK(max_difference(got, math[i].full_tensor()) < 2e-5);
      }
    }
  }
}

TEST_CASE("a backend without fused attention computes it from its parts: same values, gradients, placements, communication") {
  if (default_device_type() == "GPU") return;  // the target below is the CPU's
  std::mt19937 rng(13);
  // The CPU backend's target without its attention kernels: what a backend that has only GEMMs
  // gets from the driver.
  Target gemms_only = target_for(DeviceKind::CPU, false);
  gemms_only.library = LibraryOpSet();
  gemms_only.library.insert(LibraryOp::Gemm);
  gemms_only.library.insert(LibraryOp::OrderedGemm);
  for (const bool causal : {true, false}) {
    const Array q = random_f32({2, 3, 40, 8}, rng), k = random_f32({2, 3, 40, 8}, rng), v = random_f32({2, 3, 40, 6}, rng);
    const Array w = random_f32({2, 3, 40, 6}, rng);
    for (const AttentionLayout& at : attention_layouts()) {
      CAPTURE(causal);
      CAPTURE(at.mesh.to_string());
      auto on = [&](const Array& a) { return distribute_tensor(a, at.mesh, at.placements); };
      const Tensor tq = on(q), tk = on(k), tv = on(v);
      SdpaKernel flash({SdpBackend::Flash});
      Tensor out = scaled_dot_product_attention(tq, tk, tv, causal, 0.3);
      std::vector<Tensor> fused = gradients(reduce_sum(out * on(w)), {tq, tk, tv});
      fused.insert(fused.begin(), out);
      std::vector<NodeRef> nodes;
      for (const Tensor& t : fused) nodes.push_back(t.node());
      const FallbackGraph parts = with_library_fallbacks(nodes, gemms_only);
      CHECK(with_library_fallbacks(nodes, target_for(DeviceKind::CPU, false)).outputs == nodes);  // nothing to replace
      CHECK(!parts.stands_for.empty());
      for (size_t i = 0; i < fused.size(); ++i) {
        CAPTURE(i);  // out, dq, dk, dv
        const Tensor from_parts(parts.outputs[i]);
        CHECK(explain(from_parts).find("attention ") == std::string::npos);
        CHECK(from_parts.placements() == fused[i].placements());
        const Array got = from_parts.full_tensor();
        CHECK(compare_with_reference(got, reference_eval(fused[i]), 2e-5) == "");
        CHECK(max_difference(got, fused[i].full_tensor()) < 2e-5);
      }
    }
    // Heads sharded: the parts, like the fused kernel, need no communication.
    const Mesh two = create_mesh({{"x", 2}});
    auto heads = [&](const Array& a) { return distribute_tensor(a, two, {Shard{1}}); };
    SdpaKernel flash({SdpBackend::Flash});
    const NodeRef forward = scaled_dot_product_attention(heads(q), heads(k), heads(v), causal, 0.3).node();
    const Tensor from_parts(with_library_fallbacks({forward}, gemms_only).outputs[0]);
    {
      CommDebugMode comm;
      (void)from_parts.to_local();
      (void)Tensor(forward).to_local();
      CHECK(comm.get_total_counts() == 0);
    }
    CHECK(from_parts.placements() == std::vector<Placement>{Shard{1}});
    CHECK(max_difference(from_parts.full_tensor(), Tensor(forward).full_tensor()) < 2e-5);
  }
}

TEST_CASE("flash attention: a query's output and dq are bitwise the same on every mesh; only k and v are gathered") {
  std::mt19937 rng(10);
  const Array q = random_f32({2, 3, 70, 16}, rng), k = random_f32({2, 3, 70, 16}, rng), v = random_f32({2, 3, 70, 16}, rng);
  const Array w = random_f32({2, 3, 70, 16}, rng);
  std::optional<Array> first_out, first_dq;
  for (const AttentionLayout& at : attention_layouts()) {
    CAPTURE(at.mesh.to_string());
    auto on = [&](const Array& a) { return distribute_tensor(a, at.mesh, at.placements); };
    const Tensor tq = on(q), tk = on(k), tv = on(v);
    SdpaKernel flash({SdpBackend::Flash});  // at any length
    CommDebugMode comm;
    Tensor out = scaled_dot_product_attention(tq, tk, tv, true);
    (void)out.to_local();
    std::vector<std::string> kinds;
    for (const CollectiveRecord& r : comm.records()) kinds.push_back(r.kind);
    // Sharded sequences: k and v gathered, the output left sharded like q (features: gathered
    // for the kernel and split again locally).
    const bool sequence_sharded = std::find(at.placements.begin(), at.placements.end(), Placement(Shard{2})) != at.placements.end();
    const bool features_sharded = std::find(at.placements.begin(), at.placements.end(), Placement(Shard{3})) != at.placements.end();
    CHECK(kinds.size() == (sequence_sharded ? 2u : features_sharded ? 3u : 0u));
    const Array got = out.full_tensor();
    const Array dq = gradients(reduce_sum(out * on(w)), {tq})[0].full_tensor();
    if (!first_out) {
      first_out = got;
      first_dq = dq;
    }
    CHECK(bitwise_equal(got, *first_out));
    CHECK(bitwise_equal(dq, *first_dq));
  }
}

TEST_CASE("a flash attention training step never stores the [T, T] scores; the math backend's does") {
  std::mt19937 rng(12);
  const int64_t len = 300;  // a length no other axis has: "300, 300)" can only be scores
  const Mesh mesh = create_mesh({{"x", 2}});
  auto on = [&](const Array& a) { return distribute_tensor(a, mesh, {Shard{0}}); };  // heads
  const Tensor q = on(random_f32({2, len, 8}, rng)), k = on(random_f32({2, len, 8}, rng)), v = on(random_f32({2, len, 8}, rng));
  for (SdpBackend backend : {SdpBackend::Flash, SdpBackend::Math}) {
    CAPTURE(backend == SdpBackend::Flash);
    SdpaKernel only({backend});
    auto step = jit([](const Tensor& a, const Tensor& b, const Tensor& c) {
      Tensor loss = reduce_sum(square(scaled_dot_product_attention(a, b, c, true)));
      std::vector<Tensor> grads = gradients(loss, {a, b, c});
      grads.push_back(loss);
      return grads;
    });
    // Every kernel, GEMM and collective of the step with the shape it writes.
    const std::string plan = explain(*step.executable(q, k, v));
    CAPTURE(plan);
    CHECK((plan.find(", 300, 300)") == std::string::npos) == (backend == SdpBackend::Flash));
  }
}

TEST_CASE("SdpaKernel picks the backend; Flash alone says why it cannot run a call") {
  std::mt19937 rng(11);
  const Mesh mesh = create_mesh({{"x", 1}});
  const Tensor q = distribute_tensor(random_f32({2, 3, 4}, rng), mesh, {Replicate{}});
  const Tensor k_one = distribute_tensor(random_f32({1, 3, 4}, rng), mesh, {Replicate{}});
  {
    SdpaKernel flash_only({SdpBackend::Flash});
    CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k_one, k_one), doctest::Contains("leading axes"), Error);
    const Tensor q64 = distribute_tensor(random_f64({2, 3, 4}, rng), mesh, {Replicate{}});
    CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q64, q, q), doctest::Contains("dtype"), Error);
  }
  // Without the scope the same call broadcasts k and v through the math backend.
  CHECK(scaled_dot_product_attention(q, k_one, k_one).shape() == std::vector<int64_t>{2, 3, 4});
  CHECK_THROWS_AS(SdpaKernel({}), Error);
  // By default the fused kernel takes sequences of 256 keys or more (on CPU and GPU meshes).
  for (int64_t keys : {255, 256}) {
    const Tensor long_q = distribute_tensor(random_f32({1, keys, 8}, rng), mesh, {Replicate{}});
    const bool fused = explain(scaled_dot_product_attention(long_q, long_q, long_q, true)).find("attention  forward") != std::string::npos;
    CHECK(fused == (keys >= 256));
  }
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

TEST_CASE("16-bit attention: the flash kernel reads the 16-bit operands, its f32 results rounded once, on CPU and GPU meshes") {
  std::mt19937 rng(29);
  // CPU devices named: the suite runs again with TESSERA_DEVICE_TYPE=GPU, where a default mesh is a GPU's.
  const Mesh cpu = create_mesh({{"x", 2}}, cpu_devices(2));
  const Layout heads = Layout({"x", UNSHARDED, UNSHARDED, UNSHARDED}, cpu);
  auto bf16 = [&](std::vector<int64_t> shape) { return cast(copy_to_mesh(random_f32(std::move(shape), rng), heads), DType::bf16); };
  // 300 keys: the flash kernel's range (256 and up).
  const Tensor q = bf16({2, 2, 300, 8}), k = bf16({2, 2, 300, 8}), v = bf16({2, 2, 300, 8});
  const Tensor out = scaled_dot_product_attention(q, k, v, true);
  CHECK(out.dtype() == DType::bf16);
  CHECK(explain(out).find("attention  forward") != std::string::npos);
  const Tensor widened = cast(scaled_dot_product_attention(cast(q, DType::f32), cast(k, DType::f32), cast(v, DType::f32), true),
                              DType::bf16);
  CHECK(max_difference(out.full_tensor(), widened.full_tensor()) == 0);
  CHECK(compare_with_reference(out.full_tensor(), reference_eval(out)) == "");
  // The primitive reads q, k and v as they are (no f32 copies of them) and gives f32: the output
  // and logsumexp, and the gradients, each rounded once to its operand's dtype. Widening is exact,
  // so the values are the widened operands' to the bit.
  const Node& forward = *out.node()->inputs.at(0)->inputs.at(0);
  REQUIRE(forward.op == OpKind::Attention);
  CHECK(forward.dtype == DType::f32);
  for (const NodeRef& operand : forward.inputs) CHECK(operand->dtype == DType::bf16);
  const Tensor w = copy_to_mesh(random_f32({2, 2, 300, 8}, rng), heads);
  const std::vector<Tensor> grads = gradients(reduce_sum(cast(out, DType::f32) * w), {q, k, v});
  const std::vector<Tensor> wide_grads = gradients(reduce_sum(cast(widened, DType::f32) * w), {q, k, v});
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient ", i, " (dq, dk, dv)");
    CHECK(grads[i].dtype() == DType::bf16);
    CHECK(max_difference(grads[i].full_tensor(), wide_grads[i].full_tensor()) == 0);
    CHECK(grads[i].node()->op == OpKind::Cast);  // f32 from the parts, rounded once
  }
  // An abstract H100 mesh plans the same graph: the CUDA kernel (backend/cuda/flash_attention_mma.cu,
  // on tensor cores) reads the 16-bit operands, its f32 output rounded once.
  const Mesh gpu = abstract_mesh({{"x", 2}}, hardware_profile("h100-sxm"), 8);
  const Layout on_gpu = Layout({"x", UNSHARDED, UNSHARDED, UNSHARDED}, gpu);
  auto zeros16 = [&] { return zeros({2, 2, 300, 8}, on_gpu, DType::bf16); };
  const Tensor fused = scaled_dot_product_attention(zeros16(), zeros16(), zeros16(), true);
  REQUIRE(fused.node()->op == OpKind::Cast);
  CHECK(fused.node()->inputs.at(0)->inputs.at(0)->op == OpKind::Attention);
  CHECK(fused.node()->inputs.at(0)->inputs.at(0)->dtype == DType::f32);
  CHECK(fused.node()->inputs.at(0)->inputs.at(0)->inputs.at(0)->dtype == DType::bf16);
}
