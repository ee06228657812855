// A small GPT trained for a few steps on every kind of mesh (one device, data parallel, Megatron
// tensor parallel, both, and fully sharded) gives the one-device losses.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include <tessera/tessera.hpp>

#include "jit/executable.hpp"
#include "tiny_gpt.hpp"

using namespace tessera;

namespace {

GptConfig tiny() { return testing::tiny_gpt_config(); }
Array tokens(int64_t batch, int64_t time, uint32_t seed) { return testing::tiny_gpt_tokens(batch, time, seed); }

// Tensor and DataTensor: Megatron's plan on the "tp" dim; the *Sequence variants add its
// sequence parallelism (layer norms and the residual stream on sequence shards of "tp").
enum class Parallelism { None, Data, Tensor, DataTensor, FullyShard, TensorSequence, DataTensorSequence };

// Losses of `steps` AdamW steps (one jit'd step each) on `mesh`, parallelised as asked (the tensor
// modes' meshes have a "tp" dim, the others none), in mixed precision if given.
std::vector<double> train(const Mesh& mesh, Parallelism how, int steps, std::optional<MixedPrecisionPolicy> precision = {}) {
  GptConfig config = tiny();
  config.mixed_precision = precision;
  Gpt model(config, mesh);
  const bool sequence = how == Parallelism::TensorSequence || how == Parallelism::DataTensorSequence;
  distribute_gpt(model, mesh, sequence, how == Parallelism::FullyShard);
  AdamW optimizer(model.parameters(), 1e-2);
  const std::vector<Variable> params = model.parameters();
  std::vector<Placement> batch_placement(size_t(mesh.ndim()), Replicate{});
  if (how == Parallelism::Data || how == Parallelism::DataTensor || how == Parallelism::FullyShard || how == Parallelism::DataTensorSequence)
    batch_placement[0] = Shard{0};
  auto step = jit([&](const Tensor& ids, const Tensor& targets) {
    Tensor loss = gpt_loss(model(ids), targets);
    std::vector<Tensor> grads = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
    (void)clip_grad_norm(grads, 1.0);
    optimizer.apply(grads);
    return loss;
  });
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    // One batch, seen again each step: the loss must fall as the model memorises it. 7 of the
    // context's 8 positions: sequence shards of 4 and 3.
    (void)s;
    Tensor ids = distribute_tensor(tokens(4, 7, 1), mesh, batch_placement);
    Tensor targets = distribute_tensor(tokens(4, 7, 2), mesh, batch_placement);
    losses.push_back(double(step(ids, targets).full_tensor().data<float>()[0]));
  }
  return losses;
}

}  // namespace

TEST_CASE("a GPT trains to the same losses on one device and under data, tensor, 2-D and fully sharded parallelism") {
  const std::vector<double> reference = train(create_mesh({{"x", 1}}), Parallelism::None, 3);
  CHECK(reference.back() < reference.front());  // it learns
  struct Run {
    const char* name;
    Mesh mesh;
    Parallelism how;
  };
  const std::vector<Run> runs = {{"dp=2", create_mesh({{"dp", 2}}), Parallelism::Data},
                                 {"tp=2", create_mesh({{"tp", 2}}), Parallelism::Tensor},
                                 {"dp=2,tp=2", create_mesh({{"dp", 2}, {"tp", 2}}), Parallelism::DataTensor},
                                 {"fsdp dp=2", create_mesh({{"dp", 2}}), Parallelism::FullyShard},
                                 {"tp=2 sequence parallel", create_mesh({{"tp", 2}}), Parallelism::TensorSequence},
                                 {"dp=2,tp=2 sequence parallel", create_mesh({{"dp", 2}, {"tp", 2}}), Parallelism::DataTensorSequence}};
  for (const Run& run : runs) {
    CAPTURE(run.name);
    const std::vector<double> losses = train(run.mesh, run.how, 3);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == doctest::Approx(reference[s]).epsilon(2e-4));
  }
}

TEST_CASE("under TESSERA_DETERMINISTIC=1 a GPT's losses are bitwise equal under data, tensor, 2-D and fully sharded parallelism") {
  // Uneven on purpose: heads of 4 features, a 13-token vocabulary split 7 + 6, 2 sequences per
  // device, and fsdp over 3 devices. The embedding's gradient is an ordered scatter-add whose
  // batch-sharded rows are gathered in deterministic mode, so every sum keeps one order.
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const std::vector<double> reference = train(create_mesh({{"x", 1}}), Parallelism::None, 3);
  struct Run {
    Mesh mesh;
    Parallelism how;
  };
  for (const Run& run : {Run{create_mesh({{"dp", 2}}), Parallelism::Data}, Run{create_mesh({{"tp", 2}}), Parallelism::Tensor},
                         Run{create_mesh({{"dp", 2}, {"tp", 2}}), Parallelism::DataTensor},
                         Run{create_mesh({{"dp", 3}}), Parallelism::FullyShard},
                         Run{create_mesh({{"tp", 2}}), Parallelism::TensorSequence},
                         Run{create_mesh({{"dp", 2}, {"tp", 2}}), Parallelism::DataTensorSequence}}) {
    CAPTURE(run.mesh.to_string());
    const std::vector<double> losses = train(run.mesh, run.how, 3);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == reference[s]);
  }
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("data parallelism splits a GPT step's work: the batch stays sharded through the embedding and the loss") {
  // Summed over the devices, a dp=2 step multiplies about as much as a 1-device step (every
  // device looks up the same [T, C] positions; a gathered batch would double everything).
  auto multiplies = [](const Mesh& mesh) {
    const GptConfig config = tiny();
    Gpt model(config, mesh);
    const std::vector<Variable> params = model.parameters();
    auto step = jit([&](const Tensor& ids, const Tensor& targets) {
      Tensor loss = gpt_loss(model(ids), targets);
      std::vector<Tensor> outputs = gradients(loss, std::vector<Tensor>(params.begin(), params.end()));
      outputs.push_back(loss);
      return outputs;
    });
    std::vector<Placement> batch(size_t(mesh.ndim()), Replicate{});
    batch[0] = Shard{0};
    Tensor ids = distribute_tensor(tokens(4, 8, 1), mesh, batch), targets = distribute_tensor(tokens(4, 8, 2), mesh, batch);
    return plan_summary(*step.executable(ids, targets)).multiplies;
  };
  const int64_t one = multiplies(create_mesh({{"dp", 1}}));
  CHECK(one > 0);
  CHECK(double(multiplies(create_mesh({{"dp", 2}}))) <= 1.02 * double(one));
  CHECK(double(multiplies(create_mesh({{"dp", 4}}))) <= 1.02 * double(one));
}

