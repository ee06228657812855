// Differential tests: every op and composite on 1 device and on 1-D, 2-D and 3-D meshes, with
// random layouts (several mesh dims per axis, uneven shards, size 0 and 1 axes), gathered and
// compared with the reference evaluator.
#include <doctest/doctest.h>

#include <functional>
#include <random>

#include <tessera/tessera.hpp>

#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

enum class Values { Any, Positive, Small, Int };

struct InputSpec {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  Values values = Values::Any;
};

struct OpCase {
  std::string name;
  std::vector<InputSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  double tolerance = 1e-4;
};

Array make_input(const InputSpec& spec, std::mt19937& rng) {
  Array a(spec.shape, spec.dtype);
  std::uniform_real_distribution<double> any(-3, 3), positive(0.1, 4), small(-1, 1);
  std::uniform_int_distribution<int> integer(-9, 9);
  for (int64_t i = 0; i < a.numel(); ++i) {
    double v = spec.values == Values::Positive ? positive(rng)
               : spec.values == Values::Small  ? small(rng)
               : spec.values == Values::Int || !is_floating(spec.dtype) ? double(integer(rng))
                                                                         : any(rng);
    store_from_double(a.mutable_bytes(), spec.dtype, i, v);
  }
  return a;
}

// Runs one case on every test mesh with `layouts_per_mesh` random layout choices.
void run_case(const OpCase& c, int layouts_per_mesh = 2) {
  std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
  for (const Mesh& mesh : test_meshes()) {
    for (int trial = 0; trial < layouts_per_mesh; ++trial) {
      std::vector<Tensor> inputs;
      std::map<const Node*, Array> leaves;
      std::string layouts;
      for (const InputSpec& spec : c.inputs) {
        Array a = make_input(spec, rng);
        Layout l = trial == 0 && mesh.size() == 1 ? Layout::replicated(mesh, int64_t(spec.shape.size()))
                                                  : random_layout(mesh, int64_t(spec.shape.size()), rng);
        layouts += " [" + fmt::format("{}", fmt::join(l.sharding_specs(), ",")) + "]";
        Tensor t = copy_to_mesh(a, l);
        leaves[t.node().get()] = a;
        inputs.push_back(t);
      }
      CAPTURE(c.name);
      CAPTURE(mesh.to_string());
      CAPTURE(layouts);
      Tensor out = c.fn(inputs);
      Array got = out.full_tensor();
      std::string mismatch = compare_with_reference(got, reference_eval(out, leaves), c.tolerance);
      CHECK_MESSAGE(mismatch.empty(), mismatch);
    }
  }
}

#define UNARY(op, values) OpCase{#op, {{{5, 7}, DType::f32, values}}, [](auto& x) { return op(x[0]); }}

}  // namespace

TEST_CASE("elementwise unary ops") {
  for (const OpCase& c : {UNARY(neg, Values::Any), UNARY(abs, Values::Any), UNARY(exp, Values::Any), UNARY(log, Values::Positive),
                          UNARY(sqrt, Values::Positive), UNARY(rsqrt, Values::Positive), UNARY(square, Values::Any),
                          UNARY(tanh, Values::Any), UNARY(sigmoid, Values::Any), UNARY(relu, Values::Any), UNARY(sin, Values::Any),
                          UNARY(cos, Values::Any)})
    run_case(c);
  run_case({"neg_i32", {{{4, 3}, DType::i32}}, [](auto& x) { return -x[0]; }});
  run_case({"abs_i64", {{{4, 3}, DType::i64}}, [](auto& x) { return abs(x[0]); }});
}

