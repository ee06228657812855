// Pipeline parallelism (nn/pipeline.hpp, nn/pipelined_transformer.hpp): the GPipe schedule on a
// pp mesh dim trains a GPT, and a Llama-family model, to the losses of one device with the same
// microbatches, bitwise under TESSERA_DETERMINISTIC=1, alone and with dp and tp, with even and
// uneven stage splits; the model is the Transformer's; stages exchange activations by shifts only.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include <tessera/tessera.hpp>

#include "nn/training_step_adamw.hpp"
#include "plan_checks.hpp"
#include "tiny_gpt.hpp"

using namespace tessera;

namespace {

GptConfig tiny(int64_t layers) { return testing::tiny_gpt_config(layers); }
Array tokens(int64_t batch, int64_t time, uint32_t seed) { return testing::tiny_gpt_tokens(batch, time, seed); }

// The GPT sample's batch layout: sequences over dp, positions over sp.
std::vector<Placement> batch_placements(const Mesh& mesh) { return GptTrainingStep::batch_layout(mesh).placements(); }

struct Trained {
  std::vector<float> losses;
  std::vector<float> head_weight;  // after the last step
  std::vector<float> last_bias;    // with Options::bias_rate: the last layer's expert bias after the last step
};

// How train() and train_transformer() run: the schedule, its virtual stages, and what
// distribute_pipelined_transformer adds.
struct Options {
  int64_t virtual_stages = 1;
  PipelineSchedule schedule = PipelineSchedule::GPipe;
  bool fsdp = false;
  std::optional<MixedPrecisionPolicy> precision = std::nullopt;
  bool sequence_parallel = false;  // Megatron's, on tp
  double bias_rate = 0;            // MoE models: update_expert_bias at this rate every step
};

// `steps` AdamW steps of `model` (distributed here as `options` say) on batches of 8 sequences;
// `head`: the parameter whose final value is kept.
Trained train_model(PipelinedTransformer& model, const Mesh& mesh, int64_t microbatches, int steps, const Options& options,
                    const std::string& head) {
  distribute_pipelined_transformer(model, mesh, options.fsdp, options.sequence_parallel);
  const std::vector<Variable> params = model.parameters();
  AdamW optimizer(params, 1e-2);
  auto step = jit([&](const Tensor& ids, const Tensor& targets) {
    auto [loss, grads] = model.loss_and_gradients(ids, targets, microbatches, options.schedule);
    (void)clip_grad_norm(grads, model.gradient_squares(grads), 1.0);
    optimizer.apply(grads);
    if (options.bias_rate > 0) model.update_expert_bias(options.bias_rate);
    return loss;
  });
  Trained out;
  for (int s = 0; s < steps; ++s) {
    Tensor ids = distribute_tensor(tokens(8, 7, 1), mesh, batch_placements(mesh));
    Tensor targets = distribute_tensor(tokens(8, 7, 2), mesh, batch_placements(mesh));
    out.losses.push_back(step(ids, targets).full_tensor().data<float>()[0]);
  }
  out.head_weight = model.get_parameter(head).value().full_tensor().to_vector<float>();
  if (options.bias_rate > 0)
    out.last_bias = model.expert_bias(model.transformer_config().layers - 1).full_tensor().to_vector<float>();
  return out;
}

Trained train(const Mesh& mesh, int64_t layers, int64_t microbatches, int steps, Options options = {}) {
  GptConfig config = tiny(layers);
  config.mixed_precision = options.precision;
  PipelinedGpt model(config, mesh, options.virtual_stages);
  return train_model(model, mesh, microbatches, steps, options, "output.weight");
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("split_blocks, schedules and microbatches: even and uneven splits, typed errors") {
  CHECK(split_blocks(4, 2) == std::vector<int64_t>{2, 2});
  CHECK(split_blocks(5, 2) == std::vector<int64_t>{3, 2});
  CHECK(split_blocks(7, 4) == std::vector<int64_t>{2, 2, 2, 1});
  CHECK_THROWS_AS(split_blocks(2, 3), Error);
  CHECK_THROWS_AS(split_blocks(2, 0), Error);
  CHECK(std::string(pipeline_schedule_name(parse_pipeline_schedule("gpipe"))) == "gpipe");
  CHECK(std::string(pipeline_schedule_name(parse_pipeline_schedule("looped-bfs"))) == "looped-bfs");
  CHECK(std::string(pipeline_schedule_name(parse_pipeline_schedule("1f1b"))) == "1f1b");
  CHECK(std::string(pipeline_schedule_name(parse_pipeline_schedule("interleaved-1f1b"))) == "interleaved-1f1b");
  CHECK_THROWS_WITH_AS(parse_pipeline_schedule("zigzag"), doctest::Contains("gpipe"), Error);
  CHECK(pipeline_stage_count(create_mesh({{"dp", 2}})) == 1);
  CHECK(pipeline_stage_count(create_mesh({{"pp", 2}, {"dp", 1}})) == 2);

  // Microbatch m holds every count-th example from m on.
  const Mesh mesh = create_mesh({{"dp", 2}});
  Array a({6, 2}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i);
  const Tensor batch = distribute_tensor(a, mesh, {Shard{0}});
  CHECK(microbatch(batch, 1, 3).full_tensor().to_vector<float>() == std::vector<float>{2, 3, 8, 9});
  CHECK_THROWS_AS(microbatch(batch, 0, 4), ShapeError);
  CHECK_THROWS_AS(microbatch(batch, 3, 3), ShapeError);
}

TEST_CASE("a microbatch chosen at run time: one program for every microbatch, each exactly microbatch(m)'s, on several meshes") {
  // Even, uneven and empty shards of the split batch (3 rows a microbatch over dp = 2 and 4), 1-D and 2-D meshes.
  for (const std::vector<std::pair<std::string, int64_t>>& dims : std::vector<std::vector<std::pair<std::string, int64_t>>>{
           {{"dp", 1}}, {{"dp", 2}}, {{"dp", 4}}, {{"dp", 2}, {"tp", 2}}}) {
    const Mesh mesh = create_mesh(dims, cpu_devices(int(mesh_device_count(dims))));
    CAPTURE(mesh.to_string());
    std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
    placements[0] = Shard{0};
    Array f({12, 3}, DType::f32), ids({12, 3}, DType::i32);
    for (int64_t i = 0; i < f.numel(); ++i) f.mutable_data<float>()[i] = float(i) - 7.5f, ids.mutable_data<int32_t>()[i] = int32_t(i * 5 % 17);
    const auto chosen = jit([](const Tensor& batch, const Tensor& index) { return microbatch(batch, index, 4); });
    for (const Array& values : {f, ids}) {
      const Tensor batch = distribute_tensor(values, mesh, placements);
      for (int64_t m = 0; m < 4; ++m) {
        const Tensor index = distribute_tensor(Array::from<int32_t>({int32_t(m)}, {}), mesh, std::vector<Placement>(size_t(mesh.ndim()), Replicate{}));
        const Tensor got = chosen(batch, index), want = microbatch(batch, m, 4);
        CHECK(got.dtype() == values.dtype());
        if (mesh.size() > 1) CHECK(got.layout() == want.layout());  // on one device, Shard and Replicate are one placement
        CHECK(cast(got, DType::f64).full_tensor().to_vector<double>() == cast(want, DType::f64).full_tensor().to_vector<double>());
      }
    }
    CHECK(chosen.traces() == 2);  // one program per dtype, whatever the microbatch
  }
  const Mesh mesh = create_mesh({{"dp", 1}});
  const Tensor batch = zeros({8, 3}, Layout::replicated(mesh, 2));
  CHECK_THROWS_WITH_AS(microbatch(batch, zeros({}, Layout::replicated(mesh, 0), DType::f32), 4),
                       doctest::Contains("microbatch(index, count = 4): the index must be an int32 scalar, got float32 ()"), ShapeError);
  CHECK_THROWS_WITH_AS(microbatch(batch, zeros({1}, Layout::replicated(mesh, 1), DType::i32), 4),
                       doctest::Contains("the index must be an int32 scalar, got int32 (1,)"), ShapeError);
  CHECK_THROWS_WITH_AS(microbatch(batch, zeros({}, Layout::replicated(mesh, 0), DType::i32), 3),
                       doctest::Contains("the batch (8, 3) does not split into 3 equal microbatches"), ShapeError);
}

TEST_CASE("the looped timetable: every microbatch visits every chunk in order, one at a time per device; the bubble") {
  for (const auto& [stages, virtuals, count] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 4}, {2, 1, 4}, {4, 1, 8}, {2, 2, 4}, {2, 2, 3}, {4, 2, 8}, {3, 3, 5}}) {
    const int64_t p = stages, v = virtuals, m = count;
    CAPTURE(p);
    CAPTURE(v);
    CAPTURE(m);
    const PipelineTimetable table(p, v, m);
    // GPipe's M + P - 1 ticks; looped: M V + P - 1 when the rounds are full.
    if (v == 1 || m % p == 0) CHECK(table.ticks() == m * v + p - 1);
    if (v == 1) CHECK(table.bubble_fraction() == doctest::Approx(double(p - 1) / double(m + p - 1)));
    // Microbatch m reaches chunk c = v P + s one tick after chunk c - 1, and finishes on device P - 1.
    std::vector<std::vector<int64_t>> seen(static_cast<size_t>(m));  // each microbatch's chunks in tick order
    for (int64_t t = 0; t < table.ticks(); ++t)
      for (int64_t s = 0; s < p; ++s) {
        const PipelineSlot slot = table.slot(t, s);
        if (slot.microbatch < 0) continue;
        auto& chunks = seen[size_t(slot.microbatch)];
        CHECK(int64_t(chunks.size()) == slot.virtual_stage * p + s);
        chunks.push_back(slot.virtual_stage * p + s);
        if (int64_t(chunks.size()) == p * v) CHECK(table.finishing_tick(slot.microbatch) == t);
      }
    for (const auto& chunks : seen) CHECK(int64_t(chunks.size()) == p * v);
  }
  // Two virtual stages on 2 devices, 4 microbatches: 1 idle tick in 9 (GPipe's is 1 in 5).
  CHECK(PipelineTimetable(2, 2, 4).bubble_fraction() == doctest::Approx(1.0 / 9.0));
  CHECK_THROWS_AS(PipelineTimetable(2, 0, 4), Error);
}

