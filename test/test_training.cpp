// Training: optimizers (one fused kernel per variable update), data loading errors, sharded
// checkpoints across meshes (and killed saves, flipped bytes), and mesh invariance of training.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <tessera/tessera.hpp>

#include "jit/executable.hpp"
#include "file_faults.hpp"
#include "jit/api/explain.hpp"
#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"
#include "training_fixture.hpp"

using namespace tessera;
using namespace tessera::testing;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tessera-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace

TEST_CASE("each variable's optimizer update is one fused kernel") {
  Mesh mesh = create_mesh({{"batch", 2}});
  std::vector<Variable> vars = {Variable(random_normal({6, 5}, 1, Layout::replicated(mesh, 2))),
                                Variable(zeros({5}, Layout::replicated(mesh, 1))),
                                Variable(random_normal({5, 3}, 2, Layout::replicated(mesh, 2)))};
  Adam adam(vars);
  auto update = jit([&](const Tensor& g0, const Tensor& g1, const Tensor& g2) {
    adam.apply({g0, g1, g2});
    return std::vector<Tensor>{};
  });
  Tensor g0 = ones({6, 5}, Layout::replicated(mesh, 2)), g1 = ones({5}, Layout::replicated(mesh, 1)), g2 = ones({5, 3}, Layout::replicated(mesh, 2));
  // One kernel per variable (its moments and weight together) plus one for the step counter.
  CHECK(plan_summary(*update.executable(g0, g1, g2)).kernels == 1 + int64_t(vars.size()));
  update(g0, g1, g2);
  update(g0, g1, g2);
  // After two steps with gradient 1 Adam moves every weight by ~2 * lr.
  Array w = vars[1].value().full_tensor();
  CHECK(w.to_vector<float>()[0] == doctest::Approx(-2e-3).epsilon(1e-3));
  SGD sgd({vars[0]}, 0.1, 0.9);
  auto sgd_step = jit([&](const Tensor& g) {
    sgd.apply({g});
    return std::vector<Tensor>{};
  });
  CHECK(plan_summary(*sgd_step.executable(g0)).kernels == 1);
}

TEST_CASE("Adam shards the state of large variables over data-parallel devices (ZeRO-1), not of small ones") {
  Mesh mesh = create_mesh({{"batch", 2}});
  Variable large(random_normal({256, 300}, 1, Layout::replicated(mesh, 2)));  // 300 KB
  Variable small(random_normal({300}, 2, Layout::replicated(mesh, 1)));
  Adam adam({large, small});
  CHECK(adam.first_moments()[0].layout().sharding_specs() == std::vector<std::string>{"batch", UNSHARDED});
  CHECK(adam.second_moments()[0].layout().sharding_specs() == std::vector<std::string>{"batch", UNSHARDED});
  CHECK(adam.first_moments()[1].layout().sharding_specs() == std::vector<std::string>{UNSHARDED});
  // Data-parallel gradients (partial sums): the large one is reduce_scattered and the new weights
  // all_gathered; the small one takes a single all_reduce.
  auto update = jit([&](const Tensor& g_large, const Tensor& g_small) {
    adam.apply({g_large, g_small});
    return std::vector<Tensor>{};
  });
  const Layout partial2 = Layout::from_placements(mesh, {Partial{}}, 2), partial1 = Layout::from_placements(mesh, {Partial{}}, 1);
  Tensor g_large = with_layout(ones({256, 300}, Layout::replicated(mesh, 2)), partial2);
  Tensor g_small = with_layout(ones({300}, Layout::replicated(mesh, 1)), partial1);
  std::vector<std::string> collectives = plan_summary(*update.executable(g_large, g_small)).collectives;
  std::sort(collectives.begin(), collectives.end());
  CHECK(collectives == std::vector<std::string>{"all_gather(batch)", "all_reduce(batch)", "reduce_scatter(batch)"});
  update(g_large, g_small);
  // Adam's first step moves every weight by lr, whatever the size of its gradient.
  CHECK(large.value().full_tensor().to_vector<float>()[0] ==
        doctest::Approx(random_normal({256, 300}, 1, Layout::replicated(mesh, 2)).full_tensor().to_vector<float>()[0] - 1e-3).epsilon(1e-4));
}

