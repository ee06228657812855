// Modules: dotted parameter and module names, set_parameter's checks, hooks, state_dict through
// save/load, and distribute_module (default replication, a partition_fn sharding the Dense
// weights, input_fn / output_fn) against the same model on one device: forward values,
// gradients and a few optimizer steps agree.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include <tessera/tessera.hpp>

#include "jit/step_profiler.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

// 8 -> 6 (ReLU) -> 3; the same values on every mesh for the same seed.
struct Mlp : Module {
  std::shared_ptr<Dense> fc1, fc2;
  Mlp(const Mesh& mesh, uint64_t seed)
      : fc1(register_module("fc1", std::make_shared<Dense>(8, 6, Layout::replicated(mesh, 2), seed,
                                                            [](const Tensor& x) { return relu(x); }))),
        fc2(register_module("fc2", std::make_shared<Dense>(6, 3, Layout::replicated(mesh, 2), seed + 1))) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {(*fc2)((*fc1)(inputs.at(0)))}; }
};

// A parameter of its own next to nested children: "scale", "encoder.fc1.weight", ..., "head.bias".
struct Classifier : Module {
  std::shared_ptr<Mlp> encoder;
  std::shared_ptr<Dense> head;
  Classifier(const Mesh& mesh, uint64_t seed)
      : encoder(register_module("encoder", std::make_shared<Mlp>(mesh, seed))),
        head(register_module("head", std::make_shared<Dense>(3, 2, Layout::replicated(mesh, 2), seed + 2))) {
    register_parameter("scale", Variable(ones({}, Layout::replicated(mesh, 0))));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {(*head)((*encoder)(inputs.at(0))) * get_parameter("scale")};
  }
};

Mesh one_device() { return create_mesh({{"x", 1}}); }

Array input_rows(int64_t rows) {
  Array a(std::vector<int64_t>{rows, 8}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(std::sin(0.7 * double(i)));
  return a;
}

Tensor loss_of(Module& model, const Tensor& x) { return reduce_mean(square(model(x))); }

void check_close(const Array& got, const Array& want, double tolerance = 1e-5) {
  REQUIRE(got.shape() == want.shape());
  std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(g[i] - w[i]) <= tolerance * (1 + std::abs(w[i])));
  }
}

// The forward value and the gradients of a loss wrt the parameters of `distributed` equal those
// of `reference` (the same model on one device).
void check_matches_reference(Mlp& distributed, Mlp& reference, const Tensor& x, const Tensor& x_reference) {
  Tensor y = distributed(x), y_reference = reference(x_reference);
  check_close(y.full_tensor(), y_reference.full_tensor());
  const std::vector<Variable> params = distributed.parameters();
  std::vector<Tensor> grads = grad(loss_of(distributed, x), params);
  std::vector<Tensor> grads_reference = grad(loss_of(reference, x_reference), reference.parameters());
  REQUIRE(grads.size() == grads_reference.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    CAPTURE(distributed.named_parameters()[i].first);
    CHECK(grads[i].layout() == params[i].layout());
    check_close(grads[i].full_tensor(), grads_reference[i].full_tensor());
  }
}

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tessera-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<std::string> names(const std::vector<std::pair<std::string, Variable>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, v] : named) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("parameters and modules are named by dotted paths in registration order") {
  Classifier model(one_device(), 1);
  CHECK(names(model.named_parameters()) == std::vector<std::string>{"scale", "encoder.fc1.weight", "encoder.fc1.bias",
                                                                     "encoder.fc2.weight", "encoder.fc2.bias", "head.weight",
                                                                     "head.bias"});
  CHECK(names(model.named_parameters(false)) == std::vector<std::string>{"scale"});
  CHECK(model.parameters().size() == 7);
  std::vector<std::string> modules;
  for (const auto& [name, module] : model.named_modules()) modules.push_back(name);
  CHECK(modules == std::vector<std::string>{"", "encoder", "encoder.fc1", "encoder.fc2", "head"});
  CHECK(model.children().size() == 2);
  CHECK(model.named_children()[1].first == "head");
  CHECK(&model.get_submodule("encoder.fc2") == model.encoder->fc2.get());
  CHECK(&model.get_submodule("") == &model);
  CHECK(model.get_parameter("encoder.fc2.weight").state() == model.encoder->fc2->weight().state());
  CHECK(model.get_parameter("encoder.fc2.weight").shape() == std::vector<int64_t>{6, 3});
  const std::map<std::string, Variable> state = model.state_dict();
  CHECK(state.size() == 7);
  CHECK(state.at("head.bias").state() == model.head->bias().state());

  SUBCASE("a tied parameter is listed once, and under each name in state_dict") {
    model.register_parameter("tied", model.head->weight());
    CHECK(model.parameters().size() == 7);
    CHECK(names(model.named_parameters()).front() == "scale");
    CHECK(model.state_dict().size() == 8);
  }
}