TEST_CASE("a pipelined GPT on one stage is the GPT of nn/gpt.hpp: the same weights and the same loss") {
  const Mesh mesh = create_mesh({{"x", 1}});
  Gpt plain(tiny(3), mesh);
  PipelinedGpt piped(tiny(3), mesh);
  CHECK(piped.parameters().size() == plain.parameters().size());
  const Tensor ids = distribute_tensor(tokens(4, 7, 1), mesh, {Replicate{}});
  const Tensor targets = distribute_tensor(tokens(4, 7, 2), mesh, {Replicate{}});
  const float a = gpt_loss(plain(ids), targets).full_tensor().data<float>()[0];
  const float b = piped.loss(ids, targets, 1).full_tensor().data<float>()[0];
  CHECK(b == doctest::Approx(a).epsilon(1e-5));
  // The logits of forward() too.
  const auto la = plain(ids).full_tensor().to_vector<float>(), lb = piped(ids).full_tensor().to_vector<float>();
  REQUIRE(la.size() == lb.size());
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == doctest::Approx(la[i]).epsilon(1e-4));
}

TEST_CASE("the GPipe schedule on pp meshes trains to one device's losses with the same microbatches") {
  const Trained reference = train(create_mesh({{"x", 1}}), 4, 4, 3);
  CHECK(reference.losses.back() < reference.losses.front());
  for (const auto& [name, mesh] : std::vector<std::pair<const char*, Mesh>>{{"pp=2", create_mesh({{"pp", 2}})},
                                                                            {"pp=2,dp=2", create_mesh({{"pp", 2}, {"dp", 2}})}}) {
    CAPTURE(name);
    const Trained run = train(mesh, 4, 4, 3);
    for (size_t i = 0; i < reference.losses.size(); ++i) CHECK(run.losses[i] == doctest::Approx(reference.losses[i]).epsilon(1e-4));
  }
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 the pipelined GPT's losses and weights are bitwise one device's, on every mesh") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  struct Run {
    const char* name;
    Mesh mesh;
  };
  for (int64_t layers : {4, 3}) {  // even and uneven splits
    CAPTURE(layers);
    const Trained reference = train(create_mesh({{"x", 1}}), layers, 4, 3);
    for (const Run& run : {Run{"pp=2", create_mesh({{"pp", 2}})}, Run{"pp=2,dp=2", create_mesh({{"pp", 2}, {"dp", 2}})},
                           Run{"pp=2,tp=2", create_mesh({{"pp", 2}, {"tp", 2}})}, Run{"pp=3", create_mesh({{"pp", 3}})}}) {
      CAPTURE(run.name);
      const Trained got = train(run.mesh, layers, 4, 3);
      CHECK(bitwise_equal(got.losses, reference.losses));
      CHECK(bitwise_equal(got.head_weight, reference.head_weight));
    }
  }
  // The looped schedule: two virtual stages per device, even (4 blocks in 4 chunks) and uneven (5).
  for (int64_t layers : {4, 5}) {
    CAPTURE(layers);
    const Trained reference = train(create_mesh({{"x", 1}}), layers, 4, 3);
    for (const Run& run : {Run{"pp=2 looped", create_mesh({{"pp", 2}})}, Run{"pp=2,dp=2 looped", create_mesh({{"pp", 2}, {"dp", 2}})}}) {
      CAPTURE(run.name);
      const Trained got = train(run.mesh, layers, 4, 3, {.virtual_stages = 2, .schedule = PipelineSchedule::LoopedBFS});
      if (!bitwise_equal(got.losses, reference.losses))  // how far off: a summation order, or a wrong value
        for (size_t i = 0; i < got.losses.size(); ++i)
          MESSAGE(fmt::format("{} step {}: {:.9g} against {:.9g}", run.name, i, got.losses[i], reference.losses[i]));
      CHECK(bitwise_equal(got.losses, reference.losses));
      CHECK(bitwise_equal(got.head_weight, reference.head_weight));
    }
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("the 1F1B schedule: one device's losses with the same microbatches, bitwise under TESSERA_DETERMINISTIC=1, near GPipe's") {
  const Options one_f_one_b{.schedule = PipelineSchedule::OneFOneB};
  const Trained gpipe = train(create_mesh({{"x", 1}}), 4, 4, 3);
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  for (int64_t layers : {4, 3}) {
    CAPTURE(layers);
    const Trained reference = train(create_mesh({{"x", 1}}), layers, 4, 3, one_f_one_b);
    if (layers == 4)
      for (size_t i = 0; i < reference.losses.size(); ++i) CHECK(reference.losses[i] == doctest::Approx(gpipe.losses[i]).epsilon(1e-4));
    // Three blocks: uneven over 2 stages, one each over 3.
    std::vector<std::pair<std::string, Mesh>> meshes;
    meshes.emplace_back("pp=2", create_mesh({{"pp", 2}}));
    meshes.emplace_back("pp=3", create_mesh({{"pp", 3}}));
    if (layers == 4) {
      meshes.emplace_back("pp=2,dp=2", create_mesh({{"pp", 2}, {"dp", 2}}));
      meshes.emplace_back("pp=2,tp=2", create_mesh({{"pp", 2}, {"tp", 2}}));
    }
    for (const auto& [name, mesh] : meshes) {
      CAPTURE(name);
      const Trained got = train(mesh, layers, 4, 3, one_f_one_b);
      CHECK(bitwise_equal(got.losses, reference.losses));
      CHECK(bitwise_equal(got.head_weight, reference.head_weight));
    }
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("the interleaved 1F1B schedule (virtual stages, recomputing backward): one device's 1F1B losses, bitwise") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const Options interleaved{.virtual_stages = 2, .schedule = PipelineSchedule::Interleaved1F1B};
  for (int64_t layers : {4, 5}) {  // 4 or 5 blocks in 4 chunks
    CAPTURE(layers);
    const Trained reference = train(create_mesh({{"x", 1}}), layers, 4, 3, {.schedule = PipelineSchedule::OneFOneB});
    std::vector<std::pair<std::string, Mesh>> meshes;
    meshes.emplace_back("pp=2", create_mesh({{"pp", 2}}));
    if (layers == 4) meshes.emplace_back("pp=2,dp=2", create_mesh({{"pp", 2}, {"dp", 2}}));
    for (const auto& [name, mesh] : meshes) {
      CAPTURE(name);
      const Trained got = train(mesh, layers, 4, 3, interleaved);
      CHECK(bitwise_equal(got.losses, reference.losses));
      CHECK(bitwise_equal(got.head_weight, reference.head_weight));
    }
  }
  // One microbatch on two devices: a round of P microbatches left partly empty.
  const Trained reference = train(create_mesh({{"x", 1}}), 4, 1, 2, {.schedule = PipelineSchedule::OneFOneB});
  CHECK(bitwise_equal(train(create_mesh({{"pp", 2}}), 4, 1, 2, interleaved).losses, reference.losses));
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 pipelining composes with fully_shard, sequence shards and bf16 mixed precision, bitwise") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const Trained reference = train(create_mesh({{"x", 1}}), 4, 4, 3);
  // 7 positions over sp=2: uneven sequence shards.
  for (const auto& [name, mesh, fsdp] : std::vector<std::tuple<const char*, Mesh, bool>>{
           {"pp=2,dp=2 fsdp", create_mesh({{"pp", 2}, {"dp", 2}}), true}, {"pp=2,sp=2", create_mesh({{"pp", 2}, {"sp", 2}}), false}}) {
    CAPTURE(std::string(name));
    const Trained got = train(mesh, 4, 4, 3, {.fsdp = fsdp});
    CHECK(bitwise_equal(got.losses, reference.losses));
    CHECK(bitwise_equal(got.head_weight, reference.head_weight));
  }
  const MixedPrecisionPolicy bf16{DType::bf16, DType::f32, DType::f32};
  const Trained reference_bf16 = train(create_mesh({{"x", 1}}), 4, 4, 3, {.precision = bf16});
  CHECK(reference_bf16.losses.back() < reference_bf16.losses.front());
  for (int i = 0; i < 3; ++i) CHECK(reference_bf16.losses[size_t(i)] == doctest::Approx(reference.losses[size_t(i)]).epsilon(2e-2));
  for (const auto& [name, mesh, fsdp] : std::vector<std::tuple<const char*, Mesh, bool>>{
           {"pp=2 bf16", create_mesh({{"pp", 2}}), false}, {"pp=2,dp=2 fsdp bf16", create_mesh({{"pp", 2}, {"dp", 2}}), true}}) {
    CAPTURE(std::string(name));
    const Trained got = train(mesh, 4, 4, 3, {.fsdp = fsdp, .precision = bf16});
    CHECK(bitwise_equal(got.losses, reference_bf16.losses));
    CHECK(bitwise_equal(got.head_weight, reference_bf16.head_weight));
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("Megatron's sequence parallelism on tp composes with pipelines: one device's losses, bitwise, and activations split by position") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  // 7 positions over tp=2: uneven sequence shards. GPipe on pp x tp, 1F1B on pp x dp x tp with FSDP.
  for (const auto& [name, mesh, schedule, fsdp] : std::vector<std::tuple<const char*, Mesh, PipelineSchedule, bool>>{
           {"pp=2,tp=2 gpipe", create_mesh({{"pp", 2}, {"tp", 2}}), PipelineSchedule::GPipe, false},
           {"pp=2,dp=2,tp=2 fsdp 1f1b", create_mesh({{"pp", 2}, {"dp", 2}, {"tp", 2}}), PipelineSchedule::OneFOneB, true}}) {
    CAPTURE(std::string(name));
    const Trained reference = train(create_mesh({{"x", 1}}), 4, 4, 3, {.schedule = schedule});
    const Trained got = train(mesh, 4, 4, 3, {.schedule = schedule, .fsdp = fsdp, .sequence_parallel = true});
    CHECK(bitwise_equal(got.losses, reference.losses));
    CHECK(bitwise_equal(got.head_weight, reference.head_weight));
  }
  unsetenv("TESSERA_DETERMINISTIC");
  // What moves: the stages hand on half an activation (its positions on this tp rank), and each
  // row split's sum is a reduce_scatter over tp rather than an all_reduce.
  const Mesh mesh = create_mesh({{"pp", 2}, {"tp", 2}});
  auto collectives = [&](bool sequence_parallel) {
    PipelinedGpt model(tiny(4), mesh);
    distribute_pipelined_gpt(model, mesh, false, sequence_parallel);
    const std::vector<Variable> params = model.parameters();
    const Tensor ids = distribute_tensor(tokens(8, 8, 1), mesh, {Replicate{}, Replicate{}});
    const Tensor targets = distribute_tensor(tokens(8, 8, 2), mesh, {Replicate{}, Replicate{}});
    CommDebugMode mode;
    const Tensor loss = model.loss(ids, targets, 4);
    (void)gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
    return std::pair{mode.counts(), mode.bytes_by_kind()};
  };
  const auto [plain_counts, plain_bytes] = collectives(false);
  const auto [counts, bytes] = collectives(true);
  CHECK(counts.at("shift") == plain_counts.at("shift"));
  CHECK(bytes.at("shift") * 2 == plain_bytes.at("shift"));
  CHECK(counts.count("reduce_scatter") == 1);
  CHECK(counts.at("reduce_scatter") > 0);
  CHECK_FALSE(plain_counts.count("reduce_scatter"));
  PipelinedGpt without_tp(tiny(4), create_mesh({{"pp", 2}}));
  CHECK_THROWS_WITH_AS(distribute_pipelined_gpt(without_tp, create_mesh({{"pp", 2}}), false, true), doctest::Contains("tp mesh dim"), Error);
}

TEST_CASE("a GPipe step moves activations between stages and no weights: shifts, the last stage's outputs, the embeddings' gradients") {
  const int64_t microbatches = 4, batch = 8, time = 7, width = 16;
  const int64_t activation_bytes = batch / microbatches * time * width * 4;  // one microbatch's [2, 7, 16] f32
  for (int64_t stages : {2, 4}) {
    CAPTURE(stages);
    const Mesh mesh = create_mesh({{"pp", stages}});
    PipelinedGpt model(tiny(4), mesh);
    const std::vector<Variable> params = model.parameters();
    const Tensor ids = distribute_tensor(tokens(batch, time, 1), mesh, {Replicate{}});
    const Tensor targets = distribute_tensor(tokens(batch, time, 2), mesh, {Replicate{}});
    CommDebugMode mode;
    const Tensor loss = model.loss(ids, targets, microbatches);
    std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
    (void)clip_grad_norm(grads, model.gradient_squares(grads), 1.0);
    // M + P - 2 shifts forward and as many back; the gradient squares gathered once; each
    // microbatch's last-stage output summed over pp for the head (the other stages add zeros:
    // one slot's all_reduce, where gathering the stacked output moved P - 1 slots to every
    // device), those sums in one bucket; the embeddings' gradient terms (stage 0's) summed over
    // pp in another. Bytes count every device's share.
    const int64_t shifts = 2 * (microbatches + stages - 2);
    CHECK(mode.counts() == std::map<std::string, int64_t>{{"all_gather", 1}, {"all_reduce", 2}, {"shift", shifts}});
    CHECK(mode.bytes_by_kind().at("shift") == shifts * stages * activation_bytes);
    // Nothing weight-sized moves: the embeddings' gradients (stage 0's terms, each microbatch's
    // rows scattered into the token and position tables there) are summed over pp once, in one
    // bucket. Each bucket is a ring all_reduce: 2 (P - 1) / P of it from each of the P devices.
    const int64_t tables = (tiny(4).vocab + tiny(4).context) * width * 4, outputs = microbatches * activation_bytes;
    CHECK(mode.bytes_by_kind().at("all_reduce") == 2 * (stages - 1) * (tables + outputs));
    int64_t largest = 0;
    for (const auto& r : mode.records()) largest = std::max(largest, r.bytes);
    CHECK(largest == 2 * (stages - 1) * std::max(tables, outputs));
  }
}

TEST_CASE("a 1F1B step hands the head one slot per microbatch and the embeddings one slot back: all_reduces over pp, never the stacked state gathered") {
  const int64_t microbatches = 4, batch = 8, time = 7, width = 16;
  const int64_t activation_bytes = batch / microbatches * time * width * 4;  // one microbatch's [2, 7, 16] f32
  for (int64_t stages : {2, 4}) {
    CAPTURE(stages);
    const Mesh mesh = create_mesh({{"pp", stages}});
    PipelinedGpt model(tiny(4), mesh);
    const Tensor ids = distribute_tensor(tokens(batch, time, 1), mesh, {Replicate{}});
    const Tensor targets = distribute_tensor(tokens(batch, time, 2), mesh, {Replicate{}});
    auto step = jit([&](const Tensor& i, const Tensor& t) {  // the loss and every gradient, one program
      auto [loss, grads] = model.loss_and_gradients(i, t, microbatches, PipelineSchedule::OneFOneB);
      grads.push_back(loss);
      return grads;
    });
    CommDebugMode mode;
    (void)step(ids, targets).back().full_tensor();  // the program runs whole; the loss is replicated (nothing gathered after)
    // Each microbatch's last-stage output for the head and its cotangent at stage 0's input for
    // the embeddings: one slot each, summed over pp (2 (P - 1) / P of a slot from each of the P
    // devices). Gathering the stacked state moved P - 1 slots to every device, twice a microbatch.
    int64_t pp_all_reduce = 0, pp_all_gather = 0;
    for (const auto& r : mode.records()) {
      if (r.mesh_dim != "pp") continue;
      if (r.kind == "all_reduce") pp_all_reduce += r.bytes;
      if (r.kind == "all_gather") pp_all_gather += r.bytes;
    }
    CHECK(pp_all_gather == 0);
    CHECK(pp_all_reduce == 2 * (stages - 1) * 2 * microbatches * activation_bytes);
  }
}

TEST_CASE("a pipelined step's plan is what it holds and moves: peak bytes to the byte, collective bytes as CommDebugMode's") {
  for (const PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    // dp=2 without pp: gradient accumulation (whose 1F1B backward differentiates each
    // microbatch's forward, recomputing nothing).
    for (const auto& [name, mesh] : std::vector<std::pair<const char*, Mesh>>{{"pp=2", create_mesh({{"pp", 2}})},
                                                                              {"pp=2,dp=2", create_mesh({{"pp", 2}, {"dp", 2}})},
                                                                              {"dp=2 (accumulation)", create_mesh({{"dp", 2}})}}) {
      CAPTURE(std::string(name));
      CAPTURE(std::string(pipeline_schedule_name(schedule)));
      PipelinedGpt model(tiny(4), mesh);
      const std::vector<Variable> params = model.parameters();
      AdamW optimizer(params, 1e-2);
      auto step = jit([&](const Tensor& ids, const Tensor& targets) {
        auto [loss, grads] = model.loss_and_gradients(ids, targets, 4, schedule);
        (void)clip_grad_norm(grads, model.gradient_squares(grads), 1.0);
        optimizer.apply(grads);
        return loss;
      });
      const Tensor ids = distribute_tensor(tokens(8, 7, 1), mesh, batch_placements(mesh));
      const Tensor targets = distribute_tensor(tokens(8, 7, 2), mesh, batch_placements(mesh));
      testing::check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); });
    }
  }
}

