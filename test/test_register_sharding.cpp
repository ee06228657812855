// register_sharding: the PyTorch reference's softmax strategies (replicate, or shard any dim but
// the softmax dim), chosen by the cost of moving the input; values against the reference
// evaluator, gradients through the chosen layouts, and the typed errors of ill-fitting strategies.
#include <doctest/doctest.h>

#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// The reference's custom_softmax_sharding, on a mesh of any rank (one placement per mesh dim).
std::vector<ShardingStrategy> custom_softmax_sharding(const ShardingCall& call) {
  const int64_t softmax_dim = call.axes.at(0), ndim = int64_t(call.input_shapes.at(0).size());
  auto all = [&](Placement p) { return std::vector<Placement>(size_t(call.mesh.ndim()), p); };
  std::vector<ShardingStrategy> acceptable{{all(Replicate{}), {all(Replicate{})}}};
  for (int64_t sharding_dim = 0; sharding_dim < ndim; ++sharding_dim)
    if (sharding_dim != softmax_dim) acceptable.push_back({all(Shard{sharding_dim}), {all(Shard{sharding_dim})}});
  return acceptable;
}

// Registered for the test's lifetime only.
struct Registered {
  std::string op;
  Registered(std::string name, ShardingStrategyFn fn) : op(std::move(name)) { register_sharding(op, std::move(fn)); }
  ~Registered() { deregister_sharding(op); }
};

Array random_f32(const std::vector<int64_t>& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2, 2);
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = dist(rng);
  return a;
}

}  // namespace

TEST_CASE("the reference's softmax strategies: the cheapest is chosen, and the softmax dim is never split") {
  Mesh mesh = create_mesh({{"x", 4}});
  Array a = random_f32({8, 12}, 1);
  Tensor x = distribute_tensor(a, mesh, {Shard{1}});  // sharded along the softmax dim
  std::map<std::string, int64_t> built_in;
  {
    CommDebugMode comm;
    Tensor y = softmax(x, 1);
    (void)y.full_tensor();
    built_in = comm.get_comm_counts();
  }
  CHECK(built_in.count("all_reduce") == 1);  // the built-in rule reduces max and sum across devices

  Registered r("softmax", custom_softmax_sharding);
  CommDebugMode comm;
  Tensor y = softmax(x, 1);
  CHECK(y.placements() == std::vector<Placement>{Shard{0}});  // all_to_all beats all_gather
  std::map<const Node*, Array> leaves{{x.node().get(), a}};
  CHECK(compare_with_reference(y.full_tensor(), reference_eval(y, leaves), 1e-5) == "");
  CHECK(comm.get_comm_counts().count("all_reduce") == 0);
  CHECK(comm.get_comm_counts().at("all_to_all") == 1);

  // Already sharded on another dim: that strategy costs nothing.
  Tensor rows = distribute_tensor(a, mesh, {Shard{0}});
  CommDebugMode quiet;
  Tensor z = softmax(rows, -1);
  CHECK(z.placements() == std::vector<Placement>{Shard{0}});
  (void)z.components();  // computed where it lies (full_tensor would gather)
  CHECK(quiet.get_total_counts() == 0);
}

TEST_CASE("a registered strategy on a 2-D mesh steers gradients too, and deregistering restores the rule") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Array a = random_f32({4, 6}, 2);
  Tensor x = distribute_tensor(a, mesh, {Shard{1}, Replicate{}});
  Tensor unregistered_grad = gradients(reduce_sum(square(softmax(x, 1))), {x})[0];
  {
    Registered r("softmax", custom_softmax_sharding);
    Tensor y = softmax(x, 1);
    CHECK(y.placements() == std::vector<Placement>{Shard{0}, Shard{0}});
    Tensor g = gradients(reduce_sum(square(y)), {x})[0];
    CHECK(g.placements() == x.placements());
    CHECK(compare_with_reference(g.full_tensor(), ref_from_array(unregistered_grad.full_tensor()), 1e-5) == "");
  }
  CHECK(softmax(x, 1).placements() == x.placements());
}

TEST_CASE("matmul strategies: a row-sharded product when the operands are offered so") {
  Mesh mesh = create_mesh({{"x", 2}});
  Registered r("matmul", [](const ShardingCall&) {
    return std::vector<ShardingStrategy>{{{Shard{0}}, {{Shard{0}}, {Replicate{}}}}};
  });
  Array a = random_f32({6, 4}, 3), b = random_f32({4, 5}, 4);
  Tensor ta = distribute_tensor(a, mesh, {Shard{1}}), tb = distribute_tensor(b, mesh, {Shard{0}});
  Tensor c = matmul(ta, tb);
  CHECK(c.placements() == std::vector<Placement>{Shard{0}});
  std::map<const Node*, Array> leaves{{ta.node().get(), a}, {tb.node().get(), b}};
  CHECK(compare_with_reference(c.full_tensor(), reference_eval(c, leaves), 1e-5) == "");
}

TEST_CASE("strategies that do not fit the call are typed errors naming the op") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = distribute_tensor(random_f32({4, 6}, 5), mesh, {Shard{0}});
  {
    Registered r("exp", [](const ShardingCall&) { return std::vector<ShardingStrategy>{}; });
    CHECK_THROWS_WITH_AS(exp(x), doctest::Contains("exp offered no strategy"), LayoutError);
  }
  {
    Registered r("exp", [](const ShardingCall&) {
      return std::vector<ShardingStrategy>{{{Shard{0}, Replicate{}}, {{Shard{0}, Replicate{}}}}};
    });
    CHECK_THROWS_WITH_AS(exp(x), doctest::Contains("2 placements for a 1-dim mesh"), LayoutError);
  }
  {
    Registered r("exp", [](const ShardingCall&) { return std::vector<ShardingStrategy>{{{Shard{5}}, {{Shard{0}}}}}; });
    CHECK_THROWS_WITH_AS(exp(x), doctest::Contains("on dim 5"), LayoutError);
  }
  {
    Registered r("tanh", [](const ShardingCall&) { return std::vector<ShardingStrategy>{{{Shard{0}}, {}}}; });
    CHECK_THROWS_WITH_AS(tanh(x), doctest::Contains("0 input placements for 1 tensor inputs"), LayoutError);
  }
  CHECK_THROWS_AS(register_sharding("exp", ShardingStrategyFn{}), Error);
}