TEST_CASE("unknown and duplicate names and replaced parameters of another shape or dtype are typed errors") {
  Mesh mesh = one_device();
  Classifier model(mesh, 1);
  CHECK_THROWS_WITH_AS(model.get_parameter("encoder.fc1.wieght"), doctest::Contains("'encoder.fc1.wieght'"), Error);
  CHECK_THROWS_WITH_AS(model.get_parameter("encoder.fc1.wieght"), doctest::Contains("its parameters: weight, bias"), Error);
  CHECK_THROWS_WITH_AS(model.get_parameter("decoder.fc1.weight"), doctest::Contains("no child 'decoder'"), Error);
  CHECK_THROWS_WITH_AS(model.get_submodule("encoder.fc3"), doctest::Contains("'encoder' has no child 'fc3'"), Error);
  CHECK_THROWS_WITH_AS(model.set_parameter("head.scale", Variable(ones({}, Layout::replicated(mesh, 0)))),
                       doctest::Contains("'head.scale'"), Error);
  CHECK_THROWS_WITH_AS(model.register_parameter("scale", model.head->bias()), doctest::Contains("'scale' is already a parameter"),
                       Error);
  CHECK_THROWS_WITH_AS(model.register_parameter("head", model.head->bias()), doctest::Contains("'head' is already a child"),
                       Error);
  CHECK_THROWS_WITH_AS(model.register_module("encoder", std::make_shared<Mlp>(mesh, 3)), doctest::Contains("'encoder'"), Error);
  CHECK_THROWS_WITH_AS(model.register_parameter("a.b", model.head->bias()), doctest::Contains("contains '.'"), Error);
  CHECK_THROWS_AS(model.register_parameter("", model.head->bias()), Error);
  CHECK_THROWS_AS(model.register_module("none", std::shared_ptr<Dense>()), Error);
  auto inner = std::make_shared<Mlp>(mesh, 4);
  auto outer = std::make_shared<Mlp>(mesh, 5);
  outer->register_module("inner", inner);
  CHECK_THROWS_WITH_AS(inner->register_module("outer", outer), doctest::Contains("contains this module (as 'inner')"), Error);

  CHECK_THROWS_WITH_AS(model.set_parameter("encoder.fc1.weight", Variable(zeros({6, 8}, Layout::replicated(mesh, 2)))),
                       doctest::Contains("'encoder.fc1.weight' has shape (8, 6), the new value (6, 8)"), ShapeError);
  CHECK_THROWS_WITH_AS(model.set_parameter("head.bias", Variable(zeros({2}, Layout::replicated(mesh, 1), DType::f64))),
                       doctest::Contains("'head.bias' holds float32"), DTypeError);
  // A replacement of the right shape and dtype is what forward uses from then on.
  model.set_parameter("head.bias", Variable(full({2}, 5.0, Layout::replicated(mesh, 1))));
  CHECK(to_array(model.head->bias().value()).to_vector<float>() == std::vector<float>{5, 5});
  CHECK(model.state_dict().at("head.bias").state() == model.head->bias().state());
}

TEST_CASE("forward hooks rewrite inputs and outputs; one-tensor calls want one output") {
  Mesh mesh = one_device();
  Mlp model(mesh, 1);
  Tensor x = copy_to_mesh(input_rows(4), Layout::replicated(mesh, 2));
  const Array doubled_input = model(x * 2.0).full_tensor();
  model.register_forward_pre_hook([](Module&, std::vector<Tensor> inputs) { return std::vector<Tensor>{inputs[0] * 2.0}; });
  check_close(model(x).full_tensor(), doubled_input);
  std::vector<Tensor> seen_inputs;
  model.register_forward_hook([&](Module&, const std::vector<Tensor>& inputs, std::vector<Tensor> outputs) {
    seen_inputs = inputs;
    return std::vector<Tensor>{outputs[0], outputs[0] + 1.0};
  });
  std::vector<Tensor> outputs = model(std::vector<Tensor>{x});
  REQUIRE(outputs.size() == 2);
  check_close(seen_inputs.at(0).full_tensor(), (x * 2.0).full_tensor());  // the hook sees the pre-hook's inputs
  check_close(outputs[0].full_tensor(), doubled_input);
  CHECK_THROWS_WITH_AS(model(x), doctest::Contains("forward returned 2 outputs"), Error);
  CHECK_THROWS_AS(model.register_forward_hook(nullptr), Error);
}

TEST_CASE("state_dict round-trips through save and load") {
  fs::path dir = temp_dir("module-ckpt");
  Mesh mesh = create_mesh({{"x", 2}});
  Classifier saved(mesh, 1);
  saved.set_parameter("scale", Variable(full({}, 3.0, Layout::replicated(mesh, 0))));
  save(dir.string(), saved.state_dict());
  // Other initial values, on another mesh: load reshards into the module's own Variables.
  Classifier loaded(one_device(), 10);
  std::map<std::string, Variable> state = loaded.state_dict();
  load(dir.string(), state);
  for (const auto& [name, parameter] : saved.named_parameters()) {
    CAPTURE(name);
    CHECK(same_array(loaded.get_parameter(name).value().full_tensor(), parameter.value().full_tensor()));
  }
  check_close(loaded(copy_to_mesh(input_rows(4), Layout::replicated(one_device(), 2))).full_tensor(),
              saved(copy_to_mesh(input_rows(4), Layout::replicated(mesh, 2))).full_tensor());
  fs::remove_all(dir);
}

TEST_CASE("distribute_module replicates every parameter by default on a 1-D mesh of 4 devices") {
  Mesh mesh = create_mesh({{"x", 4}});
  Mlp model(one_device(), 7), reference(one_device(), 7);
  distribute_module(model, mesh);
  for (const auto& [name, parameter] : model.named_parameters()) {
    CAPTURE(name);
    CHECK(parameter.layout() == Layout::replicated(mesh, int64_t(parameter.shape().size())));
  }
  CHECK(model.fc1->weight().state() == model.get_parameter("fc1.weight").state());  // Dense reads the replaced one
  // Batch-sharded input: data parallelism falls out of the layouts.
  Tensor x = copy_to_mesh(input_rows(8), Layout::batch_sharded(mesh, "x", 2));
  check_matches_reference(model, reference, x, copy_to_mesh(input_rows(8), Layout::replicated(one_device(), 2)));
  CHECK_THROWS_WITH_AS(distribute_module(model, mesh), doctest::Contains("distributed already"), Error);
}

