// auto_parallelize on a model it knows only by its functions (plan/parallelizable_model.hpp): a
// two-layer MLP written here, and a Transformer described the same way, whose plans must equal
// the Transformer search's own step.
#include <doctest/doctest.h>

#include <set>

#include <algorithm>
#include <tessera/tessera.hpp>

using namespace tessera;

namespace {

// A user's model: `depth` residual blocks x + fc2(gelu(fc1(x))), each recomputed in the
// backward if asked.
class Mlp : public Module {
 public:
  Mlp(int64_t depth, int64_t width, int64_t hidden, const Mesh& mesh, std::optional<CheckpointPolicy> recompute) : recompute_(recompute) {
    for (int64_t b = 0; b < depth; ++b) {
      auto block = register_module("block" + std::to_string(b), std::make_shared<ModuleList>());
      block->append(std::make_shared<Linear>(width, hidden, mesh, uint64_t(2 * b + 1)));
      block->append(std::make_shared<Linear>(hidden, width, mesh, uint64_t(2 * b + 2)));
      blocks_.push_back(std::move(block));
    }
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    Tensor x = inputs.at(0);
    for (const auto& block : blocks_) {
      auto body = [&](const Tensor& in) { return in + (*block)[1](gelu((*block)[0](in), true)); };
      x = recompute_ ? checkpoint(body, *recompute_)(x) : body(x);
    }
    return {x};
  }
  // Megatron's split of every block: the first Linear by columns, the second by rows.
  ParallelizePlan tensor_parallel_plan() const {
    ParallelizePlan plan;
    for (size_t b = 0; b < blocks_.size(); ++b) {
      plan.emplace_back("block" + std::to_string(b) + ".0", ColwiseParallel{});
      plan.emplace_back("block" + std::to_string(b) + ".1", RowwiseParallel{});
    }
    return plan;
  }

 private:
  std::optional<CheckpointPolicy> recompute_;
  std::vector<std::shared_ptr<ModuleList>> blocks_;
};

// The MLP as auto_parallelize sees it: Megatron's column/row split on tp, FSDP2 over dp, bf16
// mixed precision, recomputation; a batch of [B, width] inputs and targets split over dp.
ParallelizableModel mlp_model(int64_t depth, int64_t width, int64_t hidden) {
  ParallelizableModel m;
  m.mesh_dims = {"dp", "tp"};
  m.fsdp = m.mixed_precision = m.activation_checkpointing = true;
  m.build = [=](const Mesh& mesh, const ParallelCandidate& c) { return std::make_unique<Mlp>(depth, width, hidden, mesh, c.activation_checkpointing); };
  m.parallelize = [](Module& model, const Mesh& mesh, const ParallelCandidate& c) {
    if (c.size("tp") > 1) parallelize_module(model, mesh, dynamic_cast<Mlp&>(model).tensor_parallel_plan(), "tp");
    if (c.fsdp) {
      if (c.mixed_precision) fully_shard(model, mesh, *c.mixed_precision, "dp");
      else fully_shard(model, mesh, "dp");
    } else if (c.mixed_precision) {
      apply_mixed_precision(model, *c.mixed_precision);
    }
  };
  m.batch = [=](const Mesh& mesh, int64_t samples) {
    std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
    for (size_t d = 0; d < placements.size(); ++d)
      if (mesh.dim_names()[d] == "dp") placements[d] = Shard{0};
    const Layout rows = Layout::from_placements(mesh, placements, 2);
    return std::vector<Tensor>{random_uniform({samples, width}, 7, rows), random_uniform({samples, width}, 8, rows)};
  };
  m.loss = [](Module& model, const std::vector<Tensor>& batch) {
    return reduce_mean(square(cast(model(batch.at(0)), DType::f32) - batch.at(1)));
  };
  return m;
}

}  // namespace

TEST_CASE("auto_parallelize plans a model it knows by its functions: every mesh of its dims, each exact") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const ParallelizableModel mlp = mlp_model(1, 1024, 4096);
  const ParallelPlanSearch search = auto_parallelize(mlp, 8, h100, int64_t(80) << 30, 64);
  REQUIRE(search.best.fits);
  // dp x tp over 8 devices: dp=8, dp=4 tp=2, dp=2 tp=4, tp=8, with FSDP where dp > 1, at f32 and
  // bf16; nothing recomputed, since everything fits.
  std::vector<std::string> names;
  for (const ParallelCandidate& c : search.candidates) {
    CHECK(c.exact);
    CHECK_FALSE(c.activation_checkpointing);
    names.push_back(c.name());
  }
  CHECK(search.candidates.size() == 14);
  for (const char* expected : {"dp=8", "dp=4,tp=2", "dp=2,tp=4", "tp=8", "dp=8 +fsdp", "dp=2,tp=4 +fsdp +bf16", "tp=8 +bf16"})
    CHECK_MESSAGE(std::find(names.begin(), names.end(), expected) != names.end(), expected);
  // The winner's figures are its step's, planned again.
  const PlanReport again = plan_training_step(mlp, search.best, h100, 8, 64);
  CHECK(again.peak_bytes == search.best.report.peak_bytes);
  CHECK(again.predicted_seconds == search.best.report.predicted_seconds);
  CHECK(search.why.find(search.best.name()) == 0);
  // tp's split is the model's: over tp=8 each device holds 1/8 of the weights, and the whole
  // batch rather than dp=8's eighth of it (a step's inputs: the weights and the batch).
  const auto tp8 = std::find_if(search.candidates.begin(), search.candidates.end(), [](const auto& c) { return c.name() == "tp=8"; });
  const auto dp8 = std::find_if(search.candidates.begin(), search.candidates.end(), [](const auto& c) { return c.name() == "dp=8"; });
  REQUIRE(tp8 != search.candidates.end());
  REQUIRE(dp8 != search.candidates.end());
  const int64_t parameter_bytes = 2 * 1024 * 4096 * 4;
  CHECK(dp8->report.input_bytes - tp8->report.input_bytes == (parameter_bytes - parameter_bytes / 8) - (64 - 8) * 1024 * 4 * 2);
}

