// The dropless mixture of experts of nn/moe.hpp: the router's choices, forward and gradients
// against a dense computation (every expert on every token, weighted by the routing), on one
// device and with experts over ep = 2 and 4 and dp x ep meshes (uneven loads, an expert with no
// token, every token to the same experts), its collectives, the balancing loss and bias, and a
// MoE Transformer's training losses bitwise equal across ep layouts under TESSERA_DETERMINISTIC=1;
// the capacity-factor mode's drops against the same dense computation with the dropped weights zero.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <tessera/tessera.hpp>

#include "dsl/memory_counter.hpp"

using namespace tessera;

namespace {

TransformerConfig moe_config(int64_t experts = 4, int64_t top_k = 2) {
  TransformerConfig c;
  c.name = "test-moe";
  c.vocab = 13, c.dim = 8, c.layers = 2, c.heads = 2, c.kv_heads = 1, c.hidden = 16, c.max_seq = 8, c.seed = 3;
  c.moe = MoEConfig{.num_experts = experts, .top_k = top_k, .num_shared_experts = 1, .expert_hidden = 6, .first_dense_layers = 1};
  return c;
}

Array random_array(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  Array a(std::move(shape), DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = normal(rng);
  return a;
}

Array ids_array(int64_t batch, int64_t time, uint32_t seed) {
  std::mt19937 rng(seed);
  Array a({batch, time}, DType::i32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<int32_t>()[i] = int32_t(rng() % 13);
  return a;
}

std::vector<float> values(const Tensor& t) { return t.full_tensor().to_vector<float>(); }

// Every expert on every token, weighted by how much the routing gives it: what dropless routing
// must equal, built from plain matmuls on global tensors.
Tensor dense_experts(const Tensor& tokens, const Routing& routing, const Module& experts, int64_t num_experts) {
  const Tensor w1 = experts.parameter_value("w1"), w2 = experts.parameter_value("w2"), w3 = experts.parameter_value("w3");
  const int64_t d = w1.shape()[1], f = w1.shape()[2];
  std::optional<Tensor> y;
  for (int64_t e = 0; e < num_experts; ++e) {
    auto expert = [&](const Tensor& w, int64_t rows, int64_t cols) { return reshape(slice(w, {e, 0, 0}, {1, rows, cols}), {rows, cols}); };
    const Tensor out = matmul(silu(matmul(tokens, expert(w1, d, f))) * matmul(tokens, expert(w3, d, f)), expert(w2, f, d));
    const Tensor weight = reduce_sum(where(routing.experts == int64_t(e), routing.weights, 0.0), {1});
    const Tensor term = out * expand_dims(weight, -1);
    y = y ? *y + term : term;
  }
  return *y;
}

// The MoE layer of moe_config() alone, placed on `mesh` with experts over ep if it has one.
struct Layer {
  std::shared_ptr<MoE> moe;
  Layer(const TransformerConfig& c, const Mesh& mesh) : moe(std::make_shared<MoE>(c, mesh, 11)) {
    if (mesh.contains_dim("ep")) moe->parallelize_experts(mesh, "ep");
  }
};

std::vector<Placement> token_placements(const Mesh& mesh) {
  std::vector<Placement> p(size_t(mesh.ndim()), Replicate{});
  for (int64_t d = 0; d < mesh.ndim(); ++d)
    if (mesh.dim_names()[size_t(d)] == "dp" || mesh.dim_names()[size_t(d)] == "ep") p[size_t(d)] = Shard{0};
  return p;
}

struct Outcome {
  std::vector<float> y, dx, dw1, dw2, drouter;
};

// Forward and gradients of sum(y * g) for tokens [n, 8] on `mesh`; `bias` set on the expert bias.
Outcome run_layer(const TransformerConfig& c, const Mesh& mesh, int64_t n, const std::vector<float>& bias = {}) {
  Layer layer(c, mesh);
  if (!bias.empty()) layer.moe->expert_bias().assign(distribute_tensor(Array::from<float>(bias, {int64_t(bias.size())}), mesh));
  const Tensor x = distribute_tensor(random_array({n, c.dim}, 5), mesh, token_placements(mesh));
  const Tensor g = distribute_tensor(random_array({n, c.dim}, 6), mesh, token_placements(mesh));
  const Tensor y = (*layer.moe)(x);
  const Module& experts = layer.moe->get_submodule("experts");
  const auto grads = gradients(reduce_sum(y * g), {x, experts.parameter_value("w1"), experts.parameter_value("w2"),
                                                   layer.moe->parameter_value("router")});
  return {values(y), values(grads[0]), values(grads[1]), values(grads[2]), values(grads[3])};
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double eps = 1e-4) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(eps));
}

// A layout's forward and gradients against one device's.
void check_outcome(const Outcome& got, const Outcome& want) {
  check_close(got.y, want.y, 1e-5);
  check_close(got.dx, want.dx, 1e-4);
  check_close(got.dw1, want.dw1, 1e-4);
  check_close(got.dw2, want.dw2, 1e-4);
  check_close(got.drouter, want.drouter, 1e-4);
}

}  // namespace

