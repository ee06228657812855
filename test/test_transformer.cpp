// The configurable decoder of nn/transformer.hpp: rotary tables against Llama 3's formula, the
// Llama family (RMSNorm, RoPE, grouped-query attention, SwiGLU) trained on one device and under
// data, tensor, sequence and fully sharded parallelism, the collectives of its tensor-parallel
// plan, tied embeddings, and the parameter count against transformer_config's formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <tessera/tessera.hpp>

#include "dsl/element_count.hpp"

using namespace tessera;

namespace {

// A small Llama: head_dim 4, 2 kv heads for 4 query heads, Llama 3's scaling with a short
// original context so both of its regimes (blended and divided) occur.
TransformerConfig tiny_llama() {
  TransformerConfig c;
  c.name = "test-llama";
  c.vocab = 13, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 24, c.max_seq = 8, c.seed = 7;
  c.rope_scaling = RopeScaling{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 8};
  return c;
}

Array ids_array(int64_t batch, int64_t time, uint32_t seed, int64_t vocab = 13) {
  std::mt19937 rng(seed);
  Array a({batch, time}, DType::i32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<int32_t>()[i] = int32_t(rng() % uint32_t(vocab));
  return a;
}

Array random_array(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Array a(std::move(shape), DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = u(rng);
  return a;
}

struct Parallelism {
  bool data = false, sequence = false, fsdp = false;
};

// Losses of `steps` AdamW steps on one batch, the model distributed as distribute_transformer does.
std::vector<double> train(const TransformerConfig& config, const Mesh& mesh, Parallelism how, int steps = 3) {
  Transformer model(config, mesh);
  distribute_transformer(model, mesh, how.sequence, how.fsdp);
  AdamW optimizer(model.parameters(), 1e-2);
  const std::vector<Variable> params = model.parameters();
  std::vector<Placement> batch(size_t(mesh.ndim()), Replicate{});
  if (how.data || how.fsdp) batch[size_t(mesh.dim_index("dp"))] = Shard{0};
  auto step = jit([&](const Tensor& ids, const Tensor& targets) {
    Tensor loss = cross_entropy(model(ids), targets);
    std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
    (void)clip_grad_norm(grads, 1.0);
    optimizer.apply(grads);
    return loss;
  });
  std::vector<double> losses;
  // 7 of the 8 positions: sequence shards of 4 and 3.
  const Tensor ids = distribute_tensor(ids_array(4, 7, 1), mesh, batch);
  const Tensor targets = distribute_tensor(ids_array(4, 7, 2), mesh, batch);
  for (int s = 0; s < steps; ++s) losses.push_back(double(step(ids, targets).full_tensor().data<float>()[0]));
  return losses;
}

struct Run {
  const char* name;
  Mesh mesh;
  Parallelism how;
};

std::vector<Run> parallel_runs() {
  return {{"dp=2", create_mesh({{"dp", 2}}), {.data = true}},
          {"tp=2", create_mesh({{"tp", 2}}), {}},
          {"dp=2,tp=2", create_mesh({{"dp", 2}, {"tp", 2}}), {.data = true}},
          {"fsdp dp=3", create_mesh({{"dp", 3}}), {.fsdp = true}},
          {"tp=2 sequence parallel", create_mesh({{"tp", 2}}), {.sequence = true}},
          {"dp=2,tp=2 sequence parallel fsdp", create_mesh({{"dp", 2}, {"tp", 2}}), {.data = true, .sequence = true, .fsdp = true}}};
}

int64_t numel_of(const Module& model) {
  int64_t n = 0;
  for (const Variable& p : model.parameters()) n += checked_element_count(p.shape(), "parameter");
  return n;
}

}  // namespace

TEST_CASE("swiglu_hidden_size is Meta's rule: the Llama 3 presets' published hidden sizes") {
  CHECK(swiglu_hidden_size(4096, 1024, 1.3) == 14336);
  CHECK(swiglu_hidden_size(8192, 4096, 1.3) == 28672);
  CHECK(swiglu_hidden_size(16384, 4096, 1.2) == 53248);
  CHECK(swiglu_hidden_size(4096, 256) == 11008);  // Llama 2 7B: no multiplier
  CHECK(transformer_preset("llama3-8b").hidden == 14336);
  CHECK(transformer_preset("llama3-405b").hidden == 53248);
  CHECK_THROWS_AS(swiglu_hidden_size(0, 256), ShapeError);
}

TEST_CASE("rotary tables computed on the devices equal Llama 3's scaled frequencies, bitwise the same on every mesh") {
  TransformerConfig c = tiny_llama();
  c.dim = 64, c.heads = 4, c.kv_heads = 4;  // head_dim 16: 8 frequencies
  c.rope_theta = 500000;
  c.rope_scaling = RopeScaling{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 64};
  const std::vector<double> inv = rotary_inverse_frequencies(c);
  REQUIRE(inv.size() == 8);
  // Wavelengths 6.3 (kept: < 64 / 4), 32.6 (blended: between 16 and 64), then > 64 (divided by 8).
  CHECK(inv[0] == doctest::Approx(1.0));
  const double raw1 = std::pow(500000.0, -2.0 / 16), smooth = (64 * raw1 / (2 * M_PI) - 1) / 3;
  CHECK(inv[1] == doctest::Approx((1 - smooth) * raw1 / 8 + smooth * raw1));
  CHECK(inv[4] == doctest::Approx(std::pow(500000.0, -8.0 / 16) / 8));
  const int64_t seq = 40;
  std::optional<std::vector<float>> first_cos;
  for (const Mesh& mesh : {create_mesh({{"x", 1}}), create_mesh({{"x", 2}}), create_mesh({{"a", 2}, {"b", 3}})}) {
    CAPTURE(mesh.to_string());
    const RotaryTables tables = rotary_tables(c, seq, mesh);
    CHECK(tables.cos.shape() == std::vector<int64_t>{seq, 8});
    const std::vector<float> cosines = tables.cos.full_tensor().to_vector<float>(), sines = tables.sin.full_tensor().to_vector<float>();
    for (int64_t p = 0; p < seq; ++p)
      for (int64_t i = 0; i < 8; ++i) {
        const double angle = double(p) * inv[size_t(i)];
        CHECK(double(cosines[size_t(p * 8 + i)]) == doctest::Approx(std::cos(angle)).epsilon(2e-5));
        CHECK(double(sines[size_t(p * 8 + i)]) == doctest::Approx(std::sin(angle)).epsilon(2e-5));
      }
    if (!first_cos) first_cos = cosines;
    else CHECK(*first_cos == cosines);
  }
  TransformerConfig odd = c;
  odd.dim = 12, odd.heads = 4, odd.kv_heads = 4;
  CHECK_THROWS_WITH_AS(rotary_tables(odd, 4, create_mesh({{"x", 1}})), doctest::Contains("head_dim 3"), ShapeError);
}

TEST_CASE("apply_rotary rotates each head's halves by the tables; sharded over heads or sequence it moves nothing") {
  const TransformerConfig c = tiny_llama();  // head_dim 4
  const Array x = random_array({2, 6, 4, 4}, 3);
  const std::vector<double> inv = rotary_inverse_frequencies(c);
  const std::vector<float> in = x.to_vector<float>();
  std::vector<float> want(in.size());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < 2; ++i) {
          const size_t base = size_t(((b * 6 + t) * 4 + h) * 4);
          const double a = double(t) * inv[size_t(i)], x1 = in[base + size_t(i)], x2 = in[base + size_t(i) + 2];
          want[base + size_t(i)] = float(x1 * std::cos(a) - x2 * std::sin(a));
          want[base + size_t(i) + 2] = float(x1 * std::sin(a) + x2 * std::cos(a));
        }
  for (const auto& [name, mesh, placements] : std::vector<std::tuple<const char*, Mesh, std::vector<Placement>>>{
           {"one device", create_mesh({{"x", 1}}), {Replicate{}}},
           {"heads over tp=2", create_mesh({{"tp", 2}}), {Shard{2}}},
           {"sequence over 4 (uneven)", create_mesh({{"cp", 4}}), {Shard{1}}},
           {"batch x heads on 2x2", create_mesh({{"dp", 2}, {"tp", 2}}), {Shard{0}, Shard{2}}}}) {
    CAPTURE(name);
    const Tensor sharded = distribute_tensor(x, mesh, placements);
    const RotaryTables tables = rotary_tables(c, 8, mesh);
    (void)tables.cos.full_tensor(), (void)tables.sin.full_tensor();
    CommDebugMode comm;
    const Tensor rotated = apply_rotary(sharded, tables);
    CHECK(rotated.placements() == placements);
    const std::vector<float> got = rotated.full_tensor().to_vector<float>();
    if (placements != std::vector<Placement>{Replicate{}}) CHECK(comm.get_comm_counts().count("all_reduce") == 0);
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("grouped-query attention is attention with each kv head repeated for its query heads") {
  // The same model with kv_heads 4, its wk and wv columns copied per query head from the
  // kv_heads 2 model's, gives the same logits: kv head j serves query heads 2j and 2j + 1.
  const Mesh mesh = create_mesh({{"x", 1}});
  const TransformerConfig grouped = tiny_llama();
  TransformerConfig full = grouped;
  full.kv_heads = 4;
  Transformer a(grouped, mesh), b(full, mesh);
  for (const auto& [name, variable] : a.named_parameters()) {
    Array value = variable.value().full_tensor();
    if (name.ends_with("attention.wk.weight") || name.ends_with("attention.wv.weight")) {
      const std::vector<float> src = value.to_vector<float>();  // [16, 2 heads x 4]
      Array repeated({16, 16}, DType::f32);
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t d = 0; d < 4; ++d) repeated.mutable_data<float>()[r * 16 + h * 4 + d] = src[size_t(r * 8 + (h / 2) * 4 + d)];
      value = repeated;
    }
    b.set_parameter(name, Variable(distribute_tensor(value, mesh, {Replicate{}})));
  }
  const Tensor ids = distribute_tensor(ids_array(3, 8, 5), mesh, {Replicate{}});
  const std::vector<float> la = a(ids).full_tensor().to_vector<float>(), lb = b(ids).full_tensor().to_vector<float>();
  REQUIRE(la.size() == lb.size());
  for (size_t i = 0; i < la.size(); ++i) CHECK(la[i] == doctest::Approx(lb[i]).epsilon(1e-5));
}

TEST_CASE("a Llama-family Transformer trains to one device's losses under data, tensor, sequence and fully sharded parallelism") {
  const TransformerConfig c = tiny_llama();
  const std::vector<double> reference = train(c, create_mesh({{"x", 1}}), {});
  CHECK(reference.back() < reference.front());
  std::vector<Run> runs = parallel_runs();
  // 2 kv heads over 4 devices: half a kv head each, which the partitioner regroups.
  runs.push_back({"tp=4 (kv heads split)", create_mesh({{"tp", 4}}), {}});
  for (const Run& run : runs) {
    CAPTURE(run.name);
    const std::vector<double> losses = train(c, run.mesh, run.how);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == doctest::Approx(reference[s]).epsilon(2e-4));
  }
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 a Llama-family Transformer's losses are bitwise one device's on every mesh") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const TransformerConfig c = tiny_llama();
  const std::vector<double> reference = train(c, create_mesh({{"x", 1}}), {});
  for (const Run& run : parallel_runs()) {
    CAPTURE(run.name);
    const std::vector<double> losses = train(c, run.mesh, run.how);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == reference[s]);
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("the Llama tensor-parallel plan: whole kv heads per device, two all_reduces per block, logits vocabulary-sharded") {
  const TransformerConfig c = tiny_llama();
  const Mesh mesh = create_mesh({{"tp", 2}});
  const Tensor ids = distribute_tensor(ids_array(4, 7, 1), mesh, {Replicate{}});
  {
    Transformer model(c, mesh);
    distribute_transformer(model, mesh, false, false);
    CHECK(model.get_parameter("layers.0.attention.wk.weight").value().placements() == std::vector<Placement>{Shard{1}});
    CHECK(model.get_parameter("layers.1.feed_forward.w3.weight").value().placements() == std::vector<Placement>{Shard{1}});
    CHECK(model.get_parameter("layers.1.feed_forward.w2.weight").value().placements() == std::vector<Placement>{Shard{0}});
    CommDebugMode comm;
    const Tensor logits = model(ids);
    CHECK(logits.placements() == std::vector<Placement>{Shard{2}});
    (void)logits.full_tensor();
    // The embedding's all_reduce, wo's and w2's per block; full_tensor's gather of the logits.
    CAPTURE(comm.generate_comm_debug_tracing_table());
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 1}, {"all_reduce", 2 * c.layers + 1}});
  }
  {
    Transformer model(c, mesh);
    distribute_transformer(model, mesh, true, false);
    CommDebugMode comm;
    const Tensor logits = model(ids);
    (void)logits.full_tensor();
    // Sequence parallel: per block two reduce_scatters and two all_gathers (attention's and the
    // MLP's inputs); the embedding's reduce_scatter, the output's gather and full_tensor's.
    CAPTURE(comm.generate_comm_debug_tracing_table());
    CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 2 * c.layers + 2}, {"reduce_scatter", 2 * c.layers + 1}});
    const Tensor embedded = model.get_submodule("tok_embeddings")(ids);
    CHECK(embedded.placements() == std::vector<Placement>{Shard{1}});
    CHECK(model.get_submodule("layers.0.attention_norm")(embedded).placements() == std::vector<Placement>{Shard{1}});
  }
}