// Gradient accumulation as PyTorch's pipelines do it (the gradient sync deferred to the last
// microbatch): each microbatch's weight-gradient terms stay partial sums over dp, are added up,
// and are reduced once, in f32 and under bf16 mixed precision (where they were reduced every tick).
TEST_CASE("a pipelined step reduces its gradients over dp once, whatever its microbatch count") {
  const Mesh mesh = create_mesh({{"pp", 2}, {"dp", 2}});
  for (const bool bf16 : {false, true}) {
    CAPTURE(bf16);
    GptConfig config = tiny(4);
    if (bf16) config.mixed_precision = kBf16MixedPrecision;
    std::map<int64_t, std::pair<int64_t, int64_t>> dp_reductions;  // microbatches -> (calls, bytes)
    for (const int64_t microbatches : {2, 4}) {
      PipelinedGptTrainingStep step(config, mesh, microbatches, PipelineSchedule::OneFOneB);
      const Tensor ids = distribute_tensor(tokens(8, 7, 1), mesh, batch_placements(mesh));
      const Tensor targets = distribute_tensor(tokens(8, 7, 2), mesh, batch_placements(mesh));
      CommDebugMode mode;
      (void)step(ids, targets).full_tensor();
      auto& [calls, bytes] = dp_reductions[microbatches];
      for (const auto& r : mode.records())
        if (r.mesh_dim == "dp" && (r.kind == "all_reduce" || r.kind == "reduce_scatter")) ++calls, bytes += r.bytes;
    }
    CHECK(dp_reductions[2].first > 0);
    CHECK(dp_reductions[4] == dp_reductions[2]);
  }
}