TEST_CASE("the router picks the top-k scores (+ the balancing bias), ties to the lower expert, weights from the scores") {
  const Mesh mesh = create_mesh({{"x", 1}});
  TransformerConfig c = moe_config();
  c.moe->num_shared_experts = 0;
  MoE moe(c, mesh, 1);
  // Router = identity on the first 4 dims: token scores are softmax of its first 4 features.
  std::vector<float> router(8 * 4, 0.0f);
  for (int64_t e = 0; e < 4; ++e) router[size_t(e * 4 + e)] = 1.0f;
  moe.set_parameter("router", Variable(distribute_tensor(Array::from<float>(router, {8, 4}), mesh)));
  std::vector<float> tokens(3 * 8, 0.0f);
  tokens[0 * 8 + 2] = 3, tokens[0 * 8 + 0] = 1;  // token 0: experts 2 then 0
  tokens[1 * 8 + 1] = 2, tokens[1 * 8 + 3] = 2;  // token 1: a tie of 1 and 3, then 0 and 2 tied below
  tokens[2 * 8 + 3] = 5;                         // token 2: 3, then the three tied at 0: expert 0
  const Routing r = moe.route(distribute_tensor(Array::from<float>(tokens, {3, 8}), mesh));
  CHECK(r.experts.full_tensor().to_vector<int64_t>() == std::vector<int64_t>{2, 0, 1, 3, 3, 0});
  CHECK(r.load.full_tensor().to_vector<int64_t>() == std::vector<int64_t>{2, 1, 1, 2});
  const std::vector<float> w = values(r.weights), s = values(r.scores);
  CHECK(w[0] == doctest::Approx(std::exp(3.0) / (std::exp(3.0) + std::exp(1.0) + 2)));
  CHECK(w[0] == s[2]);
  // The bias steers the choice, not the weights.
  moe.expert_bias().assign(distribute_tensor(Array::from<float>({0, 0, 0, 10}, {4}), mesh));
  const Routing biased = moe.route(distribute_tensor(Array::from<float>(tokens, {3, 8}), mesh));
  CHECK(biased.experts.full_tensor().to_vector<int64_t>() == std::vector<int64_t>{3, 2, 3, 1, 3, 0});
  CHECK(values(biased.weights)[0] == s[3]);
  // normalize_top_k and sigmoid scores.
  c.moe->normalize_top_k = true, c.moe->score = RouterScore::Sigmoid;
  MoE sigmoid_moe(c, mesh, 1);
  sigmoid_moe.set_parameter("router", Variable(distribute_tensor(Array::from<float>(router, {8, 4}), mesh)));
  const Routing n = sigmoid_moe.route(distribute_tensor(Array::from<float>(tokens, {3, 8}), mesh));
  const std::vector<float> nw = values(n.weights);
  const double s2 = 1 / (1 + std::exp(-3.0)), s0 = 1 / (1 + std::exp(-1.0));
  CHECK(nw[0] == doctest::Approx(s2 / (s2 + s0)));
  CHECK(nw[0] + nw[1] == doctest::Approx(1.0));
}