TEST_CASE("elementwise binary ops, scalars and broadcasting") {
  const InputSpec a{{5, 7}}, b{{5, 7}};
  run_case({"add", {a, b}, [](auto& x) { return x[0] + x[1]; }});
  run_case({"sub", {a, b}, [](auto& x) { return x[0] - x[1]; }});
  run_case({"mul", {a, b}, [](auto& x) { return x[0] * x[1]; }});
  run_case({"div", {a, {{5, 7}, DType::f32, Values::Positive}}, [](auto& x) { return x[0] / x[1]; }});
  run_case({"maximum", {a, b}, [](auto& x) { return maximum(x[0], x[1]); }});
  run_case({"minimum", {a, b}, [](auto& x) { return minimum(x[0], x[1]); }});
  run_case({"pow", {{{5, 7}, DType::f32, Values::Positive}, {{5, 7}, DType::f32, Values::Small}},
            [](auto& x) { return pow(x[0], x[1]); }});
  run_case({"scalars", {a}, [](auto& x) { return (x[0] * 0.5 + 1.0) / 2.0 - 3.0; }});
  run_case({"scalar_left", {a}, [](auto& x) { return 2.0 - x[0] * 3.0; }});
  run_case({"broadcast_row", {{{5, 7}}, {{7}}}, [](auto& x) { return x[0] + x[1]; }});
  run_case({"broadcast_outer", {{{5, 1}}, {{1, 7}}}, [](auto& x) { return x[0] * x[1]; }});
  run_case({"broadcast_3d", {{{3, 1, 4}}, {{2, 1}}}, [](auto& x) { return x[0] - x[1]; }});
  run_case({"int_div", {{{4, 6}, DType::i32}, {{4, 6}, DType::i32}}, [](auto& x) { return x[0] / x[1]; }});
  run_case({"int_arith", {{{4, 6}, DType::i64}, {{4, 6}, DType::i64}}, [](auto& x) { return x[0] * x[1] + x[0] - 3; }});
  run_case({"bf16_add", {{{5, 7}, DType::bf16}, {{5, 7}, DType::bf16}}, [](auto& x) { return x[0] + x[1]; }});
  run_case({"f16_mul", {{{5, 7}, DType::f16}, {{5, 7}, DType::f16}}, [](auto& x) { return x[0] * x[1]; }});
  run_case({"f64_chain", {{{5, 7}, DType::f64}, {{5, 7}, DType::f64}}, [](auto& x) { return exp(x[0]) * x[1] - x[0]; }});
}

TEST_CASE("comparisons, where and casts") {
  const InputSpec a{{5, 7}, DType::f32, Values::Int}, b{{5, 7}, DType::f32, Values::Int};
  run_case({"eq", {a, b}, [](auto& x) { return x[0] == x[1]; }});
  run_case({"ne", {a, b}, [](auto& x) { return x[0] != x[1]; }});
  run_case({"lt", {a, b}, [](auto& x) { return x[0] < x[1]; }});
  run_case({"le", {a, b}, [](auto& x) { return x[0] <= x[1]; }});
  run_case({"gt", {a, b}, [](auto& x) { return x[0] > x[1]; }});
  run_case({"ge_scalar", {a}, [](auto& x) { return x[0] >= 0.0; }});
  run_case({"where", {a, b}, [](auto& x) { return where(x[0] > x[1], x[0], x[1] * 2.0); }});
  run_case({"where_scalar", {a}, [](auto& x) { return where(x[0] < 0.0, 0.0, x[0]); }});
  run_case({"cast_f32_i32", {{{5, 7}, DType::f32}}, [](auto& x) { return cast(x[0], DType::i32); }});
  run_case({"cast_i32_f64", {{{5, 7}, DType::i32}}, [](auto& x) { return cast(x[0], DType::f64); }});
  run_case({"cast_f32_bf16", {{{5, 7}, DType::f32}}, [](auto& x) { return cast(x[0], DType::bf16); }});
  run_case({"cast_f16_f32", {{{5, 7}, DType::f16}}, [](auto& x) { return cast(x[0], DType::f32); }});
  run_case({"cast_bool", {a}, [](auto& x) { return cast(cast(x[0], DType::u8), DType::i32); }});
}

TEST_CASE("reductions over sharded and unsharded axes, uneven shards") {
  const InputSpec a{{5, 7}}, big{{3, 4, 5}};
  for (int64_t axis : {0, 1}) {
    run_case({"sum" + std::to_string(axis), {a}, [axis](auto& x) { return reduce_sum(x[0], {axis}); }});
    run_case({"mean" + std::to_string(axis), {a}, [axis](auto& x) { return reduce_mean(x[0], {axis}); }});
    run_case({"max" + std::to_string(axis), {a}, [axis](auto& x) { return reduce_max(x[0], {axis}); }});
    run_case({"min" + std::to_string(axis), {a}, [axis](auto& x) { return reduce_min(x[0], {axis}, true); }});
    run_case({"argmax" + std::to_string(axis), {a}, [axis](auto& x) { return argmax(x[0], axis); }});
  }
  run_case({"prod", {{{4, 3}, DType::f32, Values::Small}}, [](auto& x) { return reduce_prod(x[0], {0}); }});
  run_case({"sum_all", {big}, [](auto& x) { return reduce_sum(x[0]); }});
  run_case({"mean_02_keep", {big}, [](auto& x) { return reduce_mean(x[0], {0, 2}, true); }});
  run_case({"max_int", {{{6, 5}, DType::i32}}, [](auto& x) { return reduce_max(x[0], {1}); }});
  run_case({"sum_empty_axis", {{{0, 3}}}, [](auto& x) { return reduce_sum(x[0], {0}); }});
}