// 1F1B's point: a device keeps stage inputs for the microbatches in flight (about 2P), not for
// all of them, so its peak stops growing with the microbatch count where GPipe's grows with
// every microbatch's activations. The program runs each backward tick just after the last
// forward tick it reads (ProgramOrderScope, dsl/program_order_scope.hpp).
namespace {

void check_one_f_one_b_peak_is_bounded(const Mesh& mesh, int64_t context) {
  CAPTURE(mesh.to_string());
  GptConfig config = tiny(4);
  config.context = context;
  auto peak = [&](PipelineSchedule schedule, int64_t microbatches) {
    PipelinedGptTrainingStep step(config, mesh, microbatches, schedule);
    const int64_t batch = 2 * microbatches;  // microbatches of 2 sequences
    const Layout layout = GptTrainingStep::batch_layout(mesh);
    return step.plan(zeros({batch, context}, layout, DType::i32), zeros({batch, context}, layout, DType::i32)).peak_bytes;
  };
  const int64_t gpipe4 = peak(PipelineSchedule::GPipe, 4), gpipe16 = peak(PipelineSchedule::GPipe, 16);
  const int64_t one4 = peak(PipelineSchedule::OneFOneB, 4), one16 = peak(PipelineSchedule::OneFOneB, 16);
  const int64_t interleaved4 = peak(PipelineSchedule::Interleaved1F1B, 4), interleaved16 = peak(PipelineSchedule::Interleaved1F1B, 16);
  MESSAGE("peak bytes at 4 and 16 microbatches: gpipe " << gpipe4 << " -> " << gpipe16 << ", 1f1b " << one4 << " -> " << one16
                                                       << ", interleaved-1f1b " << interleaved4 << " -> " << interleaved16);
  // GPipe keeps every microbatch's activations for the backward; 1F1B's growth over 12 more
  // microbatches (their ids and targets, a scalar loss each) is less than one of GPipe's.
  const int64_t gpipe_per_microbatch = (gpipe16 - gpipe4) / 12;
  CHECK(gpipe_per_microbatch > 0);
  CHECK(one16 - one4 < gpipe_per_microbatch);
  CHECK(interleaved16 - interleaved4 < gpipe_per_microbatch);
  CHECK(one4 < gpipe4);
}

}  // namespace

