// Partial is a placement users see, as in PyTorch's DTensor: a result PyTorch leaves Partial
// stays Partial when looked at. placements() says so, to_local() / components() return this device's
// term, and looking costs no collective; full_tensor() and redistribute() reduce. Cases from
// PyTorch's test/distributed/tensor/ suites, each on 1-D and 2-D meshes with uneven shards,
// against the values computed on one device.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Array counting(const std::vector<int64_t>& shape, float scale = 0.25f) {
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = scale * float((i * 7) % 11) - 1.0f;
  return a;
}

std::vector<Placement> on_first(const Mesh& mesh, Placement p) {
  std::vector<Placement> out(size_t(mesh.ndim()), Replicate{});
  out[0] = p;
  return out;
}

// `t` is Partial(op) over the mesh's first dim; looking at it runs nothing; its terms add up to
// `want` (summed, or the max / min of them); full_tensor() reduces to `want`.
void check_partial(const Tensor& t, const RefArray& want, ReduceOp op = ReduceOp::Sum) {
  const Mesh mesh = t.device_mesh();
  CHECK(t.placements()[0] == Placement{Partial{op}});
  std::vector<Array> terms;
  {
    CommDebugMode comm;
    terms = t.components();  // Tessera's per-device view (unpack is TensorFlow's: it reduces)
    CHECK(comm.get_total_counts() == 0);
    CHECK(same_array(t.to_local(), terms.front()));
    CHECK(comm.get_total_counts() == 0);
  }
  // The terms along the first mesh dim combine into the value.
  const auto coords = coords_of(mesh);
  Array combined = terms.front().clone();
  for (int64_t i = 0; i < combined.numel(); ++i) {
    const bool adds = op == ReduceOp::Sum || op == ReduceOp::Avg;
    double acc = adds ? 0.0 : double(terms.front().data<float>()[i]);
    int64_t count = 0;
    for (size_t d = 0; d < terms.size(); ++d) {
      bool first_of_others = true;
      for (size_t m = 1; m < coords[d].size(); ++m) first_of_others &= coords[d][m] == 0;
      if (!first_of_others) continue;
      const double v = terms[d].data<float>()[i];
      acc = adds ? acc + v : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
      ++count;
    }
    combined.mutable_data<float>()[i] = float(op == ReduceOp::Avg ? acc / double(count) : acc);
  }
  CHECK(compare_with_reference(combined, want, 1e-5) == "");
  CommDebugMode comm;
  CHECK(compare_with_reference(t.full_tensor(), want, 1e-5) == "");
  if (mesh.shape()[0] > 1) CHECK(comm.get_total_counts() >= 1);
}

std::vector<Mesh> meshes() { return {create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}; }

}  // namespace

TEST_CASE("linear ops of Partial values stay Partial: P+P, P*scalar, P/scalar, -P, transpose, reshape, pad") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    // mm(Shard(1), Shard(0)): a Partial(sum) product, 5 contracted over 3 devices unevenly.
    const Array l = counting({5, 5}), r = counting({5, 4}, 0.125f);
    Tensor tl = distribute_tensor(l, mesh, on_first(mesh, Shard{1})), tr = distribute_tensor(r, mesh, on_first(mesh, Shard{0}));
    Tensor p = matmul(tl, tr);
    std::map<const Node*, Array> leaves{{tl.node().get(), l}, {tr.node().get(), r}};
    check_partial(p, reference_eval(p, leaves));
    Tensor p2 = matmul(tl * 2.0f, tr);
    leaves = {{tl.node().get(), l}, {tr.node().get(), r}};
    check_partial(p + p2, reference_eval(p + p2, leaves));
    check_partial(p * 3.0f, reference_eval(p * 3.0f, leaves));
    check_partial(p / 4.0f, reference_eval(p / 4.0f, leaves));
    check_partial(-p, reference_eval(-p, leaves));
    check_partial(transpose(p), reference_eval(transpose(p), leaves));
    check_partial(reshape(p, {20}), reference_eval(reshape(p, {20}), leaves));
    check_partial(reshape(p, {2, 10}), reference_eval(reshape(p, {2, 10}), leaves));
    Tensor padded = pad(p, {{1, 0}, {0, 2}});
    check_partial(padded, reference_eval(padded, leaves));
  }
}