TEST_CASE("dropless MoE equals every expert on every token weighted by the routing: values and gradients, one device") {
  const Mesh mesh = create_mesh({{"x", 1}});
  TransformerConfig c = moe_config();
  c.moe->num_shared_experts = 0;
  MoE moe(c, mesh, 11);
  const Tensor x = distribute_tensor(random_array({10, 8}, 5), mesh);
  const Tensor g = distribute_tensor(random_array({10, 8}, 6), mesh);
  const Module& experts = moe.get_submodule("experts");
  const std::vector<Tensor> wrt = {x, experts.parameter_value("w1"), experts.parameter_value("w2"), experts.parameter_value("w3"),
                                   moe.parameter_value("router")};
  const Tensor y = moe(x);
  const Tensor want = dense_experts(x, moe.route(x), experts, 4);
  check_close(values(y), values(want), 1e-5);
  const auto got_grads = gradients(reduce_sum(y * g), wrt), want_grads = gradients(reduce_sum(want * g), wrt);
  for (size_t i = 0; i < wrt.size(); ++i) {
    CAPTURE(i);
    check_close(values(got_grads[i]), values(want_grads[i]), 1e-4);
  }
}

TEST_CASE("shared experts run on every token beside the routed ones: a SwiGLU of num_shared x expert_hidden added to them") {
  const Mesh mesh = create_mesh({{"x", 1}});
  TransformerConfig c = moe_config();
  c.moe->num_shared_experts = 2;
  MoE moe(c, mesh, 11);
  const Tensor x = distribute_tensor(random_array({10, 8}, 5), mesh);
  const Tensor g = distribute_tensor(random_array({10, 8}, 6), mesh);
  const Module& experts = moe.get_submodule("experts");
  // The block projections hold [in, out]: y = x W. Two shared experts are one of twice the hidden size.
  auto linear = [&](const std::string& name, const Tensor& in) { return matmul(in, moe.parameter_value(name)); };
  // parameter_value reaches a child's parameter by its path, as get_parameter does.
  CHECK(moe.parameter_value("shared_experts.w1.weight").shape() == std::vector<int64_t>{8, 12});
  CHECK(values(moe.parameter_value("shared_experts.w1.weight")) == values(moe.get_submodule("shared_experts.w1").parameter_value("weight")));
  const Tensor shared = linear("shared_experts.w2.weight", silu(linear("shared_experts.w1.weight", x)) * linear("shared_experts.w3.weight", x));
  const Tensor want = dense_experts(x, moe.route(x), experts, 4) + shared;
  const Tensor y = moe(x);
  check_close(values(y), values(want), 1e-5);
  const std::vector<Tensor> wrt = {x, moe.parameter_value("shared_experts.w1.weight"), moe.parameter_value("shared_experts.w2.weight"),
                                   moe.parameter_value("shared_experts.w3.weight"), experts.parameter_value("w1")};
  const auto got_grads = gradients(reduce_sum(y * g), wrt), want_grads = gradients(reduce_sum(want * g), wrt);
  for (size_t i = 0; i < wrt.size(); ++i) {
    CAPTURE(i);
    check_close(values(got_grads[i]), values(want_grads[i]), 1e-4);
  }
}

TEST_CASE("expert parallelism over ep = 2 and 4 and dp x ep gives one device's values and gradients, uneven loads included") {
  const int64_t n = 16;
  struct Case {
    std::string name;
    std::vector<float> bias;
    int64_t top_k = 2;
  };
  for (const Case& routing : {Case{"uneven loads", {}}, Case{"expert 3 gets no token", {0, 0, 0, -100}},
                              Case{"every token to experts 0 and 1", {100, 100, 0, 0}},
                              Case{"every token to expert 0 alone (top 1): the other devices' experts receive nothing", {100, 0, 0, 0}, 1}}) {
    CAPTURE(routing.name);
    const TransformerConfig c = moe_config(4, routing.top_k);
    const Outcome reference = run_layer(c, create_mesh({{"x", 1}}), n, routing.bias);
    // dp=3: 16 tokens split 6, 5, 5 (gathered for the dispatch).
    for (const Mesh& mesh : {create_mesh({{"ep", 2}}), create_mesh({{"ep", 4}}), create_mesh({{"dp", 2}, {"ep", 2}}), create_mesh({{"dp", 3}})}) {
      CAPTURE(mesh.to_string());
      check_outcome(run_layer(c, mesh, n, routing.bias), reference);
    }
  }
}

