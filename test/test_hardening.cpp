// Hardening: inputs that used to crash, hang or be silently accepted now give typed errors or
// defined results (issue list: shapes whose products overflow, integer division traps, NaN
// dropped by max / min / argmax, assign_add broadcasting, argmax over an empty axis; hardware
// profiles, GPT configs and planner inputs out of range, abstract meshes, pipeline stages that
// do not exist, and the gpt and plan samples' command lines and output files).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include <tessera/tessera.hpp>

#include "run_program.hpp"
#include "samples/common/progress_line.hpp"

using namespace tessera;
using tessera::testing::ProgramRun;
using tessera::testing::run_program;

namespace {

const int64_t kHuge = int64_t(1) << 32;

std::vector<Mesh> meshes() { return {create_mesh({{"x", 1}}), create_mesh({{"x", 4}}), create_mesh({{"x", 2}, {"y", 2}})}; }

}  // namespace

TEST_CASE("shapes whose element counts overflow are ShapeErrors, before anything runs") {
  Mesh mesh = create_mesh({{"x", 2}});
  const Layout r2 = Layout::replicated(mesh, 2);
  CHECK_THROWS_AS(Mesh::from_string("|x=4294967296,y=4294967296|0|0|CPU:0"), MeshError);
  CHECK_THROWS_WITH_AS(ones({kHuge, kHuge}, r2), doctest::Contains("more than 2^48 elements"), ShapeError);
  Tensor small = ones({4, 4}, r2);
  CHECK_THROWS_AS(reshape(small, {kHuge, kHuge, 0, -1}), ShapeError);
  CHECK_THROWS_AS(reshape(small, {kHuge, kHuge}), ShapeError);
  CHECK_THROWS_AS(broadcast_to(ones({1, 1}, r2), {kHuge, kHuge}), ShapeError);
  CHECK_THROWS_AS(one_hot(ones({kHuge}, Layout::replicated(mesh, 1), DType::i64), kHuge), ShapeError);
  CHECK_THROWS_AS(slice(small, {2, 0}, {std::numeric_limits<int64_t>::max(), 4}), ShapeError);
  CHECK_THROWS_AS(pad(small, {{std::numeric_limits<int64_t>::max(), 0}, {0, 0}}, 0.0), ShapeError);
  CHECK_THROWS_AS(Array(std::vector<int64_t>{kHuge, kHuge}, DType::f32), ShapeError);
  CHECK_THROWS_AS(Array(std::vector<int64_t>{3, -1}, DType::f32), ShapeError);
  // Within the limit but more than the machine holds: an Error, not std::bad_alloc.
  CHECK_THROWS_WITH_AS(Array(std::vector<int64_t>{int64_t(1) << 46}, DType::f64), doctest::Contains("cannot allocate"), Error);
  // An empty tensor is fine however large its other extents.
  CHECK(zeros({0, kHuge}, r2).full_tensor().numel() == 0);
}

TEST_CASE("a mesh whose device count overflows is a MeshError naming its dims, not cpu_devices(0)") {
  const int64_t big = int64_t(1) << 40;  // 2^40 x 2^40 wraps to 0 in int64
  const std::string dims = "[('x', 1099511627776), ('y', 1099511627776)]";
  const auto names_the_product = doctest::Contains("the product of its dims exceeds the limit of 2^31 - 1 devices");
  CHECK_THROWS_WITH_AS(create_mesh({{"x", big}, {"y", big}}), doctest::Contains(dims.c_str()), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", big}, {"y", big}}), names_the_product, MeshError);
  CHECK_THROWS_WITH_AS(init_device_mesh("cpu", {big, big}, {"x", "y"}), doctest::Contains(dims.c_str()), MeshError);
  CHECK_THROWS_WITH_AS(create_distributed_mesh({{"x", big}, {"y", big}}), names_the_product, MeshError);
  // 2^31 devices would wrap an int device count to a negative one.
  CHECK_THROWS_WITH_AS(init_device_mesh("cpu", {int64_t(1) << 16, int64_t(1) << 15}, {"a", "b"}),
                       doctest::Contains("[('a', 65536), ('b', 32768)]: the product of its dims exceeds"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x=4294967296,y=4294967296|0|0|CPU:0"), names_the_product, MeshError);
  CHECK(mesh_device_count({{"x", 3}, {"y", 2}}) == 6);
  CHECK(create_mesh({{"x", 3}, {"y", 2}}).size() == 6);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 3}, {"y", 0}}), doctest::Contains("'y' has size 0"), MeshError);
}

TEST_CASE("a chain of 20,000 dependent ops is traced, planned, run, differentiated and freed without overflowing the stack") {
  // Each pass that follows the data flow (tracing's invariants, autodiff, the cache key, the
  // partitioner, kernel lowering, freeing nodes and kernel IR) once recursed per op along the
  // chain: about 4,000 ops overflowed a thread's 8 MiB stack and killed the process.
  constexpr int kChain = 20000;  // five times the chain that overflowed
  const Mesh mesh = create_mesh({{"x", 2}});
  auto chain = [](const Tensor& a) {
    Tensor x = a;
    for (int i = 0; i < kChain; ++i) x = x + 1.0;
    return x;
  };
  const Tensor a = full({6, 4}, 0.5, Layout::from_placements(mesh, {Shard{0}}, 2));
  auto step = jit(chain);
  CHECK(step.plan(hardware_profile("h100-sxm"), a).flops == doctest::Approx(double(kChain) * 3 * 4));  // a device's 3 x 4 block
  const Array out = step(a).full_tensor();
  for (int64_t i = 0; i < out.numel(); ++i) CHECK(out.data<float>()[i] == 0.5f + float(kChain));
  auto gradient = jit([&](const Tensor& x) { return gradients(reduce_sum(chain(x)), {x})[0]; });
  const Array g = gradient(a).full_tensor();
  for (int64_t i = 0; i < g.numel(); ++i) CHECK(g.data<float>()[i] == 1.0f);
}

TEST_CASE("integer division never traps: x / 0 is 0 and INT_MIN / -1 wraps, as numpy's") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    const Layout l = Layout::replicated(mesh, 1);
    const int32_t lo32 = std::numeric_limits<int32_t>::min();
    Tensor a = copy_to_mesh(Array::from<int32_t>({lo32, 5, 7, -7}, {4}), l), b = copy_to_mesh(Array::from<int32_t>({-1, 0, 2, 2}, {4}), l);
    CHECK((a / b).full_tensor().to_vector<int32_t>() == std::vector<int32_t>{lo32, 0, 3, -3});
    const int64_t lo64 = std::numeric_limits<int64_t>::min();
    Tensor c = copy_to_mesh(Array::from<int64_t>({lo64, 9}, {2}), Layout::replicated(mesh, 1));
    Tensor d = copy_to_mesh(Array::from<int64_t>({-1, 0}, {2}), Layout::replicated(mesh, 1));
    CHECK((c / d).full_tensor().to_vector<int64_t>() == std::vector<int64_t>{lo64, 0});
  }
}