TEST_CASE("composites: softmax, log_softmax, cross-entropy, one_hot") {
  run_case({"softmax", {{{5, 7}}}, [](auto& x) { return softmax(x[0]); }});
  run_case({"softmax0", {{{5, 7}}}, [](auto& x) { return softmax(x[0], 0); }});
  run_case({"log_softmax", {{{5, 7}}}, [](auto& x) { return log_softmax(x[0]); }});
  run_case({"one_hot", {{{6}, DType::i32, Values::Int}}, [](auto& x) { return one_hot(abs(x[0]), 10); }});
  run_case({"xent", {{{6}, DType::i64, Values::Int}, {{6, 10}}},
            [](auto& x) { return sparse_softmax_cross_entropy_with_logits(abs(x[0]), x[1]); }});
  run_case({"mean_xent", {{{6}, DType::i32, Values::Int}, {{6, 10}}},
            [](auto& x) { return reduce_mean(sparse_softmax_cross_entropy_with_logits(abs(x[0]), x[1])); }});
}

TEST_CASE("matmul: 2-D, batched, integer, with epilogues") {
  run_case({"matmul", {{{5, 7}}, {{7, 4}}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"matmul_bias_relu", {{{6, 5}}, {{5, 3}}, {{3}}}, [](auto& x) { return relu(matmul(x[0], x[1]) + x[2]); }});
  run_case({"batched", {{{3, 5, 4}}, {{3, 4, 2}}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"broadcast_batch", {{{2, 3, 4}}, {{4, 5}}}, [](auto& x) { return matmul(x[0], x[1]); }});
  // [..., k] x [k, n] is one GEMM over all rows, however the leading axes are sharded, and its
  // weight's gradient the rows contracted (dsl/dot_form.hpp); integers take generated kernels.
  run_case({"rows_4d", {{{2, 3, 2, 5}}, {{5, 3}}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"rows_transposed_weight", {{{3, 4, 5}}, {{2, 5}}}, [](auto& x) { return matmul(x[0], transpose(x[1])); }});
  run_case({"rows_int", {{{2, 3, 4}, DType::i32}, {{4, 3}, DType::i32}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"contract_rows", {{{3, 4, 5}}, {{3, 4, 2}}}, [](auto& x) { return detail::contract_rows(x[0], x[1], Loc::current()); }});
  run_case({"contract_rows_4d_int", {{{2, 2, 3, 4}, DType::i64}, {{2, 2, 3, 3}, DType::i64}},
            [](auto& x) { return detail::contract_rows(x[0], x[1], Loc::current()); }});
  run_case({"int_matmul", {{{4, 5}, DType::i32}, {{5, 3}, DType::i32}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"f64_matmul", {{{4, 5}, DType::f64}, {{5, 3}, DType::f64}}, [](auto& x) { return matmul(x[0], x[1]); }});
  // bf16: the backend's bf16 GEMM (f32 sums, one rounding), an odd depth, a transposed weight,
  // a batch, and row blocks past LIBXSMM's 128.
  const DType bf = DType::bf16;
  run_case({"bf16_matmul", {{{5, 7}, bf}, {{7, 4}, bf}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"bf16_matmul_transposed", {{{6, 9}, bf}, {{5, 9}, bf}}, [](auto& x) { return matmul(x[0], transpose(x[1])); }});
  run_case({"bf16_batched", {{{3, 5, 4}, bf}, {{3, 4, 2}, bf}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"bf16_rows", {{{3, 5, 4}, bf}, {{4, 2}, bf}}, [](auto& x) { return matmul(x[0], x[1]); }});
  run_case({"bf16_contract_rows", {{{3, 5, 4}, bf}, {{3, 5, 2}, bf}}, [](auto& x) { return detail::contract_rows(x[0], x[1], Loc::current()); }});
  run_case({"bf16_tall", {{{150, 40}, bf}, {{40, 60}, bf}, {{60}, bf}}, [](auto& x) { return relu(matmul(x[0], x[1]) + x[2]); }},
           1);
  run_case({"mlp", {{{8, 6}}, {{6, 5}}, {{5}}, {{5, 3}}},
            [](auto& x) { return softmax(matmul(relu(matmul(x[0], x[1]) + x[2]), x[3])); }});
}

TEST_CASE("movement ops") {
  const InputSpec a{{4, 6}}, c{{3, 1, 4}};
  run_case({"reshape", {a}, [](auto& x) { return reshape(x[0], {2, 12}); }});
  run_case({"reshape_infer", {a}, [](auto& x) { return reshape(x[0], {3, -1, 2}); }});
  run_case({"reshape_keep_rows", {{{5, 2, 3}}}, [](auto& x) { return reshape(x[0], {5, 6}) * 2.0; }});
  // Merged and split groups keep their outermost axis's sharding where the shard count divides
  // both outermost extents (4 and 12 over 2 or 4 devices), and gather otherwise (3 devices).
  run_case({"reshape_merge_outer", {{{4, 3, 2}}}, [](auto& x) { return reshape(x[0], {12, 2}) + 1.0; }});
  run_case({"reshape_split_outer", {{{12, 2}}}, [](auto& x) { return reshape(x[0], {4, 3, 2}) * 3.0; }});
  run_case({"reshape_merge_all", {{{6, 4}}}, [](auto& x) { return reshape(x[0], {24}) - 1.0; }});
  run_case({"reshape_regroup", {{{4, 6}}}, [](auto& x) { return reshape(x[0], {8, 3}); }});
  run_case({"transpose", {a}, [](auto& x) { return transpose(x[0]); }});
  run_case({"transpose3", {{{2, 3, 4}}}, [](auto& x) { return transpose(x[0], {1, 2, 0}) + 1.0; }});
  run_case({"broadcast_to", {c}, [](auto& x) { return broadcast_to(x[0], {2, 3, 5, 4}); }});
  run_case({"expand_dims", {a}, [](auto& x) { return expand_dims(x[0], 1); }});
  run_case({"squeeze", {c}, [](auto& x) { return squeeze(x[0]); }});
  run_case({"slice", {{{5, 7}}}, [](auto& x) { return slice(x[0], {1, 2}, {3, -1}); }});
  run_case({"pad", {a}, [](auto& x) { return pad(x[0], {{1, 0}, {2, 1}}, -1.5); }});
  run_case({"concat", {{{2, 3}}, {{4, 3}}}, [](auto& x) { return concat({x[0], x[1]}, 0); }});
  run_case({"concat1", {{{3, 2}}, {{3, 5}}, {{3, 1}}}, [](auto& x) { return concat({x[0], x[1], x[2]}, 1); }});
  run_case({"with_layout", {a}, [](auto& x) {
              Layout l = Layout::replicated(x[0].node()->mesh, 2);
              return with_layout(x[0] * 2.0, l) + 1.0;
            }});
  run_case({"int_transpose", {{{3, 5}, DType::i32}}, [](auto& x) { return transpose(x[0]); }});
}

TEST_CASE("sources: iota, factories and layout-invariant random numbers") {
  std::mt19937 rng(3);
  for (const Mesh& mesh : test_meshes()) {
    CAPTURE(mesh.to_string());
    for (int trial = 0; trial < 2; ++trial) {
      Layout l = random_layout(mesh, 2, rng);
      CAPTURE(l.to_string());
      for (Tensor t : {random_uniform({7, 5}, 42, l, -2, 3), random_normal({7, 5}, 42, l, 1, 0.5),
                       random_uniform({7, 5}, 9, l, 0, 1, DType::f64), iota({7, 5}, 1, l), full({7, 5}, 2.5, l, DType::bf16)}) {
        std::string mismatch = compare_with_reference(t.full_tensor(), reference_eval(t), 1e-5);
        CHECK_MESSAGE(mismatch.empty(), mismatch);
      }
      // The same seed gives bitwise the same global tensor under every layout.
      Array a = random_normal({7, 5}, 11, l).full_tensor();
      Array b = random_normal({7, 5}, 11, Layout::replicated(create_mesh({{"x", 1}}), 2)).full_tensor();
      CHECK(same_array(a, b));
    }
  }
}

TEST_CASE("bf16 and f16 values computed inside a fused kernel are rounded as if stored after every op") {
  // Halfway cases, the f16 subnormal range and its edges, overflow, infinities and NaN.
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.0f + 1.0f / 256,
                               1.0f + 3.0f / 256, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 6.1e-5f, 6.0e-5f,
                               3.0e-8f, 2.98023224e-8f, 5.96046448e-8f, 8.9e-8f, 1.0e-9f, -4.5e-6f, 3.3895e38f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(), 1.5e-40f, 0.1f, -2.7182818f};
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> wide(-10, 10);
  for (int i = 0; i < 200; ++i) values.push_back(std::ldexp(wide(rng), int(rng() % 60) - 40));
  // Every exponent and sign: uniformly random bit patterns (NaNs among them), and the largest
  // finite values, which round to infinity or not.
  for (int i = 0; i < 4096; ++i) values.push_back(std::bit_cast<float>(uint32_t(rng())));
  for (uint32_t bits : {0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x3f808000u, 0xbf818000u, 0x00008000u})
    values.push_back(std::bit_cast<float>(bits));
  const Array x = Array::from<float>(values, {int64_t(values.size())});
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}, {"y", 2}})}) {
    Tensor t = copy_to_mesh(x, Layout({"x"}, mesh));
    // One kernel: the multiply, both casts and the add are fused, so nothing is stored as f16.
    Array f16_trip = (cast(cast(t * 1.0f, DType::f16), DType::f32) + 0.0f).full_tensor();
    Array bf16_trip = (cast(cast(t * 1.0f, DType::bf16), DType::f32) + 0.0f).full_tensor();
    for (size_t i = 0; i < values.size(); ++i) {
      CAPTURE(values[i]);
      const float want16 = f16_to_float(float_to_f16(values[i])), want_b = bf16_to_float(float_to_bf16(values[i]));
      const float got16 = f16_trip.data<float>()[i], got_b = bf16_trip.data<float>()[i];
      if (std::isnan(want16)) {
        CHECK(std::isnan(got16));
        CHECK(std::isnan(got_b));
        continue;
      }
      // Bitwise, except that the sign of a zero is not significant (kernels are compiled with
      // nsz, docs/COMPILER.md): -0 + 0 is -0 on CPUs, which fold the add, and +0 on GPUs.
      auto same = [](float got, float want) {
        return std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want) || (got == 0 && want == 0);
      };
      CHECK(same(got16, want16));
      CHECK(same(got_b, want_b));
    }
  }
  // A bf16 chain: each op rounds, as the reference (and PyTorch eager) do.
  Mesh mesh = create_mesh({{"x", 2}});
  Array a({64}, DType::bf16);
  for (int64_t i = 0; i < 64; ++i) store_from_double(a.mutable_bytes(), DType::bf16, i, 1.0 + double(i) / 37.0);
  Tensor ta = copy_to_mesh(a, Layout({"x"}, mesh));
  Tensor chain = (ta * 3.0f + 1.0f) * ta;
  std::map<const Node*, Array> leaves{{ta.node().get(), a}};
  CHECK(compare_with_reference(chain.full_tensor(), reference_eval(chain, leaves), 0.0) == "");
}

