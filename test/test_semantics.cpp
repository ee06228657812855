// DTensor semantics that PyTorch's and JAX's own suites expect and that used to give silently
// wrong or crashing results: values read while jit traces (a ConcretizationError, never a value
// baked into later calls), jit inside jit, indices out of range at run time (an IndexError naming
// the op and line, as TensorFlow's CPU kernels raise), and long float sums (blocked partial sums:
// a sum of 2^31 ones is exact in f32).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include <tessera/tessera.hpp>

#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::vector<Mesh> meshes() { return {create_mesh({{"x", 1}}), create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}; }

// Axis 0 split over the mesh's first dim, replicated over the others.
std::vector<Placement> rows(const Mesh& mesh) {
  std::vector<Placement> p(size_t(mesh.ndim()), Replicate{});
  p[0] = Shard{0};
  return p;
}
std::vector<Placement> replicated(const Mesh& mesh) { return std::vector<Placement>(size_t(mesh.ndim()), Replicate{}); }

Array counting(int64_t n, float scale = 1.0f) {
  Array a({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) a.mutable_data<float>()[i] = float(i + 1) * scale;
  return a;
}

// Calls `read` on a traced value inside jit and checks the error names `call`.
template <class Read>
void check_read_refused(const Tensor& x, Read read, const char* call) {
  auto step = jit([&](const Tensor& t) {
    Tensor y = t * 2.0f;
    read(y);
    return y;
  });
  CAPTURE(call);
  CHECK_THROWS_WITH_AS(step(x), doctest::Contains(call), ConcretizationError);
  CHECK_THROWS_WITH_AS(step(x), doctest::Contains("jit is tracing"), ConcretizationError);
}

}  // namespace

TEST_CASE("a value read while jit traces is a ConcretizationError naming the call, never baked in") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor x = distribute_tensor(counting(5), mesh, rows(mesh));
    // The case: jit(x -> x * x.full_tensor()[0]) kept the first call's value.
    auto baked = jit([](const Tensor& t) { return t * t.full_tensor().to_vector<float>()[0]; });
    CHECK_THROWS_WITH_AS(baked(x), doctest::Contains("full_tensor()"), ConcretizationError);
    check_read_refused(x, [](const Tensor& y) { (void)y.full_tensor(); }, "full_tensor()");
    check_read_refused(x, [](const Tensor& y) { (void)y.to_local(); }, "to_local()");
    check_read_refused(x, [](const Tensor& y) { (void)unpack(y); }, "unpack()");
    check_read_refused(x, [](const Tensor& y) { (void)to_array(y); }, "to_array()");
    check_read_refused(x, [](const Tensor& y) { (void)fmt::format("{}", y); }, "printing a Tensor");
    check_read_refused(x, [](const Tensor& y) { (void)Variable(y); }, "Variable(initial)");
    // Shapes, dtypes and layouts are known while tracing, as in JAX.
    auto inspect = jit([](const Tensor& t) { return t * double(t.shape()[0] + int64_t(t.placements().size())); });
    CHECK(inspect(x).full_tensor().to_vector<float>()[0] == float(5 + mesh.ndim()));
  }
}

TEST_CASE("inside jit, captured values may be read; a traced value that escapes has no value") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor scale = distribute_tensor(Array::from<float>({3}, {1}), mesh, replicated(mesh));
  auto step = jit([&](const Tensor& t) { return t * scale.full_tensor().to_vector<float>()[0]; });
  Tensor x = distribute_tensor(counting(4), mesh, rows(mesh));
  CHECK(same_array(step(x).full_tensor(), counting(4, 3.0f)));
  Tensor leaked;
  auto leak = jit([&](const Tensor& t) {
    leaked = t + 1.0f;
    return t;
  });
  (void)leak(x);
  CHECK_THROWS_WITH_AS(leaked.full_tensor(), doctest::Contains("escaped the trace"), ConcretizationError);
}

