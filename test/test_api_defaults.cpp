// The small API forms PyTorch's and TensorFlow's references use that Tessera also takes: a
// default mesh for a scope (TF's default_mesh, PyTorch's `with mesh:`), set_default_dtype,
// from_local's stride, and redistribute's async_op. Each on a 1-D mesh with uneven shards and on
// a 2-D mesh, with placements and collective counts.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include <tessera/tessera.hpp>

#include "reference_sharding.hpp"

using namespace tessera;
using tessera::testing::same_array;

namespace {

std::vector<Mesh> meshes() { return {create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}; }

std::vector<Placement> rows(const Mesh& mesh) {
  std::vector<Placement> p(size_t(mesh.ndim()), Replicate{});
  p[0] = Shard{0};
  return p;
}
std::vector<Placement> replicated(const Mesh& mesh) { return std::vector<Placement>(size_t(mesh.ndim()), Replicate{}); }

Array counting(std::vector<int64_t> shape) {
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i);
  return a;
}

// Restores float32 however a test case ends: the default dtype is process-wide.
struct DefaultDTypeRestorer {
  ~DefaultDTypeRestorer() { set_default_dtype(DType::f32); }
};

}  // namespace

TEST_CASE("DefaultMeshScope: distribute_tensor, from_local, the factories and local_map may omit the mesh") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Array a = counting({5, 2});  // 5 rows: 2, 2, 1 over three devices; 3, 2 over two
    {
      DefaultMeshScope scope(mesh);
      REQUIRE(default_mesh().has_value());
      CHECK(*default_mesh() == mesh);
      Tensor t = distribute_tensor(a, rows(mesh));
      CHECK(t.device_mesh() == mesh);
      CHECK(t.placements() == rows(mesh));
      CHECK(same_array(t.full_tensor(), a));
      CHECK(distribute_tensor(a).placements() == replicated(mesh));  // PyTorch's default: Replicate
      // from_local: every device contributes a (2, 2) block of a (2 * shards, 2) tensor.
      Tensor local = from_local(counting({2, 2}), rows(mesh));
      CHECK(local.device_mesh() == mesh);
      CHECK(local.shape() == std::vector<int64_t>{2 * mesh.shape()[0], 2});
      // Empty Mesh{} handles mean the default too.
      CHECK(distribute_tensor(a, Mesh{}, rows(mesh)).device_mesh() == mesh);
      for (const Tensor& f : {zeros({5, 2}, rows(mesh)), ones({5, 2}, rows(mesh)), full({5, 2}, 3.0, rows(mesh)),
                              empty({5, 2}, rows(mesh)), rand({5, 2}, rows(mesh)), randn({5, 2}, rows(mesh))}) {
        CHECK(f.device_mesh() == mesh);
        CHECK(f.placements() == rows(mesh));
        CHECK(f.dtype() == DType::f32);
      }
      CHECK(full({5, 2}, 3.0, rows(mesh)).full_tensor().to_vector<float>() == std::vector<float>(10, 3.0f));
      // local_map with no tensor argument and no mesh: the scope's.
      Tensor coordinates = local_map([]() { return reshape(cast(axis_index("x"), DType::f32), {1}); }, {rows(mesh)})();
      CHECK(coordinates.device_mesh() == mesh);
      CHECK(coordinates.shape() == std::vector<int64_t>{mesh.shape()[0]});
      // Scopes nest: the innermost wins, and the outer one is back when it closes.
      {
        Mesh inner = create_mesh({{"z", 2}});
        DefaultMeshScope nested(inner);
        CHECK(zeros({4}).device_mesh() == inner);
      }
      CHECK(zeros({4}).device_mesh() == mesh);
      // Nothing moves: the factories and distribute_tensor make each device's block directly.
      CommDebugMode comm;
      (void)unpack(zeros({5, 2}, rows(mesh)) + distribute_tensor(a, rows(mesh)));
      CHECK(comm.get_total_counts() == 0);
    }
    CHECK_FALSE(default_mesh().has_value());
    CHECK_THROWS_WITH_AS(distribute_tensor(a, rows(mesh)), doctest::Contains("distribute_tensor: no mesh given and no DefaultMeshScope"),
                         MeshError);
    CHECK_THROWS_WITH_AS(from_local(a, rows(mesh)), doctest::Contains("from_local: no mesh given"), MeshError);
    CHECK_THROWS_WITH_AS(zeros({5, 2}, rows(mesh)), doctest::Contains("zeros: no mesh given"), MeshError);
    CHECK_THROWS_WITH_AS(randn({5, 2}), doctest::Contains("randn: no mesh given"), MeshError);
  }
  CHECK_THROWS_AS(DefaultMeshScope(Mesh{}), MeshError);
}