TEST_CASE("1F1B's planned peak does not grow with the microbatch count; GPipe's does") {
  check_one_f_one_b_peak_is_bounded(create_mesh({{"pp", 2}}), 8);
  // Abstract H100s at 256 positions (fused attention's shortest keys, dsl/attention.cpp): their
  // target lacks the fused kernel, and the fallback that rebuilds the graph from attention on
  // (jit/library_fallback.cpp) must keep each node's position.
  check_one_f_one_b_peak_is_bounded(abstract_mesh({{"pp", 2}}, hardware_profile("h100-sxm"), 8), 256);
}

namespace {

// A tiny Llama-family model (RMSNorm, rotary embeddings, 2 kv heads for 4 query heads, SwiGLU,
// no biases) on the GPT's vocabulary and context.
TransformerConfig tiny_llama(int64_t layers, bool tied = false) {
  TransformerConfig c;
  c.name = "llama-test";
  c.vocab = 13, c.dim = 16, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.hidden = 32, c.max_seq = 8, c.seed = 7;
  c.tied_embeddings = tied;
  return c;
}

// train() for a PipelinedTransformer of `config`, keeping its output weight (the embedding
// table when tied).
Trained train_transformer(const TransformerConfig& config, const Mesh& mesh, int64_t microbatches, int steps, Options options = {}) {
  PipelinedTransformer model(config, mesh, options.virtual_stages);
  return train_model(model, mesh, microbatches, steps, options, config.tied_embeddings ? "tok_embeddings.weight" : "output.weight");
}

}  // namespace