TEST_CASE("a Transformer holds exactly parameter_count(config) parameters, by torchtitan's names; tied embeddings have no output") {
  TransformerConfig gqa = tiny_llama();
  TransformerConfig gpt2_like = transformer_preset("gpt2");
  gpt2_like.vocab = 13, gpt2_like.dim = 16, gpt2_like.layers = 2, gpt2_like.heads = 4, gpt2_like.kv_heads = 4;
  gpt2_like.hidden = 64, gpt2_like.max_seq = 8;
  const Mesh mesh = create_mesh({{"x", 1}});
  for (const TransformerConfig& c : {gqa, gpt2_like, gpt_transformer_config(GptConfig{})}) {
    CAPTURE(c.name);
    Transformer model(c, mesh);
    CHECK(numel_of(model) == parameter_count(c));
  }
  Transformer llama(gqa, mesh);
  std::vector<std::string> names;
  for (const auto& [name, variable] : llama.named_parameters()) names.push_back(name);
  CHECK(names.front() == "tok_embeddings.weight");
  CHECK(std::find(names.begin(), names.end(), "layers.1.attention.wq.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "layers.1.feed_forward.w3.weight") != names.end());
  CHECK(names.back() == "output.weight");
  CHECK(llama.get_parameter("layers.0.attention.wk.weight").value().shape() == std::vector<int64_t>{16, 8});

  // Tied: the logits are the final hidden state against the embedding table, whose gradient
  // sums both uses; on tp=2 the vocabulary-sharded table leaves the logits vocabulary-sharded.
  Transformer tied(gpt2_like, mesh);
  CHECK_THROWS_AS(tied.get_submodule("output"), Error);
  const Tensor ids = distribute_tensor(ids_array(2, 8, 4), mesh, {Replicate{}});
  const std::vector<float> one = tied(ids).full_tensor().to_vector<float>();
  const Mesh tp = create_mesh({{"tp", 2}});
  Transformer tied_tp(gpt2_like, tp);
  distribute_transformer(tied_tp, tp, false, false);
  const Tensor logits = tied_tp(distribute_tensor(ids_array(2, 8, 4), tp, {Replicate{}}));
  CHECK(logits.placements() == std::vector<Placement>{Shard{2}});
  const std::vector<float> two = logits.full_tensor().to_vector<float>();
  for (size_t i = 0; i < one.size(); ++i) CHECK(two[i] == doctest::Approx(one[i]).epsilon(1e-5));
}

TEST_CASE("Transformer refuses what it cannot build, naming it") {
  const Mesh mesh = create_mesh({{"x", 1}});
  TransformerConfig odd = tiny_llama();
  odd.dim = 12, odd.heads = 4, odd.kv_heads = 4;
  CHECK_THROWS_WITH_AS(Transformer(odd, mesh), doctest::Contains("even head_dim"), ShapeError);
  TransformerConfig bad = tiny_llama();
  bad.kv_heads = 3;
  CHECK_THROWS_WITH_AS(Transformer(bad, mesh), doctest::Contains("kv_heads 3 does not divide heads 4"), ShapeError);
  Transformer model(tiny_llama(), mesh);
  CHECK_THROWS_WITH_AS(model(distribute_tensor(ids_array(1, 9, 1), mesh, {Replicate{}})), doctest::Contains("time <= context 8"),
                       ShapeError);
}

TEST_CASE("auto_parallelize plans a Llama-family Transformer: tp keeps whole kv heads, the winner's plan is its step's") {
  TransformerConfig c = tiny_llama();
  c.dim = 64, c.heads = 8, c.kv_heads = 2, c.hidden = 128, c.max_seq = 64, c.vocab = 512;
  const Hardware hw = hardware_profile("h100-sxm");
  Transformer model(c, abstract_mesh({{"dp", 1}}, hw, 8));
  const ParallelPlanSearch search = auto_parallelize(model, 8, hw, int64_t(80) << 30, 16, 8);
  REQUIRE(search.best.fits);
  bool some_tp = false;
  for (const ParallelCandidate& candidate : search.candidates) {
    CHECK_FALSE(candidate.pipelined());  // stages are the GPT's pipelined model's
    for (const auto& [dim, size] : candidate.mesh)
      if (dim == "tp") {
        some_tp = true;
        CHECK(c.kv_heads % size == 0);
      }
  }
  CHECK(some_tp);
  // The winner's report is exactly the plan of its training step at full depth.
  TransformerConfig planned = c;
  planned.activation_checkpointing = search.best.activation_checkpointing;
  planned.mixed_precision = search.best.mixed_precision;
  if (search.best.exact) {
    const PlanReport again = plan_transformer_training_step(planned, abstract_mesh(search.best.mesh, hw, 8), search.best.sequence_parallel,
                                                            search.best.fsdp, 16);
    CHECK(again.peak_bytes == search.best.report.peak_bytes);
  }
}