TEST_CASE("sequence parallelism keeps a GPT's residual stream on sequence shards: row-parallel outputs reduce_scatter, no all_reduce") {
  const GptConfig config = tiny();
  const Mesh mesh = create_mesh({{"tp", 2}});
  Gpt model(config, mesh);
  parallelize_module(model, mesh, gpt_tensor_parallel_plan(config, true), "tp");
  const Tensor ids = distribute_tensor(tokens(4, 7, 1), mesh, {Replicate{}});
  CommDebugMode comm;
  const Tensor logits = model(ids);
  CHECK(logits.placements() == std::vector<Placement>{Shard{2}});  // vocabulary-sharded for the loss
  (void)logits.full_tensor();  // runs the program (collectives are recorded as they run)
  // Per block two reduce_scatters (attention and MLP projections) and two all_gathers (attention
  // and MLP inputs); the embedding's reduce_scatter and the head's all_gather besides, and
  // full_tensor's gather of the logits.
  const int64_t blocks = config.layers;
  CAPTURE(comm.generate_comm_debug_tracing_table());
  CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 2 * blocks + 2}, {"reduce_scatter", 2 * blocks + 1}});
  // The layer norms' inputs and outputs, and the blocks' outputs, are Shard(1) on tp.
  const std::vector<Placement> sequence_shards = {Shard{1}};
  const Tensor embedded = model.get_submodule("tok_embeddings")(ids);
  CHECK(embedded.placements() == sequence_shards);
  CHECK(model.get_submodule("layers.0.attention_norm")(embedded).placements() == sequence_shards);
  CHECK(model.get_submodule("layers.0")(embedded).placements() == sequence_shards);
}

TEST_CASE("a GPT's blocks compile once: the training step's distinct kernels do not grow with its depth") {
  // Every block lowers to the same kernels (they differ only in the buffers bound at launch), and
  // the initialisers of every layer share kernels too (their seeds are run-time parameters).
  // On dp x tp with sequence parallelism, FSDP-free: the mesh with the most kinds of kernels.
  {
    const Mesh mesh = create_mesh({{"dp", 2}, {"tp", 2}});
    std::map<int64_t, int64_t> distinct, launches;
    for (int64_t layers : {2, 3, 4}) {
      GptConfig config = tiny();
      config.layers = layers;
      GptTrainingStep step(config, mesh, /*sequence_parallel=*/mesh.ndim() == 2);
      const Layout batch = GptTrainingStep::batch_layout(mesh);
      const auto exe = step.executable(copy_to_mesh(tokens(4, 8, 1), batch), copy_to_mesh(tokens(4, 8, 2), batch));
      distinct[layers] = exe->kernel_count();
      launches[layers] = plan_summary(*exe).kernels;
    }
    CHECK(distinct[3] == distinct[2]);
    CHECK(distinct[4] == distinct[2]);
    CHECK(launches[4] - launches[3] == launches[3] - launches[2]);  // each block launches its kernels
    CHECK(launches[3] > launches[2]);
  }
}

TEST_CASE("bf16 mixed precision: a GPT learns as in f32, with losses bitwise equal on every mesh under TESSERA_DETERMINISTIC=1") {
  const MixedPrecisionPolicy bf16{DType::bf16, DType::f32, DType::f32};
  const std::vector<double> f32 = train(create_mesh({{"x", 1}}), Parallelism::None, 6);
  const std::vector<double> mixed = train(create_mesh({{"x", 1}}), Parallelism::None, 6, bf16);
  CHECK(mixed.back() < mixed.front());
  for (size_t s = 0; s < mixed.size(); ++s) CHECK(mixed[s] == doctest::Approx(f32[s]).epsilon(0.02));
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const std::vector<double> reference = train(create_mesh({{"x", 1}}), Parallelism::None, 3, bf16);
  struct Run {
    Mesh mesh;
    Parallelism how;
  };
  for (const Run& run : {Run{create_mesh({{"dp", 2}}), Parallelism::Data}, Run{create_mesh({{"tp", 2}}), Parallelism::Tensor},
                         Run{create_mesh({{"dp", 3}}), Parallelism::FullyShard},
                         Run{create_mesh({{"dp", 2}, {"tp", 2}}), Parallelism::DataTensorSequence}}) {
    CAPTURE(run.mesh.to_string());
    const std::vector<double> losses = train(run.mesh, run.how, 3, bf16);
    for (size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == reference[s]);
  }
  unsetenv("TESSERA_DETERMINISTIC");
}
