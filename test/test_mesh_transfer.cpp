// Redistribute between two meshes: 4 devices to 2, one half of the devices to the other (as
// pipeline stages do), onto the same devices arranged differently (only the bytes that change
// device move), Partial sources, gradients back to the source mesh, and the typed errors.
#include <doctest/doctest.h>

#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Array counting(const std::vector<int64_t>& shape) {
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i) * 0.5f - 3.0f;
  return a;
}

}  // namespace

TEST_CASE("a 4-device mesh to a 2-device mesh and back, every placement pair") {
  Mesh four = create_mesh({{"x", 4}}), two = create_mesh({{"y", 2}}, {"CPU:4", "CPU:5"});
  const Array a = counting({7, 6});  // uneven over 4
  for (Placement from : {Placement{Shard{0}}, Placement{Shard{1}}, Placement{Replicate{}}})
    for (Placement to : {Placement{Shard{0}}, Placement{Shard{1}}, Placement{Replicate{}}}) {
      CAPTURE(placement_string(from));
      CAPTURE(placement_string(to));
      Tensor x = distribute_tensor(a, four, {from});
      Tensor y = x.redistribute(two, {to});
      CHECK(y.device_mesh() == two);
      CHECK(y.placements() == std::vector<Placement>{to});
      CHECK(same_array(y.full_tensor(), a));
      CHECK(same_array(relayout(y, Layout::from_placements(four, {from}, 2)).full_tensor(), a));
    }
}

TEST_CASE("pipeline halves: stage 0's activations move to stage 1's devices, gradients come back") {
  Mesh stage0 = create_mesh({{"dp", 2}}, {"CPU:0", "CPU:1"}), stage1 = create_mesh({{"dp", 2}}, {"CPU:2", "CPU:3"});
  const Array a = counting({4, 3});
  Tensor x = distribute_tensor(a, stage0, {Shard{0}});
  Tensor h = tanh(x);                                    // stage 0
  Tensor moved = h.redistribute(stage1, {Shard{0}});
  Tensor loss = reduce_sum(square(moved) * 3.0f);        // stage 1
  std::map<const Node*, Array> leaves{{x.node().get(), a}};
  CHECK(compare_with_reference(Tensor(loss).full_tensor(), reference_eval(loss, leaves), 1e-5) == "");
  Tensor g = gradients(loss, {x})[0];
  CHECK(g.device_mesh() == stage0);
  CHECK(g.placements() == std::vector<Placement>{Shard{0}});
  Array got = g.full_tensor();
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double t = std::tanh(double(a.data<float>()[i]));
    CHECK(got.data<float>()[i] == doctest::Approx(6.0 * t * (1 - t * t)).epsilon(1e-5));
  }
}

TEST_CASE("onto the same devices arranged differently: only regions that change device move") {
  Mesh line = create_mesh({{"x", 4}}), square_mesh = create_mesh({{"a", 2}, {"b", 2}});  // CPU:0..3 both
  const Array a = counting({8, 4});
  {
    CommDebugMode comm;
    Tensor y = distribute_tensor(a, line, {Shard{0}}).redistribute(square_mesh, {Shard{0}, Replicate{}});
    (void)y.components();
    // Each device of the 2x2 mesh holds 4 rows, 2 of which it already held: 4 devices x 2 rows x 4 floats.
    CHECK(comm.bytes_by_kind().at("mesh_transfer") == 4 * 2 * 4 * 4);
    CHECK(same_array(y.full_tensor(), a));
  }
  {
    CommDebugMode comm;
    Tensor y = distribute_tensor(a, line, {Replicate{}}).redistribute(square_mesh, {Shard{1}, Shard{0}});
    (void)y.components();
    CHECK(comm.bytes_by_kind().at("mesh_transfer") == 0);  // every device already holds its block
    CHECK(same_array(y.full_tensor(), a));
  }
}

TEST_CASE("partial values are reduced before they move; a partial target splits them again") {
  Mesh four = create_mesh({{"x", 4}}), two = create_mesh({{"y", 2}}, {"CPU:4", "CPU:5"});
  const Array a = counting({4, 4});
  Tensor x = distribute_tensor(a, four, {Shard{1}});
  Tensor partial = relayout(x * 2.0f, Layout::from_placements(four, {Partial{}}, 2));
  Tensor y = partial.redistribute(two, {Partial{}});
  CHECK(y.placements() == std::vector<Placement>{Partial{}});
  Array want = (distribute_tensor(a, four, {Replicate{}}) * 2.0f).full_tensor();
  CHECK(same_array(y.full_tensor(), want));
}

TEST_CASE("redistribute between meshes: errors") {
  Mesh four = create_mesh({{"x", 4}}), two = create_mesh({{"y", 2}}, {"CPU:4", "CPU:5"});
  Tensor x = distribute_tensor(counting({4, 4}), four, {Shard{0}});
  CHECK_THROWS_AS(relayout(x, Layout::from_placements(two, {Shard{0}}, 1)), LayoutError);  // wrong rank
  CHECK_THROWS_AS(x.redistribute(two, {Shard{0}, Shard{1}}), LayoutError);               // 2 placements, 1-dim mesh
  auto step = jit([&](const Tensor& t) { return t.redistribute(two, {Shard{0}}) * 2.0f; });
  CHECK_THROWS_WITH_AS(step(x), doctest::Contains("cannot be traced"), LayoutError);
}

TEST_CASE("unpack and to_local of a tensor moved onto the same devices arranged as 2x2, gradients included") {
  Mesh line = create_mesh({{"x", 4}}), square_mesh = create_mesh({{"a", 2}, {"b", 2}});
  const Array a = counting({7, 4});  // uneven over 4 (2, 2, 2, 1) and over 2 (4, 3)
  const std::vector<std::vector<Placement>> targets = {
      {Replicate{}, Shard{0}}, {Shard{0}, Replicate{}}, {Shard{1}, Shard{0}}, {Replicate{}, Replicate{}}, {Shard{0}, Shard{0}}};
  for (Placement from : {Placement{Shard{0}}, Placement{Shard{1}}, Placement{Replicate{}}})
    for (const auto& to : targets) {
      CAPTURE(placement_string(from));
      CAPTURE(placement_string(to[0]) + placement_string(to[1]));
      Tensor x = distribute_tensor(a, line, {from});
      Tensor y = x.redistribute(square_mesh, to);
      const Layout layout = Layout::from_placements(square_mesh, to, 2);
      const std::vector<Array> parts = unpack(y);
      REQUIRE(parts.size() == 4);
      const auto coords = coords_of(square_mesh);
      for (size_t d = 0; d < parts.size(); ++d) CHECK(same_array(parts[d], reference_component(a, layout, coords[d])));
      CHECK(same_array(y.to_local(), reference_component(a, layout, coords[0])));
      CHECK(same_array(y.full_tensor(), a));
      // The gradient comes back to the line mesh in x's layout.
      Tensor g = gradients(reduce_sum(square(y)), {x})[0];
      CHECK(g.device_mesh() == line);
      CHECK(g.placements() == std::vector<Placement>{from});
      const std::vector<float> got = g.full_tensor().to_vector<float>();
      for (int64_t i = 0; i < a.numel(); ++i) CHECK(got[size_t(i)] == 2 * a.data<float>()[i]);
    }
}