TEST_CASE("Partial(avg) stays Partial(avg) through linear ops, with no collective: + Replicate, * scalar, * 0-d tensor, * Replicate tensor") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    // Term k (on the devices at coordinate k of the first mesh dim) is counting() scaled by k + 1.
    const std::vector<int64_t> shape = {3, 4};
    std::vector<Array> components;
    for (const auto& coords : coords_of(mesh)) components.push_back(counting(shape, 0.25f * float(coords[0] + 1)));
    Tensor p = pack(components, Layout::from_placements(mesh, on_first(mesh, Partial{ReduceOp::Avg}), 2));
    const Array mean = counting(shape, 0.25f * float(mesh.shape()[0] + 1) / 2.0f);  // counting() is linear in its scale
    const Array rv = counting(shape, 0.5f);
    Tensor r = distribute_tensor(rv, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    Tensor s = distribute_tensor(Array::scalar(2.5f), mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    const std::map<const Node*, Array> leaves{{p.node().get(), mean}, {r.node().get(), rv}, {s.node().get(), Array::scalar(2.5f)}};
    CHECK(compare_with_reference(p.full_tensor(), ref_from_array(mean), 1e-5) == "");
    for (const auto& [name, value] : std::vector<std::pair<std::string, Tensor>>{
             {"P + R", p + r}, {"R + P", r + p}, {"P - R", p - r}, {"P * 3", p * 3.0f}, {"P * 0-d", p * s},
             {"0-d * P", s * p}, {"P * R", p * r}, {"P / 4", p / 4.0f}, {"-P", -p}, {"P + P", p + p}}) {
      CAPTURE(name);
      check_partial(value, reference_eval(value, leaves), ReduceOp::Avg);
    }
    // A product of two Partial values is not linear: it is reduced first.
    CHECK(!is_partial((p * p).placements()[0]));
  }
}

TEST_CASE("addmm and a sum over a sharded axis stay Partial; maximum of Partial(max) values stays Partial(max)") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Array l = counting({4, 5}), r = counting({5, 3}, 0.5f), bias = counting({3}, 1.0f);
    Tensor tl = distribute_tensor(l, mesh, on_first(mesh, Shard{1})), tr = distribute_tensor(r, mesh, on_first(mesh, Shard{0}));
    Tensor tb = distribute_tensor(bias, mesh, on_first(mesh, Replicate{}));
    std::map<const Node*, Array> leaves{{tl.node().get(), l}, {tr.node().get(), r}, {tb.node().get(), bias}};
    Tensor addmm = tb + matmul(tl, tr);
    check_partial(addmm, reference_eval(addmm, leaves));
    Tensor s = reduce_sum(tl, {1});
    check_partial(s, reference_eval(s, leaves));
    // Partial(max) terms: each device holds its block's maximum.
    Tensor mx = reduce_max(tl, {1});
    check_partial(mx, reference_eval(mx, leaves), ReduceOp::Max);
    Tensor both = maximum(mx, reduce_max(tl * -2.0f, {1}));  // two Partial(max) values
    check_partial(both, reference_eval(both, leaves), ReduceOp::Max);
  }
}

TEST_CASE("where(mask, Partial, zeros or a whole value) and scatter_add_rows of Partial rows stay Partial; a non-zero constant branch is reduced") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Array l = counting({5, 5}), r = counting({5, 4}, 0.125f), other = counting({5, 4}, 0.5f);
    const Array ids = Array::from<int32_t>({2, 0, 2, 1, 0}, {5});
    Tensor tl = distribute_tensor(l, mesh, on_first(mesh, Shard{1})), tr = distribute_tensor(r, mesh, on_first(mesh, Shard{0}));
    Tensor whole = distribute_tensor(other, mesh, on_first(mesh, Replicate{}));
    Tensor tids = distribute_tensor(ids, mesh, on_first(mesh, Replicate{}));
    std::map<const Node*, Array> leaves{{tl.node().get(), l}, {tr.node().get(), r}, {whole.node().get(), other}, {tids.node().get(), ids}};
    const Tensor p = matmul(tl, tr);
    const Tensor mask = whole > 0.0;  // the same on every device
    // A pipeline stage's weights picked for one tick: the terms pick alike.
    const Tensor picked = where(mask, p, 0.0);
    check_partial(picked, reference_eval(picked, leaves));
    const Tensor either = where(mask, whole, p);  // the whole branch split into terms
    check_partial(either, reference_eval(either, leaves));
    // Each device scatters its terms with the same ids (a position embedding's gradient).
    const Tensor scattered = detail::scatter_add_rows(p, tids, 3, Loc::current());
    check_partial(scattered, reference_eval(scattered, leaves));
    // A constant that is not zero would be added once per term: the sum is reduced first.
    const Tensor filled = where(mask, p, 1.0);
    CHECK(filled.placements()[0] == Placement{Replicate{}});
    CHECK(compare_with_reference(filled.full_tensor(), reference_eval(filled, leaves), 1e-5) == "");
  }
}