TEST_CASE("auto_parallelize on a model it knows by its functions splits what does not fit, recomputing only where asked") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const ParallelizableModel mlp = mlp_model(4, 4096, 16384);
  // Parameters, gradients and Adam's moments of 537M f32 parameters: 8 GiB replicated, more than the budget.
  const ParallelPlanSearch search = auto_parallelize(mlp, 8, h100, int64_t(4) << 30, 4096, 8, false);
  REQUIRE(search.best.fits);
  CHECK((search.best.size("tp") > 1 || search.best.fsdp));
  for (const ParallelCandidate& c : search.candidates)
    if (c.name() == "dp=8") CHECK_FALSE(c.fits);
  // One byte under the smallest peak without recomputation: only a recomputing plan fits.
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const ParallelCandidate& c : search.candidates) smallest = std::min(smallest, c.report.peak_bytes);
  const ParallelPlanSearch tight = auto_parallelize(mlp, 8, h100, smallest - 1, 4096, 8, false);
  REQUIRE(tight.best.fits);
  REQUIRE(tight.best.activation_checkpointing);
  CHECK(tight.best.report.peak_bytes < smallest);
  CHECK(tight.why.find("recomputes activations") != std::string::npos);
  // A model that does not recompute is never planned recomputing.
  ParallelizableModel plain = mlp;
  plain.activation_checkpointing = false;
  for (const ParallelCandidate& c : auto_parallelize(plain, 8, h100, smallest - 1, 4096, 8, false).candidates) CHECK_FALSE(c.activation_checkpointing);
  // accepts: the model's own limits.
  ParallelizableModel narrow = mlp;
  narrow.accepts = [](const ParallelCandidate& c) { return c.size("tp") <= 2; };
  for (const ParallelCandidate& c : auto_parallelize(narrow, 8, h100, int64_t(80) << 30, 4096, 8, false).candidates) CHECK(c.size("tp") <= 2);
}

TEST_CASE("a model known by its functions: its planned step's peak is what its devices hold when it runs") {
  const ParallelizableModel mlp = mlp_model(2, 24, 40);
  for (const std::vector<std::pair<std::string, int64_t>>& dims :
       {std::vector<std::pair<std::string, int64_t>>{{"dp", 2}}, {{"tp", 2}}, {{"dp", 2}, {"tp", 2}}}) {
    for (bool fsdp : {false, true}) {
      ParallelCandidate c;
      c.mesh = dims;
      c.fsdp = fsdp && dims.front().first == "dp";
      if (fsdp && !c.fsdp) continue;
      CAPTURE(c.name());
      const Mesh mesh = create_mesh(dims, cpu_devices(int(mesh_device_count(dims))));
      ModelTrainingStep step(mlp, c, mesh);
      const std::vector<Tensor> batch = mlp.batch(mesh, 6);  // 3 samples a dp rank
      const float first = step(batch).full_tensor().to_vector<float>().at(0);
      const PlanReport plan = step.plan(batch);
      reset_peak_memory_stats();
      const float second = step(batch).full_tensor().to_vector<float>().at(0);
      CHECK(memory_stats(mesh).peak_bytes == plan.peak_bytes);
      CHECK(second < first);  // AdamW stepped
    }
  }
}