TEST_CASE("inside a whole training step, each variable's Adam update is still one kernel") {
  // The bias corrections (1 - beta^t) are computed after the first variable's moments in program
  // order; the first update must not split around them.
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    Mesh mesh = create_mesh({{"batch", devices}});
    SmallMlp model(Layout::replicated(mesh, 2), Layout::replicated(mesh, 2));
    auto step = jit([&](const Tensor& x, const Tensor& y) { return model.train_step(x, y); });
    Tensor x = random_normal({20, 12}, 1, Layout::batch_sharded(mesh, "batch", 2));
    Tensor y = cast(random_uniform({20}, 2, Layout::batch_sharded(mesh, "batch", 1), 0, 3.99), DType::i32);
    auto exe = step.executable(x, y);
    int updates = 0, moments_alone = 0;
    for (const kir::Kernel& k : exe->schedule().kernels) {
      const bool has_sqrt = std::find(k.fused_ops.begin(), k.fused_ops.end(), "sqrt") != k.fused_ops.end();
      updates += has_sqrt;
      moments_alone += !has_sqrt && k.fused_ops.size() == 4 && k.fused_ops[0] == "add" && k.fused_ops[1] == "mul";
    }
    CHECK(updates == int(model.vars.size()));
    CHECK(moments_alone == 0);
  }
}

TEST_CASE("two identical models in one process train their own variables") {
  // Both steps compile to the same cached executable; each must read and write its own model.
  Mesh mesh = create_mesh({{"batch", 2}});
  struct Model {
    Dense layer;
    Adam adam;
    explicit Model(const Mesh& m) : layer(6, 3, Layout::replicated(m, 2), 9), adam({layer.weight(), layer.bias()}, 0.05) {}
  };
  Model a(mesh), b(mesh);
  auto step_of = [](Model& m) {
    return jit([&m](const Tensor& x) {
      Tensor loss = reduce_mean(m.layer(x) * m.layer(x));
      m.adam.apply(grad(loss, {m.layer.weight(), m.layer.bias()}));
      return loss;
    });
  };
  auto step_a = step_of(a), step_b = step_of(b);
  Tensor x = random_normal({8, 6}, 3, Layout::batch_sharded(mesh, "batch", 2));
  const Array b_before = b.layer.weight().value().full_tensor();
  std::vector<float> losses_a;
  for (int s = 0; s < 3; ++s) losses_a.push_back(to_array(step_a(x)).to_vector<float>()[0]);
  CHECK(losses_a[2] < losses_a[0]);
  CHECK(same_array(b.layer.weight().value().full_tensor(), b_before));  // untouched by a's steps
  for (int s = 0; s < 3; ++s) CHECK(to_array(step_b(x)).to_vector<float>()[0] == losses_a[s]);
}

TEST_CASE("mesh invariance: 20 Adam steps give the same losses on 1, 2, 4, 8 devices and a 2x2 TP mesh") {
  const int steps = 20;
  Mesh one = create_mesh({{"batch", 1}});
  std::vector<float> reference = train_losses(one, Layout::replicated(one, 2), Layout::replicated(one, 2), "batch", steps);
  CHECK(reference.back() < reference.front());
  for (int n : {2, 4, 8}) {
    Mesh mesh = create_mesh({{"batch", n}});
    auto losses = train_losses(mesh, Layout::replicated(mesh, 2), Layout::replicated(mesh, 2), "batch", steps);
    for (int s = 0; s < steps; ++s) CHECK(losses[s] == doctest::Approx(reference[s]).epsilon(1e-5));
  }
  Mesh tp = create_mesh({{"batch", 2}, {"model", 2}});
  auto losses = train_losses(tp, Layout({UNSHARDED, "model"}, tp), Layout({"model", UNSHARDED}, tp), "batch", steps);
  for (int s = 0; s < steps; ++s) CHECK(losses[s] == doctest::Approx(reference[s]).epsilon(1e-5));
}