TEST_CASE("tokens that do not split evenly over ep: padded rows dispatch nothing, one device's values and gradients") {
  const TransformerConfig c = moe_config();
  // 15 tokens: 8 and 7 over ep=2, 4, 4, 4, 3 over ep=4; dp=2 x ep=2 gathers them over dp first.
  const Outcome reference = run_layer(c, create_mesh({{"x", 1}}), 15);
  for (const Mesh& mesh : {create_mesh({{"ep", 2}}), create_mesh({{"ep", 4}}), create_mesh({{"dp", 2}, {"ep", 2}})}) {
    CAPTURE(mesh.to_string());
    check_outcome(run_layer(c, mesh, 15), reference);
  }
}

TEST_CASE("capacity-factor mode drops what an expert receives past its capacity, first choices first, the same on every layout") {
  TransformerConfig c = moe_config();
  c.moe->num_shared_experts = 0;
  c.moe->capacity_factor = 1.0;
  const Mesh one = create_mesh({{"x", 1}});
  const int64_t n = 16, k = 2, experts = 4;
  struct Case {
    std::string name;
    std::vector<float> bias;
    std::vector<Mesh> meshes;  // the layouts checked against one device
  };
  for (const Case& routing_case : {Case{"uneven loads", {}, {create_mesh({{"ep", 2}}), create_mesh({{"dp", 3}})}},
                                   Case{"every token to experts 0 and 1", {100, 100, 0, 0}, {create_mesh({{"dp", 2}, {"ep", 2}})}}}) {
    CAPTURE(routing_case.name);
    MoE moe(c, one, 11);
    if (!routing_case.bias.empty()) moe.expert_bias().assign(distribute_tensor(Array::from<float>(routing_case.bias, {experts}), one));
    const int64_t capacity = moe.expert_capacity(n);
    CHECK(capacity == 8);  // ceil(1.0 x 16 tokens x 2 / 4 experts)
    const Tensor x = distribute_tensor(random_array({n, c.dim}, 5), one);
    const Tensor g = distribute_tensor(random_array({n, c.dim}, 6), one);
    const Routing routing = moe.route(x);
    // What runs, worked out here: first choices of every token, then second ones, in token order.
    const std::vector<int64_t> chosen = routing.experts.full_tensor().to_vector<int64_t>();
    std::vector<int64_t> kept(size_t(n * k), 0), taken(size_t(experts), 0);
    for (int64_t slot = 0; slot < k; ++slot)
      for (int64_t token = 0; token < n; ++token) {
        const size_t a = size_t(token * k + slot);
        if (taken[size_t(chosen[a])] < capacity) kept[a] = 1, ++taken[size_t(chosen[a])];
      }
    REQUIRE(routing.kept);
    CHECK(routing.kept->full_tensor().to_vector<int64_t>() == kept);
    const int64_t running = std::count(kept.begin(), kept.end(), int64_t(1));
    if (routing_case.bias.empty()) CHECK(running > 16);
    else CHECK(running == 16);  // experts 0 and 1 run 8 each; the other 16 assignments are dropped
    // Against every expert on every token, weighted by the routing with the dropped weights zero.
    Routing masked = routing;
    masked.weights = routing.weights * cast(*routing.kept, DType::f32);
    const Module& weights = moe.get_submodule("experts");
    const std::vector<Tensor> wrt = {x, weights.parameter_value("w1"), weights.parameter_value("w2"), moe.parameter_value("router")};
    const Tensor y = moe(x), want = dense_experts(x, masked, weights, experts);
    check_close(values(y), values(want), 1e-5);
    const auto got_grads = gradients(reduce_sum(y * g), wrt), want_grads = gradients(reduce_sum(want * g), wrt);
    for (size_t i = 0; i < wrt.size(); ++i) {
      CAPTURE(i);
      check_close(values(got_grads[i]), values(want_grads[i]), 1e-4);
    }
    // The same drops on every layout: decided on the global routing, not per device.
    const Outcome reference = run_layer(c, one, n, routing_case.bias);
    check_close(reference.y, values(y), 1e-6);
    for (const Mesh& mesh : routing_case.meshes) {
      CAPTURE(mesh.to_string());
      check_outcome(run_layer(c, mesh, n, routing_case.bias), reference);
    }
  }
  TransformerConfig bad = moe_config();
  bad.moe->capacity_factor = -1;
  CHECK_THROWS_WITH_AS(MoE(bad, one, 1), doctest::Contains("moe.capacity_factor must be 0 (dropless) or positive"), Error);
}