TEST_CASE("a pipelined Llama on one stage is its Transformer: the same weights, slot by slot, and the same loss") {
  const Mesh mesh = create_mesh({{"x", 1}});
  const TransformerConfig config = tiny_llama(3);
  Transformer plain(config, mesh);
  PipelinedTransformer piped(config, mesh);
  CHECK(piped.parameters().size() == plain.parameters().size());
  // One stage, one chunk: slot j holds layer j's parameters as its single stacked row.
  for (const auto& [name, p] : plain.named_parameters()) {
    if (name.rfind("layers.", 0) != 0) {
      CHECK(piped.get_parameter(name).value().full_tensor().to_vector<float>() == p.value().full_tensor().to_vector<float>());
      continue;
    }
    const size_t dot = name.find('.', 7);
    const std::string slot = "slot" + name.substr(7, dot - 7) + name.substr(dot);
    CAPTURE(slot);
    CHECK(piped.get_parameter(slot).shape()[0] == 1);
    CHECK(piped.get_parameter(slot).value().full_tensor().to_vector<float>() == p.value().full_tensor().to_vector<float>());
  }
  const Tensor ids = distribute_tensor(tokens(4, 7, 1), mesh, {Replicate{}});
  const Tensor targets = distribute_tensor(tokens(4, 7, 2), mesh, {Replicate{}});
  const float a = cross_entropy(plain(ids), targets).full_tensor().data<float>()[0];
  CHECK(piped.loss(ids, targets, 1).full_tensor().data<float>()[0] == doctest::Approx(a).epsilon(1e-5));
  const auto la = plain(ids).full_tensor().to_vector<float>(), lb = piped(ids).full_tensor().to_vector<float>();
  REQUIRE(la.size() == lb.size());
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == doctest::Approx(la[i]).epsilon(1e-4));
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 a pipelined Llama trains to one device's losses bitwise: GPipe, 1F1B, tp over kv heads, tied") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const Options gpipe, one_f_one_b{.schedule = PipelineSchedule::OneFOneB};
  const Trained reference = train_transformer(tiny_llama(4), create_mesh({{"x", 1}}), 4, 3);
  CHECK(reference.losses.back() < reference.losses.front());
  for (const auto& [name, mesh] : std::vector<std::pair<const char*, Mesh>>{{"pp=2", create_mesh({{"pp", 2}})},
                                                                            {"pp=2,tp=2", create_mesh({{"pp", 2}, {"tp", 2}})}}) {
    CAPTURE(std::string(name));
    const Trained got = train_transformer(tiny_llama(4), mesh, 4, 3);
    CHECK(bitwise_equal(got.losses, reference.losses));
    CHECK(bitwise_equal(got.head_weight, reference.head_weight));
  }
  // 1F1B over 3 blocks (uneven on 2 stages) with dp, and with the output tied to the embedding
  // table, whose gradient is the first stage's and the loss's added up: near GPipe's on one device.
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    const Trained one = train_transformer(tiny_llama(3, tied), create_mesh({{"x", 1}}), 4, 3, one_f_one_b);
    const Trained piped = train_transformer(tiny_llama(3, tied), create_mesh({{"x", 1}}), 4, 3, gpipe);
    for (size_t i = 0; i < one.losses.size(); ++i) CHECK(one.losses[i] == doctest::Approx(piped.losses[i]).epsilon(1e-5));
    const Trained got = train_transformer(tiny_llama(3, tied), create_mesh({{"pp", 2}, {"dp", 2}}), 4, 3, one_f_one_b);
    CHECK(bitwise_equal(got.losses, one.losses));
    CHECK(bitwise_equal(got.head_weight, one.head_weight));
  }
  // Megatron's sequence parallelism and fully sharded stages.
  const Trained sequence_parallel =
      train_transformer(tiny_llama(4), create_mesh({{"pp", 2}, {"tp", 2}}), 4, 3, {.sequence_parallel = true});
  CHECK(bitwise_equal(sequence_parallel.losses, reference.losses));
  const Trained fsdp = train_transformer(tiny_llama(4), create_mesh({{"pp", 2}, {"dp", 2}}), 4, 3, {.fsdp = true});
  CHECK(bitwise_equal(fsdp.losses, reference.losses));
  unsetenv("TESSERA_DETERMINISTIC");
}

namespace {

// `steps` steps of a PipelinedTransformerTrainingStep (1F1B over pp: a host loop of tick
// programs, nn/pipeline_tick_loop.hpp) and of the same model and optimizer with the whole
// schedule traced as one program (run_pipeline_1f1b), on batches of 8 sequences of 7.
std::pair<Trained, Trained> host_loop_and_one_program(const TransformerConfig& config, const Mesh& mesh, int64_t microbatches, int steps,
                                                      bool fsdp = false, bool sequence_parallel = false) {
  const std::string head = config.tied_embeddings ? "tok_embeddings.weight" : "output.weight";
  auto batch = [&](uint32_t seed) { return distribute_tensor(tokens(8, 7, seed), mesh, batch_placements(mesh)); };
  Trained looped, one;
  PipelinedTransformerTrainingStep step(config, mesh, microbatches, PipelineSchedule::OneFOneB, fsdp, sequence_parallel);
  for (int s = 0; s < steps; ++s) looped.losses.push_back(step(batch(1), batch(2)).full_tensor().data<float>()[0]);
  looped.head_weight = step.model().get_parameter(head).value().full_tensor().to_vector<float>();
  PipelinedTransformer model(config, mesh);
  distribute_pipelined_transformer(model, mesh, fsdp, sequence_parallel);
  const std::vector<Variable> params = model.parameters();
  AdamW optimizer = training_step_adamw(params);
  auto whole = jit([&](const Tensor& ids, const Tensor& targets) {
    auto [loss, grads] = model.loss_and_gradients(ids, targets, microbatches, PipelineSchedule::OneFOneB);
    (void)clip_grad_norm(grads, model.gradient_squares(grads), 1.0);
    optimizer.apply(grads);
    return loss;
  });
  for (int s = 0; s < steps; ++s) one.losses.push_back(whole(batch(1), batch(2)).full_tensor().data<float>()[0]);
  one.head_weight = model.get_parameter(head).value().full_tensor().to_vector<float>();
  return {looped, one};
}

// The host loop's programs choose each tick's microbatches and busy stages from a counter, and
// carry the stage inputs, cotangents and gradient sums between calls: the same ops in the same
// order as the one program, so the same bits. Fewer microbatches than stages (warm-up and
// cool-down without a full steady state), uneven stage splits, and every composing dim.
struct HostLoopCase {
  const char* name;
  Mesh mesh;
  int64_t layers, microbatches;
  bool tied = false, fsdp = false, sequence_parallel = false;
};

void check_host_loop_is_one_program(const std::vector<HostLoopCase>& cases) {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  for (const HostLoopCase& c : cases) {
    CAPTURE(std::string(c.name));
    const auto [looped, one] = host_loop_and_one_program(tiny_llama(c.layers, c.tied), c.mesh, c.microbatches, 2, c.fsdp, c.sequence_parallel);
    CHECK(looped.losses.back() < looped.losses.front());
    CHECK(bitwise_equal(looped.losses, one.losses));
    CHECK(bitwise_equal(looped.head_weight, one.head_weight));
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

}  // namespace

// Two meshes whose programs hold every part of the loop (a warm-up longer than the steady state,
// uneven stages; tp's sequence-parallel collectives): the sanitizer runs run these.
TEST_CASE("1F1B as a host loop of tick programs: the one program's losses and weights, bitwise, on uneven stages and tp") {
  check_host_loop_is_one_program({HostLoopCase{"pp=3, 4 blocks (uneven), 8 microbatches", create_mesh({{"pp", 3}}), 4, 8},
                                  HostLoopCase{"pp=2,tp=2 sequence parallel", create_mesh({{"pp", 2}, {"tp", 2}}), 4, 4, false, false, true}});
}

// The rest of the meshes: the suite `sweep` (test/meson.build), which the plain build runs.
TEST_CASE("1F1B as a host loop of tick programs: the one program's losses and weights, bitwise, on every other mesh") {
  check_host_loop_is_one_program({HostLoopCase{"pp=2", create_mesh({{"pp", 2}}), 4, 4},
                                  HostLoopCase{"pp=2, one microbatch", create_mesh({{"pp", 2}}), 4, 1},
                                  HostLoopCase{"pp=3, 3 blocks, 2 microbatches", create_mesh({{"pp", 3}}), 3, 2},
                                  HostLoopCase{"pp=2,dp=2 tied", create_mesh({{"pp", 2}, {"dp", 2}}), 4, 4, true},
                                  HostLoopCase{"pp=2,dp=2 fsdp", create_mesh({{"pp", 2}, {"dp", 2}}), 4, 2, false, true}});
}

TEST_CASE("1F1B's host loop: P - 1 warm-up, M steady and P - 1 cool-down calls, and typed errors for what it cannot run") {
  const PipelineTickLoop loop(3, 5);
  std::vector<PipelineTickPhase> phases;
  for (int64_t n = 0; n < 5 + 2 * 2; ++n) phases.push_back(loop.phase_of_call(n));
  using enum PipelineTickPhase;
  CHECK(phases == std::vector<PipelineTickPhase>{WarmUp, WarmUp, Steady, Steady, Steady, Steady, Steady, CoolDown, CoolDown});
  CHECK(loop.calls(WarmUp) == 2);
  CHECK(loop.calls(Steady) == 5);
  CHECK(loop.calls(CoolDown) == 2);
  CHECK_THROWS_WITH_AS(PipelineTickLoop(1, 4), doctest::Contains("at least 2 stages"), Error);
  CHECK_THROWS_WITH_AS(PipelineTickLoop(2, 0), doctest::Contains("1 microbatch"), Error);
  PipelineTickLoop unprepared(2, 2);
  CHECK_FALSE(unprepared.prepared());
  CHECK_THROWS_WITH_AS((void)unprepared.call(Steady, PipelineTickModel{}), doctest::Contains("before prepare()"), Error);
  // Virtual stages and MoE layers stay on the one-program schedule, and say why if asked.
  const Mesh mesh = create_mesh({{"pp", 2}});
  const Tensor ids = distribute_tensor(tokens(8, 7, 1), mesh, {Replicate{}});
  PipelinedTransformer looped(tiny_llama(4), mesh, 2);
  CHECK_THROWS_WITH_AS((void)looped.tick_model(ids, ids, 4), doctest::Contains("one virtual stage per device"), Error);
  TransformerConfig moe = tiny_llama(4);
  moe.moe = MoEConfig{.num_experts = 4, .top_k = 2, .expert_hidden = 16, .first_dense_layers = 1};
  PipelinedTransformer experts(moe, mesh);
  CHECK_THROWS_WITH_AS((void)experts.tick_model(ids, ids, 4), doctest::Contains("MoE layers"), Error);
}

TEST_CASE("a pipelined Llama step's plan is what it holds and moves, with tp over its kv heads") {
  const Mesh mesh = create_mesh({{"pp", 2}, {"tp", 2}});
  PipelinedTransformerTrainingStep step(tiny_llama(4), mesh, 4, PipelineSchedule::OneFOneB);
  const Tensor ids = distribute_tensor(tokens(8, 7, 1), mesh, batch_placements(mesh));
  const Tensor targets = distribute_tensor(tokens(8, 7, 2), mesh, batch_placements(mesh));
  testing::check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); });
}