TEST_CASE("TESSERA_DETERMINISTIC=1 makes the losses bitwise equal on every mesh") {
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  const int steps = 20;
  Mesh one = create_mesh({{"batch", 1}});
  std::vector<float> reference = train_losses(one, Layout::replicated(one, 2), Layout::replicated(one, 2), "batch", steps);
  for (int n : {2, 4, 8}) {
    CAPTURE(n);
    Mesh mesh = create_mesh({{"batch", n}});
    CHECK(train_losses(mesh, Layout::replicated(mesh, 2), Layout::replicated(mesh, 2), "batch", steps) == reference);
  }
  Mesh tp = create_mesh({{"batch", 2}, {"model", 2}});
  CHECK(train_losses(tp, Layout({UNSHARDED, "model"}, tp), Layout({"model", UNSHARDED}, tp), "batch", steps) == reference);
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("TESSERA_DETERMINISTIC=1: a product fused into a sum rounds as it does unfused, so a sharded sum of squares is bitwise the one-device one") {
  // On one device square() and reduce_sum() share a kernel; over a sharded axis the sum is
  // gathered into a kernel of its own. An FMA contraction in the fused kernel would differ.
  setenv("TESSERA_DETERMINISTIC", "1", 1);
  std::mt19937 rng(5);
  Array x({7, 33}, DType::f32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : std::span(x.mutable_data<float>(), size_t(x.numel()))) v = normal(rng);
  auto sum_of_squares = [](const Tensor& t) { return reduce_sum(square(t), {}, false); };
  Mesh one = create_mesh({{"x", 1}});
  const float reference = to_array(jit(sum_of_squares)(distribute_tensor(x, one, {Replicate{}}))).to_vector<float>()[0];
  for (int n : {2, 3}) {
    Mesh mesh = create_mesh({{"x", n}});
    for (int axis : {0, 1}) {
      CAPTURE(n);
      CAPTURE(axis);
      Tensor sharded = distribute_tensor(x, mesh, {Shard{axis}});
      CHECK(to_array(jit(sum_of_squares)(sharded)).to_vector<float>()[0] == reference);
      CHECK(to_array(sum_of_squares(sharded)).to_vector<float>()[0] == reference);
    }
  }
  Mesh grid = create_mesh({{"a", 2}, {"b", 2}});
  CHECK(to_array(jit(sum_of_squares)(distribute_tensor(x, grid, {Shard{1}, Shard{0}}))).to_vector<float>()[0] == reference);
  unsetenv("TESSERA_DETERMINISTIC");
}

TEST_CASE("IDX files: Fashion-MNIST loads; missing, truncated and corrupt files raise IOError naming the file") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (fs::exists(dir)) {
    Dataset test = load_fashion_mnist(false, 100);
    CHECK(test.size() == 100);
    CHECK(test.images.shape() == std::vector<int64_t>{100, 784});
    float lo = 1, hi = 0;
    for (float v : test.images.to_vector<float>()) lo = std::min(lo, v), hi = std::max(hi, v);
    CHECK(lo >= 0.0f);
    CHECK(hi <= 1.0f);
    CHECK(hi > 0.5f);
  }
  fs::path tmp = temp_dir("idx");
  CHECK_THROWS_WITH_AS(read_idx((tmp / "missing.gz").string()), doctest::Contains("missing.gz"), IOError);
  // A valid file, then a truncated and a corrupt copy.
  std::vector<uint8_t> bytes = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
  auto write_gz = [&](const fs::path& p, const std::vector<uint8_t>& b) {
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, b.data(), unsigned(b.size()));
    gzclose(f);
  };
  write_gz(tmp / "ok.gz", bytes);
  Array a = read_idx((tmp / "ok.gz").string());
  CHECK(a.shape() == std::vector<int64_t>{2, 3});
  CHECK(a.to_vector<uint8_t>()[5] == 6);
  write_gz(tmp / "short.gz", std::vector<uint8_t>(bytes.begin(), bytes.end() - 2));
  CHECK_THROWS_WITH_AS(read_idx((tmp / "short.gz").string()), doctest::Contains("short.gz' is truncated"), IOError);
  std::vector<uint8_t> bad = bytes;
  bad[2] = 0x0d;
  write_gz(tmp / "float.gz", bad);
  CHECK_THROWS_WITH_AS(read_idx((tmp / "float.gz").string()), doctest::Contains("float.gz' holds element type"), IOError);
  std::string gz = [&] { std::ifstream in(tmp / "ok.gz", std::ios::binary); return std::string(std::istreambuf_iterator<char>(in), {}); }();
  gz[gz.size() / 2] ^= 0x55;
  std::ofstream(tmp / "corrupt.gz", std::ios::binary) << gz;
  CHECK_THROWS_WITH_AS(read_idx((tmp / "corrupt.gz").string()), doctest::Contains("corrupt.gz"), IOError);
  // Headers claiming absurd sizes: rejected, or found truncated without allocating what they claim.
  write_gz(tmp / "huge.gz", {0, 0, 8, 4, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 1});
  CHECK_THROWS_WITH_AS(read_idx((tmp / "huge.gz").string()), doctest::Contains("more elements than any tensor"), IOError);
  write_gz(tmp / "big.gz", {0, 0, 8, 2, 0, 1, 0, 0, 0, 1, 0, 0, 7});  // 2^32 bytes claimed, 1 there
  CHECK_THROWS_WITH_AS(read_idx((tmp / "big.gz").string()), doctest::Contains("big.gz' is truncated"), IOError);
  fs::remove_all(tmp);
}