TEST_CASE("NaN propagates through maximum, relu, reduce_max / reduce_min (sharded too) and argmax takes the first NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Array rows = Array::from<float>({1, nan, 3, 4, 9, 2, nan, nan}, {2, 4});
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    std::vector<Placement> cols(size_t(mesh.ndim()), Replicate{});
    cols[0] = Shard{1};
    Tensor x = distribute_tensor(rows, mesh, cols);
    const std::vector<float> max = reduce_max(x, {1}).full_tensor().to_vector<float>();
    const std::vector<float> min = reduce_min(x, {1}).full_tensor().to_vector<float>();
    CHECK(std::isnan(max[0]));
    CHECK(std::isnan(max[1]));
    CHECK(std::isnan(min[0]));
    CHECK(std::isnan(reduce_max(x).full_tensor().to_vector<float>()[0]));
    const std::vector<float> m = maximum(x, 2.0f).full_tensor().to_vector<float>();
    CHECK(std::isnan(m[1]));
    CHECK(m[0] == 2.0f);
    CHECK(std::isnan(relu(x).full_tensor().to_vector<float>()[6]));
    CHECK(std::isnan(minimum(x, 0.0f).full_tensor().to_vector<float>()[1]));
    CHECK(argmax(x, 1).full_tensor().to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  }
}

TEST_CASE("assign_add / assign_sub check shape and dtype like assign; argmax of an empty axis is an error") {
  Mesh mesh = create_mesh({{"x", 2}});
  Variable v(zeros({4, 2}, Layout({"x", UNSHARDED}, mesh)));
  CHECK_THROWS_WITH_AS(v.assign_add(ones({2}, Layout::replicated(mesh, 1))), doctest::Contains("assign_add"), ShapeError);
  CHECK_THROWS_AS(v.assign_sub(ones({4, 2}, Layout::replicated(mesh, 2), DType::f64)), DTypeError);
  v.assign_add(ones({4, 2}, Layout({"x", UNSHARDED}, mesh)) * 2.0f);
  CHECK(v.value().full_tensor().to_vector<float>() == std::vector<float>(8, 2.0f));
  // Another layout, and a Partial gradient, are redistributed into the variable's layout.
  v.assign_add(ones({4, 2}, Layout::replicated(mesh, 2)));
  v.assign_sub(ones({4, 2}, Layout::from_placements(mesh, {Partial{}}, 2)) * 0.5f);  // a Partial(sum) of value 0.5
  CHECK(v.layout() == Layout({"x", UNSHARDED}, mesh));
  CHECK(v.value().full_tensor().to_vector<float>() == std::vector<float>(8, 2.5f));
  CHECK_THROWS_WITH_AS(argmax(zeros({3, 0}, Layout::replicated(mesh, 2)), 1), doctest::Contains("is empty"), ShapeError);
}

TEST_CASE("cross-entropy with a label out of range is an IndexError, not a quiet number; one_hot depth must fit int32 indices") {
  for (const Mesh& mesh : meshes()) {
    CAPTURE(mesh.to_string());
    Tensor logits = distribute_tensor(Array::from<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}), mesh);
    Tensor labels = distribute_tensor(Array::from<int32_t>({0, 3, -1}, {3}), mesh);
    CHECK_THROWS_WITH_AS(sparse_softmax_cross_entropy_with_logits(labels, logits).full_tensor(),
                         doctest::Contains("label 3 is outside the valid range [0, 3)"), IndexError);
  }
  Mesh mesh = create_mesh({{"x", 1}});
  CHECK_THROWS_WITH_AS(one_hot(zeros({2}, Layout::replicated(mesh, 1), DType::i32), int64_t(1) << 31),
                       doctest::Contains("int32"), ShapeError);
}

namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("tessera_hardening_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary | std::ios::trunc) << text; }

}  // namespace

TEST_CASE("a checkpoint index is untrusted: every single-byte change is an IOError or loads the saved values") {
  const fs::path dir = fresh_dir("index");
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  std::map<std::string, Variable> saved = {{"w", Variable(random_normal({5, 3}, 1, Layout({"x", "y"}, mesh)))}};
  save(dir.string(), saved);
  const Array want = saved.at("w").value().full_tensor();
  const std::string index = read_text(dir / "index.json");
  int rejected = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    std::string changed = index;
    changed[i] = char(changed[i] ^ 0x04);
    write_text(dir / "index.json", changed);
    std::map<std::string, Variable> into = {{"w", Variable(zeros({5, 3}, Layout({"y", "x"}, mesh)))}};
    try {
      load(dir.string(), into);
      CHECK(into.at("w").value().full_tensor().to_vector<float>() == want.to_vector<float>());  // whitespace, say
    } catch (const IOError&) {
      ++rejected;
    }
  }
  CHECK(rejected > int(index.size()) / 2);
  write_text(dir / "index.json", index);
  fs::remove_all(dir);
}