TEST_CASE("mm of two Partial operands on a 2x2 mesh reduces each once: 2 all_reduces, not 4") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  const Array a = counting({4, 6}), b = counting({6, 4}, 0.5f), c = counting({4, 6}, 0.125f), d = counting({6, 3}, 1.0f);
  Tensor ta = distribute_tensor(a, mesh, {Shard{1}, Replicate{}}), tb = distribute_tensor(b, mesh, {Shard{0}, Replicate{}});
  Tensor tc = distribute_tensor(c, mesh, {Replicate{}, Shard{1}}), td = distribute_tensor(d, mesh, {Replicate{}, Shard{0}});
  Tensor left = matmul(ta, tb), right = matmul(tc, td);  // Partial over x, Partial over y
  CHECK(left.placements() == std::vector<Placement>{Partial{}, Replicate{}});
  CHECK(right.placements() == std::vector<Placement>{Replicate{}, Partial{}});
  Tensor product = matmul(left, right);
  CommDebugMode comm;
  const Array got = product.full_tensor();
  CHECK(comm.get_comm_counts()["all_reduce"] == 2);
  std::map<const Node*, Array> leaves{{ta.node().get(), a}, {tb.node().get(), b}, {tc.node().get(), c}, {td.node().get(), d}};
  CHECK(compare_with_reference(got, reference_eval(product, leaves), 1e-4) == "");
}

TEST_CASE("mm of a Partial operand and a Replicate one stays Partial, sum and avg, with no collective: [P] x [R] and [P, P] x [R, R] on 2x2") {
  for (const Mesh& mesh : {create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      CAPTURE(mesh.to_string());
      CAPTURE(reduce_op_name(op));
      // Every device its own term (device k: counting() scaled by k + 1), Partial(op) on every mesh dim.
      const std::vector<std::vector<int64_t>> coords = coords_of(mesh);
      std::vector<Array> terms;
      Array global({4, 5}, DType::f32);
      for (size_t k = 0; k < coords.size(); ++k) {
        terms.push_back(counting({4, 5}, 0.25f * float(k + 1)));
        for (int64_t i = 0; i < global.numel(); ++i)
          global.mutable_data<float>()[i] += terms.back().data<float>()[i] / (op == ReduceOp::Avg ? float(coords.size()) : 1.0f);
      }
      Tensor a = pack(terms, Layout::from_placements(mesh, std::vector<Placement>(size_t(mesh.ndim()), Partial{op}), 2));
      const Array bv = counting({5, 3}, 0.5f);
      Tensor b = distribute_tensor(bv, mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
      CommDebugMode comm;
      Tensor product = matmul(a, b);
      CHECK(product.placements() == std::vector<Placement>(size_t(mesh.ndim()), Partial{op}));
      (void)product.components();
      CHECK(comm.get_total_counts() == 0);  // computed and looked at: nothing moved
      const Array got = product.full_tensor();
      CHECK(comm.get_comm_counts()["all_reduce"] == mesh.ndim());  // one per Partial mesh dim (PyTorch: 2 on 2x2)
      CHECK(comm.get_total_counts() == mesh.ndim());
      const std::map<const Node*, Array> leaves{{a.node().get(), global}, {b.node().get(), bv}};
      CHECK(compare_with_reference(got, reference_eval(product, leaves), 1e-4) == "");
    }
}

TEST_CASE("full_tensor and redistribute reduce a Partial value; inside a jit step the partitioner still chooses freely") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Array x = counting({7, 3});
    Tensor tx = distribute_tensor(x, mesh, on_first(mesh, Shard{0}));
    Tensor s = reduce_sum(tx, {0});
    CHECK(s.placements()[0] == Placement{Partial{}});
    Tensor r = s.redistribute(on_first(mesh, Replicate{}));
    CHECK(r.placements()[0] == Placement{Replicate{}});
    std::map<const Node*, Array> leaves{{tx.node().get(), x}};
    CHECK(compare_with_reference(r.full_tensor(), reference_eval(s, leaves), 1e-5) == "");
    // A jit step returning the sum hands it back as Partial too (the same placement as eagerly);
    // a consumer inside the step gets what the partitioner picks.
    auto step = jit([](const Tensor& t) { return std::make_tuple(reduce_sum(t, {0}), reduce_sum(t, {0}) * reduce_sum(t, {0})); });
    auto [sum, squared] = step(tx);
    CHECK(sum.placements()[0] == Placement{Partial{}});
    CHECK(squared.placements()[0] == Placement{Replicate{}});  // a product of two Partials is not linear: reduced first
    Tensor want = reduce_sum(tx, {0}) * reduce_sum(tx, {0});
    CHECK(compare_with_reference(squared.full_tensor(), reference_eval(want, leaves), 1e-4) == "");
  }
}