TEST_CASE("a reshape merging or splitting a batch-sharded axis keeps it sharded, with no collective, when the shards divide it") {
  Mesh mesh = create_mesh({{"dp", 2}});
  Array a({8, 6}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i);
  Tensor rows = distribute_tensor(a, mesh, {Shard{0}});
  Tensor flat = reshape(rows, {48});
  CHECK(plan_summary(flat).collectives.empty());
  CHECK(flat.layout().to_string().find("sharding_specs:dp") != std::string::npos);
  CHECK(flat.full_tensor().to_vector<float>() == a.to_vector<float>());
  Tensor back = reshape(flat, {4, 2, 6});
  CHECK(plan_summary(back).collectives.empty());
  CHECK(back.full_tensor().to_vector<float>() == a.to_vector<float>());
  // 9 rows over 2 devices split 5 + 4: 45 and 36 elements are not halves of 81, so the group is
  // gathered first.
  Array odd({9, 6}, DType::f32);
  for (int64_t i = 0; i < odd.numel(); ++i) odd.mutable_data<float>()[i] = float(i);
  Tensor odd_flat = reshape(distribute_tensor(odd, mesh, {Shard{0}}), {54});
  CHECK(odd_flat.full_tensor().to_vector<float>() == odd.to_vector<float>());
}