TEST_CASE("malformed checkpoint indexes name the field; chunks must tile the tensor") {
  const fs::path dir = fresh_dir("fields");
  Mesh mesh = create_mesh({{"x", 2}});
  std::map<std::string, Variable> saved = {{"w", Variable(ones({4, 3}, Layout({"x", UNSHARDED}, mesh)))}};
  save(dir.string(), saved);
  const nlohmann::json good = nlohmann::json::parse(read_text(dir / "index.json"));
  auto load_with = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json index = good;
    change(index);
    index.erase("xxh64");
    std::string text = index.dump();
    index["xxh64"] = XXH64(text.data(), text.size(), 0);  // a consistent checksum: the checks behind it must hold
    write_text(dir / "index.json", index.dump());
    std::map<std::string, Variable> into = {{"w", Variable(zeros({4, 3}, Layout({"x", UNSHARDED}, mesh)))}};
    load(dir.string(), into);
  };
  auto chunks = [](nlohmann::json& i) -> nlohmann::json& { return i["variables"]["w"]["chunks"]; };
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { i["variables"]["w"].erase("dtype"); }), doctest::Contains("missing field 'dtype'"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { i["variables"]["w"]["shape"] = "4x3"; }), doctest::Contains("'shape' is not a list"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { chunks(i)[1]["offset"] = {3, 0}; }), doctest::Contains("reaches outside"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { chunks(i).erase(1); }), doctest::Contains("cover 6 of 12"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { chunks(i)[1]["offset"] = {1, 0}; }), doctest::Contains("overlap"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { chunks(i)[0]["file"] = "../../etc/passwd"; }), doctest::Contains("not a file name"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { chunks(i)[0]["xxh64"] = -1; }), doctest::Contains("'xxh64'"), IOError);
  CHECK_THROWS_WITH_AS(load_with([&](auto& i) { i["version"] = 9; }), doctest::Contains("unknown version 9"), IOError);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint indexes of version 1 or without their own checksum are refused, naming the file and the version") {
  const fs::path dir = fresh_dir("version");
  Mesh mesh = create_mesh({{"x", 2}});
  std::map<std::string, Variable> saved = {{"w", Variable(copy_to_mesh(Array::from<float>({1, 2, 3, 4}, {4}), Layout({"x"}, mesh)))}};
  save(dir.string(), saved);
  const std::string index_file = (dir / "index.json").string(), good = read_text(index_file);
  auto load_index = [&](const std::string& text) {
    write_text(index_file, text);
    std::map<std::string, Variable> into = {{"w", Variable(zeros({4}, Layout({"x"}, mesh)))}};
    load(dir.string(), into);
    return into.at("w").value().full_tensor().to_vector<float>();
  };
  CHECK(load_index(good) == std::vector<float>{1, 2, 3, 4});  // a current checkpoint still loads
  const nlohmann::json current = nlohmann::json::parse(good);
  nlohmann::json old = current;  // as version 1 wrote it: no index checksum
  old["version"] = 1;
  old.erase("xxh64");
  CHECK_THROWS_WITH_AS(load_index(old.dump()), doctest::Contains(("checkpoint index '" + index_file + "'").c_str()), IOError);
  CHECK_THROWS_WITH_AS(load_index(old.dump()), doctest::Contains("version 1 (written before indexes carried their own checksum)"), IOError);
  old["xxh64"] = current["xxh64"];  // version 1 with a checksum is no better
  CHECK_THROWS_WITH_AS(load_index(old.dump()), doctest::Contains("version 1"), IOError);
  nlohmann::json unchecked = current;
  unchecked.erase("xxh64");
  CHECK_THROWS_WITH_AS(load_index(unchecked.dump()), doctest::Contains(("checkpoint index '" + index_file + "'").c_str()), IOError);
  CHECK_THROWS_WITH_AS(load_index(unchecked.dump()), doctest::Contains("version 2 index has no checksum"), IOError);
  nlohmann::json future = current;
  future["version"] = 3;
  CHECK_THROWS_WITH_AS(load_index(future.dump()), doctest::Contains("unknown version 3 (this Tessera reads version 2)"), IOError);
  CHECK(load_index(good) == std::vector<float>{1, 2, 3, 4});
  fs::remove_all(dir);
}