TEST_CASE("distribute_module on a 2x2 mesh: partition_fn shards the Dense weights, input_fn and output_fn redistribute") {
  Mesh mesh = create_mesh({{"dp", 2}, {"tp", 2}});
  Mlp model(one_device(), 3), reference(one_device(), 3);
  // PyTorch's docs example: every Linear's weight Shard(0) (here over "tp"); the rest is left
  // to the default replication.
  std::vector<std::string> visited;
  auto shard_params = [&visited](const std::string& name, Module& module, const Mesh& m) {
    visited.push_back(name);
    if (!dynamic_cast<Dense*>(&module)) return;
    Variable weight = module.get_parameter("weight");
    module.set_parameter("weight", Variable(distribute_tensor(weight.value().full_tensor(), m, {Replicate{}, Shard{0}})));
  };
  auto shard_batch = [](Module&, std::vector<Tensor> inputs, const Mesh&) {
    for (Tensor& input : inputs) input = input.redistribute({Shard{0}, Replicate{}});
    return inputs;
  };
  auto replicate_outputs = [](Module&, std::vector<Tensor> outputs, const Mesh&) {
    for (Tensor& output : outputs) output = output.redistribute({Replicate{}, Replicate{}});
    return outputs;
  };
  distribute_module(model, mesh, shard_params, shard_batch, replicate_outputs);
  CHECK(visited == std::vector<std::string>{"", "fc1", "fc2"});
  const std::vector<Placement> row_sharded = {Replicate{}, Shard{0}}, replicated = {Replicate{}, Replicate{}};
  CHECK(model.fc1->weight().layout().placements() == row_sharded);
  CHECK(model.fc2->weight().layout().placements() == row_sharded);
  CHECK(model.fc1->bias().layout().placements() == replicated);
  CHECK(model.fc1->bias().layout().mesh() == mesh);

  Tensor x = copy_to_mesh(input_rows(4), Layout::replicated(mesh, 2));
  Tensor y = model(x);
  CHECK(y.placements() == replicated);
  check_matches_reference(model, reference, x, copy_to_mesh(input_rows(4), Layout::replicated(one_device(), 2)));

  SUBCASE("Adam over the module's parameters trains it as on one device") {
    Adam adam(model.parameters(), 0.01), adam_reference(reference.parameters(), 0.01);
    auto step = jit([&](const Tensor& input) {
      Tensor loss = loss_of(model, input);
      adam.apply(grad(loss, model.parameters()));
      return loss;
    });
    auto step_reference = jit([&](const Tensor& input) {
      Tensor loss = loss_of(reference, input);
      adam_reference.apply(grad(loss, reference.parameters()));
      return loss;
    });
    Tensor x_reference = copy_to_mesh(input_rows(4), Layout::replicated(one_device(), 2));
    for (int s = 0; s < 3; ++s) check_close(to_array(step(x)), to_array(step_reference(x_reference)));
    for (const auto& [name, parameter] : model.named_parameters()) {
      CAPTURE(name);
      check_close(parameter.value().full_tensor(), reference.get_parameter(name).value().full_tensor());
    }
  }
}

TEST_CASE("distribute_module: a parameter left off the mesh, or replaced by another shape, is a typed error naming it") {
  Mesh mesh = create_mesh({{"x", 4}}), other = create_mesh({{"y", 2}}, {"CPU:4", "CPU:5"});
  SUBCASE("on another mesh before") {
    Mlp model(other, 1);
    CHECK_THROWS_WITH_AS(distribute_module(model, mesh), doctest::Contains("parameter 'fc1.weight' is on mesh"), MeshError);
  }
  SUBCASE("placed on another mesh by partition_fn") {
    Mlp model(one_device(), 1);
    auto misplace = [&other](const std::string& name, Module& module, const Mesh&) {
      if (name != "fc2") return;
      Variable bias = module.get_parameter("bias");
      module.set_parameter("bias", Variable(distribute_tensor(bias.value().full_tensor(), other)));
    };
    CHECK_THROWS_WITH_AS(distribute_module(model, mesh, misplace), doctest::Contains("parameter 'fc2.bias' is on mesh"),
                         MeshError);
  }
  SUBCASE("replaced by partition_fn with another shape") {
    Mlp model(one_device(), 1);
    auto reshape = [](const std::string&, Module& module, const Mesh& m) {
      if (dynamic_cast<Dense*>(&module)) module.set_parameter("weight", Variable(zeros({2, 2}, Layout::replicated(m, 2))));
    };
    CHECK_THROWS_WITH_AS(distribute_module(model, mesh, reshape), doctest::Contains("'weight' has shape (8, 6)"), ShapeError);
  }
}

TEST_CASE("distribute_module keeps tied parameters tied") {
  Mesh mesh = create_mesh({{"x", 2}});
  Mlp model(one_device(), 1);
  auto tied = std::make_shared<Dense>(8, 6, Layout::replicated(one_device(), 2), 1);
  tied->set_parameter("weight", model.fc1->weight());
  model.register_module("tied", tied);
  distribute_module(model, mesh);
  CHECK(tied->weight().state() == model.fc1->weight().state());
  CHECK(tied->weight().layout().mesh() == mesh);
  CHECK(tied->bias().state() != model.fc1->bias().state());
}