TEST_CASE("batches are sharded on the batch dim and keep an uneven last batch") {
  // Example i's pixels are all i, so every image row must match its label.
  std::vector<float> pixels;
  for (int i = 0; i < 10; ++i) pixels.insert(pixels.end(), 4, float(i));
  Dataset d{Array::from<float>(pixels, {10, 4}), Array::from<int32_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10})};
  for (Mesh mesh : {create_mesh({{"batch", 3}}), create_mesh({{"batch", 2}, {"model", 2}})}) {
    CAPTURE(mesh.to_string());
    Batches batches(d, 4, mesh, "batch", 1);
    CHECK(batches.count() == 3);
    batches.shuffle(0);
    std::vector<int32_t> seen;
    for (int64_t b = 0; b < batches.count(); ++b) {
      auto [x, y] = batches.get(b);
      CHECK(x.layout().sharding_specs() == std::vector<std::string>{"batch", UNSHARDED});
      const std::vector<int32_t> labels = y.full_tensor().to_vector<int32_t>();
      const std::vector<float> images = x.full_tensor().to_vector<float>();
      for (size_t r = 0; r < labels.size(); ++r)
        for (size_t c = 0; c < 4; ++c) CHECK(images[r * 4 + c] == float(labels[r]));
      seen.insert(seen.end(), labels.begin(), labels.end());
      if (b == 2) CHECK(x.shape() == std::vector<int64_t>{2, 4});  // not dropped
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
}

TEST_CASE("checkpoints round-trip across meshes and layouts; corruption is detected") {
  fs::path dir = temp_dir("ckpt");
  Mesh a = create_mesh({{"x", 2}, {"y", 2}});
  std::map<std::string, Variable> saved = {{"w", Variable(random_normal({7, 5}, 1, Layout({"x", "y"}, a)))},
                                           {"b", Variable(random_normal({5}, 2, Layout({"y"}, a)))},
                                           {"p", Variable(ones({3, 2}, Layout::from_placements(a, {Partial{}, Shard{1}}, 2)))}};
  save(dir.string(), saved);
  Mesh b = create_mesh({{"z", 3}});
  std::map<std::string, Variable> loaded = {{"w", Variable(zeros({7, 5}, Layout({UNSHARDED, "z"}, b)))},
                                            {"b", Variable(zeros({5}, Layout({"z"}, b)))},
                                            {"p", Variable(zeros({3, 2}, Layout({"z", UNSHARDED}, b)))}};
  load(dir.string(), loaded);
  for (const auto& [name, var] : saved) {
    CAPTURE(name);
    CHECK(same_array(loaded.at(name).value().full_tensor(), var.value().full_tensor()));
    CHECK(loaded.at(name).layout().mesh() == b);
  }
  std::map<std::string, Variable> missing = {{"nope", Variable(zeros({2}, Layout({"z"}, b)))}};
  CHECK_THROWS_WITH_AS(load(dir.string(), missing), doctest::Contains("no variable 'nope'"), IOError);
  std::map<std::string, Variable> wrong = {{"w", Variable(zeros({5, 7}, Layout({"z", UNSHARDED}, b)))}};
  CHECK_THROWS_WITH_AS(load(dir.string(), wrong), doctest::Contains("'w' has shape (7, 5)"), IOError);
  // Flip one byte of a data file: its checksum catches it.
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") {
      std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(-3, std::ios::end);
      char c;
      file.get(c);
      file.seekp(-3, std::ios::end);
      file.put(char(c ^ 0x40));
      break;
    }
  CHECK_THROWS_WITH_AS(load(dir.string(), loaded), doctest::Contains("checksum"), IOError);
  fs::remove_all(dir);
}

