// Autodiff and Variables: gradients of every primitive and composite against central finite
// differences in f64 (on one device and on sharded 2-D layouts), Variables' layout rules,
// assignments eager and inside jit, and the data-parallel all_reduce coming out of propagation.
#include <doctest/doctest.h>

#include <functional>
#include <random>

#include <tessera/tessera.hpp>

#include "jit/api/explain.hpp"
#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

enum class Range { Any, Positive };

struct GradCase {
  std::string name;
  std::vector<std::pair<std::vector<int64_t>, Range>> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

Array random_f64(const std::vector<int64_t>& shape, Range range, std::mt19937& rng) {
  Array a(shape, DType::f64);
  std::uniform_real_distribution<double> any(-1.5, 1.5), positive(0.5, 2.0);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<double>()[i] = range == Range::Positive ? positive(rng) : any(rng);
  return a;
}

// The gradients of sum(f(inputs) * weights) from a jit-traced step (one compiled program).
std::vector<Tensor> traced_gradients(const GradCase& c, const std::vector<Tensor>& in, const Tensor& weights) {
  auto grads_of = [&c](std::vector<Tensor> args, const Tensor& w) { return gradients(reduce_sum(c.fn(args) * w), args); };
  switch (in.size()) {
    case 1: return jit([&](const Tensor& a, const Tensor& w) { return grads_of({a}, w); })(in[0], weights);
    case 2: return jit([&](const Tensor& a, const Tensor& b, const Tensor& w) { return grads_of({a, b}, w); })(in[0], in[1], weights);
    case 3:
      return jit([&](const Tensor& a, const Tensor& b, const Tensor& d, const Tensor& w) { return grads_of({a, b, d}, w); })(
          in[0], in[1], in[2], weights);
  }
  FAIL("traced_gradients: add a case for " << in.size() << " inputs");
  return {};
}

// Each mesh dim shards the first free axis of `shape` it cannot split evenly, else the first
// free axis longer than 1: uneven blocks wherever the shape allows.
Layout uneven_layout(const Mesh& mesh, const std::vector<int64_t>& shape) {
  std::vector<std::vector<int64_t>> axes(shape.size());
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    const int64_t n = mesh.shape()[size_t(d)];
    auto first_free = [&](bool uneven) {
      for (size_t a = 0; a < shape.size(); ++a)
        if (axes[a].empty() && shape[a] > 1 && (!uneven || shape[a] % n != 0)) return int64_t(a);
      return int64_t(-1);
    };
    int64_t a = first_free(true);
    if (a < 0) a = first_free(false);
    if (a >= 0) axes[size_t(a)].push_back(d);
  }
  return Layout(mesh, axes);
}

enum class Layouts { Random, Uneven };

// loss = sum(f(inputs) * weights), so every output element matters with a different weight.
void check_gradients(const GradCase& c, const Mesh& mesh, Layouts layouts = Layouts::Random) {
  std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffff);
  std::vector<Array> arrays;
  std::vector<Tensor> inputs;
  std::map<const Node*, Array> leaves;
  for (const auto& [shape, range] : c.inputs) {
    arrays.push_back(random_f64(shape, range, rng));
    Layout l = mesh.size() == 1             ? Layout::replicated(mesh, int64_t(shape.size()))
               : layouts == Layouts::Uneven ? uneven_layout(mesh, shape)
                                            : random_layout(mesh, int64_t(shape.size()), rng);
    if (layouts == Layouts::Uneven && mesh.size() > 1) CHECK(!l.is_fully_replicated());  // every case's inputs allow it
    inputs.push_back(copy_to_mesh(arrays.back(), l));
    leaves[inputs.back().node().get()] = arrays.back();
  }
  Tensor out = c.fn(inputs);
  Array weights = random_f64(out.shape(), Range::Any, rng);
  Tensor w = copy_to_mesh(weights, Layout::replicated(mesh, out.rank()));
  leaves[w.node().get()] = weights;
  Tensor loss = reduce_sum(out * w);
  std::vector<Tensor> grads = gradients(loss, inputs);
  const std::vector<Tensor> traced_grads = traced_gradients(c, inputs, w);
  for (size_t k = 0; k < inputs.size(); ++k) {
    CAPTURE(c.name);
    CAPTURE(k);
    CAPTURE(mesh.to_string());
    CHECK(grads[k].shape() == inputs[k].shape());
    Array g = grads[k].full_tensor(), g_traced = traced_grads[k].full_tensor();
    for (int64_t i = 0; i < arrays[k].numel(); ++i) {
      const double h = 1e-6, x = arrays[k].data<double>()[i];
      auto loss_at = [&](double v) {
        Array moved = arrays[k].clone();
        moved.mutable_data<double>()[i] = v;
        std::map<const Node*, Array> l = leaves;
        l[inputs[k].node().get()] = moved;
        return reference_eval(loss, l).data[0];
      };
      const double numeric = (loss_at(x + h) - loss_at(x - h)) / (2 * h);
      CHECK(g.data<double>()[i] == doctest::Approx(numeric).epsilon(1e-5).scale(1.0));
      CHECK(g_traced.data<double>()[i] == doctest::Approx(numeric).epsilon(1e-5).scale(1.0));
    }
  }
}