TEST_CASE("CommDebugMode reports a module's collectives under its dotted name") {
  Mesh mesh = create_mesh({{"x", 2}});
  Mlp model(mesh, 3);
  // Megatron-style: fc1 column-parallel, fc2 row-parallel, so fc2's product is a partial sum.
  distribute_module(model, mesh, [](const std::string& name, Module& m, const Mesh& on) {
    if (name == "fc1") m.set_parameter("weight", Variable(m.get_parameter("weight").value().redistribute({Shard{1}})));
    if (name == "fc1") m.set_parameter("bias", Variable(m.get_parameter("bias").value().redistribute({Shard{0}})));
    if (name == "fc2") m.set_parameter("weight", Variable(m.get_parameter("weight").value().redistribute({Shard{0}})));
    (void)on;
  });
  Tensor x = distribute_tensor(input_rows(4), mesh, {Replicate{}});
  CommDebugMode comm;
  (void)model(x).full_tensor();
  bool fc2_reduced = false;
  for (const CollectiveRecord& r : comm.records()) fc2_reduced |= r.module == "fc2" && r.kind == "all_reduce";
  CHECK(fc2_reduced);
  CHECK(comm.generate_comm_debug_tracing_table().find("fc2") != std::string::npos);
  // Parameter and sharding info, as PyTorch's module tracker records them at each forward.
  const auto parameters = comm.get_parameter_info();
  REQUIRE(parameters.count("Global"));
  REQUIRE(parameters.count("fc1"));
  CHECK(parameters.at("Global").count("fc1.weight"));
  CHECK(parameters.at("fc1").at("weight").placements() == std::vector<Placement>{Shard{1}});
  const auto sharding = comm.get_sharding_info();
  CHECK(sharding.at("fc1.bias") == std::vector<Placement>{Shard{0}});
  CHECK(sharding.at("fc2.weight") == std::vector<Placement>{Shard{0}});
  CHECK(sharding.at("Global.fc2.weight") == std::vector<Placement>{Shard{0}});
}

TEST_CASE("parallelize_module: Megatron's colwise fc1 and rowwise fc2 match one device, with one all_reduce forward") {
  for (const Mesh& mesh : {create_mesh({{"tp", 2}}), create_mesh({{"tp", 3}}), create_mesh({{"dp", 2}, {"tp", 2}})}) {
    CAPTURE(mesh.to_string());
    Mlp model(mesh, 5), reference(one_device(), 5);
    parallelize_module(model, mesh, {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}}, "tp");
    const int64_t tp = mesh.dim_index("tp");
    CHECK(model.fc1->weight().value().placements()[size_t(tp)] == Placement{Shard{1}});  // output features (6 over 3: even; over 2: even)
    CHECK(model.fc2->weight().value().placements()[size_t(tp)] == Placement{Shard{0}});
    std::vector<Placement> batch(size_t(mesh.ndim()), Replicate{});
    if (mesh.ndim() == 2) batch[0] = Shard{0};  // data parallel over "dp"
    Tensor x = distribute_tensor(input_rows(4), mesh, batch), x_reference = distribute_tensor(input_rows(4), one_device(), {Replicate{}});
    {
      CommDebugMode comm;
      (void)model(x).full_tensor();
      int64_t reduces = 0;
      for (const CollectiveRecord& r : comm.records()) reduces += r.kind == "all_reduce" && r.mesh_dim == "tp";
      CHECK(reduces == 1);  // fc2's partial products, once
    }
    check_matches_reference(model, reference, x, x_reference);
  }
  Mesh mesh = create_mesh({{"tp", 2}});
  Mlp model(mesh, 1);
  CHECK_THROWS_WITH_AS(parallelize_module(model, mesh, {{"fc3", ColwiseParallel{}}}), doctest::Contains("fc3"), Error);
  CHECK_THROWS_AS(parallelize_module(model, mesh, {{"fc1", ColwiseParallel{}}}, "dp"), MeshError);
}

TEST_CASE("parallelize_module: sequence parallelism, a reduce_scatter into sequence shards, and PrepareModuleInput") {
  Mesh mesh = create_mesh({{"tp", 2}});
  Mlp model(mesh, 9), reference(one_device(), 9);
  // fc2's partial sums become sequence (row) shards: a reduce_scatter instead of an all_reduce.
  parallelize_module(model, mesh, {{"", PrepareModuleInput{{Shard{0}}}}, {"fc1", ColwiseParallel{Replicate{}, Shard{-1}}},
                                   {"fc2", RowwiseParallel{Shard{-1}, Shard{0}}}});
  Tensor x = distribute_tensor(input_rows(6), mesh, {Replicate{}});
  CommDebugMode comm;
  Tensor y = model(x);
  CHECK(y.placements() == std::vector<Placement>{Shard{0}});
  check_close(y.full_tensor(), reference(distribute_tensor(input_rows(6), one_device(), {Replicate{}})).full_tensor());
  CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 1}, {"reduce_scatter", 1}});
}

// PyTorch's test_colwise_parallel_with_input_layouts: ColwiseParallel(input_layouts=Shard(0)) takes
// a row-sharded input, gathers it once for forward, and reduce_scatters its gradient (a partial
// sum over the output features) straight back into the row shards.
TEST_CASE("ColwiseParallel with input_layout Shard(0): one all_gather forward, one reduce_scatter for the input's gradient") {
  for (const Mesh& mesh : {create_mesh({{"tp", 2}}), create_mesh({{"tp", 3}}), create_mesh({{"dp", 2}, {"tp", 2}})}) {
    CAPTURE(mesh.to_string());
    Mlp model(mesh, 5), reference(one_device(), 5);
    parallelize_module(model, mesh, {{"fc1", ColwiseParallel{Shard{0}}}}, "tp");
    const size_t tp = size_t(mesh.dim_index("tp"));
    std::vector<Placement> rows(size_t(mesh.ndim()), Replicate{});
    rows[tp] = Shard{0};  // 5 rows: 3 and 2 over two devices, 2, 2 and 1 over three
    Tensor x = distribute_tensor(input_rows(5), mesh, rows), x_reference = distribute_tensor(input_rows(5), one_device(), {Replicate{}});
    Tensor h = (*model.fc1)(x);
    CHECK(h.placements()[tp] == Placement{Shard{1}});
    auto comm = std::make_unique<CommDebugMode>();
    const std::vector<Tensor> dx = gradients(reduce_sum(square(h)), {x});
    (void)unpack(dx[0]);
    const auto counts = comm->get_comm_counts();
    comm.reset();
    CHECK(dx[0].placements() == rows);
    CHECK(counts == std::map<std::string, int64_t>{{"all_gather", 1}, {"reduce_scatter", 1}});
    Tensor h_reference = (*reference.fc1)(x_reference);
    check_close(h.full_tensor(), h_reference.full_tensor());
    check_close(dx[0].full_tensor(), gradients(reduce_sum(square(h_reference)), {x_reference})[0].full_tensor());
  }
}