TEST_CASE("expert parallelism moves tokens with two all_to_all_v per layer and the counts with one all_to_all") {
  const TransformerConfig c = moe_config();
  const Mesh mesh = create_mesh({{"ep", 2}});
  Layer layer(c, mesh);
  CHECK(layer.moe->get_submodule("experts").get_parameter("w1").value().placements() == std::vector<Placement>{Shard{0}});
  const Tensor x = distribute_tensor(random_array({16, 8}, 5), mesh, {Shard{0}});
  CommDebugMode comm;
  const Tensor y = (*layer.moe)(x);
  CHECK(y.placements() == std::vector<Placement>{Shard{0}});
  (void)y.to_local();
  CAPTURE(comm.generate_comm_debug_tracing_table());
  const std::map<std::string, int64_t> counts = comm.get_comm_counts();
  CHECK(counts.at("all_to_all_v") == 2);
  CHECK(counts.at("all_to_all") == 1);
  CHECK(counts.at("all_gather") == 2);  // each all_to_all_v all_gathers the counts it checks
  CHECK_THROWS_WITH_AS(Layer(moe_config(3, 2), mesh), doctest::Contains("3 experts do not split evenly over ep=2"), ShapeError);
}

TEST_CASE("the balancing loss is 1 for a uniform load and grows with imbalance; the bias moves toward the mean load") {
  const Mesh mesh = create_mesh({{"x", 1}});
  TransformerConfig c = moe_config(4, 1);
  c.moe->num_shared_experts = 0;
  MoE moe(c, mesh, 1);
  CHECK_THROWS_WITH_AS(moe.aux_loss(), doctest::Contains("before any forward"), Error);
  // A zero router: every score 1/4 and, ties to the lower index, every token to expert 0.
  moe.set_parameter("router", Variable(zeros({8, 4}, Layout::replicated(mesh, 2))));
  (void)moe(distribute_tensor(random_array({8, 8}, 1), mesh));
  CHECK(moe.expert_load().full_tensor().to_vector<int64_t>() == std::vector<int64_t>{8, 0, 0, 0});
  CHECK(values(moe.aux_loss())[0] == doctest::Approx(1.0));  // 4 * (1 * 1/4)
  moe.update_expert_bias(0.5);
  CHECK(values(moe.expert_bias().value()) == std::vector<float>{-0.5f, 0.5f, 0.5f, 0.5f});
  // Now experts 1, 2, 3 tie above expert 0: every token to expert 1.
  (void)moe(distribute_tensor(random_array({8, 8}, 1), mesh));
  CHECK(moe.expert_load().full_tensor().to_vector<int64_t>() == std::vector<int64_t>{0, 8, 0, 0});
}

namespace {

std::vector<double> train_moe(const Mesh& mesh, int steps = 3, bool fsdp = false, const TransformerConfig& c = moe_config()) {
  Transformer model(c, mesh);
  distribute_transformer(model, mesh, false, fsdp);
  AdamW optimizer(model.parameters(), 1e-2);
  const std::vector<Variable> params = model.parameters();
  auto step = jit([&](const Tensor& ids, const Tensor& targets) {
    const Tensor logits = model(ids);  // before moe_aux_loss(), which reads this forward's
    Tensor loss = cross_entropy(logits, targets) + 0.01 * model.moe_aux_loss();
    std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
    optimizer.apply(grads);
    for (MoE* moe : model.moe_layers()) moe->update_expert_bias(1e-3);
    return loss;
  });
  const Tensor ids = distribute_tensor(ids_array(8, 8, 1), mesh, token_placements(mesh));
  const Tensor targets = distribute_tensor(ids_array(8, 8, 2), mesh, token_placements(mesh));
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(double(step(ids, targets).full_tensor().data<float>()[0]));
  return losses;
}

}  // namespace