TEST_CASE("a failed save of a pipelined model removes every file it wrote: the folder holds the previous checkpoint, or nothing new") {
  // Stage s's blocks are stacked and sharded over pp: each stage's device writes a data file of
  // its own.
  GptConfig config;
  config.vocab = 11, config.context = 4, config.layers = 2, config.width = 4, config.heads = 1;
  const Mesh mesh = create_mesh({{"pp", 2}});
  PipelinedGpt model(config, mesh);
  const std::map<std::string, Variable> state = model.state_dict();
  const fs::path dir = temp_dir("failed-pipelined-save");
  save(dir.string(), state);
  const std::map<std::string, std::string> previous = folder_contents(dir);
  size_t largest_data_file = 0;
  int data_files = 0;
  for (const auto& [name, bytes] : previous)
    if (name.rfind("shard-", 0) == 0) largest_data_file = std::max(largest_data_file, bytes.size()), ++data_files;
  REQUIRE(data_files == 2);
  const size_t index_size = previous.at("index.json").size();
  REQUIRE(index_size > largest_data_file + 1);
  {
    // Room for every data file, not for the index: the save fails after both data files are
    // in place.
    const FileSizeLimit disk_fills_up(largest_data_file + 1);
    CHECK_THROWS_WITH_AS(save(dir.string(), state), doctest::Contains("index.json"), IOError);
  }
  CHECK(folder_contents(dir) == previous);
  std::map<std::string, Variable> loaded = PipelinedGpt(config, mesh).state_dict();
  load(dir.string(), loaded);
  for (const auto& [name, var] : state) CHECK(same_array(loaded.at(name).value().full_tensor(), var.value().full_tensor()));
  // No previous checkpoint, and an index that cannot be put in place (a folder in its way).
  fs::remove_all(dir);
  fs::create_directories(dir / "index.json");
  CHECK_THROWS_WITH_AS(save(dir.string(), state), doctest::Contains(("'" + (dir / "index.json").string() + "'").c_str()), IOError);
  CHECK(folder_contents(dir) == std::map<std::string, std::string>{{"index.json", "(a folder)"}});
  fs::remove_all(dir);
}

TEST_CASE("a save killed midway leaves the previous checkpoint loadable") {
  fs::path dir = temp_dir("killed");
  Mesh mesh = create_mesh({{"x", 2}});
  std::map<std::string, Variable> vars = {{"w", Variable(full({300, 200}, 1.0, Layout({"x", UNSHARDED}, mesh)))}};
  save(dir.string(), vars);
  std::mt19937 rng(4);
  for (int trial = 0; trial < 6; ++trial) {
    // A child process saves new values over and over; it is killed at a random moment.
    pid_t child = fork();
    if (child == 0) {
      const std::string writer = std::string(TESSERA_TEST_BUILD_DIR) + "/checkpoint_writer";
      execl(writer.c_str(), writer.c_str(), dir.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    usleep(useconds_t(2000 + rng() % 40000));
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    std::map<std::string, Variable> check = {{"w", Variable(zeros({300, 200}, Layout({"x", UNSHARDED}, mesh)))}};
    CHECK_NOTHROW(load(dir.string(), check));
    std::vector<float> values = check.at("w").value().full_tensor().to_vector<float>();
    const float first = values.front();
    CHECK((first == 1.0f || first == 2.0f));
    CHECK(std::all_of(values.begin(), values.end(), [&](float v) { return v == first; }));  // never a mix
  }
  fs::remove_all(dir);
}