TEST_CASE("saving: an uncreatable directory is an IOError; temporaries of killed saves are cleared") {
  Mesh mesh = create_mesh({{"x", 1}});
  std::map<std::string, Variable> vars = {{"w", Variable(ones({2}, Layout::replicated(mesh, 1)))}};
  const fs::path dir = fresh_dir("save");
  fs::create_directories(dir);
  write_text(dir / "a_file", "x");
  CHECK_THROWS_WITH_AS(save((dir / "a_file" / "sub").string(), vars), doctest::Contains("cannot create checkpoint directory"), IOError);
  write_text(dir / "shard-dead.safetensors.tmp", std::string(1000, 'x'));  // a save killed midway
  save(dir.string(), vars);
  CHECK(!fs::exists(dir / "shard-dead.safetensors.tmp"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint files that are FIFOs, directories or links to /dev/zero are IOErrors naming the file and what it is, never a hang") {
  const fs::path dir = fresh_dir("special");
  Mesh mesh = create_mesh({{"x", 2}});
  std::map<std::string, Variable> saved = {{"w", Variable(ones({4, 3}, Layout({"x", UNSHARDED}, mesh)))}};
  save(dir.string(), saved);
  fs::path data_file;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") data_file = f.path();
  REQUIRE(!data_file.empty());
  const fs::path index_file = dir / "index.json";
  // Loads in another thread: a load blocked on a FIFO fails the check and is released by a
  // writer that opens and closes the FIFO (end of file), rather than hanging the suite.
  auto load_beside = [&](const fs::path& planted) {
    auto loading = std::async(std::launch::async, [&] {
      std::map<std::string, Variable> into = {{"w", Variable(zeros({4, 3}, Layout({"x", UNSHARDED}, mesh)))}};
      load(dir.string(), into);
    });
    if (loading.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      FAIL_CHECK("load blocked on " << planted);
      ::close(::open(planted.c_str(), O_WRONLY | O_NONBLOCK));
    }
    loading.get();
  };
  for (const fs::path& file : {index_file, data_file}) {
    CAPTURE(file);
    const fs::path kept = file.string() + ".kept";
    fs::rename(file, kept);
    const std::string named = "'" + file.string() + "'";
    REQUIRE(::mkfifo(file.c_str(), 0600) == 0);
    CHECK_THROWS_WITH_AS(load_beside(file), doctest::Contains((named + " is a FIFO, not a regular file").c_str()), IOError);
    fs::remove(file);
    fs::create_directory(file);
    CHECK_THROWS_WITH_AS(load_beside(file), doctest::Contains((named + " is a directory, not a regular file").c_str()), IOError);
    fs::remove(file);
    fs::create_symlink("/dev/zero", file);  // endless: once read until std::bad_alloc
    CHECK_THROWS_WITH_AS(load_beside(file), doctest::Contains((named + " is a character device, not a regular file").c_str()), IOError);
    fs::remove(file);
    fs::rename(kept, file);
  }
  CHECK_NOTHROW(load_beside(index_file));  // as saved, it loads
  fs::remove_all(dir);
}

TEST_CASE("save never writes through a link planted at a temporary name: the file it points at is unchanged") {
  const fs::path dir = fresh_dir("planted"), victim = fresh_dir("victim");
  fs::create_directories(dir);
  write_text(victim, "a file of this user's that another local user wants overwritten");
  const std::string precious = read_text(victim);
  Mesh mesh = create_mesh({{"x", 4}});
  std::map<std::string, Variable> vars = {{"w", Variable(random_normal({64, 256}, 1, Layout({"x", UNSHARDED}, mesh)))}};
  // Another user with write access to the folder keeps planting links to the victim where a save
  // put its temporaries: index.json.tmp, and each data file's name + ".tmp" once it has seen the
  // save's id in the name of the first (data files were named shard-<id>-<device>, and are now
  // shard-<id>-<client>-<device>).
  std::atomic<bool> saving{true};
  std::thread attacker([&] {
    while (saving) {
      (void)::symlink(victim.c_str(), (dir / "index.json.tmp").c_str());
      std::error_code error;
      for (fs::directory_iterator f(dir, error), end; !error && f != end; f.increment(error)) {
        const std::string name = f->path().filename().string();
        if (name.rfind("shard-", 0) != 0 || name.find('-', 6) == std::string::npos) continue;
        const std::string save_id = name.substr(6, name.find('-', 6) - 6);
        for (const char* client : {"", "0-"})
          for (int d = 0; d < 4; ++d)
            (void)::symlink(victim.c_str(), (dir / ("shard-" + save_id + "-" + client + std::to_string(d) + ".safetensors.tmp")).c_str());
      }
    }
  });
  for (int round = 0; round < 8; ++round) CHECK_NOTHROW(save(dir.string(), vars));
  saving = false;
  attacker.join();
  CHECK(read_text(victim) == precious);
  CHECK(!fs::is_symlink(dir / "index.json"));
  std::map<std::string, Variable> loaded = {{"w", Variable(zeros({64, 256}, Layout({UNSHARDED, "x"}, mesh)))}};
  load(dir.string(), loaded);
  CHECK(loaded.at("w").value().full_tensor().to_vector<float>() == vars.at("w").value().full_tensor().to_vector<float>());
  fs::remove_all(dir);
  fs::remove(victim);
}

// Found by libFuzzer (test/fuzz/fuzz_idx_reader.cpp, scripts/libfuzz.sh).
TEST_CASE("IDX files are untrusted: no images of 2^32-1 x 2^32-1 pixels is an IOError, not an int64 overflow") {
  const fs::path dir = fresh_dir("idx");
  fs::create_directories(dir);
  auto write_bytes = [](const fs::path& p, std::vector<uint8_t> b) { write_text(p, std::string(b.begin(), b.end())); };
  // read_idx reads plain files too; load_fashion_mnist only fixes the names.
  write_bytes(dir / "train-images-idx3-ubyte.gz", {0, 0, 8, 3, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 254});
  write_bytes(dir / "train-labels-idx1-ubyte.gz", {0, 0, 8, 1, 0, 0, 0, 0});
  CHECK_THROWS_WITH_AS(load_fashion_mnist(true, -1, dir.string()), doctest::Contains("more than any tensor may hold"), IOError);
  write_bytes(dir / "train-images-idx3-ubyte.gz", {0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28});
  const Dataset empty = load_fashion_mnist(true, -1, dir.string());
  CHECK(empty.size() == 0);
  CHECK(empty.images.shape() == std::vector<int64_t>{0, 784});
  // The element type is named in hex.
  write_bytes(dir / "f32", {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0});
  CHECK_THROWS_WITH_AS(read_idx((dir / "f32").string()), doctest::Contains("element type 0x0d;"), IOError);
  fs::remove_all(dir);
}

TEST_CASE("Fashion-MNIST files of the wrong rank or counts are IOErrors naming the file and the rank") {
  const fs::path dir = fresh_dir("idx_rank");
  fs::create_directories(dir);
  auto write_bytes = [](const fs::path& p, std::vector<uint8_t> b) { write_text(p, std::string(b.begin(), b.end())); };
  const std::string images = (dir / "train-images-idx3-ubyte.gz").string(), labels = (dir / "train-labels-idx1-ubyte.gz").string();
  write_bytes(labels, {0, 0, 8, 1, 0, 0, 0, 2, 3, 7});
  // Rank-1 images: once reported as "2 images, 2 labels" that "do not match".
  write_bytes(images, {0, 0, 8, 1, 0, 0, 0, 2, 10, 20});
  CHECK_THROWS_WITH_AS(load_fashion_mnist(true, -1, dir.string()),
                       doctest::Contains(("IDX images file '" + images + "' has rank 1, shape (2,); expected rank 3 (n, rows, cols)").c_str()), IOError);
  write_bytes(images, {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 1, 10, 20});
  CHECK_THROWS_WITH_AS(load_fashion_mnist(true, -1, dir.string()), doctest::Contains("has rank 2, shape (2, 1); expected rank 3"), IOError);
  // Rank-2 labels.
  write_bytes(images, {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 10, 20});
  write_bytes(labels, {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 1, 3, 7});
  CHECK_THROWS_WITH_AS(load_fashion_mnist(true, -1, dir.string()),
                       doctest::Contains(("IDX labels file '" + labels + "' has rank 2, shape (2, 1); expected rank 1 (n,)").c_str()), IOError);
  // Counts that differ name both files.
  write_bytes(labels, {0, 0, 8, 1, 0, 0, 0, 3, 3, 7, 1});
  CHECK_THROWS_WITH_AS(load_fashion_mnist(true, -1, dir.string()),
                       doctest::Contains(("IDX images file '" + images + "' holds 2 images but labels file '" + labels + "' holds 3 labels").c_str()),
                       IOError);
  write_bytes(labels, {0, 0, 8, 1, 0, 0, 0, 2, 3, 7});
  const Dataset d = load_fashion_mnist(true, -1, dir.string());
  CHECK(d.images.shape() == std::vector<int64_t>{2, 1});
  CHECK(d.labels.to_vector<int32_t>() == std::vector<int32_t>{3, 7});
  fs::remove_all(dir);
}

TEST_CASE("a cached program does not keep the graph it was compiled from alive") {
  const Mesh mesh = create_mesh({{"x", 2}});
  auto run_once = [&](double scale) {
    Tensor a = distribute_tensor(Array::from<double>({1, 2, 3, 4, 5, 6}, {6}), mesh, {Shard{0}});
    Tensor b = reduce_sum(exp(a * scale) + 1.0);
    return b.full_tensor().data<double>()[0];
  };
  (void)run_once(0.5);  // compiles and caches the program
  const size_t before = live_node_count();
  for (int i = 0; i < 3; ++i) (void)run_once(0.5 + i);  // the cached program, built on new graphs
  CHECK(live_node_count() == before);
}

TEST_CASE("hardware_from_json refuses figures no device has, naming the field and its value") {
  const nlohmann::json good = nlohmann::json::parse(hardware_to_json(hardware_profile("h100-sxm")));
  auto from = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = good;
    change(j);
    return hardware_from_json(j.dump());
  };
  CHECK(from([](nlohmann::json&) {}) == hardware_profile("h100-sxm"));
  // A negative memory "fitted" every plan; rates of 0 divided by zero.
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["memory_bytes"] = -1; }), doctest::Contains("field 'memory_bytes' is -1; it must be at least 1"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["memory_bytes"] = 1e30; }),
                       doctest::Contains("field 'memory_bytes' is 1e+30, not a whole number within int64"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["memory_bytes"] = std::numeric_limits<uint64_t>::max(); }),
                       doctest::Contains("field 'memory_bytes' is 18446744073709551615, not a whole number within int64"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["memory_bytes_per_second"] = 0; }),
                       doctest::Contains("field 'memory_bytes_per_second' is 0; it must be finite and positive"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["gemm_flops"]["bfloat16"] = -5; }), doctest::Contains("field 'gemm_flops.bfloat16' is -5"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["vector_flops"].erase("float32"); }),
                       doctest::Contains("field 'vector_flops' has no float32 rate"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["launch_seconds"] = -1e-6; }),
                       doctest::Contains("field 'launch_seconds' is -1e-06; it must be finite and at least 0"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["intra_node"]["latency_seconds"] = -1; }),
                       doctest::Contains("field 'intra_node.latency_seconds' is -1"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["inter_node"]["bytes_per_second"] = 0; }),
                       doctest::Contains("field 'inter_node.bytes_per_second' is 0"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["cores"] = 0; }), doctest::Contains("field 'cores' is 0; it must be at least 1"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["cache_bytes"] = 1 << 20, j["cache_bytes_per_second"] = 0; }),
                       doctest::Contains("field 'cache_bytes_per_second' is 0; it must be finite and positive"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["shared_cache_bytes"] = -4, j["shared_cache_bytes_per_second"] = 1e9; }),
                       doctest::Contains("field 'shared_cache_bytes' is -4; it must be at least 0"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["gemm_efficiency"] = {{10, 0.5}, {100, 1.5}}; }),
                       doctest::Contains("field 'gemm_efficiency[1]' is [100, 1.5]; its fraction of the peak must be in (0, 1]"), Error);
  CHECK_THROWS_WITH_AS(from([](auto& j) { j["special_functions_per_second"] = {{"float32", {{"exp", -2e9}}}}; }),
                       doctest::Contains("field 'special_functions_per_second.float32.exp' is -2000000000"), Error);
  // JSON has no NaN; a profile built in code does, and abstract_mesh plans on it.
  Hardware nan_rate = hardware_profile("h100-sxm");
  nan_rate.memory_bytes_per_second = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH_AS(abstract_mesh({{"x", 2}}, nan_rate, 8),
                       doctest::Contains("abstract_mesh: hardware 'h100-sxm': field 'memory_bytes_per_second' is nan"), Error);
  nan_rate = hardware_profile("h100-sxm");
  nan_rate.gemm_flops[DType::f32] = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(abstract_mesh({{"x", 2}}, nan_rate, 8), doctest::Contains("field 'gemm_flops.float32' is inf"), Error);
}