namespace {

// tiny_llama with MoE layers after a dense first one (4 experts, top 2, one shared expert): on 2
// stages of 4 layers, slot 0 holds the dense layer 0 on stage 0 and the MoE layer 2 on stage 1.
TransformerConfig tiny_moe(int64_t layers, double capacity_factor = 0) {
  TransformerConfig c = tiny_llama(layers);
  c.moe = MoEConfig{.num_experts = 4, .top_k = 2, .num_shared_experts = 1, .expert_hidden = 16, .first_dense_layers = 1,
                    .capacity_factor = capacity_factor};
  return c;
}

}  // namespace

TEST_CASE("MoE layers in stages: the balancing loss's gradient is the unpipelined objective's, coefficient included") {
  const Mesh mesh = create_mesh({{"x", 1}});
  const Tensor ids = distribute_tensor(tokens(4, 7, 1), mesh, {Replicate{}});
  const Tensor targets = distribute_tensor(tokens(4, 7, 2), mesh, {Replicate{}});
  for (double coefficient : {0.01, 0.5}) {
    CAPTURE(coefficient);
    TransformerConfig config = tiny_moe(2);
    config.moe->aux_loss_coefficient = coefficient;
    Transformer plain(config, mesh);
    const Tensor cross = cross_entropy(plain(ids), targets);  // the forward first: it sets the balancing loss
    const Tensor objective = cross + coefficient * plain.moe_aux_loss();
    const Tensor router = plain.get_parameter("layers.1.moe.router").value();
    const std::vector<float> want = gradients(objective, {router})[0].full_tensor().to_vector<float>();
    PipelinedTransformer piped(config, mesh);
    const auto [loss, grads] = piped.loss_and_gradients(ids, targets, 1, PipelineSchedule::GPipe);
    const auto named = piped.named_parameters();
    const size_t at = size_t(std::find_if(named.begin(), named.end(), [](const auto& p) { return p.first == "slot1.moe.router"; }) -
                             named.begin());
    REQUIRE(at < named.size());
    const std::vector<float> got = grads[at].full_tensor().to_vector<float>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-4).scale(1e-6));
  }
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 MoE layers in stages train to one device's losses bitwise, over ep, dp and tp with sequence parallelism, dropless or not") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const Options one_f_one_b{.schedule = PipelineSchedule::OneFOneB};
  for (double capacity : {0.0, 1.0}) {
    CAPTURE(capacity);
    const Trained reference = train_transformer(tiny_moe(4, capacity), create_mesh({{"x", 1}}), 4, 3, one_f_one_b);
    CHECK(reference.losses.back() < reference.losses.front());
    // Megatron's sequence parallelism too: the MoE layer gathers its input over tp, and its
    // shared experts read the same tokens as the routed ones, so x's gradient adds the layer's
    // terms as one device does (they had differed in the last bits).
    Options sequence_parallel = one_f_one_b;
    sequence_parallel.sequence_parallel = true;
    for (const auto& [name, mesh, options] : std::vector<std::tuple<const char*, Mesh, Options>>{
             {"pp=2,ep=2", create_mesh({{"pp", 2}, {"ep", 2}}), one_f_one_b},
             {"pp=2,dp=2", create_mesh({{"pp", 2}, {"dp", 2}}), one_f_one_b},
             {"pp=2,tp=2 +sequence parallel", create_mesh({{"pp", 2}, {"tp", 2}}), sequence_parallel}}) {
      if (options.sequence_parallel && capacity > 0) continue;  // the dropless run covers the gathered tokens' gradient
      CAPTURE(std::string(name));
      const Trained got = train_transformer(tiny_moe(4, capacity), mesh, 4, 3, options);
      CHECK(bitwise_equal(got.losses, reference.losses));
      CHECK(bitwise_equal(got.head_weight, reference.head_weight));
    }
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("the auxiliary-loss-free bias in stages: MoE::update_expert_bias's rule on each layer's load, bitwise one device's on pp") {
  // One stage, one microbatch: each layer's bias moves as the Transformer's MoE layer's does.
  const Mesh one = create_mesh({{"x", 1}});
  const Tensor ids = distribute_tensor(tokens(4, 7, 1), one, {Replicate{}});
  const Tensor targets = distribute_tensor(tokens(4, 7, 2), one, {Replicate{}});
  Transformer plain(tiny_moe(3), one);
  (void)plain(ids);
  for (MoE* moe : plain.moe_layers()) moe->update_expert_bias(0.1);
  PipelinedTransformer piped(tiny_moe(3), one);
  CHECK_THROWS_WITH_AS(piped.update_expert_bias(0.1), doctest::Contains("before any loss"), Error);
  (void)piped.loss(ids, targets, 1);
  piped.update_expert_bias(0.1);
  for (int64_t layer : {1, 2}) {
    CAPTURE(layer);
    const std::vector<float> want = plain.moe_layers()[size_t(layer - 1)]->expert_bias().value().full_tensor().to_vector<float>();
    CHECK(piped.expert_bias(layer).full_tensor().to_vector<float>() == want);
    CHECK(std::any_of(want.begin(), want.end(), [](float b) { return b != 0; }));
  }
  CHECK_THROWS_WITH_AS((void)piped.expert_bias(0), doctest::Contains("layer 0 is no MoE layer"), Error);
  CHECK_THROWS_WITH_AS(PipelinedTransformer(tiny_llama(2), one).update_expert_bias(0.1), doctest::Contains("without MoE layers"), Error);
  // Trained with the update every step: the loads of every microbatch, wherever its stage runs.
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const Options options{.schedule = PipelineSchedule::OneFOneB, .bias_rate = 0.05};
  const Trained reference = train_transformer(tiny_moe(4), one, 4, 3, options);
  const Trained got = train_transformer(tiny_moe(4), create_mesh({{"pp", 2}}), 4, 3, options);
  CHECK(bitwise_equal(got.losses, reference.losses));
  CHECK(bitwise_equal(got.last_bias, reference.last_bias));
  CHECK(std::any_of(reference.last_bias.begin(), reference.last_bias.end(), [](float b) { return b != 0; }));
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("a pipelined MoE step's plan is what it holds, its experts over ep, and at least what it moves") {
  const Mesh mesh = create_mesh({{"pp", 2}, {"ep", 2}});
  PipelinedTransformerTrainingStep step(tiny_moe(4), mesh, 4, PipelineSchedule::OneFOneB);
  const Tensor ids = distribute_tensor(tokens(8, 7, 1), mesh, TransformerTrainingStep::batch_layout(mesh).placements());
  const Tensor targets = distribute_tensor(tokens(8, 7, 2), mesh, TransformerTrainingStep::batch_layout(mesh).placements());
  // all_to_all_v is planned at its bound (what the routing may send at most).
  testing::check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); },
                                  testing::CollectiveBytes::AtMost);
}