// The first `n` of `placements` (one per mesh dim): the cases run on 1-D and 2-D meshes.
std::vector<Placement> first_placements(std::vector<Placement> placements, int64_t n) {
  placements.resize(size_t(n));
  return placements;
}
std::vector<Placement> on_mesh(const Tensor& t, std::vector<Placement> placements) {
  return first_placements(std::move(placements), t.device_mesh().ndim());
}

std::vector<GradCase> cases() {
  using S = std::vector<int64_t>;
  const auto A = Range::Any, P = Range::Positive;
  return {
      {"neg", {{S{3, 4}, A}}, [](auto& x) { return -x[0]; }},
      {"abs", {{S{3, 4}, P}}, [](auto& x) { return abs(x[0] - 0.25); }},
      {"exp", {{S{3, 4}, A}}, [](auto& x) { return exp(x[0]); }},
      {"log", {{S{3, 4}, P}}, [](auto& x) { return log(x[0]); }},
      {"sqrt", {{S{3, 4}, P}}, [](auto& x) { return sqrt(x[0]); }},
      {"rsqrt", {{S{3, 4}, P}}, [](auto& x) { return rsqrt(x[0]); }},
      {"tanh", {{S{3, 4}, A}}, [](auto& x) { return tanh(x[0]); }},
      {"sin", {{S{3, 4}, A}}, [](auto& x) { return sin(x[0] * 3.0); }},
      {"cos", {{S{3, 4}, A}}, [](auto& x) { return cos(x[0] * 3.0); }},
      {"sigmoid", {{S{3, 4}, A}}, [](auto& x) { return sigmoid(x[0]); }},
      {"square", {{S{3, 4}, A}}, [](auto& x) { return square(x[0]); }},
      {"relu", {{S{3, 4}, P}}, [](auto& x) { return relu(x[0] - 1.2); }},
      {"add_sub_mul_div", {{S{3, 4}, A}, {S{3, 4}, P}}, [](auto& x) { return (x[0] + x[1]) * x[0] / x[1] - x[1]; }},
      {"broadcast", {{S{3, 4}, A}, {S{4}, A}, {S{3, 1}, A}}, [](auto& x) { return x[0] * x[1] + x[2]; }},
      {"maximum_minimum", {{S{3, 4}, A}, {S{3, 4}, A}}, [](auto& x) { return maximum(x[0], x[1]) - minimum(x[0], x[1] * 0.5); }},
      {"pow", {{S{3, 4}, P}, {S{3, 4}, P}}, [](auto& x) { return pow(x[0], x[1]); }},
      {"where", {{S{3, 4}, A}, {S{3, 4}, A}}, [](auto& x) { return where(x[0] > 0.1, x[0] * x[1], x[1]); }},
      {"reduce_sum_mean", {{S{3, 4}, A}}, [](auto& x) { return reduce_sum(x[0], {0}) + reduce_mean(x[0], {0}); }},
      {"reduce_max_min", {{S{3, 4}, A}}, [](auto& x) { return reduce_max(x[0], {1}, true) - reduce_min(x[0], {0}, true); }},
      {"reduce_prod", {{S{3, 4}, P}}, [](auto& x) { return reduce_prod(x[0], {1}); }},
      {"reshape_transpose", {{S{3, 4}, A}}, [](auto& x) { return transpose(reshape(x[0], {2, 6})) * 2.0; }},
      {"slice_pad_concat", {{S{3, 4}, A}}, [](auto& x) {
         return concat({slice(x[0], {1, 1}, {2, 3}), pad(slice(x[0], {0, 0}, {3, 2}), {{1, 0}, {0, 1}}, 0.0)}, 0);
       }},
      {"matmul", {{S{3, 4}, A}, {S{4, 5}, A}}, [](auto& x) { return matmul(x[0], x[1]); }},
      {"batched_matmul", {{S{2, 3, 4}, A}, {S{4, 2}, A}}, [](auto& x) { return matmul(x[0], x[1]); }},
      {"rows_matmul_4d", {{S{2, 2, 3, 4}, A}, {S{4, 3}, A}}, [](auto& x) { return matmul(x[0], x[1]); }},
      // Second derivatives run through contract_rows' own gradient (two Rows products).
      {"rows_matmul_squared_grad", {{S{2, 3, 4}, A}, {S{4, 2}, A}},
       [](auto& x) { return square(gradients(reduce_sum(square(matmul(x[0], x[1]))), {x[1]})[0]); }},
      {"softmax", {{S{3, 4}, A}}, [](auto& x) { return softmax(x[0]); }},
      {"log_softmax", {{S{3, 5}, A}}, [](auto& x) { return log_softmax(x[0], 0); }},
      {"xent", {{S{4, 5}, A}}, [](auto& x) {
         Tensor labels = copy_to_mesh(Array::from<int32_t>({1, 0, 4, 2}, {4}), Layout::replicated(x[0].node()->mesh, 1));
         return sparse_softmax_cross_entropy_with_logits(labels, x[0]);
       }},
      {"mlp", {{S{4, 3}, A}, {S{3, 5}, A}, {S{5}, A}}, [](auto& x) { return log_softmax(tanh(matmul(x[0], x[1]) + x[2])); }},
      // The transformer's ops (composites: their gradients come from the primitives').
      {"gelu_silu", {{S{3, 5}, A}}, [](auto& x) { return gelu(x[0]) + gelu(x[0], true) * silu(x[0]); }},
      {"layer_norm", {{S{3, 5}, A}, {S{5}, A}, {S{5}, A}}, [](auto& x) { return layer_norm(x[0], x[1], x[2]); }},
      {"rms_norm", {{S{3, 5}, A}, {S{5}, A}}, [](auto& x) { return rms_norm(x[0], x[1]); }},
      {"embedding", {{S{7, 3}, A}}, [](auto& x) {
         Tensor ids = copy_to_mesh(Array::from<int32_t>({6, 0, 3, 3, 2}, {5}), Layout::replicated(x[0].node()->mesh, 1));
         return embedding(ids, x[0]);
       }},
      {"gather_axis_1", {{S{3, 5}, A}}, [](auto& x) {
         Tensor idx = copy_to_mesh(Array::from<int64_t>({4, 1, 1}, {3}), Layout::replicated(x[0].node()->mesh, 1));
         return gather(x[0], idx, 1);
       }},
      {"masked_fill_split_chunk", {{S{3, 5}, A}}, [](auto& x) {
         std::vector<Tensor> parts = split(masked_fill(x[0], x[0] > 0.7, 0.25), {2, 3}, 1);
         std::vector<Tensor> rows = chunk(x[0], 2, 0);
         return concat({parts[1] * 2.0, parts[0]}, 1) + concat({rows[1], rows[0]}, 0);
       }},
      {"dropout", {{S{4, 5}, A}}, [](auto& x) { return dropout(x[0], 0.3, 11); }},
      // f64 on CPU meshes: the fused flash kernel (its own backward; GPU meshes take the math
      // backend whatever is asked), then the math backend's primitive ops, and cross-attention
      // (lq != lk, e != ev).
      {"attention_causal", {{S{2, 3, 4}, A}, {S{2, 3, 4}, A}, {S{2, 3, 4}, A}}, [](auto& x) {
         SdpaKernel flash({default_device_type() == "CPU" ? SdpBackend::Flash : SdpBackend::Math});
         return scaled_dot_product_attention(x[0], x[1], x[2], true);
       }},
      {"attention_causal_math", {{S{2, 3, 4}, A}, {S{2, 3, 4}, A}, {S{2, 3, 4}, A}}, [](auto& x) {
         SdpaKernel math({SdpBackend::Math});
         return scaled_dot_product_attention(x[0], x[1], x[2], true);
       }},
      {"attention_cross", {{S{2, 3, 4}, A}, {S{2, 5, 4}, A}, {S{2, 5, 2}, A}}, [](auto& x) {
         SdpaKernel flash({default_device_type() == "CPU" ? SdpBackend::Flash : SdpBackend::Math});
         return scaled_dot_product_attention(x[0], x[1], x[2], false, 0.8);
       }},
      // Layout changes are graph nodes: gradients flow through them (the 3x^2 example).
      {"redistribute_replicate", {{S{3, 4}, A}}, [](auto& x) { return square(x[0].redistribute()) * x[0]; }},
      {"redistribute_shard", {{S{3, 4}, A}, {S{3, 4}, A}}, [](auto& x) {
         return x[0].redistribute(on_mesh(x[0], {Shard{1}, Shard{0}})) * tanh(x[1].redistribute(on_mesh(x[1], {Shard{0}, Replicate{}})));
       }},
      {"relayout_partial", {{S{3, 4}, A}}, [](auto& x) {
         Tensor doubled = relayout(x[0] * 2.0, Layout::from_placements(x[0].device_mesh(), on_mesh(x[0], {Partial{}, Shard{1}}), 2));
         return exp(doubled) * x[0];
       }},
      {"redistribute_grad_placements", {{S{3, 4}, A}, {S{4, 5}, A}}, [](auto& x) {
         Tensor r = x[0].redistribute(on_mesh(x[0], {Replicate{}, Replicate{}}), on_mesh(x[0], {Partial{}, Shard{0}}));
         return matmul(tanh(r), x[1].redistribute(on_mesh(x[1], {Shard{1}, Replicate{}})));
       }},
  };
}

}  // namespace