TEST_CASE("a GPT config with no heads, no width or a negative depth is a ShapeError naming the field, not a division by zero") {
  const Mesh mesh = create_mesh({{"x", 1}});
  auto config = [](const std::function<void(GptConfig&)>& change) {
    GptConfig c;
    c.vocab = 16, c.context = 8, c.layers = 2, c.width = 8, c.heads = 2;
    change(c);
    return c;
  };
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.heads = 0; }), mesh), doctest::Contains("Gpt: GptConfig's heads is 0; it must be at least 1"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.heads = -2; }), mesh), doctest::Contains("GptConfig's heads is -2"), ShapeError);
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.layers = -1; }), mesh), doctest::Contains("GptConfig's layers is -1"), ShapeError);
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.width = 0; }), mesh), doctest::Contains("GptConfig's width is 0"), ShapeError);
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.vocab = 0; }), mesh), doctest::Contains("GptConfig's vocab is 0"), ShapeError);
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.context = 0; }), mesh), doctest::Contains("GptConfig's context is 0"), ShapeError);
  CHECK_THROWS_WITH_AS(Gpt(config([](auto& c) { c.width = 9; }), mesh),
                       doctest::Contains("GptConfig's width 9 is not a multiple of its heads 2"), ShapeError);
  CHECK_THROWS_WITH_AS(PipelinedGpt(config([](auto& c) { c.heads = 0; }), mesh),
                       doctest::Contains("PipelinedGpt: GptConfig's heads is 0"), ShapeError);
  CHECK_THROWS_WITH_AS(GptTrainingStep(config([](auto& c) { c.heads = 0; }), mesh), doctest::Contains("GptConfig's heads is 0"), ShapeError);
  CHECK(Gpt(config([](auto&) {}), mesh).parameters().size() > 0);
}

TEST_CASE("planning: 2^40 devices is refused at once (the divisor loop ran to 2^40); abstract meshes have a stated limit") {
  const Hardware h100 = hardware_profile("h100-sxm");
  GptConfig c;
  c.vocab = 16, c.context = 8, c.layers = 2, c.width = 8, c.heads = 2;
  Gpt model(c, abstract_mesh({{"dp", 1}}, h100, 8));
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(auto_parallelize(model, int64_t(1) << 40, h100, int64_t(1) << 30, 16),
                       doctest::Contains("auto_parallelize: 1099511627776 devices is more than an abstract mesh may have (2^20 = 1048576)"),
                       MeshError);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(1));
  // 2^30 devices: std::bad_alloc before (several int64s and a decimal string per device).
  CHECK_THROWS_WITH_AS(abstract_mesh({{"dp", int64_t(1) << 20}, {"tp", 1024}}, h100, 8),
                       doctest::Contains("abstract_mesh [('dp', 1048576), ('tp', 1024)]: 1073741824 devices is more than the limit of 2^20"),
                       MeshError);
  // The limit itself is a mesh like any other: planned from a few devices' programs.
  const Mesh largest = abstract_mesh({{"dp", kMaxAbstractMeshDevices / 8}, {"tp", 8}}, h100, 8);
  CHECK(largest.size() == kMaxAbstractMeshDevices);
  auto double_it = jit([](const Tensor& x) { return x * 2.0; });
  CHECK(double_it.plan(zeros({int64_t(1) << 21, 8}, Layout({"dp", UNSHARDED}, largest))).devices == kMaxAbstractMeshDevices);
}