TEST_CASE("inside local_map, reading a local block is a ConcretizationError") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Tensor x = distribute_tensor(counting(6), mesh, {Shard{0}, Replicate{}});
  auto reads = [&](auto read, const char* call) {
    auto f = local_map([&](const Tensor& a) {
      read(a);
      return a * 2.0f;
    }, {{Shard{0}, Replicate{}}}, {{Shard{0}, Replicate{}}}, mesh);
    CAPTURE(call);
    CHECK_THROWS_WITH_AS(f(x), doctest::Contains(call), ConcretizationError);
    CHECK_THROWS_WITH_AS(f(x), doctest::Contains("local_map"), ConcretizationError);
  };
  reads([](const Tensor& a) { (void)a.full_tensor(); }, "full_tensor()");
  reads([](const Tensor& a) { (void)a.to_local(); }, "to_local()");
  reads([](const Tensor& a) { (void)unpack(a); }, "unpack()");
  // Inside jit too.
  auto f = local_map([](const Tensor& a) { return a * 2.0f; }, {{Shard{0}, Replicate{}}}, {{Shard{0}, Replicate{}}}, mesh);
  auto step = jit([&](const Tensor& t) { return f(t); });
  CHECK(same_array(step(x).full_tensor(), counting(6, 2.0f)));
}

TEST_CASE("jit inside jit is inlined: later calls see their own arguments and variables") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Variable counter(distribute_tensor(Array::from<float>({0, 0, 0, 0, 0}, {5}), mesh, rows(mesh)));
    auto inner = jit([&](const Tensor& t) {
      counter.assign_add(t);
      return t * 2.0f;
    });
    auto outer = jit([&](const Tensor& t) { return inner(t) + 1.0f; });
    for (float k : {1.0f, 2.0f, 5.0f}) {
      Tensor x = distribute_tensor(counting(5, k), mesh, rows(mesh));
      Array got = outer(x).full_tensor();
      for (int64_t i = 0; i < 5; ++i) CHECK(got.to_vector<float>()[size_t(i)] == float(i + 1) * 2 * k + 1);
    }
    // Every call's assignment happened: 1 + 2 + 5 times (i + 1).
    const std::vector<float> total = counter.value().full_tensor().to_vector<float>();
    for (int64_t i = 0; i < 5; ++i) CHECK(total[size_t(i)] == float(i + 1) * 8);
    CHECK(outer.traces() == 1);
  }
}

TEST_CASE("a label or an index out of range is an IndexError when the step runs, naming the op and line") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor logits = distribute_tensor(Array({5, 4}, DType::f32), mesh, rows(mesh));
    auto loss_of = [&](std::vector<int32_t> labels) {
      return sparse_softmax_cross_entropy_with_logits(distribute_tensor(Array::from<int32_t>(labels, {5}), mesh, rows(mesh)), logits);
    };
    // In range: ln 4 each (zero logits), no error.
    for (float v : loss_of({0, 1, 2, 3, 0}).full_tensor().to_vector<float>()) CHECK(v == doctest::Approx(std::log(4.0)));
    CHECK_THROWS_WITH_AS(loss_of({0, 1, 4, 3, 0}).full_tensor(), doctest::Contains("label 4 is outside the valid range [0, 4)"),
                         IndexError);
    CHECK_THROWS_WITH_AS(loss_of({0, 1, 2, 3, -1}).full_tensor(), doctest::Contains("test_semantics.cpp"), IndexError);
    // Inside jit, on every call: a good batch after a bad one runs normally.
    auto step = jit([&](const Tensor& labels) { return reduce_mean(sparse_softmax_cross_entropy_with_logits(labels, logits)); });
    auto labels_of = [&](std::vector<int32_t> v) { return distribute_tensor(Array::from<int32_t>(v, {5}), mesh, rows(mesh)); };
    CHECK(step(labels_of({0, 1, 2, 3, 3})).full_tensor().to_vector<float>()[0] == doctest::Approx(std::log(4.0)));
    CHECK_THROWS_AS(step(labels_of({0, 1, 2, 3, 9})).full_tensor(), IndexError);
    CHECK(step(labels_of({3, 3, 2, 1, 0})).full_tensor().to_vector<float>()[0] == doctest::Approx(std::log(4.0)));
    // gather and embedding indices, sharded tables included.
    Tensor table = distribute_tensor(counting(12), mesh, rows(mesh));
    auto ids_of = [&](std::vector<int64_t> v) { return distribute_tensor(Array::from<int64_t>(v, {int64_t(v.size())}), mesh, replicated(mesh)); };
    CHECK(same_array(gather(table, ids_of({11, 0, 5}), 0).full_tensor(), Array::from<float>({12, 1, 6}, {3})));
    CHECK_THROWS_WITH_AS(gather(table, ids_of({11, 12, 5}), 0).full_tensor(), doctest::Contains("gather: index 12 is outside the valid range [0, 12)"),
                         IndexError);
    Tensor rows = reshape(table, {6, 2});
    CHECK_THROWS_WITH_AS(embedding(ids_of({0, -3}), rows).full_tensor(), doctest::Contains("embedding: id -3 is outside the valid range [0, 6)"),
                         IndexError);
  }
}