TEST_CASE("gradients match central finite differences, on one device and sharded") {
  for (const GradCase& c : cases()) {
    check_gradients(c, create_mesh({{"x", 1}}));
    check_gradients(c, create_mesh({{"x", 2}, {"y", 2}}));
  }
}

TEST_CASE("gradients match central finite differences on uneven shards of every input (1-D and 2-D meshes)") {
  for (const GradCase& c : cases()) {
    check_gradients(c, create_mesh({{"x", 3}}), Layouts::Uneven);
    check_gradients(c, create_mesh({{"x", 3}, {"y", 2}}), Layouts::Uneven);
  }
}

TEST_CASE("Variables: fixed layout, handle semantics, assign and typed errors") {
  Mesh mesh = create_mesh({{"x", 6}});
  Layout layout = Layout::replicated(mesh, 2);
  Variable v(random_normal({64, 32}, 1, layout));
  CHECK(v.layout() == layout);
  Variable alias = v;  // a handle: the same state
  Tensor a = ones({64, 32}, layout);
  Tensor b = v.value() + a;
  v.assign(a);
  CHECK(same_array(alias.value().full_tensor(), a.full_tensor()));
  v.assign_add(a);
  v.assign_sub(a * 0.5);
  CHECK(alias.value().full_tensor().to_vector<float>()[7] == 1.5f);
  CHECK(b.shape() == std::vector<int64_t>{64, 32});
  // The overview's "exception raised": a tensor on another mesh cannot be assigned.
  Mesh another = create_mesh({{"x", 3}, {"y", 2}});
  CHECK_THROWS_WITH_AS(v.assign(ones({64, 32}, Layout::replicated(another, 2))), doctest::Contains("layout never changes"), LayoutError);
  // Another layout of the same mesh is redistributed into the variable's (PyTorch's add_).
  v.assign(ones({64, 32}, Layout({"x", UNSHARDED}, mesh)) * 3.0f);
  CHECK(v.layout() == layout);
  CHECK(alias.value().full_tensor().to_vector<float>()[7] == 3.0f);
  CHECK_THROWS_WITH_AS(v.assign(ones({32, 64}, layout)), doctest::Contains("shape (64, 32)"), ShapeError);
  CHECK_THROWS_WITH_AS(v.assign(ones({64, 32}, layout, DType::f64)), doctest::Contains("float32"), DTypeError);
}