TEST_CASE("PrepareModuleOutput redistributes outputs; std::nullopt in PrepareModuleInput leaves an input as it is") {
  Mesh mesh = create_mesh({{"tp", 2}});
  Mlp model(mesh, 9), reference(one_device(), 9);
  parallelize_module(model, mesh, {{"", PrepareModuleInput{{std::nullopt}}}, {"", PrepareModuleOutput{{Replicate{}}}},
                                   {"fc1", ColwiseParallel{Shard{0}, Shard{-1}}}, {"fc2", RowwiseParallel{Shard{-1}, Shard{0}}}});
  Tensor x = distribute_tensor(input_rows(6), mesh, {Shard{0}});
  Tensor y = model(x);
  CHECK(x.placements() == std::vector<Placement>{Shard{0}});
  CHECK(y.placements() == std::vector<Placement>{Replicate{}});
  check_close(y.full_tensor(), reference(distribute_tensor(input_rows(6), one_device(), {Replicate{}})).full_tensor());
  Mlp wrong(mesh, 9);
  parallelize_module(wrong, mesh, {{"", PrepareModuleOutput{{Replicate{}, Replicate{}}}}});
  CHECK_THROWS_WITH_AS(wrong(x), doctest::Contains("PrepareModuleOutput has 2 layouts for 1 outputs"), Error);
}

TEST_CASE("fully_shard: parameters stored sharded, gathered for forward, gradients reduce-scattered (ZeRO-3)") {
  // 1-D, dp x tp, and a 3-D dp x tp x sp mesh whose third dim splits the rows again (uneven: 2, 1).
  for (const Mesh& mesh : {create_mesh({{"dp", 2}}), create_mesh({{"dp", 3}}), create_mesh({{"dp", 2}, {"tp", 2}}),
                           create_mesh({{"dp", 2}, {"tp", 2}, {"sp", 2}})}) {
    CAPTURE(mesh.to_string());
    Mlp model(mesh, 3), reference(one_device(), 3);
    if (mesh.ndim() >= 2) parallelize_module(model, mesh, {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}}, "tp");
    fully_shard(model, mesh, "dp");
    for (const auto& [name, v] : model.named_parameters()) {
      CAPTURE(name);
      CHECK(v.value().placements()[0] == Placement{Shard{0}});
      // A row-parallel weight's tp shards are split further over dp (FSDP2's _StridedShard), so
      // its tp-sharded gradient is reduce_scattered over dp straight into them.
      if (mesh.ndim() >= 2 && name == "fc2.weight") CHECK(v.value().layout().sharding_specs()[0] == "tp+dp");
    }
    std::vector<Placement> batch(size_t(mesh.ndim()), Replicate{});
    batch[0] = Shard{0};
    if (mesh.ndim() == 3) batch[2] = Shard{0};
    Tensor x = distribute_tensor(input_rows(6), mesh, batch), x_reference = distribute_tensor(input_rows(6), one_device(), {Replicate{}});
    CommDebugMode comm;
    check_matches_reference(model, reference, x, x_reference);  // gradients come back in the sharded layouts
    const auto counts = comm.get_comm_counts();
    CHECK(counts.count("all_gather"));
    CHECK(counts.count("reduce_scatter"));
  }
}