TEST_CASE("long float sums add blocked partial sums: 2^31 ones are exact in f32, on every mesh and in deterministic mode") {
  const int64_t n = int64_t(1) << 31;
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor ones_ = ones({n}, Layout::batch_sharded(mesh, "x", 1), DType::f32);
    CHECK(reduce_sum(ones_).full_tensor().to_vector<float>()[0] == float(n));
    // 2^24 tenths: a single running f32 sum drifts by percents; blocked sums keep f32's precision.
    const int64_t m = int64_t(1) << 24;
    const double want = double(m) * double(0.1f);
    const double got = reduce_sum(full({m}, 0.1, Layout::batch_sharded(mesh, "x", 1), DType::f32)).full_tensor().to_vector<float>()[0];
    CHECK(std::abs(got - want) / want < 1e-6);
    // A row sum over a long axis inside a fused kernel (softmax-like): mean of tenths is a tenth.
    Tensor rows = full({2, m / 2}, 0.1, Layout::replicated(mesh, 2), DType::f32);
    for (float v : reduce_mean(rows, {1}).full_tensor().to_vector<float>()) CHECK(std::abs(double(v) - 0.1) < 1e-7);
  }
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  Mesh mesh = create_mesh({{"x", 2}});
  CHECK(reduce_sum(ones({n}, Layout::batch_sharded(mesh, "x", 1), DType::f32)).full_tensor().to_vector<float>()[0] == float(n));
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("long float column sums add blocked partial sums too: 2^25 ones per column are exact in f32") {
  const int64_t rows = int64_t(1) << 25;
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor ones_ = ones({rows, 3}, Layout::batch_sharded(mesh, "x", 2), DType::f32);
    for (float v : reduce_sum(ones_, {0}).full_tensor().to_vector<float>()) CHECK(v == float(rows));
    // 2^24 tenths per column (a running f32 sum drifts by percents), and a mean of them.
    const int64_t m = int64_t(1) << 24;
    Tensor tenths = full({m, 2}, 0.1, Layout::batch_sharded(mesh, "x", 2), DType::f32);
    for (float v : reduce_sum(tenths, {0}).full_tensor().to_vector<float>())
      CHECK(std::abs(double(v) - double(m) * double(0.1f)) / (double(m) * 0.1) < 1e-6);
    for (float v : reduce_mean(tenths, {0}).full_tensor().to_vector<float>()) CHECK(std::abs(double(v) - 0.1) < 1e-7);
  }
  // Short columns (a bias gradient over a batch) keep the streaming loop; their sums are exact too.
  Mesh mesh = create_mesh({{"x", 2}});
  for (float v : reduce_sum(ones({1000, 5}, Layout::batch_sharded(mesh, "x", 2), DType::f32), {0}).full_tensor().to_vector<float>())
    CHECK(v == 1000.0f);
}