TEST_CASE("under TESSERA_DETERMINISTIC=1 a MoE Transformer's training losses are bitwise equal for ep = 1, 2, 4 and dp x ep") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const std::vector<double> reference = train_moe(create_mesh({{"x", 1}}), 6);
  CHECK(reference.back() < reference.front());
  for (const Mesh& mesh : {create_mesh({{"ep", 2}}), create_mesh({{"ep", 4}}), create_mesh({{"dp", 2}, {"ep", 2}}), create_mesh({{"dp", 2}}),
                           create_mesh({{"dp", 3}})}) {
    CAPTURE(mesh.to_string());
    const std::vector<double> losses = train_moe(mesh, 6);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == reference[s]);
  }
  // Experts over ep with the rest fully sharded over dp (torchtitan's dp2ep with FSDP).
  const std::vector<double> fsdp = train_moe(create_mesh({{"dp", 2}, {"ep", 2}}), 6, true);
  for (size_t s = 0; s < fsdp.size(); ++s) CHECK(fsdp[s] == reference[s]);
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("MoE on every k-th layer after the dense ones: the blocks alternate, and training is bitwise equal across ep layouts") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  TransformerConfig c = moe_config();
  c.layers = 5;
  c.moe->first_dense_layers = 1;
  c.moe->every = 2;
  {
    Transformer model(c, create_mesh({{"x", 1}}));
    CHECK(model.moe_layers().size() == 2);  // layers 1 and 3
    for (int64_t layer = 0; layer < c.layers; ++layer) {
      CAPTURE(layer);
      const bool moe = layer == 1 || layer == 3;
      CHECK(c.is_moe_layer(layer) == moe);
      const Module& block = model.get_submodule("layers." + std::to_string(layer));
      CHECK_NOTHROW((void)block.get_submodule(moe ? "moe" : "feed_forward"));
      CHECK_THROWS_AS((void)block.get_submodule(moe ? "feed_forward" : "moe"), Error);
    }
  }
  const std::vector<double> reference = train_moe(create_mesh({{"x", 1}}), 4, false, c);
  CHECK(reference.back() < reference.front());
  for (const Mesh& mesh : {create_mesh({{"ep", 2}}), create_mesh({{"dp", 2}, {"ep", 2}})}) {
    CAPTURE(mesh.to_string());
    const std::vector<double> losses = train_moe(mesh, 4, false, c);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == reference[s]);
  }
  unsetenv("TESSERA_DETERMINISTIC");
}


TEST_CASE("moe.receive_capacity sizes what a device's experts may receive: plans shrink with it, and routing past it is an IndexError") {
  TransformerConfig c = moe_config();
  const Mesh ep = create_mesh({{"ep", 2}});
  auto batch = [&](uint32_t seed) { return distribute_tensor(ids_array(8, 8, seed), ep, TransformerTrainingStep::batch_layout(ep).placements()); };
  const Tensor ids = batch(1), targets = batch(2);
  // The plan of each capacity is the measured peak, device by device (2 = ep: the worst case).
  std::vector<int64_t> peaks;
  for (double capacity : {2.0, 1.5, 1.0}) {
    CAPTURE(capacity);
    c.moe->receive_capacity = capacity;
    TransformerTrainingStep step(c, ep);
    const PlanReport plan = step.plan(ids, targets);
    peaks.push_back(plan.peak_bytes);
    // The buffers are the bound's, whatever the routing: the peak is exact (the all_to_all_v
    // bytes are planned at the bound, and move what the routing sends). Run at the worst case:
    // this batch's routing is not balanced enough for the smaller bounds.
    if (capacity == 2.0) {
      (void)step(ids, targets).full_tensor();  // compiled, first values replaced
      reset_peak_memory_stats();
      // Bytes earlier cases of this process left on these devices count beside the step's.
      std::vector<int64_t> before;
      for (const std::string& device : ep.local_devices()) before.push_back(memory_counter(device).current.load());
      (void)step(ids, targets).full_tensor();
      for (size_t i = 0; i < plan.device_ids.size(); ++i) {
        CHECK(memory_counter(ep.local_devices()[i]).peak.load() - (before[i] - plan.input_bytes) == plan.device_peak_bytes[i]);
      }
    }
    // Planned without devices (as auto_parallelize plans it): the same bytes.
    CHECK(plan_transformer_training_step(c, abstract_mesh({{"ep", 2}}, this_machine_device(2), 8), false, false, 8).peak_bytes ==
          plan.peak_bytes);
  }
  CHECK(peaks[2] < peaks[1]);
  CHECK(peaks[1] < peaks[0]);
  c.moe->receive_capacity = 0;  // the worst case: as 2 on ep=2
  CHECK(TransformerTrainingStep(c, ep).plan(ids, targets).peak_bytes == peaks[0]);
  // Half a device's share: some device always receives at least its share, so the step stops.
  c.moe->receive_capacity = 0.5;
  TransformerTrainingStep tight(c, ep);
  CHECK_THROWS_WITH_AS((void)tight(ids, targets).full_tensor(), doctest::Contains("max_received_rows bounds it"), IndexError);
  c.moe->receive_capacity = -1;
  CHECK_THROWS_WITH_AS(TransformerTrainingStep(c, ep), doctest::Contains("moe.receive_capacity"), Error);
}