TEST_CASE("matmul of two Shard(0) operands gathers the right operand once and stays Shard(0), as PyTorch's plan") {
  for (const Mesh& mesh : {create_mesh({{"x", 4}}), create_mesh({{"x", 3}})}) {
    CAPTURE(mesh.to_string());
    const Array a = counting({8, 6}), b = counting({6, 5}, 0.5f);  // 6 rows over 4 and 3: uneven
    Tensor ta = distribute_tensor(a, mesh, {Shard{0}}), tb = distribute_tensor(b, mesh, {Shard{0}});
    Tensor c = matmul(ta, tb);
    CHECK(c.placements() == std::vector<Placement>{Shard{0}});
    CommDebugMode comm;
    const std::vector<Array> blocks = unpack(c);
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 1}});
    std::map<const Node*, Array> leaves{{ta.node().get(), a}, {tb.node().get(), b}};
    CHECK(compare_with_reference(c.full_tensor(), reference_eval(c, leaves), 1e-5) == "");
  }
}

TEST_CASE("matmul of [B, T, k] rows keeps them sharded along any leading axis, unevenly or empty; the weight's gradient sums them once") {
  // torch.matmul folds [B, T, k] x [k, n] into one [B*T, k] GEMM; a reshape to that shape can
  // describe only a batch sharded evenly, so a sharded sequence or an uneven batch was gathered.
  // A Rows product (dsl/dot_form.hpp) keeps any leading axis's sharding and runs one local GEMM.
  struct Case {
    Mesh mesh;
    std::vector<int64_t> shape;  // [B, T, k]
    std::vector<Placement> x, w, out;
    int64_t collectives = 0;                            // reading y
    std::map<std::string, int64_t> gradient_collectives = {{"all_reduce", 1}};  // reading dw
  };
  using Counts = std::map<std::string, int64_t>;
  const Mesh two = create_mesh({{"x", 2}}), three = create_mesh({{"x", 3}}), four = create_mesh({{"x", 4}});
  const Mesh grid = create_mesh({{"dp", 2}, {"sp", 2}});
  const std::vector<Case> cases = {
      {two, {2, 6, 4}, {Shard{1}}, {Replicate{}}, {Shard{1}}},               // sequence parallel
      {three, {2, 5, 4}, {Shard{1}}, {Replicate{}}, {Shard{1}}},             // 5 positions over 3: 2, 2, 1
      {three, {4, 3, 4}, {Shard{0}}, {Replicate{}}, {Shard{0}}},             // 4 sequences over 3: 2, 2, 0
      {four, {3, 2, 4}, {Shard{0}}, {Replicate{}}, {Shard{0}}},              // 3 over 4: an empty block
      // Rows and columns on one dim: the weight gathered, its gradient reduce_scattered.
      {four, {2, 3, 4}, {Shard{1}}, {Shard{1}}, {Shard{1}}, 1, Counts{{"reduce_scatter", 1}}},
      {grid, {2, 6, 4}, {Shard{0}, Shard{1}}, {Replicate{}, Replicate{}}, {Shard{0}, Shard{1}}, 0, Counts{{"all_reduce", 2}}},
      {grid, {3, 5, 4}, {Shard{1}, Replicate{}}, {Replicate{}, Shard{1}}, {Shard{1}, Shard{2}}},  // sp x tp
  };
  for (const Case& c : cases) {
    CAPTURE(c.mesh.to_string());
    CAPTURE(c.shape);
    const Array a = counting(c.shape), b = counting({c.shape.back(), 3}, 0.5f);
    Tensor x = distribute_tensor(a, c.mesh, c.x), w = distribute_tensor(b, c.mesh, c.w);
    Tensor y = matmul(x, w);
    CHECK(y.placements() == c.out);
    std::map<const Node*, Array> leaves{{x.node().get(), a}, {w.node().get(), b}};
    {
      CommDebugMode comm;
      const std::vector<Array> blocks = unpack(y);
      CHECK(comm.get_total_counts() == c.collectives);
    }
    CHECK(compare_with_reference(y.full_tensor(), reference_eval(y, leaves), 1e-5) == "");
    // d(sum y)/dw sums x's rows: each device its own rows (Partial(sum) over the mesh dims
    // sharding them), reduced once per such dim into w's placements.
    const Tensor dw = gradients(reduce_sum(y), {w})[0];
    CHECK(dw.placements() == c.w);
    CommDebugMode comm;
    const std::vector<Array> blocks = unpack(dw);
    CHECK(comm.get_comm_counts() == c.gradient_collectives);
    CHECK(compare_with_reference(dw.full_tensor(), reference_eval(dw, leaves), 1e-4) == "");
  }
}