TEST_CASE("where takes every tensor / scalar mix; two scalars take PyTorch's dtypes") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Array values = Array::from<float>({-2, 5, 0, 7, -1}, {5});
    Tensor x = distribute_tensor(values, mesh, rows(mesh));
    Tensor cond = x > 0.0f;
    Tensor both = where(cond, 1.0, 2.0);
    CHECK(both.dtype() == DType::f32);
    CHECK(both.placements() == x.placements());
    CHECK(same_array(both.full_tensor(), Array::from<float>({2, 1, 2, 1, 2}, {5})));
    Tensor ints = where(cond, 1, 2);
    CHECK(ints.dtype() == DType::i64);
    CHECK(same_array(ints.full_tensor(), Array::from<int64_t>({2, 1, 2, 1, 2}, {5})));
    CHECK(where(cond, 1, 2.5).dtype() == DType::f32);
    CHECK(same_array(where(cond, x, 0.5).full_tensor(), Array::from<float>({0.5f, 5, 0.5f, 7, 0.5f}, {5})));
    CHECK(same_array(where(cond, -1.0, x).full_tensor(), Array::from<float>({-2, -1, 0, -1, -1}, {5})));
    CHECK(same_array(where(cond, x, x * 2.0f).full_tensor(), Array::from<float>({-4, 5, 0, 7, -2}, {5})));
  }
}

TEST_CASE("plans the suites expect: a view leaving an uneven (even empty) shard alone, and concat with a replicated operand, move nothing") {
  for (const Mesh& mesh : {create_mesh({{"x", 4}}), create_mesh({{"x", 4}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> p(size_t(mesh.ndim()), Replicate{});
    p[0] = Shard{0};  // 6 rows over 4: 2, 2, 2, 0 (an empty shard)
    Array a({6, 4, 3}, DType::f32);
    for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i);
    Tensor t = distribute_tensor(a, mesh, p);
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{6, 12}, {6, 2, 2, 3}, {6, 3, 4}}) {
      CAPTURE(shape.size());
      Tensor v = reshape(t, shape);
      CHECK(v.placements() == p);
      CommDebugMode comm;
      (void)unpack(v);
      CHECK(comm.get_total_counts() == 0);
      CHECK(same_array(v.full_tensor(), reshape(distribute_tensor(a, mesh, replicated(mesh)), shape).full_tensor()));
    }
    Tensor r = distribute_tensor(Array({6, 2}, DType::f32), mesh, replicated(mesh));
    Tensor both = concat({reshape(t, {6, 12}), r}, 1);
    CHECK(both.placements() == p);
    CommDebugMode comm;
    (void)unpack(both);
    CHECK(comm.get_total_counts() == 0);
  }
}

// PyTorch's test_view_ops case: a (1, 2, 2, 2) tensor Shard(0) on 2 devices (one row and one empty
// shard) viewed with its size-1 axis left alone keeps Shard(0); a concat whose replicated operand
// comes first takes the sharded operand's layout (each device slices its block of the replicated
// one). Both used to all_gather and return Replicate.
TEST_CASE("a view keeping a size-1 sharded axis, and concat with a replicated operand first, move nothing") {
  for (const Mesh& mesh : {create_mesh({{"x", 2}}), create_mesh({{"x", 2}, {"y", 2}}), create_mesh({{"x", 3}})}) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> p = rows(mesh);
    Array a({1, 2, 2, 2}, DType::f32);
    for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i + 1);
    Tensor t = distribute_tensor(a, mesh, p);
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 2, 4}, {1, 4, 2}, {1, 8}, {1, 1, 8}, {1, 2, 2, 2}}) {
      CAPTURE(shape.size());
      CAPTURE(shape.back());
      Tensor v = reshape(t, shape);
      CHECK(v.placements() == p);
      CommDebugMode comm;
      const std::vector<Array> blocks = unpack(v);
      CHECK(comm.get_total_counts() == 0);
      CHECK(blocks[0].shape()[0] == 1);                           // device 0 holds the row
      CHECK(blocks[size_t(mesh.strides()[0])].shape()[0] == 0);   // the next device along x: empty
      CHECK(same_array(v.full_tensor(), reshape(distribute_tensor(a, mesh, replicated(mesh)), shape).full_tensor()));
    }
    // Rows 0-4 of a (5, 3) tensor over x: uneven (3 devices: 2, 2, 1) and, over 2, 3 and 2.
    Array s({5, 3}, DType::f32), r({5, 2}, DType::f32);
    for (int64_t i = 0; i < s.numel(); ++i) s.mutable_data<float>()[i] = float(i);
    for (int64_t i = 0; i < r.numel(); ++i) r.mutable_data<float>()[i] = float(100 + i);
    Tensor sharded = distribute_tensor(s, mesh, p), whole = distribute_tensor(r, mesh, replicated(mesh));
    for (bool replicated_first : {true, false}) {
      CAPTURE(replicated_first);
      Tensor both = replicated_first ? concat({whole, sharded}, 1) : concat({sharded, whole}, 1);
      CHECK(both.placements() == p);
      CommDebugMode comm;
      (void)unpack(both);
      CHECK(comm.get_total_counts() == 0);
      Tensor expected = replicated_first ? concat({whole, distribute_tensor(s, mesh, replicated(mesh))}, 1)
                                         : concat({distribute_tensor(s, mesh, replicated(mesh)), whole}, 1);
      CHECK(same_array(both.full_tensor(), expected.full_tensor()));
    }
    // A concat of the (1, 2, 2, 2) tensor and a replicated one along axis 1, replicated first.
    Tensor both = concat({distribute_tensor(a, mesh, replicated(mesh)), t}, 1);
    CHECK(both.placements() == p);
    CommDebugMode comm;
    (void)unpack(both);
    CHECK(comm.get_total_counts() == 0);
  }
}