TEST_CASE("a tensor cannot move between an abstract mesh and a real one: a MeshError naming both, not a segfault") {
  const Mesh planned = abstract_mesh({{"x", 2}}, hardware_profile("h100-sxm"), 8), real = create_mesh({{"x", 2}});
  const Tensor on_abstract = zeros({4, 2}, Layout({"x", UNSHARDED}, planned));
  CHECK_THROWS_WITH_AS(on_abstract.redistribute(real, {Replicate{}}).full_tensor(),
                       doctest::Contains("mesh_transfer: cannot move a value from abstract mesh (x=2 of h100-sxm) to mesh |x=2|"), MeshError);
  const Tensor on_real = ones({4, 2}, Layout({"x", UNSHARDED}, real));
  CHECK_THROWS_WITH_AS(relayout(on_real, Layout::replicated(planned, 2)), doctest::Contains("to abstract mesh (x=2 of h100-sxm)"), MeshError);
  // Between real meshes a transfer still runs.
  CHECK(on_real.redistribute(create_mesh({{"y", 1}}), {Replicate{}}).full_tensor().to_vector<float>() == std::vector<float>(8, 1.0f));
}

TEST_CASE("a pipeline stage, tick or microbatch that does not exist is an error naming it and the count, never an idle slot") {
  const PipelineTimetable table(2, 1, 4);
  CHECK(table.slot(0, 1).microbatch == -1);  // stage 1 does idle at tick 0: the bubble
  CHECK_THROWS_WITH_AS(table.slot(0, 5), doctest::Contains("PipelineTimetable: stage 5 does not exist: the pipeline has 2 stages (0..1)"),
                       MeshError);
  CHECK_THROWS_WITH_AS(table.slot(3, -1), doctest::Contains("stage -1 does not exist: the pipeline has 2 stages"), MeshError);
  CHECK_THROWS_WITH_AS(table.slot(table.ticks(), 0), doctest::Contains("tick 5 does not exist: the pipeline has 5 ticks"), MeshError);
  CHECK_THROWS_WITH_AS(table.tick_of(0, 0, 2), doctest::Contains("stage 2 does not exist"), MeshError);
  CHECK_THROWS_WITH_AS(table.tick_of(4, 0, 0), doctest::Contains("microbatch 4 does not exist: the pipeline has 4 microbatches"), MeshError);
  CHECK_THROWS_WITH_AS(table.tick_of(0, 1, 0), doctest::Contains("virtual stage 1 does not exist"), MeshError);
  CHECK(table.tick_of(3, 0, 1) == 4);
}

TEST_CASE("misleading messages: microbatch(m = -1) says the microbatch does not exist; a second apply_mixed_precision says so") {
  const Mesh mesh = create_mesh({{"x", 1}});
  const Tensor batch = zeros({8, 3}, Layout::replicated(mesh, 2));
  CHECK_THROWS_WITH_AS(microbatch(batch, -1, 4), doctest::Contains("microbatch(m = -1, count = 4): microbatch -1 does not exist; there are 4 (0..3)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(microbatch(batch, 4, 4), doctest::Contains("microbatch 4 does not exist"), ShapeError);
  CHECK_THROWS_WITH_AS(microbatch(batch, 0, 0), doctest::Contains("count must be at least 1"), ShapeError);
  CHECK_THROWS_WITH_AS(microbatch(batch, 0, 3), doctest::Contains("the batch (8, 3) does not split into 3 equal microbatches"), ShapeError);
  CHECK(microbatch(batch, 3, 4).shape() == std::vector<int64_t>{2, 3});
  Dense layer(3, 2, Layout::replicated(mesh, 2), 1);
  apply_mixed_precision(layer, MixedPrecisionPolicy{DType::bf16, DType::f32, DType::f32});
  CHECK_THROWS_WITH_AS(apply_mixed_precision(layer, MixedPrecisionPolicy{DType::f16, DType::f32, DType::f16}),
                       doctest::Contains("apply_mixed_precision: module '(root)' has mixed precision applied already (param_dtype bfloat16"),
                       Error);
  CHECK(layer(ones({2, 3}, Layout::replicated(mesh, 2))).dtype() == DType::f32);  // the first policy's output dtype, not f16
}

namespace {

std::string sample(const std::string& name) { return std::string(TESSERA_TEST_BUILD_DIR) + "/../samples/" + name; }

// A few kilobytes of text, three of TextCorpus's 4 KiB blocks: one held out at a validation
// fraction of 0.5.
fs::path tiny_text(const fs::path& dir) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 10) + "\n";
  fs::create_directories(dir);
  write_text(dir / "text.txt", text);
  return dir / "text.txt";
}

// "--flag=value" for each flag ("--flag" alone for an empty value): a value may start with '-'.
std::vector<std::string> command_line(const std::map<std::string, std::string>& flags) {
  std::vector<std::string> args;
  for (const auto& [flag, value] : flags) args.push_back(value.empty() ? flag : flag + "=" + value);
  return args;
}

// The gpt sample's flags for two steps of a tiny model on one device (seconds), `changed` put
// in place of the defaults or added.
std::vector<std::string> tiny_gpt_args(const fs::path& data, const std::string& out, const std::map<std::string, std::string>& changed = {}) {
  std::map<std::string, std::string> flags = {{"--data", data.string()}, {"--mesh", "dp=1"},     {"--layers", "1"},
                                              {"--width", "16"},         {"--heads", "2"},       {"--context", "16"},
                                              {"--batch-size", "4"},     {"--steps", "2"},       {"--warmup", "1"},
                                              {"--eval-interval", "2"},  {"--eval-batches", "1"}, {"--generate", "0"},
                                              {"--validation-fraction", "0.5"}, {"--out", out}};
  for (const auto& [flag, value] : changed) flags[flag] = value;
  return command_line(flags);
}

// The plan sample's flags for a small GPT on 8 H100s (test/meson.build's sample_plan_short).
std::vector<std::string> small_plan_args(const std::map<std::string, std::string>& changed) {
  std::map<std::string, std::string> flags = {{"--layers", "2"}, {"--width", "64"}, {"--heads", "4"},          {"--seq", "32"},
                                              {"--vocab", "64"}, {"--batch", "16"}, {"--devices", "8"},       {"--hardware", "h100-sxm"},
                                              {"--memory", "1GiB"}};
  for (const auto& [flag, value] : changed) flags[flag] = value;
  return command_line(flags);
}

}  // namespace