TEST_CASE("gradients come out in each variable's layout; the data-parallel all_reduce comes from propagation") {
  Mesh mesh = create_mesh({{"batch", 2}});
  Variable w(random_normal({8, 4}, 3, Layout::replicated(mesh, 2), 0, 0.5));
  Variable bias(zeros({4}, Layout::replicated(mesh, 1)));
  Tensor x = random_uniform({6, 8}, 5, Layout::batch_sharded(mesh, "batch", 2));
  Tensor labels = copy_to_mesh(Array::from<int32_t>({0, 1, 2, 3, 0, 1}, {6}), Layout::batch_sharded(mesh, "batch", 1));
  Tensor loss = reduce_mean(sparse_softmax_cross_entropy_with_logits(labels, matmul(x, w.value()) + bias.value()));
  auto g = grad(loss, {w, bias});
  CHECK(g[0].layout() == w.layout());
  CHECK(g[1].layout() == bias.layout());
  PlanSummary plan = plan_summary(g[0]);
  CHECK(std::count(plan.collectives.begin(), plan.collectives.end(), "all_reduce(batch)") >= 1);
  // Same gradients as on one device.
  Mesh one = create_mesh({{"batch", 1}});
  Variable w1(copy_to_mesh(w.value().full_tensor(), Layout::replicated(one, 2)));
  Tensor x1 = random_uniform({6, 8}, 5, Layout::replicated(one, 2));
  Tensor labels1 = copy_to_mesh(Array::from<int32_t>({0, 1, 2, 3, 0, 1}, {6}), Layout::replicated(one, 1));
  Tensor loss1 = reduce_mean(sparse_softmax_cross_entropy_with_logits(labels1, matmul(x1, w1.value()) + copy_to_mesh(bias.value().full_tensor(), Layout::replicated(one, 1))));
  std::string mismatch = compare_with_reference(grad(loss1, {w1})[0].full_tensor(), ref_from_array(g[0].full_tensor()), 1e-5);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("assignments inside jit update the variables, like eager steps") {
  Mesh mesh = create_mesh({{"batch", 2}});
  auto make = [&] { return Variable(random_normal({5, 3}, 9, Layout::replicated(mesh, 2))); };
  Variable eager = make(), traced = make();
  Tensor x = random_uniform({4, 5}, 2, Layout::batch_sharded(mesh, "batch", 2));
  auto sgd = [](Variable& v, const Tensor& input) {
    Tensor loss = reduce_mean(square(matmul(input, v.value())));
    v.assign_sub(grad(loss, {v})[0] * 0.1);
    return loss;
  };
  auto step = jit([&](const Tensor& input) { return sgd(traced, input); });
  for (int i = 0; i < 4; ++i) {
    Array l_eager = sgd(eager, x).full_tensor();
    Array l_traced = step(x).full_tensor();
    CHECK(l_traced.to_vector<float>()[0] == doctest::Approx(l_eager.to_vector<float>()[0]).epsilon(1e-5));
  }
  CHECK(step.traces() == 1);
  std::string mismatch = compare_with_reference(traced.value().full_tensor(), ref_from_array(eager.value().full_tensor()), 1e-5);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  CHECK(traced.layout() == Layout::replicated(mesh, 2));
}

TEST_CASE("redistribute and relayout are lazy graph nodes: gradients flow through them, eagerly and inside jit") {
  // d/dx sum(redistribute(x)^2 * x) = 3x^2 (a redistribute that cut the graph would give x^2).
  for (Mesh mesh : {create_mesh({{"x", 4}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    CAPTURE(mesh.to_string());
    Array a = Array::from<float>({1, 2, 3, 4, 5, 6, 7}, {7});  // 7 over 4 or 2 devices: uneven
    const std::vector<float> want = {3, 12, 27, 48, 75, 108, 147};
    Tensor x = distribute_tensor(a, mesh, first_placements({Shard{0}, Replicate{}}, mesh.ndim()));
    CommDebugMode comm;
    Tensor r = x.redistribute();
    CHECK(!r.is_computed());
    CHECK(comm.counts() == std::map<std::string, int64_t>{{"all_gather", 1}});  // reading them computes r
    CHECK(r.is_computed());
    CHECK(r.layout().is_fully_replicated());
    CHECK(r.placements() == std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
    CHECK(r.device_mesh() == mesh);
    CHECK(gradients(reduce_sum(r * r * x), {x})[0].full_tensor().to_vector<float>() == want);
    auto step = jit([](const Tensor& x) {
      Tensor r = relayout(x, Layout::replicated(x.device_mesh(), 1));
      return gradients(reduce_sum(r * r * x), {x})[0];
    });
    Tensor g = step(x);
    CHECK(g.full_tensor().to_vector<float>() == want);
    CHECK(g.layout() == x.layout());  // handed out in the input's layout
    // Looking at the value runs it, once.
    CHECK(fmt::format("{}", r).find("[1 2 3 4 5 6 7]") != std::string::npos);
    CHECK(r.is_computed());
  }
}

TEST_CASE("a gradient that depends on no data is a constant in the input's layout") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Layout layout({"y", "x"}, mesh);
  Tensor x = copy_to_mesh(Array::from<float>({1, 2, 3, 4, 5, 6}, {3, 2}), layout);
  Tensor g3 = gradients(reduce_sum(x * 3.0f), {x})[0];
  CHECK(g3.layout() == layout);
  CHECK(g3.full_tensor().to_vector<float>() == std::vector<float>(6, 3.0f));
  Tensor g1 = gradients(reduce_sum(x), {x})[0];
  CHECK(g1.full_tensor().to_vector<float>() == std::vector<float>(6, 1.0f));
  // Unused input: zeros, also in its layout.
  Tensor other = copy_to_mesh(Array::from<float>({1, 2}, {2}), Layout({"x"}, mesh));
  Tensor g0 = gradients(reduce_sum(x), {other})[0];
  CHECK(g0.layout() == other.layout());
  CHECK(g0.full_tensor().to_vector<float>() == std::vector<float>{0, 0});
  // Inside jit too.
  auto step = jit([](const Tensor& x) { return gradients(reduce_mean(x * 3.0f), {x})[0]; });
  CHECK(step(x).full_tensor().to_vector<float>() == std::vector<float>(6, 0.5f));
}

TEST_CASE("grad_placements: the gradient of a redistribute is wanted in the given placements") {
  Mesh mesh = create_mesh({{"x", 4}});
  Tensor x = distribute_tensor(Array::from<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {10}), mesh, {Shard{0}});
  Tensor w = distribute_tensor(Array::from<float>({1, -1, 2, -2, 3, -3, 4, -4, 5, -5}, {10}), mesh, {Replicate{}});
  // The gradient of the replicated value comes back as Partial sums, reduce_scattered onto x.
  Tensor r = x.redistribute({Replicate{}}, {Partial{}});
  Tensor g = gradients(reduce_sum(r * r * w), {x})[0];
  CHECK(g.full_tensor().to_vector<float>() == std::vector<float>{2, -4, 12, -16, 30, -36, 56, -64, 90, -100});
  CHECK_THROWS_WITH_AS(x.redistribute({Replicate{}}, {Shard{1}}), doctest::Contains("Shard(1)"), LayoutError);
  CHECK_THROWS_WITH_AS(x.redistribute({Replicate{}, Replicate{}}), doctest::Contains("2 placements"), LayoutError);
}

TEST_CASE("a Variable is accepted wherever a Tensor operand is, and fetch_layout works on it") {
  Mesh mesh = create_mesh({{"x", 2}});
  Variable v(copy_to_mesh(Array::from<float>({1, 2, 3}, {3}), Layout({"x"}, mesh)));
  Tensor a = copy_to_mesh(Array::from<float>({10, 20, 30}, {3}), Layout::replicated(mesh, 1));
  CHECK((v + a).full_tensor().to_vector<float>() == std::vector<float>{11, 22, 33});
  CHECK((2.0f * v - v).full_tensor().to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(reduce_sum(v).full_tensor().to_vector<float>() == std::vector<float>{6});
  CHECK(relu(v).full_tensor().to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(fetch_layout(v) == Layout({"x"}, mesh));
  // Inside jit a Variable operand reads the variable's value at each call.
  auto f = jit([&](const Tensor& x) { return reduce_sum(v * x); });
  CHECK(f(a).full_tensor().to_vector<float>() == std::vector<float>{140});
  v.assign_add(ones({3}, Layout({"x"}, mesh)));
  CHECK(f(a).full_tensor().to_vector<float>() == std::vector<float>{200});
}

TEST_CASE("every redistribute transition is differentiable: all placement pairs on 1-D and 2-D meshes, uneven") {
  // d/dx sum(redistribute(relayout(x, from), to)^2 * w) = 2 x w, whatever the path the planner takes.
  const std::vector<Placement> kinds = {Shard{0}, Shard{1}, Replicate{}, Partial{}};
  for (Mesh mesh : {create_mesh({{"x", 3}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    std::vector<std::vector<Placement>> all;
    if (mesh.ndim() == 1)
      for (const Placement& p : kinds) all.push_back({p});
    else
      for (const Placement& p : kinds)
        for (const Placement& q : kinds) all.push_back({p, q});
    std::mt19937 rng(17);
    const Array a = random_f64({3, 5}, Range::Any, rng), weights = random_f64({3, 5}, Range::Any, rng);
    Tensor x = distribute_tensor(a, mesh, std::vector<Placement>(size_t(mesh.ndim()), Shard{1}));
    Tensor w = distribute_tensor(weights, mesh);
    auto loss_of = [&](const Tensor& t, const std::vector<Placement>& from, const std::vector<Placement>& to) {
      Tensor moved = relayout(t, Layout::from_placements(mesh, from, 2)).redistribute(to);
      return reduce_sum(square(moved) * w);
    };
    size_t pair = 0;
    for (const auto& from : all)
      for (const auto& to : all) {
        CAPTURE(mesh.to_string());
        CAPTURE(fmt::format("{} -> {}", Layout::from_placements(mesh, from, 2).specs_string(),
                            Layout::from_placements(mesh, to, 2).specs_string()));
        Array g = gradients(loss_of(x, from, to), {x})[0].full_tensor();
        if (pair++ % 9 == 0) {  // a sample also inside jit (each pair compiles its own program)
          auto step = jit([&](const Tensor& t) { return gradients(loss_of(t, from, to), {t})[0]; });
          Array traced = step(x).full_tensor();
          for (int64_t i = 0; i < a.numel(); ++i) CHECK(traced.data<double>()[i] == doctest::Approx(g.data<double>()[i]));
        }
        for (int64_t i = 0; i < a.numel(); ++i)
          CHECK(g.data<double>()[i] == doctest::Approx(2 * a.data<double>()[i] * weights.data<double>()[i]).epsilon(1e-12));
      }
  }
}