TEST_CASE("sums and cumsum of bool and narrow integers accumulate in i64, as numpy's and PyTorch's do") {
  // 300 trues once summed to 44 replicated (300 mod 256) and to 1 sharded.
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    for (const auto& placements : {replicated(mesh), rows(mesh)}) {
      Tensor trues = distribute_tensor(Array::from<uint8_t>(std::vector<uint8_t>(300, 1), {300}), mesh, placements);
      Tensor total = reduce_sum(trues);
      CHECK(total.dtype() == DType::i64);
      CHECK(total.full_tensor().to_vector<int64_t>() == std::vector<int64_t>{300});
      const std::vector<int64_t> running = cumsum(trues, 0).full_tensor().to_vector<int64_t>();
      CHECK(running.size() == 300);
      CHECK(running.front() == 1);
      CHECK(running.back() == 300);
      // int32 values whose sum leaves int32.
      Tensor big = distribute_tensor(Array::from<int32_t>(std::vector<int32_t>(6, 2'000'000'000), {6}), mesh, placements);
      CHECK(reduce_sum(big).full_tensor().to_vector<int64_t>() == std::vector<int64_t>{12'000'000'000});
      CHECK(cumsum(big, 0).full_tensor().to_vector<int64_t>().back() == 12'000'000'000);
      // A mean keeps its input's integer dtype (the i64 sum is internal).
      CHECK(reduce_mean(big).dtype() == DType::i32);
      CHECK(reduce_mean(big).full_tensor().to_vector<int32_t>() == std::vector<int32_t>{2'000'000'000});
    }
  }
  // Floats keep their dtype.
  CHECK(reduce_sum(distribute_tensor(counting(4), create_mesh({{"x", 2}}))).dtype() == DType::f32);
}

TEST_CASE("multinomial with negative, NaN, infinite or all-zero weights is an IndexError when the step runs, naming the fault") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    auto draws = [&](std::vector<float> weights) {
      return multinomial(distribute_tensor(Array::from<float>(weights, {2, 3}), mesh, replicated(mesh)), 4, 7).full_tensor();
    };
    const std::vector<int64_t> picked = draws({0, 1, 0, 0, 0, 5}).to_vector<int64_t>();
    CHECK(picked == std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 2});
    CHECK_THROWS_WITH_AS(draws({0, 1, 0, 0, -1, 5}), doctest::Contains("multinomial: a row of probs has a negative weight"), IndexError);
    CHECK_THROWS_WITH_AS(draws({0, NAN, 1, 1, 1, 1}), doctest::Contains("has a NaN weight"), IndexError);
    CHECK_THROWS_WITH_AS(draws({0, INFINITY, 1, 1, 1, 1}), doctest::Contains("has an infinite weight"), IndexError);
    CHECK_THROWS_WITH_AS(draws({1, 1, 1, 0, 0, 0}), doctest::Contains("has weights that sum to zero"), IndexError);
    CHECK_THROWS_WITH_AS(draws({1, 1, 1, 0, 0, 0}), doctest::Contains("test_semantics.cpp"), IndexError);
    CHECK(draws({0, 0, 3, 2, 0, 0}).to_vector<int64_t>() == std::vector<int64_t>{2, 2, 2, 2, 0, 0, 0, 0});
  }
}

TEST_CASE("floating tensors of different widths promote as in PyTorch: bf16 x f32 is f32, f16 + bf16 is f32, f32 + f64 is f64") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor wide = distribute_tensor(counting(6, 0.5f), mesh, rows(mesh));
    Tensor narrow = cast(distribute_tensor(counting(6, 0.25f), mesh, replicated(mesh)), DType::bf16);
    Tensor product = narrow * wide;
    CHECK(product.dtype() == DType::f32);
    CHECK(product.placements() == (cast(narrow, DType::f32) * wide).placements());  // as with the cast written out
    // bf16 holds these quarters exactly, so the f32 product equals the all-f32 one.
    CHECK(same_array(product.full_tensor(), (cast(narrow, DType::f32) * wide).full_tensor()));
    CHECK((wide - narrow).dtype() == DType::f32);
    CHECK((cast(wide, DType::f16) + narrow).dtype() == DType::f32);
    CHECK((cast(wide, DType::f64) / narrow).dtype() == DType::f64);
    CHECK((narrow < wide).dtype() == DType::u8);
    CHECK(maximum(narrow, wide).dtype() == DType::f32);
    // Gradients come back in each operand's own dtype.
    const std::vector<Tensor> g = gradients(reduce_sum(narrow * wide), {narrow, wide});
    CHECK(g[0].dtype() == DType::bf16);
    CHECK(g[1].dtype() == DType::f32);
    CHECK(same_array(cast(g[0], DType::f32).full_tensor(), cast(cast(wide, DType::bf16), DType::f32).full_tensor()));
    // Integers and floats still do not mix silently.
    Tensor ints = distribute_tensor(Array::from<int32_t>({1, 2, 3, 4, 5, 6}, {6}), mesh, rows(mesh));
    CHECK_THROWS_WITH_AS(wide * ints, doctest::Contains("operands have different dtypes float32 and int32"), DTypeError);
  }
}

// Rotary embeddings compute their tables on the devices: sin and cos must be accurate over the
// angles a long context reaches and give the same bits under every layout.
TEST_CASE("sin and cos: within 2 ulp of libm over |x| < 8192 in f32, exact in f64, the same bits under every layout") {
  const int64_t n = 4099;  // uneven over 3 devices and over 2 x 2
  Array angles({n}, DType::f32), wide({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) {
    const double x = (double(i) - double(n / 2)) * 3.9 + 0.01 * double(i % 7);  // about -8000 .. 8000, every octant
    angles.mutable_data<float>()[i] = float(x);
    wide.mutable_data<double>()[i] = x;
  }
  std::vector<Array> first;
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    for (const auto& placements : {replicated(mesh), rows(mesh)}) {
      Tensor x = distribute_tensor(angles, mesh, placements);
      const Array s = sin(x).full_tensor(), c = cos(x).full_tensor();
      CHECK(sin(x).placements() == x.placements());
      if (first.empty()) {
        first = {s, c};
        for (int64_t i = 0; i < n; ++i) {
          const float a = angles.data<float>()[i];
          const double ulp = double(std::nextafter(1.0f, 2.0f) - 1.0f);
          CAPTURE(a);
          CHECK(std::abs(double(s.data<float>()[i]) - std::sin(double(a))) <= 2 * ulp);
          CHECK(std::abs(double(c.data<float>()[i]) - std::cos(double(a))) <= 2 * ulp);
        }
      } else {
        CHECK(same_array(s, first[0]));
        CHECK(same_array(c, first[1]));
      }
      const Array s64 = sin(distribute_tensor(wide, mesh, placements)).full_tensor();
      for (int64_t i = 0; i < n; i += 97) CHECK(s64.data<double>()[i] == std::sin(wide.data<double>()[i]));
    }
  }
  Tensor ints = distribute_tensor(Array::from<int32_t>({1, 2}, {2}), create_mesh({{"x", 2}}));
  CHECK_THROWS_WITH_AS(sin(ints), doctest::Contains("sin: needs a floating tensor, got int32"), DTypeError);
}