TEST_CASE("the plan sample refuses bad sizes with a message naming the flag and what is wrong, exit 1, never a crash or a hang") {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> refused = {
      {{{"--memory", "1e30GiB"}}, "--memory '1e30GiB' is 1.07e+39 bytes, more than the int64 limit of 9223372036854775807 bytes"},
      {{{"--memory", "nan"}}, "--memory 'nan' is not finite"},
      {{{"--memory", "inf"}}, "--memory 'inf' is not finite"},
      {{{"--memory", "-3GiB"}}, "--memory '-3GiB' is -3221225472 bytes; the budget must be at least 1 byte"},
      {{{"--memory", "1e400"}}, "--memory '1e400': the number is outside a double's range"},
      {{{"--heads", "0"}}, "--heads 0: must be at least 1"},  // divided by zero (SIGFPE)
      {{{"--layers", "-2"}}, "--layers -2: must be at least 1"},
      {{{"--seq", "0"}}, "--seq 0: must be at least 1"},
      {{{"--batch", "0"}}, "--batch 0: must be at least 1"},
      {{{"--devices", "1099511627776"}}, "auto_parallelize: 1099511627776 devices is more than an abstract mesh may have"},  // hung
      {{{"--fsdp", ""}}, "--fsdp: only with --plan"},
      {{{"--microbatches", "4"}}, "--microbatches: only with --plan"},
      {{{"--plan", "dp=2,xp=4"}}, "plan 'dp=2,xp=4': unknown mesh dim 'xp'"},
      {{{"--plan", "dp=2,tp=2"}}, "--plan dp=2,tp=2 has 4 devices, --devices says 8"},
      {{{"--plan", "pp=4,dp=2"}}, "plan pp=4,dp=2 +1f1b x8: pp=4 does not divide the model's 2 layers"},
      {{{"--plan", "dp=8"}, {"--microbatches", "0"}}, "--microbatches 0: must be at least 1"},
      {{{"--hardware", "/nonexistent/h.json"}}, "--hardware '/nonexistent/h.json': cannot read the file"},
  };
  for (const auto& [flags, message] : refused) {
    CAPTURE(message);
    const ProgramRun run = run_program(sample("plan"), small_plan_args(flags), 30);
    CAPTURE(run.output);
    CHECK(!run.timed_out);
    CHECK(run.exit_code == 1);
    CHECK(run.output.find("error: " + message) != std::string::npos);
  }
}

TEST_CASE("the plan sample plans the presets by name: llama3-8b and mixtral-8x7b at a chosen sequence length, as evaluate_plan does") {
  const Hardware h100 = hardware_profile("h100-sxm");
  struct Preset {
    std::string name, plan;
    std::vector<std::pair<std::string, int64_t>> mesh;
  };
  for (const Preset& preset : {Preset{"llama3-8b", "dp=2,tp=4", {{"dp", 2}, {"tp", 4}}}, Preset{"mixtral-8x7b", "ep=8", {{"ep", 8}}}}) {
    CAPTURE(preset.name);
    const ProgramRun run = run_program(sample("plan"), command_line({{"--model", preset.name}, {"--plan", preset.plan}, {"--devices", "8"},
                                                                     {"--seq", "1024"}, {"--batch", "8"}, {"--hardware", "h100-sxm"},
                                                                     {"--memory", "256GiB"}, {"--json", ""}}),
                                       120);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(run.output.substr(run.output.find('{')));
    REQUIRE(j.at("candidates").size() == 1);
    const nlohmann::json& got = j.at("candidates")[0];
    // The preset's published shape with --seq as its sequence length, planned as evaluate_plan plans it.
    TransformerConfig config = transformer_preset(preset.name);
    config.max_seq = 1024;
    ParallelCandidate chosen;
    chosen.mesh = preset.mesh;
    const ParallelCandidate want = evaluate_plan(config, chosen, h100, int64_t(256) << 30, 8, 8);
    CHECK(got.at("name") == want.name());
    CHECK(got.at("fits") == want.fits);
    CHECK(got.at("peak_bytes") == want.report.peak_bytes);
    CHECK(got.at("flops") == want.report.flops);
    CHECK(got.at("collective_bytes") == want.report.collective_bytes);
  }
  // A preset's shape is its own: a size beside --model was ignored without a word; now refused.
  const ProgramRun both = run_program(sample("plan"), command_line({{"--model", "llama3-8b"}, {"--layers", "2"}, {"--devices", "8"}}), 30);
  CAPTURE(both.output);
  CHECK(both.exit_code == 1);
  CHECK(both.output.find("error: --layers: not with --model llama3-8b") != std::string::npos);
}