TEST_CASE("auto_parallelize plans MoE models with ep borrowing dp ranks, states the routing it assumes and the peak at 1.25x") {
  const Hardware h100 = hardware_profile("h100-sxm");
  TransformerConfig c = moe_config();
  // Experts that outweigh the rest of the model, so that holding a share of them is what needs
  // least memory (with small ones, FSDP's dp=4 shards everything as well and needs less).
  c.moe->expert_hidden = 96;
  Transformer model(c, abstract_mesh({{"dp", 1}}, h100, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 4, h100, int64_t(80) << 30, 8, 8, false);
  std::map<std::string, const ParallelCandidate*> by_name;
  for (const ParallelCandidate& candidate : search.candidates) by_name[candidate.name()] = &candidate;
  CHECK(by_name.count("dp=2,ep=2"));
  CHECK(by_name.count("ep=4"));
  // Expert parallelism holds a quarter of the experts on each device: less than dp=4's whole set.
  CHECK(by_name.at("ep=4")->report.peak_bytes < by_name.at("dp=4")->report.peak_bytes);
  // A winner without ep states no routing; under the least peak of all, only a plan holding a
  // share of the experts meets it, and the winner has ep and states the routing it assumed and
  // its peak at 1.25x.
  if (search.best.name().find("ep=") == std::string::npos) CHECK(search.routing_imbalance == 0);
  const auto least = std::min_element(search.candidates.begin(), search.candidates.end(), [](const auto& a, const auto& b) {
    return a.report.peak_bytes < b.report.peak_bytes;
  });
  REQUIRE(least->name().find("ep=") != std::string::npos);
  const ParallelPlanSearch tight = auto_parallelize(model, 4, h100, least->report.peak_bytes, 8, 8, false);
  REQUIRE(tight.best.name().find("ep=") != std::string::npos);
  CHECK(tight.routing_imbalance == kReportedImbalance);
  CHECK(tight.peak_at_imbalance > tight.best.report.peak_bytes);
  CHECK(tight.why.find("MoE routing assumed balanced") != std::string::npos);
  CHECK(tight.to_json().find("\"moe_routing\"") != std::string::npos);
  {  // the peak at 1.25x is the winner planned with each device's experts receiving 1.25 shares
    TransformerConfig skewed = c;
    skewed.moe->receive_capacity = kReportedImbalance;
    CHECK(evaluate_plan(skewed, tight.best, h100, int64_t(80) << 30, 8, 8).report.peak_bytes == tight.peak_at_imbalance);
  }
  // Planned balanced: each candidate's peak is its plan with moe.receive_capacity 1.
  TransformerConfig balanced = c;
  balanced.moe->receive_capacity = 1;
  const ParallelCandidate& ep4 = *by_name.at("ep=4");
  REQUIRE(ep4.exact);
  CHECK(plan_transformer_training_step(balanced, abstract_mesh(ep4.mesh, h100, 8), false, false, 8).peak_bytes == ep4.report.peak_bytes);
}