TEST_CASE("mixed precision: bf16 shards gathered, f32 gradients reduced in reduce_dtype, f32 master weights") {
  const MixedPrecisionPolicy bf16_params{DType::bf16, DType::f32, DType::f32};
  const MixedPrecisionPolicy bf16_everywhere{DType::bf16, DType::bf16, DType::bf16};
  for (const Mesh& mesh : {create_mesh({{"dp", 2}}), create_mesh({{"dp", 3}}), create_mesh({{"dp", 2}, {"tp", 2}})}) {
    for (const MixedPrecisionPolicy& policy : {bf16_params, bf16_everywhere}) {
      for (const bool sharded : {true, false}) {
        CAPTURE(mesh.to_string());
        CAPTURE(dtype_name(policy.reduce_dtype));
        CAPTURE(sharded);
        Mlp model(mesh, 3), reference(one_device(), 3);
        if (mesh.ndim() == 2) parallelize_module(model, mesh, {{"fc1", ColwiseParallel{}}, {"fc2", RowwiseParallel{}}}, "tp");
        if (sharded) fully_shard(model, mesh, policy, "dp");
        else apply_mixed_precision(model, policy);
        std::vector<Placement> batch(size_t(mesh.ndim()), Replicate{});
        batch[0] = Shard{0};
        Tensor x = distribute_tensor(input_rows(6), mesh, batch), x_reference = distribute_tensor(input_rows(6), one_device(), {Replicate{}});
        // The step's own collectives (looking at the values afterwards gathers them, uncounted).
        auto comm = std::make_unique<CommDebugMode>();
        Tensor y = model(x);
        const std::vector<Variable> params = model.parameters();
        const std::vector<Tensor> grads = grad(loss_of(model, x), params);
        const std::vector<CollectiveRecord> records = comm->records();
        comm.reset();
        CHECK(y.dtype() == policy.output_dtype);
        // Against f32 on one device: within bf16's precision.
        check_close(cast(y, DType::f32).full_tensor(), reference(x_reference).full_tensor(), 3e-2);
        const std::vector<Tensor> grads_reference = grad(loss_of(reference, x_reference), reference.parameters());
        for (size_t i = 0; i < grads.size(); ++i) {
          CAPTURE(model.named_parameters()[i].first);
          CHECK(params[i].value().dtype() == DType::f32);  // master weights
          CHECK(grads[i].dtype() == DType::f32);
          CHECK(grads[i].layout() == params[i].layout());
          check_close(grads[i].full_tensor(), grads_reference[i].full_tensor(), 5e-2);
        }
        // Parameters move in param_dtype; every sum over devices is in reduce_dtype: gradients over
        // dp, and over tp the row-parallel output and the column-parallel input's gradient.
        int gathers = 0, reductions = 0, tp_reductions = 0;
        for (const CollectiveRecord& r : records) {
          CAPTURE(r.kind);
          CAPTURE(r.mesh_dim);
          CAPTURE(r.source_line);
          if (r.mesh_dim == "tp") {
            if (r.kind == "reduce_scatter" || r.kind == "all_reduce") {
              ++tp_reductions;
              CHECK(r.dtype == dtype_name(policy.reduce_dtype));
            }
            continue;
          }
          if (r.kind == "all_gather") {
            ++gathers;
            CHECK(r.dtype == dtype_name(DType::bf16));
          } else if (r.kind == "reduce_scatter" || r.kind == "all_reduce") {
            ++reductions;
            CHECK(r.dtype == dtype_name(policy.reduce_dtype));
          }
        }
        CHECK((gathers >= 4) == sharded);
        CHECK(reductions >= (sharded ? 4 : 1));  // replicated: one bucketed all_reduce
        CHECK((tp_reductions >= 1) == (mesh.ndim() == 2));  // fc2's output (no input gradient is asked for)
        if (mesh.ndim() == 2) {
          const std::string text = explain(y);
          CAPTURE(text);
          CHECK(text.find("all_reduce     over tp: ") != std::string::npos);
          CHECK(text.find(std::string(" bytes of ") + std::string(dtype_name(policy.reduce_dtype))) != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("mixed precision: bad policies and a second policy are typed errors naming what is wrong") {
  const Mesh mesh = create_mesh({{"dp", 2}});
  Mlp model(mesh, 3);
  CHECK_THROWS_WITH_AS(fully_shard(model, mesh, MixedPrecisionPolicy{DType::i32, DType::f32, DType::f32}),
                       doctest::Contains("fully_shard: MixedPrecisionPolicy's param_dtype must be a floating dtype, got int32"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(apply_mixed_precision(model, MixedPrecisionPolicy{DType::bf16, DType::u8, DType::f32}),
                       doctest::Contains("reduce_dtype must be a floating dtype, got bool"), DTypeError);
  fully_shard(model, mesh, MixedPrecisionPolicy{DType::bf16, DType::f32, DType::f32});
  CHECK_THROWS_WITH_AS(apply_mixed_precision(model, MixedPrecisionPolicy{DType::bf16, DType::f32, DType::f32}),
                       doctest::Contains("module '(root)' is fully sharded already"), Error);
  // The other order keeps the policy: fully_shard without one gathers the module's bf16 shards.
  Mlp other(mesh, 3);
  apply_mixed_precision(other, MixedPrecisionPolicy{DType::bf16, DType::f32, DType::f32});
  CHECK_THROWS_WITH_AS(fully_shard(other, mesh, MixedPrecisionPolicy{DType::f16, DType::f32, DType::f32}),
                       doctest::Contains("fully_shard: the module has another mixed precision policy already (param_dtype bfloat16)"),
                       Error);
  fully_shard(other, mesh);
  const Tensor y = other(distribute_tensor(input_rows(4), mesh, {Shard{0}}));
  CHECK(y.dtype() == DType::f32);
  CHECK(explain(y).find("all_gather     over dp: 48 bytes of bfloat16, (8, 6)") != std::string::npos);
  CHECK_THROWS_WITH_AS(with_layout(ones({2}, Layout::replicated(mesh, 1), DType::i32), Layout::replicated(mesh, 1), std::nullopt, DType::f32),
                       doctest::Contains("with_layout: a gradient dtype (float32) needs a floating tensor"), DTypeError);
}

namespace {

// A Llama-style block's MLP from the new building blocks: RMSNorm, then a ModuleList of
// bias-free Linears (up, down) with silu between.
struct NormedMlp : Module {
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<ModuleList> layers;
  NormedMlp(const Mesh& mesh, uint64_t seed)
      : norm(register_module("norm", std::make_shared<RMSNorm>(8, mesh))),
        layers(register_module("layers", std::make_shared<ModuleList>(std::vector<std::shared_ptr<Module>>{
                                             std::make_shared<Linear>(8, 6, mesh, seed), std::make_shared<Linear>(6, 3, mesh, seed + 1, true)}))) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {(*layers)[1](silu((*layers)[0]((*norm)(inputs.at(0)))))};
  }
};

}  // namespace

TEST_CASE("Linear, RMSNorm and ModuleList: PyTorch's names and parameters, tensor parallel by index paths, equal to one device") {
  Mesh one = one_device();
  NormedMlp reference(one, 4);
  CHECK(names(reference.named_parameters()) ==
        std::vector<std::string>{"norm.weight", "layers.0.weight", "layers.1.weight", "layers.1.bias"});  // layers.0 has no bias
  CHECK(reference.get_parameter("layers.0.weight").value().shape() == std::vector<int64_t>{8, 6});
  CHECK(reference.layers->size() == 2);
  CHECK_THROWS_WITH_AS((*reference.layers)[2], doctest::Contains("index 2 is out of range for 2 modules"), IndexError);
  CHECK_THROWS_WITH_AS((*reference.layers)(distribute_tensor(input_rows(2), one)), doctest::Contains("ModuleList has no forward"), Error);
  // PyTorch's initialisation bound, 1/sqrt(in).
  for (float w : reference.get_parameter("layers.0.weight").value().full_tensor().to_vector<float>())
    CHECK(std::abs(w) <= 1 / std::sqrt(8.0f));
  const Tensor x_reference = distribute_tensor(input_rows(5), one);
  // RMSNorm is rms_norm with its weight.
  check_close((*reference.norm)(x_reference).full_tensor(), rms_norm(x_reference).full_tensor());
  for (const Mesh& mesh : {create_mesh({{"tp", 2}}), create_mesh({{"tp", 3}}), create_mesh({{"dp", 2}, {"tp", 2}})}) {
    CAPTURE(mesh.to_string());
    NormedMlp model(mesh, 4);
    parallelize_module(model, mesh, {{"layers.0", ColwiseParallel{}}, {"layers.1", RowwiseParallel{}}}, "tp");
    const size_t tp = size_t(mesh.dim_index("tp"));
    CHECK(model.get_parameter("layers.0.weight").value().placements()[tp] == Placement{Shard{1}});
    CHECK(model.get_parameter("layers.1.weight").value().placements()[tp] == Placement{Shard{0}});
    Tensor x = distribute_tensor(input_rows(5), mesh);
    Tensor y = model(x);
    {
      CommDebugMode comm;
      (void)unpack(y);
      CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});  // the row-parallel sum, once
    }
    check_close(y.full_tensor(), reference(x_reference).full_tensor());
    const std::vector<Tensor> grads = grad(loss_of(model, x), model.parameters());
    const std::vector<Tensor> grads_reference = grad(loss_of(reference, x_reference), reference.parameters());
    for (size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(model.named_parameters()[i].first);
      check_close(grads[i].full_tensor(), grads_reference[i].full_tensor());
    }
  }
}

TEST_CASE("Embedding: rows of its weight by id, PyTorch's name and N(0, 1) start, the same rows and gradient sharded over the vocabulary or the width") {
  Mesh one = one_device();
  Embedding reference(7, 4, one, 3);
  CHECK(names(reference.named_parameters()) == std::vector<std::string>{"weight"});
  const Array weight = reference.get_parameter("weight").value().full_tensor();
  CHECK(weight.shape() == std::vector<int64_t>{7, 4});
  const Array ids_array = Array::from<int32_t>({6, 0, 3, 3, 1, 6}, {2, 3});
  const Array rows = reference(distribute_tensor(ids_array, one)).full_tensor();
  REQUIRE(rows.shape() == std::vector<int64_t>{2, 3, 4});
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 4; ++j) CHECK(rows.data<float>()[i * 4 + j] == weight.data<float>()[ids_array.data<int32_t>()[i] * 4 + j]);
  // The gradient of sum(rows * rows) adds 2 x row once per use: id 3 and id 6 twice, unused ids zero.
  const Tensor ids_one = distribute_tensor(ids_array, one);
  const Array g_reference = grad(reduce_sum(square(reference(ids_one))), reference.parameters())[0].full_tensor();
  for (int64_t j = 0; j < 4; ++j) {
    CHECK(g_reference.data<float>()[3 * 4 + j] == doctest::Approx(4 * weight.data<float>()[3 * 4 + j]));
    CHECK(g_reference.data<float>()[2 * 4 + j] == 0.0f);
  }
  for (int64_t shard_axis : {0, 1}) {
    for (const Mesh& mesh : {create_mesh({{"tp", 2}}), create_mesh({{"tp", 3}})}) {
      CAPTURE(shard_axis);
      CAPTURE(mesh.to_string());
      Embedding model(7, 4, mesh, 3);
      model.set_parameter("weight", Variable(distribute_tensor(weight, mesh, {Shard{shard_axis}})));
      const Tensor ids = distribute_tensor(ids_array, mesh);
      check_close(model(ids).full_tensor(), rows);
      check_close(grad(reduce_sum(square(model(ids))), model.parameters())[0].full_tensor(), g_reference);
    }
  }
}

// Published parameter counts: Meta's Llama 3 model cards (8.03B, 70.6B, 405B: 8,030,261,248,
// 70,553,706,496 and 405,853,388,800), Mistral's Mixtral 8x7B (46.7B total, 12.9B active per
// token: 46,702,792,704 and 12,879,925,248) and OpenAI's GPT-2 small (124,439,808, tied).
TEST_CASE("transformer presets have the published shapes and parameter counts, and bad configs are ShapeErrors naming the field") {
  CHECK(parameter_count(transformer_preset("llama3-8b")) == 8'030'261'248);
  CHECK(parameter_count(transformer_preset("llama3-70b")) == 70'553'706'496);
  CHECK(parameter_count(transformer_preset("llama3-405b")) == 405'853'388'800);
  const TransformerConfig mixtral = transformer_preset("mixtral-8x7b");
  CHECK(parameter_count(mixtral) == 46'702'792'704);
  CHECK(active_parameter_count(mixtral) == 12'879'925'248);
  CHECK(parameter_count(transformer_preset("gpt2")) == 124'439'808);
  // GPT-3's "175B" (Brown et al., table 2.1): within half a percent.
  CHECK(std::abs(double(parameter_count(transformer_preset("gpt3-175b"))) / 175e9 - 1) < 0.005);
  const TransformerConfig deepseek = transformer_preset("deepseek-v3");
  REQUIRE(deepseek.moe.has_value());
  CHECK(deepseek.moe->num_experts == 256);
  CHECK(deepseek.moe->num_shared_experts == 1);
  CHECK(deepseek.moe->top_k == 8);
  CHECK_FALSE(deepseek.is_moe_layer(2));  // the first three layers are dense
  CHECK(deepseek.is_moe_layer(3));
  CHECK(deepseek.is_moe_layer(60));
  const TransformerConfig llama = transformer_preset("llama3-8b");
  CHECK(llama.head_dim() == 128);
  CHECK(llama.kv_heads == 8);  // grouped-query attention
  CHECK(llama.rope_scaling.has_value());
  for (const std::string& name : transformer_preset_names()) CHECK(transformer_preset(name).name == name);
  CHECK_THROWS_WITH_AS(transformer_preset("llama9"), doctest::Contains("unknown preset 'llama9' (known: llama3-8b"), Error);
  TransformerConfig bad = transformer_preset("llama-tiny");
  bad.kv_heads = 3;
  CHECK_THROWS_WITH_AS(parameter_count(bad), doctest::Contains("kv_heads 3 does not divide heads 4"), ShapeError);
  bad = transformer_preset("moe-tiny");
  bad.moe->top_k = 5;
  CHECK_THROWS_WITH_AS(checked_transformer_config(bad), doctest::Contains("moe.top_k 5 exceeds moe.num_experts 4"), ShapeError);
  bad.moe.reset();
  bad.dim = 0;
  CHECK_THROWS_WITH_AS(checked_transformer_config(bad), doctest::Contains("dim must be at least 1, got 0"), ShapeError);
}

TEST_CASE("collectives, errors and programs built inside library modules and optimizers name the user's line that called them") {
  auto here = [](int line) { return "test_module.cpp:" + std::to_string(line); };
  const Mesh mesh = create_mesh({{"tp", 2}});
  Linear fc(6, 4, mesh, 1);
  parallelize_module(fc, mesh, {{"", RowwiseParallel{}}}, "tp");  // its partial products all_reduced inside the library
  const Tensor x = distribute_tensor(Array({3, 6}, DType::f32), mesh, {Replicate{}});
  {
    CommDebugMode comm;
    const int line = __LINE__ + 1;
    const Tensor y = fc(x);
    (void)y.full_tensor();
    REQUIRE(!comm.records().empty());
    for (const CollectiveRecord& r : comm.records()) CHECK(r.source_line == here(line));
  }
  // An op inside the module that cannot run: the error names the call's line.
  const Tensor wrong = distribute_tensor(Array({3, 5}, DType::f32), mesh, {Replicate{}});
  const std::string at_bad_line = "(at " + here(__LINE__ + 1) + ")";
  CHECK_THROWS_WITH_AS((void)fc(wrong), doctest::Contains(at_bad_line.c_str()), ShapeError);
  // An optimizer's update ops, in a jit step's program: explain() lists them at apply's line.
  std::vector<Variable> vars = {fc.get_parameter("weight")};
  Adam adam(vars, 0.1);
  int apply_line = 0;
  auto step = jit([&](const Tensor& g) {
    apply_line = __LINE__ + 1;
    adam.apply({g});
    return reduce_sum(vars[0].value());
  });
  const Tensor g = zeros(vars[0].value().shape(), vars[0].value().layout());
  const std::string text = step.explain(g);
  CAPTURE(text);
  CHECK(text.find(here(apply_line)) != std::string::npos);
  CHECK(text.find("adam_update.cpp") == std::string::npos);
  CHECK(text.find("linear.cpp") == std::string::npos);
  // TESSERA_PROFILE's table names the step's lines too.
  set_profiling(true);
  reset_profiles();
  (void)step(g).full_tensor();
  const std::string profile = profile_report();
  set_profiling(false);
  CAPTURE(profile);
  CHECK(profile.find(here(apply_line)) != std::string::npos);
  CHECK(profile.find("adam_update.cpp") == std::string::npos);
}

TEST_CASE("a jit function's inputs are named by the user's lines: a gathered argument or variable, before and after calls") {
  auto here = [](int line) { return "test_module.cpp:" + std::to_string(line); };
  const Mesh mesh = create_mesh({{"dp", 2}});
  const int argument_line = __LINE__ + 1;
  const Tensor x = random_normal({4, 4}, 1, Layout::batch_sharded(mesh, "dp", 2));
  const int variable_line = __LINE__ + 1;
  Variable v(random_normal({4, 4}, 2, Layout::batch_sharded(mesh, "dp", 2)));
  // Both sharded by row and both wanted whole by the matmuls: each is gathered, at its own line.
  auto f = jit([&](const Tensor& a) {
    const Tensor y = matmul(a, v.value());
    v.assign(v.value() * 0.5);
    return matmul(y, a);
  });
  for (int call = 0; call < 2; ++call) {  // the variable's value after a call keeps its line
    const std::string text = f.explain(x);
    CAPTURE(text);
    CHECK(text.find("all_gather") != std::string::npos);
    CHECK(text.find(here(argument_line)) != std::string::npos);
    CHECK(text.find(here(variable_line)) != std::string::npos);
    CHECK(text.find("node.cpp") == std::string::npos);
    CHECK(text.find("variable.cpp") == std::string::npos);
    CHECK(text.find("jit_function.cpp") == std::string::npos);
    (void)f(x);
  }
}