TEST_CASE("the plan sample evaluates a chosen plan on any published hardware or a JSON profile: that plan first, its breakdown") {
  const fs::path dir = fresh_dir("plan_chosen");
  fs::create_directories(dir);
  // A profile written as JSON: the A100's, renamed.
  Hardware mine = hardware_profile("a100-sxm4-40gb");
  mine.name = "my-a100";
  const fs::path profile = dir / "my-a100.json";
  std::ofstream(profile) << hardware_to_json(mine);
  for (const std::string& hardware : {std::string("b200"), std::string("mi300x"), profile.string()}) {
    CAPTURE(hardware);
    const ProgramRun run = run_program(
        sample("plan"),
        small_plan_args({{"--hardware", hardware}, {"--plan", "pp=2,dp=2,tp=2"}, {"--microbatches", "4"}, {"--recompute", "selective"},
                         {"--precision", "bf16"}, {"--sequence-parallel", ""}, {"--breakdown", ""}, {"--json", ""}}),
        60);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(run.output.substr(run.output.find('{')));
    CHECK(j.at("best") == "pp=2,dp=2,tp=2 +seq-parallel +recompute-selective +bf16 +1f1b x4");
    REQUIRE(j.at("candidates").size() == 1);
    CHECK(j.at("candidates")[0].at("microbatches") == 4);
    CHECK(j.at("candidates")[0].at("exact") == true);
    // The breakdown is the evaluated plan's report, on the hardware asked for.
    CHECK(j.at("breakdown").at("hardware") == (hardware == profile.string() ? "my-a100" : hardware));
    CHECK(j.at("breakdown").at("peak_bytes") == j.at("candidates")[0].at("peak_bytes"));
    CHECK(!j.at("breakdown").at("by_op_kind").empty());
  }
  // Gradient accumulation without pp, in the table.
  const ProgramRun accumulate =
      run_program(sample("plan"), small_plan_args({{"--plan", "dp=8"}, {"--microbatches", "2"}, {"--hardware", "a100-sxm4-80gb"}}), 60);
  CAPTURE(accumulate.output);
  CHECK(accumulate.exit_code == 0);
  CHECK(accumulate.output.find("chose dp=8 +accumulate x2") != std::string::npos);
  CHECK(accumulate.output.find("(the plan given)") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("the gpt sample refuses a NaN learning rate, no validation batches, negative microbatches or heads: exit 1 naming the flag") {
  const fs::path dir = fresh_dir("gpt_flags");
  const fs::path data = tiny_text(dir);
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> refused = {
      {{{"--lr", "nan"}}, "--lr nan: the learning rate must be finite and positive"},  // trained on NaN losses, exit 0
      {{{"--lr", "0"}}, "--lr 0: the learning rate must be finite and positive"},
      {{{"--lr", "-inf"}}, "--lr -inf: the learning rate must be finite and positive"},
      {{{"--eval-batches", "0"}}, "--eval-batches 0: each validation loss needs at least 1 batch"},  // NaN validation loss, exit 0
      {{{"--microbatches", "-3"}}, "--microbatches -3: a step needs at least 1 microbatch"},  // ignored without pp
      {{{"--microbatches", "0"}, {"--mesh", "pp=1"}}, "--microbatches 0: a step needs at least 1 microbatch"},
      {{{"--heads", "0"}}, "--heads 0: the model needs at least 1 attention head"},  // divided by zero (SIGFPE)
      {{{"--layers", "-1"}}, "--layers -1: the model needs at least 1 block"},
      {{{"--width", "0"}}, "--width 0: the width must be at least 1"},
      {{{"--temperature", "nan"}}, "--temperature nan: must be finite and positive"},
      // --mesh is read by the library's parse_mesh_dims, as the plan sample's --plan is.
      {{{"--mesh", "dp=2,dp=2"}}, "--mesh 'dp=2,dp=2': mesh dim 'dp' is named twice"},
      {{{"--mesh", "xp=2"}}, "--mesh 'xp=2': unknown mesh dim 'xp' (pp, dp, ep, cp, tp, sp)"},
      {{{"--mesh", "dp=0"}}, "--mesh 'dp=0': dp's size '0' is not a whole number of at least 1"},
  };
  for (const auto& [flags, message] : refused) {
    CAPTURE(message);
    const ProgramRun run = run_program(sample("gpt"), tiny_gpt_args(data, (dir / "out").string(), flags));
    CAPTURE(run.output);
    CHECK(run.exit_code == 1);
    CHECK(run.output.find("error: " + message) != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("the samples' progress bar redraws in place on a terminal, and elsewhere prints a line a tenth") {
  samples::ProgressLine terminal(true), log(false);
  CHECK(terminal.update(1, 100, "step 1/100", "loss 4") .starts_with("\rstep 1/100 ["));
  CHECK(terminal.end_line() == "\n");
  CHECK(terminal.end_line().empty());  // once per drawn line
  std::vector<std::string> lines;
  for (int64_t done = 1; done <= 100; ++done)
    if (const std::string line = log.update(done, 100, "step", "x"); !line.empty()) lines.push_back(line);
  CHECK(lines.size() == 11);  // 1 (the first tenth's start), 10, 20, ..., 100
  for (const std::string& line : lines) {
    CHECK(line.find('\r') == std::string::npos);
    CHECK(line.ends_with("\n"));
  }
  CHECK(lines.back().find("[##############################]") != std::string::npos);
  CHECK(log.end_line().empty());
  // A new total (the next epoch) starts over.
  CHECK(!log.update(1, 50, "epoch 2", "x").empty());
}

TEST_CASE("the gpt sample runs no shell: an --out of 'x;touch marker;#' is only a folder's name") {
  const fs::path dir = fresh_dir("gpt_shell");
  const fs::path data = tiny_text(dir), marker = dir / "marker";
  // The plot step once ran "gnuplot <out>/plot.gp" through the shell, which ran the touch.
  const std::string out = (dir / ("run;touch " + marker.string() + ";#")).string();
  const ProgramRun run = run_program(sample("gpt"), tiny_gpt_args(data, out));
  CAPTURE(run.output);
  CHECK(run.exit_code == 0);
  CHECK(!fs::exists(marker));
  // Its output is a pipe here, not a terminal: whole progress lines, no carriage returns.
  CHECK(run.output.find('\r') == std::string::npos);
  CHECK(run.output.find("step 2/2 [##############################] loss") != std::string::npos);
  CHECK(read_text(fs::path(out) / "metrics.csv").starts_with("step,train_loss,validation_loss"));
  // Where gnuplot is installed, it plotted into that folder all the same.
  if (run.output.find("plot: ") != std::string::npos) CHECK(fs::file_size(fs::path(out) / "metrics.svg") > 0);
  fs::remove_all(dir);
}

TEST_CASE("the gpt sample's output files replace a link planted at their names, never writing through it; appending refuses one") {
  const fs::path dir = fresh_dir("gpt_links");
  const fs::path data = tiny_text(dir), out = dir / "out", checkpoint = dir / "checkpoint";
  fs::create_directories(out);
  // Another user's links in a shared output folder, to files the sample's user may write.
  for (const std::string name : {"metrics.csv", "plot.gp", "metrics.svg"}) {
    write_text(dir / ("victim-" + name), "precious\n");
    fs::create_symlink(dir / ("victim-" + name), out / name);
  }
  const ProgramRun run = run_program(sample("gpt"), tiny_gpt_args(data, out.string(), {{"--checkpoint", checkpoint.string()}}));
  CAPTURE(run.output);
  CHECK(run.exit_code == 0);
  for (const std::string name : {"metrics.csv", "plot.gp", "metrics.svg"}) {
    CAPTURE(name);
    CHECK(read_text(dir / ("victim-" + name)) == "precious\n");
  }
  CHECK(!fs::is_symlink(out / "metrics.csv"));
  CHECK(read_text(out / "metrics.csv").starts_with("step,train_loss,validation_loss"));
  CHECK(!fs::is_symlink(out / "plot.gp"));
  // A resumed run appends to metrics.csv: through a link planted there it will not.
  fs::remove(out / "metrics.csv");
  fs::create_symlink(dir / "victim-metrics.csv", out / "metrics.csv");
  const ProgramRun resumed =
      run_program(sample("gpt"), tiny_gpt_args(data, out.string(), {{"--checkpoint", checkpoint.string()}, {"--resume", ""}, {"--steps", "4"}}));
  CAPTURE(resumed.output);
  CHECK(resumed.exit_code == 1);
  CHECK(resumed.output.find("error: '" + (out / "metrics.csv").string() + "' is a symbolic link; refusing to append") != std::string::npos);
  CHECK(read_text(dir / "victim-metrics.csv") == "precious\n");
  fs::remove_all(dir);
}