namespace {

// A Transformer configuration described by its functions, as a user would describe any model.
ParallelizableModel described(const TransformerConfig& config, std::vector<std::string> dims) {
  ParallelizableModel llama;
  llama.mesh_dims = std::move(dims);
  llama.fsdp = llama.sequence_parallel = true;
  llama.build = [config](const Mesh& mesh, const ParallelCandidate&) { return std::make_unique<Transformer>(config, mesh); };
  llama.parallelize = [](Module& model, const Mesh& mesh, const ParallelCandidate& c) {
    distribute_transformer(dynamic_cast<Transformer&>(model), mesh, c.sequence_parallel, c.fsdp);
  };
  llama.batch = [config](const Mesh& mesh, int64_t sequences) {
    const Layout rows = TransformerTrainingStep::batch_layout(mesh);
    return std::vector<Tensor>{zeros({sequences, config.max_seq}, rows, DType::i32), zeros({sequences, config.max_seq}, rows, DType::i32)};
  };
  llama.loss = [](Module& model, const std::vector<Tensor>& batch) {  // TransformerTrainingStep::objective's
    Transformer& transformer = dynamic_cast<Transformer&>(model);
    Tensor loss = cross_entropy(transformer(batch.at(0)), batch.at(1));
    if (!transformer.moe_layers().empty()) loss = loss + transformer.config().moe->aux_loss_coefficient * transformer.moe_aux_loss();
    return loss;
  };
  llama.accepts = [config](const ParallelCandidate& c) { return config.kv_heads % c.size("tp") == 0; };
  return llama;
}

// Every candidate of the search equals the Transformer's own step planned on its mesh; returns
// the meshes compared.
std::set<std::string> check_plans_as_own_step(const TransformerConfig& config, const ParallelPlanSearch& search, const Hardware& hardware) {
  std::set<std::string> compared;
  for (const ParallelCandidate& c : search.candidates) {
    CAPTURE(c.name());
    const PlanReport own = plan_transformer_training_step(config, abstract_mesh(c.mesh, hardware, 8), c.sequence_parallel, c.fsdp, 8);
    CHECK(c.report.peak_bytes == own.peak_bytes);
    CHECK(c.report.flops == own.flops);
    CHECK(c.report.collective_bytes == own.collective_bytes);
    compared.insert(c.name());
  }
  return compared;
}

}  // namespace

TEST_CASE("a Transformer described by its functions plans as the Transformer's own step") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const TransformerConfig config = transformer_preset("llama-tiny");
  const ParallelPlanSearch search = auto_parallelize(described(config, {"dp", "tp"}), 4, h100, int64_t(80) << 30, 8, 8, false);
  REQUIRE(search.best.fits);
  CHECK(check_plans_as_own_step(config, search, h100).size() >= 4);
}

TEST_CASE("a model described by its functions is searched over cp (ring attention) and ep (experts) as the Transformer's own step") {
  const Hardware h100 = hardware_profile("h100-sxm");
  const TransformerConfig llama = transformer_preset("llama-tiny");
  const std::set<std::string> long_sequences =
      check_plans_as_own_step(llama, auto_parallelize(described(llama, {"dp", "cp"}), 4, h100, int64_t(80) << 30, 8, 8, false), h100);
  CHECK(long_sequences.count("cp=4"));
  CHECK(long_sequences.count("dp=2,cp=2"));
  TransformerConfig moe = transformer_preset("moe-tiny");
  moe.moe->receive_capacity = 1;  // balanced routing, as the Transformer search assumes
  const std::set<std::string> experts =
      check_plans_as_own_step(moe, auto_parallelize(described(moe, {"dp", "ep"}), 4, h100, int64_t(80) << 30, 8, 8, false), h100);
  CHECK(experts.count("ep=4"));
  CHECK(experts.count("dp=2,ep=2"));
}

TEST_CASE("a model known by its functions: what is missing or unknown is named") {
  const Hardware h100 = hardware_profile("h100-sxm");
  ParallelizableModel none;
  CHECK_THROWS_WITH_AS(auto_parallelize(none, 8, h100, int64_t(1) << 30), doctest::Contains("no build, batch, loss function"), Error);
  ParallelizableModel piped = mlp_model(1, 8, 8);
  piped.mesh_dims = {"pp", "dp"};
  CHECK_THROWS_WITH_AS(auto_parallelize(piped, 8, h100, int64_t(1) << 30), doctest::Contains("pipelines are planned for Transformers"), Error);
  ParallelizableModel twice = mlp_model(1, 8, 8);
  twice.mesh_dims = {"dp", "dp"};
  CHECK_THROWS_WITH_AS(auto_parallelize(twice, 8, h100, int64_t(1) << 30), doctest::Contains("'dp' is named twice"), Error);
  ParallelizableModel unsplit = mlp_model(1, 8, 8);
  unsplit.parallelize = nullptr;
  CHECK_THROWS_WITH_AS(auto_parallelize(unsplit, 8, h100, int64_t(1) << 30), doctest::Contains("no parallelize function"), Error);
  ParallelizableModel refuses = mlp_model(1, 8, 8);
  refuses.accepts = [](const ParallelCandidate&) { return false; };
  CHECK_THROWS_WITH_AS(auto_parallelize(refuses, 8, h100, int64_t(1) << 30), doctest::Contains("that the model accepts"), Error);
  ParallelizableModel empty = mlp_model(1, 8, 8);
  empty.build = [](const Mesh&, const ParallelCandidate&) { return std::unique_ptr<Module>(); };
  CHECK_THROWS_WITH_AS(auto_parallelize(empty, 8, h100, int64_t(1) << 30), doctest::Contains("build returned no model"), Error);
  CHECK_THROWS_WITH_AS(auto_parallelize(mlp_model(1, 8, 8), 0, h100, int64_t(1) << 30), doctest::Contains("must be positive"), Error);
}