TEST_CASE("ring attention in stages: a pp x cp mesh trains to one device's losses, to rounding (the ring merges blocks in its order)") {
  // 8 positions: 2 chunks a device on cp=2 for the causal balance (tokens of 7 would not split).
  auto batch = [](const Mesh& mesh, uint32_t seed) {
    return distribute_tensor(tokens(8, 8, seed), mesh, TransformerTrainingStep::batch_layout(mesh).placements());
  };
  auto losses = [&](const Mesh& mesh) {
    PipelinedTransformerTrainingStep step(tiny_llama(4), mesh, 4, PipelineSchedule::OneFOneB);
    std::vector<float> out;
    for (int s = 0; s < 3; ++s) out.push_back(step(batch(mesh, 1), batch(mesh, 2)).full_tensor().data<float>()[0]);
    return out;
  };
  const std::vector<float> reference = losses(create_mesh({{"x", 1}}));
  const std::vector<float> got = losses(create_mesh({{"pp", 2}, {"cp", 2}}));
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(reference[i]).epsilon(1e-5));
}

TEST_CASE("a pipeline's MoE dispatch needs the stage dim first, and says so") {
  // MoE dispatch folds the stages into the tokens, so the mesh must list pp before ep.
  const Mesh backwards = create_mesh({{"ep", 2}, {"pp", 2}});
  PipelinedTransformer model(tiny_moe(2), backwards);
  const Tensor ids = distribute_tensor(tokens(8, 7, 1), backwards, {Replicate{}, Replicate{}});
  CHECK_THROWS_WITH_AS((void)model.loss(ids, ids, 2), doctest::Contains("lists ep before pp"), Error);
}

TEST_CASE("bad pipelines are typed errors naming what is wrong, before anything runs") {
  const Mesh pp3 = create_mesh({{"pp", 3}});
  CHECK_THROWS_WITH_AS(PipelinedGpt(tiny(2), pp3), doctest::Contains("2 blocks cannot be split over 3 stages"), Error);
  CHECK_THROWS_WITH_AS(PipelinedGpt(tiny(4), create_mesh({{"pp", 2}}), 3), doctest::Contains("4 blocks cannot be split over 6"), Error);
  CHECK_THROWS_AS(PipelinedGpt(tiny(4), create_mesh({{"pp", 2}}), 0), Error);
  const Mesh pp = create_mesh({{"pp", 2}});
  PipelinedGpt model(tiny(4), pp);
  const Tensor ids = distribute_tensor(tokens(8, 7, 1), pp, {Replicate{}});
  const Tensor targets = distribute_tensor(tokens(8, 7, 2), pp, {Replicate{}});
  // 8 sequences do not split into 3 microbatches.
  CHECK_THROWS_WITH_AS((void)model.loss_and_gradients(ids, targets, 3, PipelineSchedule::GPipe), doctest::Contains("3 equal microbatches"),
                       ShapeError);
  CHECK_THROWS_WITH_AS((void)model.loss_and_gradients(ids, targets, 4, PipelineSchedule::LoopedBFS), doctest::Contains("looped-bfs"), Error);
  const Mesh other = create_mesh({{"dp", 2}});
  CHECK_THROWS_AS((void)model.loss(distribute_tensor(tokens(8, 7, 1), other, {Replicate{}}), targets, 2), LayoutError);
  CHECK_THROWS_AS((void)model.loss(distribute_tensor(tokens(8, 9, 1), pp, {Replicate{}}), targets, 2), ShapeError);  // 9 > context 8
}