TEST_CASE("jit traces again when the default mesh or the default dtype changes: what fn's factories make depends on them") {
  DefaultDTypeRestorer restore;
  auto step = jit([](const Tensor& x) { return x + reduce_sum(ones({3})); });
  Mesh one = create_mesh({{"x", 1}}), three = create_mesh({{"x", 3}});
  Tensor x1 = distribute_tensor(counting({1}), one), x3 = distribute_tensor(counting({1}), three);
  {
    DefaultMeshScope scope(one);
    CHECK(step(x1).full_tensor().to_vector<float>() == std::vector<float>{3});
  }
  {
    DefaultMeshScope scope(three);
    Tensor y = step(x3);  // a trace made under `one` would mix meshes
    CHECK(y.device_mesh() == three);
    CHECK(y.full_tensor().to_vector<float>() == std::vector<float>{3});
    set_default_dtype(DType::f64);
    Tensor wide = step(distribute_tensor(Array::from<double>({1.0}, {1}), three));
    CHECK(wide.dtype() == DType::f64);
    CHECK(wide.full_tensor().to_vector<double>() == std::vector<double>{4});
  }
}

TEST_CASE("set_default_dtype: factories, random tensors, layers and two-scalar ops follow it; integers are a DTypeError") {
  DefaultDTypeRestorer restore;
  CHECK(default_dtype() == DType::f32);
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    set_default_dtype(DType::f64);
    const Layout layout = Layout::from_placements(mesh, rows(mesh), 2);
    for (const Tensor& f : {zeros({5, 2}, mesh, rows(mesh)), ones({5, 2}, layout), full({5, 2}, 0.1, mesh), rand({5, 2}, mesh),
                            randn({5, 2}, mesh, rows(mesh)), random_uniform({5, 2}, 7, layout), random_normal({5, 2}, 7, layout)}) {
      CHECK(f.dtype() == DType::f64);
    }
    // 0.1 in f64, not f32's 0.100000001.
    CHECK(full({1}, 0.1, mesh).full_tensor().to_vector<double>() == std::vector<double>{0.1});
    // The same seed gives the same values under every layout, at the new dtype too.
    CHECK(same_array(random_uniform({5, 2}, 7, layout).full_tensor(),
                     random_uniform({5, 2}, 7, Layout::replicated(mesh, 2)).full_tensor()));
    Tensor condition = distribute_tensor(Array::from<uint8_t>({1, 0}, {2}), mesh);
    CHECK(where(condition, 1.5, 2.5).dtype() == DType::f64);
    CHECK(where(condition, 1, 2).dtype() == DType::i64);  // integers stay int64, as in PyTorch
    Dense layer(4, 3, Layout::replicated(mesh, 2), 1);
    CHECK(layer.get_parameter("weight").value().dtype() == DType::f64);
    set_default_dtype(DType::bf16);
    CHECK(zeros({2}, mesh).dtype() == DType::bf16);
    CHECK(zeros({2}, mesh, {}, DType::f32).dtype() == DType::f32);  // an explicit dtype wins
    set_default_dtype(DType::f32);
    CHECK(zeros({2}, mesh).dtype() == DType::f32);
  }
  CHECK_THROWS_WITH_AS(set_default_dtype(DType::i32), doctest::Contains("set_default_dtype: int32 is not a floating dtype"), DTypeError);
  CHECK_THROWS_AS(set_default_dtype(DType::u8), DTypeError);
  CHECK(default_dtype() == DType::f32);
}

TEST_CASE("from_local takes PyTorch's stride when it is the contiguous one; any other is a LayoutError naming both") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const int64_t shards = mesh.shape()[0];
    Tensor t = from_local(counting({2, 3}), mesh, rows(mesh), std::vector<int64_t>{2 * shards, 3}, false, std::vector<int64_t>{3, 1});
    CHECK(t.shape() == std::vector<int64_t>{2 * shards, 3});
    CHECK(t.placements() == rows(mesh));
    // Without a global shape the stride is checked against the inferred one.
    CHECK(from_local(counting({2, 3}), mesh, rows(mesh), std::nullopt, false, std::vector<int64_t>{3, 1}).shape()[0] == 2 * shards);
    // A size-0 axis counts as 1, as PyTorch's contiguous strides do.
    CHECK(from_local(Array({2, 0, 3}, DType::f32), mesh, rows(mesh), std::nullopt, false, std::vector<int64_t>{3, 3, 1}).shape()[1] == 0);
    const std::string message = "stride (1, " + std::to_string(2 * shards) + ") is not the contiguous stride (3, 1)";
    CHECK_THROWS_WITH_AS(from_local(counting({2, 3}), mesh, rows(mesh), std::nullopt, false, std::vector<int64_t>{1, 2 * shards}),
                         doctest::Contains(message.c_str()), LayoutError);
    CHECK_THROWS_AS(from_local(counting({2, 3}), mesh, rows(mesh), std::nullopt, false, std::vector<int64_t>{3}), LayoutError);
  }
}

TEST_CASE("redistribute takes async_op: the same value, placements and collectives either way (Tessera is lazy)") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Array a = counting({5, 2});
    Tensor t = distribute_tensor(a, mesh, rows(mesh));
    for (bool async_op : {true, false}) {
      CAPTURE(async_op);
      Tensor r = t.redistribute(replicated(mesh), async_op);
      CHECK(r.placements() == replicated(mesh));
      CommDebugMode comm;
      (void)unpack(r);
      CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 1}});
      CHECK(same_array(r.full_tensor(), a));
      Tensor s = t.redistribute(mesh, replicated(mesh), async_op);
      CHECK(s.placements() == replicated(mesh));
      CHECK(same_array(s.full_tensor(), a));
    }
  }
}
