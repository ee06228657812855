// The compiler's behaviour: fusion by kernel count, caching, collectives of the overview's
// matmul scenarios, explain(), jit(), and typed errors that name the op and the user's line.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <tessera/tessera.hpp>

#include "comm/machine_load.hpp"
#include "ir/local_program_verify.hpp"
#include "dsl/determinism.hpp"
#include "jit/backend_registry.hpp"
#include "jit/device_workers.hpp"
#include "jit/driver.hpp"
#include "jit/executable.hpp"
#include "jit/arena_placement.hpp"
#include "jit/memory_plan.hpp"
#include "backend/cpu/orc_engine.hpp"
#include "codegen/cuda_renderer.hpp"
#include "codegen/in_place.hpp"
#include "codegen/lowering_memo.hpp"
#include "backend/cpu/cpu_gemm.hpp"
#include "backend/cpu/short_gemm.hpp"
#include "backend/cpu/transpose_16bit.hpp"
#include "jit/step_profiler.hpp"
#include "reference_evaluator.hpp"
#include "reference_sharding.hpp"
#include "spinning_processes.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor replicated(const Array& a, const Mesh& mesh) { return copy_to_mesh(a, Layout::replicated(mesh, a.rank())); }

Array iota_array(std::vector<int64_t> shape) {
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i % 7) - 3.0f;
  return a;
}

std::string here(int line) { return "test_compiler.cpp:" + std::to_string(line); }

size_t count_of(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

// test/cache_probe run in `cwd` with TESSERA_CACHE_DIR=`cache_dir`: its line ("compiled=N
// disk=M value=V") and what it logged.
struct ProbeRun {
  std::string line, log;
};
ProbeRun run_cache_probe(const std::string& cache_dir, const std::filesystem::path& cwd = ".") {
  const auto log_file = std::filesystem::temp_directory_path() / ("tessera-probe-" + std::to_string(::getpid()) + ".log");
  const std::string command = "cd '" + cwd.string() + "' && TESSERA_CACHE_DIR='" + cache_dir + "' " +
                              TESSERA_TEST_BUILD_DIR + "/cache_probe 2>'" + log_file.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  char line[256] = {0};
  CHECK(fgets(line, sizeof line, pipe) != nullptr);
  CHECK(pclose(pipe) == 0);
  std::ifstream in(log_file);
  ProbeRun out{line, std::string(std::istreambuf_iterator<char>(in), {})};
  std::filesystem::remove(log_file);
  return out;
}

}  // namespace

TEST_CASE("fusion: an elementwise chain is one kernel, softmax at most two") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor a = copy_to_mesh(iota_array({64, 32}), Layout({"x", UNSHARDED}, mesh));
  Tensor b = copy_to_mesh(iota_array({64, 32}), Layout({"x", UNSHARDED}, mesh));
  Tensor chain = relu(a * b + a) * 0.5 - b / 3.0 + 1.0;  // 6+ elementwise ops
  CHECK(plan_summary(chain).kernels == 1);
  CHECK(plan_summary(softmax(a)).kernels <= 2);
  CHECK(plan_summary(log_softmax(a)).kernels <= 2);
  CHECK(plan_summary(reduce_mean(a * a, {1})).kernels == 1);
  // A second force of the same structure compiles nothing and reuses the executable.
  Array first = chain.full_tensor();
  const CompileStats before = compile_stats();
  const DriverStats driver_before = driver_stats();
  Tensor again = relu(a * b + a) * 0.5 - b / 3.0 + 1.0;
  Tensor a2 = copy_to_mesh(iota_array({64, 32}), Layout({"x", UNSHARDED}, mesh));
  Tensor other = relu(a2 * b + a2) * 0.5 - b / 3.0 + 1.0;  // new leaves, same structure
  CHECK(same_array(other.full_tensor(), first));
  CHECK(compile_stats().compiled_modules == before.compiled_modules);
  CHECK(driver_stats().executables_built == driver_before.executables_built);
  CHECK(again.node() == chain.node());  // hash-consed: the same expression is the same node
}

// A residual stream of `depth` blocks (layer norm, GEMM, bias, relu, residual add) and the sum of
// every weight's squares (a gradient norm's shape): the program of a deep model in miniature.
Tensor residual_blocks(const Tensor& x0, const std::vector<Tensor>& weights, const Tensor& bias) {
  Tensor x = x0;
  for (const Tensor& w : weights) {
    x = x + matmul(layer_norm(x), w);
    x = x + relu(matmul(layer_norm(x), w) + bias);
  }
  Tensor squares = reduce_sum(weights.front() * weights.front());
  for (size_t i = 1; i < weights.size(); ++i) squares = squares + reduce_sum(weights[i] * weights[i]);
  return reduce_sum(x, {1}) + squares;
}

TEST_CASE("identical blocks are one set of kernels: distinct kernels do not grow with the depth") {
  for (const auto& [dims, layout_dims] :
       {std::pair{std::vector<std::pair<std::string, int64_t>>{{"x", 1}}, std::vector<std::string>{UNSHARDED, UNSHARDED}},
        std::pair{std::vector<std::pair<std::string, int64_t>>{{"x", 3}}, std::vector<std::string>{"x", UNSHARDED}}}) {
    Mesh mesh = create_mesh(dims);
    CAPTURE(mesh.to_string());
    std::mt19937 rng(3);
    Tensor x = copy_to_mesh(random_array({10, 16}, DType::f32, rng), Layout(layout_dims, mesh));
    Tensor bias = copy_to_mesh(random_array({16}, DType::f32, rng), Layout::replicated(mesh, 1));
    std::map<int, std::pair<int64_t, int64_t>> kernels;  // depth -> {distinct kernels, launches}
    std::map<int, size_t> text;                          // depth -> the distinct kernels' IR text
    for (int depth : {4, 8, 16}) {
      std::vector<Tensor> weights;
      for (int i = 0; i < depth; ++i) weights.push_back(copy_to_mesh(random_array({16, 16}, DType::f32, rng), Layout::replicated(mesh, 2)));
      Tensor y = residual_blocks(x, weights, bias);
      const auto exe = executable_for({y.node()});
      kernels[depth] = {exe->kernel_count(), plan_summary(y).kernels};
      for (const kir::Kernel& k : exe->schedule().kernels) text[depth] += k.to_string().size();
      MESSAGE(depth, " blocks: ", kernels[depth].first, " distinct kernels, ", kernels[depth].second, " launches, ", text[depth], " bytes of IR");
      const std::string mismatch = compare_with_reference(y.full_tensor(), reference_eval(y), 1e-3);
      CHECK_MESSAGE(mismatch.empty(), mismatch);
    }
    // Past the first blocks, deeper models launch more kernels but compile none more: the
    // stream's sums are materialised, not re-inlined into every later block, and the squares
    // past the fourth are reduced in kernels of their own, one kernel for every weight. Only the
    // final sum reads more buffers.
    CHECK(kernels[8].first <= kernels[4].first + 1);
    CHECK(kernels[16].first == kernels[8].first);
    CHECK(double(text[16]) < 1.5 * double(text[8]));
    CHECK(kernels[16].second > kernels[8].second);
  }
}

namespace {

// A local program of `leading` unrelated inputs, then x and y [8] and the elementwise
// op(x, y) * x: the same group at node ids `leading` apart.
LocalProgram two_input_program(int leading, OpKind op) {
  LocalProgram p;
  auto add_node = [&](LocalNode::Kind kind, OpKind o, std::vector<int> inputs) {
    LocalNode n;
    n.kind = kind;
    n.op = o;
    n.global_shape = {8};
    n.local_shape = {SymbolicDim{8}};
    n.local_offset = {SymbolicDim{0}};
    n.inputs = std::move(inputs);
    if (kind == LocalNode::Kind::Input) n.input_index = int(p.nodes.size());
    p.nodes.push_back(n);
    return int(p.nodes.size()) - 1;
  };
  for (int i = 0; i < leading; ++i) add_node(LocalNode::Kind::Input, OpKind::Leaf, {});
  const int x = add_node(LocalNode::Kind::Input, OpKind::Leaf, {}), y = add_node(LocalNode::Kind::Input, OpKind::Leaf, {});
  const int combined = add_node(LocalNode::Kind::Compute, op, {x, y});
  add_node(LocalNode::Kind::Compute, OpKind::Mul, {combined, x});
  return p;
}

std::vector<bool> inputs_and_root_materialised(const LocalProgram& p) {
  std::vector<bool> mat(p.nodes.size(), false);
  for (size_t i = 0; i < p.nodes.size(); ++i) mat[i] = p.nodes[i].kind == LocalNode::Kind::Input;
  mat.back() = true;
  return mat;
}

}  // namespace

TEST_CASE("the lowering memo keys a group by what lowering reads, not where its nodes sit; a hit is the kernel lowering makes") {
  const LocalProgram near = two_input_program(0, OpKind::Add), far = two_input_program(5, OpKind::Add), other = two_input_program(0, OpKind::Sub);
  const int near_root = int(near.nodes.size()) - 1, far_root = int(far.nodes.size()) - 1;
  const GroupKey a = group_key(near, {near_root}, inputs_and_root_materialised(near), kir::LoopTarget::Cpu);
  const GroupKey b = group_key(far, {far_root}, inputs_and_root_materialised(far), kir::LoopTarget::Cpu);
  CHECK(a.text == b.text);  // five nodes later, the same group
  CHECK(a.nodes == std::vector<int>{3, 2, 0, 1});  // root, op(x, y), x, y: the walk's order
  CHECK(b.nodes == std::vector<int>{8, 7, 5, 6});
  CHECK(group_key(other, {near_root}, inputs_and_root_materialised(other), kir::LoopTarget::Cpu).text != a.text);  // another op
  CHECK(group_key(near, {near_root}, inputs_and_root_materialised(near), kir::LoopTarget::Cuda).text != a.text);   // another loop target
  std::vector<bool> combined_in_buffer = inputs_and_root_materialised(near);
  combined_in_buffer[2] = true;  // op(x, y) read from a buffer: a load, not computed inline
  CHECK(group_key(near, {near_root}, combined_in_buffer, kir::LoopTarget::Cpu).text != a.text);

  // The far program's group comes from the memo, its buffers bound to the far program's nodes,
  // and is the kernel lowering the far program makes.
  std::vector<int> near_buffers, far_buffers, fresh_buffers;
  auto near_kernel = lower_group_memoised(near, {near_root}, inputs_and_root_materialised(near), near_buffers, kir::LoopTarget::Cpu);
  const LoweringMemoStats before = lowering_memo_stats();
  auto far_kernel = lower_group_memoised(far, {far_root}, inputs_and_root_materialised(far), far_buffers, kir::LoopTarget::Cpu);
  CHECK(lowering_memo_stats().reused == before.reused + 1);
  CHECK(lowering_memo_stats().lowered == before.lowered);
  REQUIRE(std::holds_alternative<std::shared_ptr<const LoweredKernel>>(far_kernel));
  auto fresh = lower_group(far, {far_root}, inputs_and_root_materialised(far), fresh_buffers, kir::LoopTarget::Cpu);
  REQUIRE(std::holds_alternative<kir::Kernel>(fresh));
  CHECK(std::get<std::shared_ptr<const LoweredKernel>>(far_kernel)->text == std::get<kir::Kernel>(fresh).to_string());
  CHECK(far_buffers == fresh_buffers);
  CHECK(near_buffers == std::vector<int>{3, 0, 1});
  CHECK(far_buffers == std::vector<int>{8, 5, 6});
}

TEST_CASE("a deeper model lowers no more groups than a shallower one: its blocks' kernels come from the lowering memo") {
  Mesh mesh = create_mesh({{"x", 2}});
  std::mt19937 rng(11);
  Tensor x = copy_to_mesh(random_array({12, 24}, DType::f32, rng), Layout({"x", UNSHARDED}, mesh));
  Tensor bias = copy_to_mesh(random_array({24}, DType::f32, rng), Layout::replicated(mesh, 1));
  std::map<int, int64_t> lowered;  // depth -> groups lowered afresh planning it
  for (int depth : {3, 6}) {
    std::vector<Tensor> weights;
    for (int i = 0; i < depth; ++i) weights.push_back(copy_to_mesh(random_array({24, 24}, DType::f32, rng), Layout::replicated(mesh, 2)));
    // A bias of its own per depth: the first program's kernels are not the second's by chance.
    Tensor y = residual_blocks(x, weights, bias * double(depth));
    const LoweringMemoStats before = lowering_memo_stats();
    const auto exe = executable_for({y.node()});
    lowered[depth] = lowering_memo_stats().lowered - before.lowered;
    // Every hit was lowered again and compared (the suites set TESSERA_VERIFY_CACHE_KEYS=1).
    const std::string mismatch = compare_with_reference(y.full_tensor(), reference_eval(y), 1e-3);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
  MESSAGE("groups lowered afresh: ", lowered[3], " at depth 3, ", lowered[6], " at depth 6");
  CHECK(verify_cache_keys());
  CHECK(lowered[3] > 0);
  CHECK(lowered[6] <= lowered[3]);  // six blocks: the blocks' groups were lowered planning three
}

TEST_CASE("the local-program verifier names the node and the rule a broken program breaks") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  std::mt19937 rng(5);
  Tensor a = copy_to_mesh(random_array({6, 4}, DType::f32, rng), Layout({"x", "y"}, mesh));
  Tensor w = copy_to_mesh(random_array({4, 3}, DType::f32, rng), Layout({"y", UNSHARDED}, mesh));
  Tensor y = relu(matmul(a, w)) + random_uniform({6, 3}, 11, Layout({"x", UNSHARDED}, mesh));
  const LocalProgram good = executable_for({y.node()})->program();
  CHECK_NOTHROW(verify(good));  // partition() verified it too
  int redistribute = -1, random = -1, reader = -1;
  for (size_t i = 0; i < good.nodes.size(); ++i) {
    const LocalNode& n = good.nodes[i];
    if (n.kind == LocalNode::Kind::Redistribute && redistribute < 0) redistribute = int(i);
    if (n.seed_param >= 0) random = int(i);
    if (!n.inputs.empty() && reader < 0) reader = int(i);
  }
  REQUIRE(redistribute >= 0);
  REQUIRE(random >= 0);
  REQUIRE(reader >= 0);
  auto broken = [&](const std::function<void(LocalProgram&)>& corrupt, const std::string& message) {
    CAPTURE(message);
    LocalProgram p = good;
    corrupt(p);
    try {
      verify(p);
      FAIL("verified");
    } catch (const InternalError& e) {
      CHECK(std::string(e.what()).find(message) != std::string::npos);
      CHECK(std::string(e.what()).find("local program: ") == 0);
    }
  };
  const std::string at_reader = "node " + std::to_string(reader) + " (";
  broken([&](LocalProgram& p) { p.nodes[size_t(reader)].inputs[0] = reader; }, "reads node " + std::to_string(reader) + ", which is not an earlier node");
  broken([&](LocalProgram& p) { p.nodes[size_t(reader)].inputs[0] = reader; }, at_reader);
  broken([&](LocalProgram& p) { p.nodes[size_t(redistribute)].step.mesh_dim = 2; }, "steps over mesh dim 2 of a 2-dim mesh");
  broken([&](LocalProgram& p) { p.nodes[size_t(random)].seed_param = p.num_params; },
         "reads its seed from parameter slot " + std::to_string(good.num_params));
  broken([&](LocalProgram& p) { p.nodes[size_t(reader)].local_shape.pop_back(); }, "local extents for a rank-");
  broken([&](LocalProgram& p) { p.nodes[size_t(reader)].local_shape[0] = SymbolicDim{-1, -1}; }, "has extent -1 on axis 0 on device");
  broken([&](LocalProgram& p) { p.nodes[size_t(reader)].local_shape[0] = SymbolicDim{0, p.num_params}; },
         "reads parameter slot " + std::to_string(good.num_params));
  broken([&](LocalProgram& p) { p.outputs.push_back(int(p.nodes.size())); }, "output " + std::to_string(good.nodes.size()) + " is not a node");
  broken([&](LocalProgram& p) { p.device_params[1].push_back(0); }, "parameter values for " + std::to_string(good.num_params) + " slots");
  broken([&](LocalProgram& p) { p.device_ids.pop_back(); }, "planned devices' parameters but");
  broken([&](LocalProgram& p) { p.nodes[size_t(reader)].layout = Layout::replicated(mesh, p.nodes[size_t(reader)].rank() + 1); },
         "layout for a rank-");
}

TEST_CASE("random ops of different seeds are one kernel: the seed is a run-time parameter") {
  Mesh mesh = create_mesh({{"x", 2}});
  const Layout layout({"x", UNSHARDED}, mesh);
  Tensor a = random_uniform({6, 5}, 7, layout, -1, 1);
  Tensor b = random_uniform({6, 5}, 8, layout, -1, 1);
  Tensor n = random_normal({6, 5}, 9, layout);
  const auto kernel_text = [](const Tensor& t) { return executable_for({t.node()})->schedule().kernels.at(0).to_string(); };
  CHECK(kernel_text(a) == kernel_text(b));
  CHECK(kernel_text(a) != kernel_text(n));
  for (const Tensor& t : {a, b, n}) {
    const std::string mismatch = compare_with_reference(t.full_tensor(), reference_eval(t), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
  CHECK_FALSE(same_array(a.full_tensor(), b.full_tensor()));
  // A third seed compiles nothing: its kernel is loaded already.
  const CompileStats before = compile_stats();
  Tensor c = random_uniform({6, 5}, 1234567890123ull, layout, -1, 1);
  const std::string mismatch = compare_with_reference(c.full_tensor(), reference_eval(c), 1e-5);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  CHECK(compile_stats().compiled_modules == before.compiled_modules);
  CHECK(compile_stats().disk_hits == before.disk_hits);
}

TEST_CASE("the disk cache serves a second process without compiling") {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-cache-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto run = [&] { return run_cache_probe(dir.string()).line; };
  std::string cold = run(), warm = run();
  CHECK(cold.find("compiled=1 disk=0") == 0);
  CHECK(warm.find("compiled=0 disk=1") == 0);
  CHECK(cold.substr(cold.find("value")) == warm.substr(warm.find("value")));
  // A corrupt entry is detected and recompiled.
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x5a');
  }
  std::string repaired = run();
  CHECK(repaired.find("compiled=1 disk=0") == 0);
  CHECK(repaired.substr(repaired.find("value")) == cold.substr(cold.find("value")));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a relative TESSERA_CACHE_DIR is refused with a warning; off, none, 0 and empty turn the cache off") {
  const auto work = std::filesystem::temp_directory_path() / ("tessera-cache-relative-" + std::to_string(::getpid()));
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  for (const std::string value : {"relative-cache", "none", "off", "0", ""}) {
    CAPTURE(value);
    for (int i = 0; i < 2; ++i) {  // nothing is stored: the second process compiles again
      const ProbeRun run = run_cache_probe(value, work);
      CHECK(run.line.find("compiled=1 disk=0 value=") == 0);
      // One warning per process (the setting is read before each read and write), naming the value.
      CHECK(count_of(run.log, "TESSERA_CACHE_DIR") == (value == "relative-cache" ? 1 : 0));
      if (value == "relative-cache")
        CHECK(run.log.find("TESSERA_CACHE_DIR=relative-cache is a relative path; the compile cache is off (give an "
                           "absolute path") != std::string::npos);
    }
    CHECK(std::filesystem::is_empty(work));  // nothing written where the process runs
  }
  std::filesystem::remove_all(work);
}

TEST_CASE("the disk cache trusts only folders and entries private to this user (it loads native code)") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tessera-cache-trust-" + std::to_string(::getpid()));
  const fs::path dir = root / "a" / "b";
  fs::remove_all(root);
  auto status = [](const fs::path& p) {
    struct stat st {};
    CHECK(::lstat(p.c_str(), &st) == 0);
    return st;
  };
  auto mode = [&](const fs::path& p) { return status(p).st_mode & 07777; };
  auto compiled = [&](const ProbeRun& run) { return run.line.find("compiled=1 disk=0 value=") == 0; };
  auto from_disk = [&] { return run_cache_probe(dir.string()).line.find("compiled=0 disk=1 value=") == 0; };

  // New folders are 0700 and entries 0600 even under umask 0 (which would leave them open to all).
  const mode_t umask_before = ::umask(0);
  const ProbeRun cold = run_cache_probe(dir.string());
  ::umask(umask_before);
  CHECK(compiled(cold));
  CHECK(mode(root) == 0700);
  CHECK(mode(root / "a") == 0700);
  CHECK(mode(dir) == 0700);
  // One object, and the disk index's entries (kernel -> object, one per kernel), private too.
  std::vector<fs::path> entries, index_entries;
  for (const auto& f : fs::directory_iterator(dir)) (f.path().extension() == ".o" ? entries : index_entries).push_back(f.path());
  REQUIRE(entries.size() == 1);
  REQUIRE(!index_entries.empty());
  for (const fs::path& index_entry : index_entries) CHECK(mode(index_entry) == 0600);
  const auto all_entries = [&] { return std::distance(fs::directory_iterator(dir), fs::directory_iterator()); };
  const auto entry_count = all_entries();
  const fs::path entry = entries[0];
  CHECK(mode(entry) == 0600);
  CHECK(from_disk());

  // An entry writable by others is skipped with a warning, recompiled and replaced by a private one.
  REQUIRE(::chmod(entry.c_str(), 0666) == 0);
  const ProbeRun loose = run_cache_probe(dir.string());
  CHECK(compiled(loose));
  CHECK(loose.log.find("compile cache entry " + entry.string() + " is writable by group or others (mode 0666); not loading it") !=
        std::string::npos);
  CHECK(mode(entry) == 0600);
  CHECK(from_disk());

  // A symbolic link is skipped whatever it points to (its target is left alone) and replaced by a file.
  fs::rename(entry, root / "elsewhere.o");
  fs::create_symlink(root / "elsewhere.o", entry);
  const ProbeRun linked = run_cache_probe(dir.string());
  CHECK(compiled(linked));
  CHECK(linked.log.find(entry.string() + " is a symbolic link; not loading it") != std::string::npos);
  CHECK(S_ISREG(status(entry).st_mode));
  CHECK(fs::exists(root / "elsewhere.o"));
  CHECK(from_disk());

  // Another user's entry is skipped (tests run as root, which can make one).
  const bool root_user = ::geteuid() == 0;
  if (root_user) {
    REQUIRE(::chown(entry.c_str(), 12345, gid_t(-1)) == 0);
    const ProbeRun foreign = run_cache_probe(dir.string());
    CHECK(compiled(foreign));
    CHECK(foreign.log.find(entry.string() + " is owned by uid 12345, not by this user (uid 0)") != std::string::npos);
    CHECK(status(entry).st_uid == ::geteuid());
    CHECK(from_disk());
  }

  // A cache folder writable by others is refused: its entry is not read, nothing is written, one warning.
  REQUIRE(::chmod(dir.c_str(), 0777) == 0);
  const ino_t inode = status(entry).st_ino;
  const ProbeRun open_dir = run_cache_probe(dir.string());
  CHECK(compiled(open_dir));
  CHECK(count_of(open_dir.log, "compile cache directory " + dir.string() +
                                   " is writable by group or others (mode 0777); the disk cache is off") == 1);
  CHECK(count_of(open_dir.log, dir.string()) == 1);
  CHECK(status(entry).st_ino == inode);  // not replaced
  CHECK(all_entries() == entry_count);
  CHECK(mode(dir) == 0777);  // an existing folder is left as it is
  // And so is another user's.
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  CHECK(from_disk());
  if (root_user) {
    REQUIRE(::chown(dir.c_str(), 12345, gid_t(-1)) == 0);
    const ProbeRun foreign_dir = run_cache_probe(dir.string());
    CHECK(compiled(foreign_dir));
    CHECK(foreign_dir.log.find("compile cache directory " + dir.string() + " is owned by uid 12345") != std::string::npos);
    CHECK(status(entry).st_ino == inode);
  }
  fs::remove_all(root);
}

TEST_CASE("overview matmul scenarios: layouts, collectives and 72 / 24 / 12 multiplications") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  Array a{{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}}, b{{6.f, 5.f}, {4.f, 3.f}, {2.f, 1.f}};
  struct Scenario { Layout la, lb; std::vector<std::string> specs; int64_t all_reduces, multiplies; std::vector<std::string> components; };
  std::vector<Scenario> scenarios = {
      {Layout({UNSHARDED, UNSHARDED}, mesh), Layout({UNSHARDED, UNSHARDED}, mesh), {UNSHARDED, UNSHARDED}, 0, 72,
       std::vector<std::string>(6, "[[20 14] [56 41]]")},
      {Layout({UNSHARDED, "x"}, mesh), Layout({"x", UNSHARDED}, mesh), {UNSHARDED, UNSHARDED}, 1, 24,
       std::vector<std::string>(6, "[[20 14] [56 41]]")},
      {Layout({"y", "x"}, mesh), Layout({"x", UNSHARDED}, mesh), {"y", UNSHARDED}, 1, 12,
       {"[[20 14]]", "[[56 41]]", "[[20 14]]", "[[56 41]]", "[[20 14]]", "[[56 41]]"}}};
  for (const Scenario& s : scenarios) {
    CAPTURE(s.multiplies);
    Tensor product = matmul(copy_to_mesh(a, s.la), copy_to_mesh(b, s.lb));
    // A contraction over "x" leaves Partial(sum) terms (PyTorch's placement), reduced only when
    // asked: looking at the product runs no collective.
    CHECK(product.layout().sharding_specs() == s.specs);  // known before anything runs
    CHECK(product.layout().has_partial() == (s.all_reduces > 0));
    CHECK(plan_summary(product).collectives.empty());
    // TensorFlow's overview asks for the layout without Partial: one all_reduce gives its values.
    Tensor c = relayout(product, Layout(s.specs, mesh));
    PlanSummary plan = plan_summary(c);
    CHECK(plan.multiplies == s.multiplies);
    CHECK(plan.collectives == std::vector<std::string>(s.all_reduces, "all_reduce(x)"));
    CHECK(explain(c).find("all devices: " + std::to_string(s.multiplies) + " multiplications") != std::string::npos);
    {
      CommDebugMode comm;
      std::vector<std::string> got;
      for (const Array& comp : unpack(c)) got.push_back(fmt::format("{}", comp));
      CHECK(got == s.components);
      CHECK(comm.counts()["all_reduce"] == s.all_reduces);
    }
    // TensorFlow's calls on the product itself see what TF gives: the reduced value, in the
    // layout fetch_layout reports, printed without a Partial; PyTorch's calls keep Partial.
    CHECK(fetch_layout(product).sharding_specs() == s.specs);
    CHECK(fetch_layout(product) == Layout(s.specs, mesh));
    CHECK(fetch_layout(product).to_string() == Layout(s.specs, mesh).to_string());
    {
      CommDebugMode comm;
      std::vector<std::string> got;
      for (const Array& comp : unpack(product)) got.push_back(fmt::format("{}", comp));
      CHECK(got == s.components);
      CHECK(comm.counts()["all_reduce"] == s.all_reduces);
    }
    const std::string printed = fmt::format("{}", product);
    CHECK(printed.find("partial") == std::string::npos);
    CHECK(printed.find("sharding_specs:" + fmt::format("{}", fmt::join(s.specs, ","))) != std::string::npos);
    if (s.all_reduces == 1 && s.specs[0] == UNSHARDED) {
      CHECK(printed.starts_with("Tensor([[20 14] [56 41]], layout=\"sharding_specs:unsharded,unsharded, mesh:"));
      CHECK(fmt::format("{}", to_array(product)) == "[[20 14] [56 41]]");
    }
    CommDebugMode comm;
    CHECK(product.placements()[0] == Placement{s.all_reduces ? Placement{Partial{}} : Placement{Replicate{}}});
    const Array term = product.to_local();  // device 0's term: row block 0 of a times b's first block
    if (s.all_reduces) CHECK(fmt::format("{}", term) == (s.specs[0] == UNSHARDED ? "[[6 5] [24 20]]" : "[[6 5]]"));
    CHECK(comm.counts()["all_reduce"] == 0);
  }
}

TEST_CASE("explain names kernels, library calls and the source line of each collective") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(iota_array({4, 6}), Layout({UNSHARDED, "x"}, mesh));
  Tensor w = copy_to_mesh(iota_array({6, 3}), Layout({"x", UNSHARDED}, mesh));
  const int line = __LINE__ + 1;
  Tensor y = relu(matmul(x, w));
  std::string text = explain(y);
  CHECK(text.find("sgemm") != std::string::npos);
  CHECK(text.find("all_reduce     over x") != std::string::npos);
  CHECK(text.find("@" + here(line)) != std::string::npos);
  CHECK(text.find("[maximum") != std::string::npos);
  // The target it was compiled for: the mesh's backend, its arch, the mode.
  CHECK(text.find("\ntarget: " + target_for(mesh.device_kind(), deterministic_mode()).to_string() + "\n") != std::string::npos);
}

TEST_CASE("a sum over a sharded axis is Partial when looked at (PyTorch's placement); full_tensor reduces it") {
  Mesh mesh = create_mesh({{"x", 3}});
  Tensor x = copy_to_mesh(iota_array({7, 4}), Layout({"x", UNSHARDED}, mesh));
  Tensor s = reduce_sum(x, {0});
  CHECK(s.layout().has_partial());
  CHECK(!fetch_layout(s).has_partial());  // TensorFlow's call sees the reduced value's layout
  CHECK(s.placements() == std::vector<Placement>{Partial{}});
  Tensor p = with_layout(s, Layout::from_placements(mesh, {Partial{}}, 1));
  CHECK(p.layout().has_partial());
  CHECK(same_array(p.full_tensor(), s.full_tensor()));
}

TEST_CASE("jit traces once per signature and matches eager results") {
  Mesh mesh = create_mesh({{"x", 2}});
  auto step = jit([](const Tensor& x, const Tensor& w) {
    Tensor h = relu(matmul(x, w));
    return std::make_tuple(h, reduce_mean(h));
  });
  Layout lx({"x", UNSHARDED}, mesh);
  Tensor w = replicated(iota_array({6, 3}), mesh);
  for (int call = 0; call < 3; ++call) {
    Array xa = iota_array({4, 6});
    xa.mutable_data<float>()[0] = float(call);
    Tensor x = copy_to_mesh(xa, lx);
    auto [h, mean] = step(x, w);
    CHECK(same_array(h.full_tensor(), relu(matmul(x, w)).full_tensor()));
    CHECK(mean.full_tensor().to_vector<float>()[0] == doctest::Approx(reduce_mean(relu(matmul(x, w))).full_tensor().to_vector<float>()[0]));
  }
  CHECK(step.traces() == 1);
  step(copy_to_mesh(iota_array({8, 6}), lx), w);  // a new shape: a new trace
  CHECK(step.traces() == 2);
  auto many = jit([](const Tensor& a) { return std::vector<Tensor>{a + 1.0, a * 2.0}; });
  auto outs = many(w);
  REQUIRE(outs.size() == 2);
  CHECK(same_array(outs[1].full_tensor(), (w * 2.0).full_tensor()));
  CHECK(step.explain(copy_to_mesh(iota_array({4, 6}), lx), w).find("sgemm") != std::string::npos);
}

TEST_CASE("bad input is a typed error naming the op and the user's line") {
  Mesh mesh = create_mesh({{"x", 2}}), other = create_mesh({{"x", 2}}, {"CPU:2", "CPU:3"});
  Tensor a = replicated(iota_array({2, 3}), mesh), b = replicated(iota_array({4, 5}), mesh);
  Tensor i = replicated(Array{{1, 2, 3}, {4, 5, 6}}, mesh);
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(a + b, doctest::Contains(("add: shapes (2, 3) and (4, 5) cannot broadcast (at " + here(line)).c_str()), ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains(("matmul: inner dimensions differ: (2, 3) x (4, 5) (at " + here(line)).c_str()), ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(a * i, doctest::Contains(("mul: operands have different dtypes float32 and int32; cast one first (at " + here(line)).c_str()), DTypeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(reduce_sum(a, {2}), doctest::Contains(("reduce_sum: axis 2 is out of range for rank 2 (at " + here(line)).c_str()), ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(reshape(a, {4, 2}), doctest::Contains(("reshape: cannot reshape (2, 3) (6 elements) into (4, 2) (at " + here(line)).c_str()), ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH_AS(a + replicated(iota_array({2, 3}), other), doctest::Contains("add: operands live on mismatched meshes"), LayoutError);
  CHECK_THROWS_WITH_AS(transpose(a, {0, 0}), doctest::Contains("transpose: axis 0 appears twice"), ShapeError);
  CHECK_THROWS_WITH_AS(slice(a, {1, 0}, {2, 3}), doctest::Contains("slice: begin 1 size 2 is outside axis 0"), ShapeError);
  CHECK_THROWS_WITH_AS(with_layout(a, Layout({"x"}, mesh)), doctest::Contains("with_layout: a tensor of shape (2, 3) cannot take a rank-1 layout"), LayoutError);
  CHECK_THROWS_WITH_AS(one_hot(a, 3), doctest::Contains("one_hot: indices must be int32 or int64, got float32"), DTypeError);
  CHECK_THROWS_WITH_AS(log(i), doctest::Contains("log: needs a floating tensor, got int32"), DTypeError);
  CHECK_THROWS_WITH_AS(where(a, a, a), doctest::Contains("where: the condition must be bool"), DTypeError);
  CHECK_THROWS_WITH_AS(random_uniform({2}, 1, Layout({"x", UNSHARDED}, mesh)), doctest::Contains("does not match the rank-2 layout"), LayoutError);
  CHECK_THROWS_WITH_AS(concat({a, b}, 0), doctest::Contains("concat: shapes (2, 3) and (4, 5) differ off the concat axis"), ShapeError);
  CHECK_THROWS_WITH_AS(sparse_softmax_cross_entropy_with_logits(a, a), doctest::Contains("must have one more axis"), ShapeError);
}

TEST_CASE("a device owning several cores splits large kernels; results are unchanged") {
  set_cores_per_device(2);
  Mesh mesh = create_mesh({{"x", 1}});
  Tensor x = copy_to_mesh(iota_array({301, 257}), Layout::replicated(mesh, 2));
  Tensor y = softmax(x * 0.25) + reduce_mean(x, {0}, true);
  std::string mismatch = compare_with_reference(y.full_tensor(), reference_eval(y), 1e-4);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  set_cores_per_device(0);
}

TEST_CASE("while other processes keep the cores busy, a device runs its kernel parts on the cores left: every part once, the same values") {
  CHECK(parse_wait_policy(nullptr) == WaitPolicy::Auto);
  CHECK(parse_wait_policy("") == WaitPolicy::Auto);
  CHECK(parse_wait_policy("passive") == WaitPolicy::Passive);
  CHECK(parse_wait_policy("active") == WaitPolicy::Active);
  CHECK_THROWS_WITH_AS(parse_wait_policy("lazy"), doctest::Contains("auto, active and passive"), Error);
  CHECK(spins_before_sleeping(20000) == 20000);  // auto keeps the spin (comm/machine_load.hpp says why)

  // A device owning every core splits a large elementwise kernel and its GEMMs over them.
  set_cores_per_device(machine_cores());
  Tensor x = distribute_tensor(iota_array({512, 256}), create_mesh({{"x", 1}}), {Replicate{}});
  auto step = jit([](const Tensor& a) { return matmul(softmax(matmul(a, transpose(a)) * 1e-6), a) * 3.0 + a; });
  const Array quiet = step(x).full_tensor();
  std::vector<std::atomic<int>> ran(7);
  {
    const SpinningProcesses others;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // two load samples apart
    CHECK(cores_busy_elsewhere() >= 0.5);
    CHECK(cores_wanted_elsewhere());
    if (machine_cores() > 1) CHECK(threads_free_for(machine_cores()) < machine_cores());
    CHECK(threads_free_for(1) == 1);
    run_split(0, 7, [&](int part) { ++ran[size_t(part)]; });
    CHECK(same_array(step(x).full_tensor(), quiet));
  }
  for (const auto& count : ran) CHECK(count.load() == 1);
  set_cores_per_device(0);
}

// place_in_arena's definition, scanning every placed item: what the segment tree must give.
std::vector<int64_t> place_by_scanning(const std::vector<ArenaItem>& items) {
  std::vector<int64_t> offset;
  for (size_t i = 0; i < items.size(); ++i) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (size_t j = 0; j < i; ++j)
      if (!(items[j].end < items[i].begin || items[i].end < items[j].begin)) busy.push_back({offset[j], offset[j] + items[j].size});
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + items[i].size <= lo) break;
      at = std::max(at, hi);
    }
    offset.push_back(at);
  }
  return offset;
}

TEST_CASE("arena placement through the segment tree places every value where scanning every placed value would") {
  std::mt19937 rng(7);
  for (const int64_t steps : {1, 2, 7, 64, 1000}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<ArenaItem> items(size_t(std::uniform_int_distribution<int>(0, 300)(rng)));
      for (ArenaItem& item : items) {
        const int64_t a = std::uniform_int_distribution<int64_t>(0, steps - 1)(rng);
        // Short lifetimes mostly, some spanning the program (parameters' gradients, a stash).
        const int64_t length = round % 3 == 0 ? std::uniform_int_distribution<int64_t>(0, steps)(rng)
                                              : std::uniform_int_distribution<int64_t>(0, 3)(rng);
        item = {64 * std::uniform_int_distribution<int64_t>(1, 8)(rng), a, std::min(a + length, steps - 1)};
      }
      std::stable_sort(items.begin(), items.end(), [](const ArenaItem& a, const ArenaItem& b) { return a.size > b.size; });
      const ArenaPlacement placed = place_in_arena(items, steps);
      const std::vector<int64_t> expected = place_by_scanning(items);
      REQUIRE(placed.offset == expected);
      int64_t top = 0;
      for (size_t i = 0; i < items.size(); ++i) top = std::max(top, expected[i] + items[i].size);
      CHECK(placed.arena_bytes == top);
    }
  }
  CHECK_THROWS_AS(place_in_arena({{64, 3, 9}}, 5), InternalError);  // a lifetime past the program's steps
  CHECK_THROWS_AS(place_in_arena({{64, 4, 2}}, 5), InternalError);  // ending before it begins
}

TEST_CASE("the memory plan never overlaps values alive at the same time") {
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(iota_array({64, 48}), Layout({"x", UNSHARDED}, mesh));
  Tensor w = copy_to_mesh(iota_array({48, 48}), Layout::replicated(mesh, 2));
  Tensor h = x;
  for (int layer = 0; layer < 4; ++layer) h = softmax(relu(matmul(h, w)) * 0.01);
  auto exe = executable_for({h.node()});
  const Schedule& s = exe->schedule();
  MemoryPlan plan = plan_memory(exe->program(), s);
  // Recompute lifetimes and check every pair of planned values.
  std::map<int, std::pair<size_t, size_t>> life;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const auto& st = s.steps[i];
    if (plan.offset[st.node] >= 0) life[st.node] = {i, i};
    for (int o : st.outputs)
      if (plan.offset[o] >= 0) life[o] = {i, i};
    for (int r : step_reads(exe->program(), st))
      if (life.count(r)) life[r].second = i;
  }
  int64_t total = 0;
  for (auto& [a, la] : life) {
    total += plan.size[a];
    for (auto& [b, lb] : life) {
      if (a >= b || la.second < lb.first || lb.second < la.first) continue;
      const bool apart = plan.offset[a] + plan.size[a] <= plan.offset[b] || plan.offset[b] + plan.size[b] <= plan.offset[a];
      CHECK_MESSAGE(apart, "values %" << a << " and %" << b << " overlap while both alive");
    }
  }
  CHECK(plan.arena_bytes < total);  // memory is reused
  CHECK(same_array(h.full_tensor(), h.full_tensor()));
}

TEST_CASE("a value read only by an all_gather is written in place into the gathered output") {
  for (Mesh mesh : {create_mesh({{"x", 2}}), create_mesh({{"x", 3}}), create_mesh({{"y", 2}, {"x", 2}})}) {
    CAPTURE(mesh.to_string());
    for (int64_t rows : {7, 12}) {  // uneven and even blocks
      Tensor x = copy_to_mesh(iota_array({rows, 5}), Layout({"x", UNSHARDED}, mesh));
      Tensor y = with_layout(relu(x) * 2.0f + 1.0f, Layout::replicated(mesh, 2));
      auto exe = executable_for({y.node()});
      int in_place = 0;
      for (int g : exe->memory_plan().in_gather) in_place += g >= 0;
      CHECK(in_place == 1);
      CommDebugMode comm;
      const std::string mismatch = compare_with_reference(y.full_tensor(), reference_eval(y), 1e-6);
      CHECK_MESSAGE(mismatch.empty(), mismatch);
      for (const Array& component : unpack(y)) CHECK(same_array(component, y.full_tensor()));
    }
  }
  // Blocks that are not back to back (gathering axis 1 of a 2-D block) are gathered through staging.
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(iota_array({4, 6}), Layout({UNSHARDED, "x"}, mesh));
  Tensor y = with_layout(relu(x) * 2.0f, Layout::replicated(mesh, 2));
  for (int g : executable_for({y.node()})->memory_plan().in_gather) CHECK(g < 0);
  const std::string mismatch = compare_with_reference(y.full_tensor(), reference_eval(y), 1e-6);
  CHECK_MESSAGE(mismatch.empty(), mismatch);
}

TEST_CASE("a data-parallel weight gradient wanted sharded moves activations, not the gradient") {
  for (int devices : {2, 3}) {
    CAPTURE(devices);
    Mesh mesh = create_mesh({{"batch", devices}});
    // x: [batch, features] and dy: [batch, outputs], both batch-sharded; dW = x^T dy is wanted
    // sharded on its rows (an optimizer's sharded state): gathering the small activations beats
    // reduce_scattering the large gradient.
    Tensor x = copy_to_mesh(iota_array({16, 301}), Layout({"batch", UNSHARDED}, mesh));
    Tensor dy = copy_to_mesh(iota_array({16, 200}), Layout({"batch", UNSHARDED}, mesh));
    Tensor dw = with_layout(matmul(transpose(x), dy), Layout({"batch", UNSHARDED}, mesh));
    const PlanSummary plan = plan_summary(dw);
    CHECK(std::count(plan.collectives.begin(), plan.collectives.end(), "reduce_scatter(batch)") == 0);
    CHECK(std::count(plan.collectives.begin(), plan.collectives.end(), "all_gather(batch)") == 1);
    CHECK(plan.kernels == 0);  // x moves before its transpose, which stays a BLAS flag (no copy kernel)
    std::string mismatch = compare_with_reference(dw.full_tensor(), reference_eval(dw), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
    // With a long batch and a small gradient the reduce_scatter stays the cheaper plan.
    Tensor long_x = copy_to_mesh(iota_array({3000, 8}), Layout({"batch", UNSHARDED}, mesh));
    Tensor long_dy = copy_to_mesh(iota_array({3000, 6}), Layout({"batch", UNSHARDED}, mesh));
    Tensor small_dw = with_layout(matmul(transpose(long_x), long_dy), Layout({"batch", UNSHARDED}, mesh));
    CHECK(plan_summary(small_dw).collectives == std::vector<std::string>{"reduce_scatter(batch)"});
    mismatch = compare_with_reference(small_dw.full_tensor(), reference_eval(small_dw), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}

TEST_CASE("small all_reduces over one mesh dim run as one bucket; one that needs another's result runs after it") {
  for (Mesh mesh : {create_mesh({{"batch", 2}}), create_mesh({{"batch", 3}}), create_mesh({{"batch", 2}, {"model", 2}})}) {
    CAPTURE(mesh.to_string());
    // 7 rows: uneven shards on 2 and 3 devices. Both column sums are partial until all_reduced.
    Tensor a = copy_to_mesh(iota_array({7, 5}), Layout({"batch", UNSHARDED}, mesh));
    Tensor b = copy_to_mesh(iota_array({7, 3}), Layout({"batch", UNSHARDED}, mesh));
    Tensor sa = reduce_sum(a, {0}), sb = reduce_sum(b, {0});
    Tensor outer = matmul(reshape(sa, {5, 1}), reshape(sb, {1, 3}));
    CHECK(plan_summary(outer).collectives == std::vector<std::string>{"all_reduce(batch)"});
    CHECK(explain(outer).find("a bucket of 2: (5,) (3,)") != std::string::npos);
    std::string mismatch = compare_with_reference(outer.full_tensor(), reference_eval(outer), 1e-6);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
    // exp needs sa reduced first, so the sum over a * exp(sa) has its own all_reduce, after the bucket.
    // (Replicate + Partial stays Partial, PyTorch's placement: asked for replicated, it is reduced.)
    Tensor dependent = relayout(outer + reduce_sum(a * exp(reshape(sa, {1, 5}) * 0.01f)), Layout::replicated(mesh, 2));
    CHECK(plan_summary(dependent).collectives == std::vector<std::string>{"all_reduce(batch)", "all_reduce(batch)"});
    mismatch = compare_with_reference(dependent.full_tensor(), reference_eval(dependent), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}

TEST_CASE("large work that needs a bucketed all_reduce runs right after it; independent work does not overtake it") {
  // A bucket waits for more members, and the small steps that read it wait with it. A large one
  // (a loss's backward, after the loss's all_reduce) closes the bucket where it stands: were it
  // deferred too, independent work after it in the program (every checkpointed block's
  // recomputed forward) would run first and hold its values until the deferred chain ran.
  for (Mesh mesh : {create_mesh({{"batch", 2}}), create_mesh({{"batch", 3}})}) {
    CAPTURE(mesh.to_string());
    Tensor a = copy_to_mesh(iota_array({7, 5}), Layout({"batch", UNSHARDED}, mesh));
    Tensor w = copy_to_mesh(iota_array({4096, 5}), Layout::replicated(mesh, 2));
    Tensor v = copy_to_mesh(iota_array({4096, 6}), Layout::replicated(mesh, 2));  // not one kernel with it
    Tensor needs_sum = w * exp(reshape(reduce_sum(a, {0}), {1, 5}) * 1e-6f);  // 80 KiB, reads the all_reduce
    Tensor independent = exp(v * 1e-6f);
    // Expanded in this order, the program computes needs_sum first, then independent.
    auto exe = executable_for({independent.node(), needs_sum.node()});
    const LocalProgram& program = exe->program();
    const Schedule& s = exe->schedule();
    int reduced = -1, first_reader = -1, other = -1;
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const ScheduledStep& step = s.steps[i];
      if (step.kind == ScheduledStep::Kind::Redistribute && program.nodes[size_t(step.node)].step.kind == RedistributeKind::AllReduce)
        reduced = int(i);
      if (std::find(step.outputs.begin(), step.outputs.end(), program.outputs[1]) != step.outputs.end()) first_reader = int(i);
      if (std::find(step.outputs.begin(), step.outputs.end(), program.outputs[0]) != step.outputs.end()) other = int(i);
    }
    REQUIRE(reduced >= 0);
    CHECK(reduced < first_reader);
    CHECK(first_reader < other);
    std::string mismatch = compare_with_reference(needs_sum.full_tensor(), reference_eval(needs_sum), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}

TEST_CASE("a program built in ProgramOrderScopes runs its parts in the scopes' order; the values are the same") {
  for (Mesh mesh : {create_mesh({{"batch", 2}}), create_mesh({{"batch", 3}}), create_mesh({{"batch", 2}, {"model", 2}})}) {
    CAPTURE(mesh.to_string());
    // Two parts, each with its own collective: a sum (an all_reduce) and a gather. Each build
    // starts from its own leaf: built again from the same one, hash-consing would return the
    // first build's nodes, positions included.
    auto build = [&](int64_t sum_position, int64_t gather_position) {
      const Tensor x = copy_to_mesh(iota_array({7, 5}), Layout({"batch", UNSHARDED}, mesh));
      std::optional<ProgramOrderScope> scope;
      if (sum_position >= 0) scope.emplace(sum_position);
      // (an all_reduce runs just before its first reader, which is in this part)
      const Tensor summed = exp(relayout(reduce_sum(exp(x * 0.1f), {0}), Layout::replicated(mesh, 1)) * 0.01f);
      scope.reset();
      if (gather_position >= 0) scope.emplace(gather_position);
      const Tensor gathered = reduce_sum(relayout(x * 3.0f, Layout::replicated(mesh, 2)) + 1.0f, {0});
      scope.reset();
      return summed + gathered;  // expansion's depth-first walk meets the sum first
    };
    const Tensor unscoped = build(-1, -1), in_order = build(0, 1), reversed = build(1, 0);
    // Unscoped, the all_reduce waits for its reader, which the final sum's kernel computes inline.
    CHECK(plan_summary(unscoped).collectives == std::vector<std::string>{"all_gather(batch)", "all_reduce(batch)"});
    CHECK(plan_summary(in_order).collectives == std::vector<std::string>{"all_reduce(batch)", "all_gather(batch)"});
    CHECK(plan_summary(reversed).collectives == std::vector<std::string>{"all_gather(batch)", "all_reduce(batch)"});
    const std::vector<float> expected = unscoped.full_tensor().to_vector<float>();
    CHECK(reversed.full_tensor().to_vector<float>() == expected);
    CHECK(in_order.full_tensor().to_vector<float>() == expected);
    std::string mismatch = compare_with_reference(reversed.full_tensor(), reference_eval(reversed), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
  CHECK_THROWS_WITH_AS(ProgramOrderScope(-2), doctest::Contains("position -2 is negative"), Error);
}

TEST_CASE("a batch-sharded activation times a large replicated weight reads only the device's rows of it") {
  for (Mesh mesh : {create_mesh({{"batch", 2}}), create_mesh({{"batch", 3}}), create_mesh({{"batch", 2}, {"model", 2}})}) {
    CAPTURE(mesh.to_string());
    // x: [10, 512] batch-sharded; W: [512, 300] replicated, 600 KB. Each device multiplies by its
    // rows of W (171 of 512 on 3 devices) and the partial products are reduced.
    Tensor x = copy_to_mesh(iota_array({10, 512}), Layout({"batch", UNSHARDED}, mesh));
    Tensor w = copy_to_mesh(iota_array({512, 300}), Layout::replicated(mesh, 2));
    Tensor y = relu(matmul(x, w) * 0.01f);
    const int64_t rows = mesh.dim_size("batch") == 3 ? 171 : 256;
    CHECK(explain(y).find(fmt::format("x ({}, 300)", rows)) != std::string::npos);
    const PlanSummary plan = plan_summary(y);
    CHECK(std::count(plan.collectives.begin(), plan.collectives.end(), "all_to_all(batch)") == 1);
    std::string mismatch = compare_with_reference(y.full_tensor(), reference_eval(y), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
    // A small weight is cheaper to read whole than to reduce partial products over.
    Tensor small = relu(matmul(x, copy_to_mesh(iota_array({512, 4}), Layout::replicated(mesh, 2))));
    CHECK(plan_summary(small).collectives.empty());
    mismatch = compare_with_reference(small.full_tensor(), reference_eval(small), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}

TEST_CASE("a partial sum times a sharded weight is reduced first when passing it on would gather the weight and a larger product") {
  for (Mesh mesh : {create_mesh({{"model", 2}}), create_mesh({{"model", 3}}), create_mesh({{"batch", 2}, {"model", 2}})}) {
    CAPTURE(mesh.to_string());
    // A tensor-parallel backward: dy [64, 32] Partial(sum) over "model" (the product of two
    // operands sharded along its contraction) times a weight [32, 96] sharded by its 96 columns.
    // Passed on, the sum would need the weight gathered and a Partial [64, 96] reduced later;
    // reduced first (one collective of the smaller dy) the product comes out sharded like the
    // weight, with no gather.
    Tensor a = copy_to_mesh(iota_array({64, 16}), Layout({UNSHARDED, "model"}, mesh));
    Tensor b = copy_to_mesh(iota_array({16, 32}), Layout({"model", UNSHARDED}, mesh));
    Tensor dy = matmul(a, b) * 0.01f;
    Tensor w = copy_to_mesh(iota_array({32, 96}), Layout({UNSHARDED, "model"}, mesh));
    Tensor dx = matmul(dy, w) * 0.01f;
    const PlanSummary plan = plan_summary(dx);
    CAPTURE(explain(dx));
    CHECK(std::count(plan.collectives.begin(), plan.collectives.end(), "all_gather(model)") == 0);
    CHECK(plan.collectives.size() == 1);  // dy's reduction
    CHECK(dx.placements().back() == Placement{Shard{1}});
    std::string mismatch = compare_with_reference(dx.full_tensor(), reference_eval(dx), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
    // A product smaller than the partial operand keeps passing the sum on: it stays Partial, and
    // reducing it moves less (a [64, 4] all_reduce instead of a [64, 32] one).
    Tensor small = matmul(dy, copy_to_mesh(iota_array({32, 4}), Layout::replicated(mesh, 2)));
    CAPTURE(explain(small));
    CHECK(plan_summary(small).collectives.empty());
    CHECK(small.layout().has_partial());
    const Layout replicated = Layout::replicated(mesh, 2);
    CHECK(plan_summary(relayout(small, replicated)).collectives == std::vector<std::string>{"all_reduce(model)"});
    CHECK(plan_summary(relayout(small, replicated)).bytes_moved <= plan_summary(relayout(dy, replicated)).bytes_moved / 4);
    mismatch = compare_with_reference(small.full_tensor(), reference_eval(small), 1e-5);
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
}

TEST_CASE("LIBXSMM GEMMs (when built with it) agree with a plain triple loop") {
  struct Case { int64_t m, n, k; bool trans_a, trans_b; };
  // The relative error of a batch of `c` against double sums (nothing checked without LIBXSMM).
  auto check = [](const Case& c, int64_t batch, int parts, const PartRunner& run) {
    std::vector<float> a(size_t(batch * c.m * c.k)), b(size_t(batch * c.k * c.n)), out(size_t(batch * c.m * c.n), -1.0f);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(int64_t(i * 37 % 19) - 9) / 8.0f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(int64_t(i * 11 % 23) - 11) / 8.0f;
    if (!short_sgemm(batch, c.m, c.n, c.k, a.data(), c.trans_a, b.data(), c.trans_b, out.data(), parts, run)) return;
    double worst = 0;
    for (int64_t e = 0; e < batch; ++e)
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          const float *ae = a.data() + e * c.m * c.k, *be = b.data() + e * c.k * c.n;
          double sum = 0;
          for (int64_t p = 0; p < c.k; ++p)
            sum += double(c.trans_a ? ae[p * c.m + i] : ae[i * c.k + p]) * double(c.trans_b ? be[j * c.k + p] : be[p * c.n + j]);
          worst = std::max(worst, std::abs(sum - out[size_t((e * c.m + i) * c.n + j)]) / (1.0 + std::abs(sum)));
        }
    CHECK(worst < 1e-5);
  };
  // Ragged row blocks (200 = 128 + 72, 257), column tiles (47, 700 = 14 x 48 + 28) and depth
  // chunks (784, 1100, 1025), transposed operands on either side, a weight packed from its transpose.
  for (Case c : {Case{1, 1, 1, false, false}, Case{64, 700, 784, false, false}, Case{7, 49, 3, false, false},
                 Case{128, 47, 300, true, false}, Case{33, 96, 1, true, false}, Case{5, 10, 500, false, false},
                 Case{200, 50, 20, false, false}, Case{257, 96, 64, true, false}, Case{300, 130, 70, false, true},
                 Case{64, 48, 33, true, true}, Case{130, 50, 1100, true, false}, Case{40, 60, 1025, false, true}}) {
    INFO("m ", c.m, " n ", c.n, " k ", c.k, " trans_a ", c.trans_a, " trans_b ", c.trans_b);
    check(c, 1, 1, {});
  }
  // A batch shared among threads: row blocks, and column chunks when there are too few blocks.
  const PartRunner threads = [](int parts, const std::function<void(int)>& part) {
    std::vector<std::thread> running;
    for (int p = 0; p < parts; ++p) running.emplace_back(part, p);
    for (std::thread& t : running) t.join();
  };
  for (Case c : {Case{300, 100, 40, false, true}, Case{20, 500, 30, true, false}})
    for (int parts : {1, 2, 3, 16}) {
      INFO("batch of 3: m ", c.m, " n ", c.n, " k ", c.k, " parts ", parts);
      check(c, 3, parts, threads);
    }
  // What it leaves to BLAS: a transposed weight with too few rows to pay for its copy.
  std::vector<float> a(4 * 4, 1.0f), b(4 * 4, 1.0f), out(4 * 4);
  CHECK_FALSE(short_sgemm(1, 4, 4, 4, a.data(), false, b.data(), true, out.data()));
}

TEST_CASE("BLAS GEMMs shared among parts: every row of every batch entry once, transposes either side") {
  // f64 products always take BLAS (host_gemm's split of rows among single-threaded calls).
  struct Case { int64_t batch, m, n, k; bool trans_a, trans_b; };
  const PartRunner threads = [](int parts, const std::function<void(int)>& part) {
    std::vector<std::thread> running;
    for (int p = 0; p < parts; ++p) running.emplace_back(part, p);
    for (std::thread& t : running) t.join();
  };
  std::atomic<int> most_parts = 0;
  const PartRunner counting = [&](int parts, const std::function<void(int)>& part) {
    most_parts = std::max(most_parts.load(), parts);
    threads(parts, part);
  };
  // No batch entries (an empty shard), fewer rows than parts, ragged row chunks, more batch
  // entries than parts and fewer.
  for (Case c : {Case{0, 4, 4, 4, false, false}, Case{1, 1, 1, 1, false, false}, Case{1, 70, 9, 33, true, false}, Case{3, 37, 5, 8, false, true},
                 Case{5, 64, 48, 17, true, true}, Case{2, 200, 3, 40, false, false}})
    for (int parts : {1, 2, 3, 8}) {
      INFO("batch ", c.batch, " m ", c.m, " n ", c.n, " k ", c.k, " trans ", c.trans_a, c.trans_b, " parts ", parts);
      const std::vector<int64_t> a_shape = c.trans_a ? std::vector<int64_t>{c.batch, c.k, c.m} : std::vector<int64_t>{c.batch, c.m, c.k};
      const std::vector<int64_t> b_shape = c.trans_b ? std::vector<int64_t>{c.batch, c.n, c.k} : std::vector<int64_t>{c.batch, c.k, c.n};
      Array a(a_shape, DType::f64), b(b_shape, DType::f64), out({c.batch, c.m, c.n}, DType::f64);
      for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<double>()[i] = double((i * 37) % 19 - 9) / 8.0;
      for (int64_t i = 0; i < b.numel(); ++i) b.mutable_data<double>()[i] = double((i * 11) % 23 - 11) / 8.0;
      for (int64_t i = 0; i < out.numel(); ++i) out.mutable_data<double>()[i] = -12345.0;
      most_parts = 0;
      host_gemm(a, c.trans_a, b, c.trans_b, out, false, parts, counting);
      if (parts > 1 && c.batch * c.m >= 2 * 16) CHECK(most_parts.load() > 1);  // shared, where there is enough to share
      int64_t wrong = 0;
      for (int64_t e = 0; e < c.batch; ++e)
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            const double* ae = a.data<double>() + e * c.m * c.k;
            const double* be = b.data<double>() + e * c.k * c.n;
            double sum = 0;
            for (int64_t p = 0; p < c.k; ++p)
              sum += (c.trans_a ? ae[p * c.m + i] : ae[i * c.k + p]) * (c.trans_b ? be[j * c.k + p] : be[p * c.n + j]);
            wrong += std::abs(sum - out.data<double>()[(e * c.m + i) * c.n + j]) > 1e-9 * (1.0 + std::abs(sum));
          }
      CHECK(wrong == 0);
    }
}

TEST_CASE("16-bit transposes: whole and ragged 32 x 32 tiles, strided rows, nothing written past the edge") {
  for (int64_t rows : {1, 5, 31, 32, 33, 64, 100})
    for (int64_t cols : {1, 7, 32, 47, 64, 65}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const int64_t from_stride = cols + 3, to_stride = rows + 5;
      std::vector<uint16_t> from(size_t(rows * from_stride)), to(size_t(cols * to_stride), 0xdead);
      for (size_t i = 0; i < from.size(); ++i) from[i] = uint16_t(i * 7 + 1);
      transpose_16bit(from.data(), rows, cols, from_stride, to.data(), to_stride);
      int64_t wrong = 0, overwritten = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) wrong += to[size_t(c * to_stride + r)] != from[size_t(r * from_stride + c)];
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = rows; r < to_stride; ++r) overwritten += to[size_t(c * to_stride + r)] != 0xdead;
      CHECK(wrong == 0);
      CHECK(overwritten == 0);
    }
}

TEST_CASE("bf16 GEMMs: f32 sums rounded once; the fixed order gives the generated kernel's bits") {
  struct Case { int64_t m, n, k; bool trans_a, trans_b; };
  auto bf16_array = [](std::vector<int64_t> shape, int salt) {
    Array x(std::move(shape), DType::bf16);
    for (int64_t i = 0; i < x.numel(); ++i)
      store_from_double(x.mutable_bytes(), DType::bf16, i, double((i * 37 + salt) % 19 - 9) / 8.0 + double(i % 5) / 256.0);
    return x;
  };
  const PartRunner threads = [](int parts, const std::function<void(int)>& part) {
    std::vector<std::thread> running;
    for (int p = 0; p < parts; ++p) running.emplace_back(part, p);
    for (std::thread& t : running) t.join();
  };
  // Odd depths (padded for VNNI), ragged row blocks and column tiles, depth chunks, transposes.
  for (Case c : {Case{1, 1, 1, false, false}, Case{7, 49, 3, false, false}, Case{130, 50, 1100, true, false},
                 Case{64, 700, 784, false, false}, Case{200, 50, 21, false, true}, Case{33, 96, 1, true, true},
                 Case{40, 60, 1025, false, true}, Case{64, 16, 64, true, false}, Case{37, 20, 45, true, false}}) {
    INFO("m ", c.m, " n ", c.n, " k ", c.k, " trans_a ", c.trans_a, " trans_b ", c.trans_b);
    const Array a = bf16_array(c.trans_a ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k}, 1);
    const Array b = bf16_array(c.trans_b ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n}, 2);
    auto at = [&](const Array& x, bool trans, int64_t rows, int64_t cols, int64_t i, int64_t j) {
      return x.element_as_double(trans ? j * rows + i : i * cols + j);
    };
    Array ordered({c.m, c.n}, DType::bf16), fast({c.m, c.n}, DType::bf16);
    host_gemm(a, c.trans_a, b, c.trans_b, ordered, true);
    host_gemm(a, c.trans_a, b, c.trans_b, fast, false, 3, threads);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        float in_order = 0;  // what lower_kernel.cpp's generated Dot computes
        double exact = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = at(a, c.trans_a, c.m, c.k, i, p), y = at(b, c.trans_b, c.k, c.n, p, j);
          in_order += float(x) * float(y);
          exact += x * y;
        }
        const int64_t e = i * c.n + j;
        REQUIRE(ordered.element_as_double(e) == double(bf16_to_float(float_to_bf16(in_order))));
        // f32 sums in any order, one rounding: within two bf16 steps of the exact sum.
        REQUIRE(std::abs(fast.element_as_double(e) - exact) <= (1.0 + std::abs(exact)) / 128.0);
      }
  }
  // Through the compiler, a bf16 matmul is the backend's bf16 GEMM, not a generated loop nest.
  Mesh mesh = create_mesh({{"x", 2}});
  const Tensor x = cast(copy_to_mesh(iota_array({6, 4}), Layout({"x", UNSHARDED}, mesh)), DType::bf16);
  const Tensor w = cast(copy_to_mesh(iota_array({4, 5}), Layout::replicated(mesh, 2)), DType::bf16);
  const std::string text = explain(matmul(x, w));
  CAPTURE(text);
  CHECK(text.find("bf16 gemm (3, 4) x (4, 5) -> (3, 5)") != std::string::npos);
}

TEST_CASE("TESSERA_PROFILE: every step of a program is timed and reported") {
  set_profiling(true);
  reset_profiles();
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(iota_array({64, 48}), Layout({"x", UNSHARDED}, mesh));
  Tensor w = copy_to_mesh(iota_array({48, 32}), Layout::replicated(mesh, 2));
  auto f = jit([](const Tensor& a, const Tensor& b) { return reduce_sum(relu(matmul(a, b))); });
  for (int i = 0; i < 3; ++i) f(x, w).full_tensor();
  const std::string report = profile_report();
  set_profiling(false);
  CHECK(report.find("3 runs on 2 devices") != std::string::npos);
  CHECK(report.find("sgemm (32, 48) x (48, 32) -> (32, 32)") != std::string::npos);
  CHECK(report.find("all_reduce") != std::string::npos);
  CHECK(report.find("[reduce_sum, maximum]") != std::string::npos);
}

// A function that builds a jit'd step, as a user's model code would: its programs carry its name.
auto summed_relu_of_product() {
  return jit([](const Tensor& a, const Tensor& b) { return reduce_sum(relu(matmul(a, b))); });
}

TEST_CASE("TESSERA_PROFILE names each program by the function that made it and writes a Chrome trace: a track per device, kernels, GEMMs and collectives") {
  CHECK_FALSE(parse_profile_setting(nullptr).enabled);
  CHECK_FALSE(parse_profile_setting("0").enabled);
  CHECK(parse_profile_setting("1").enabled);
  CHECK(parse_profile_setting("1").trace_path.empty());
  CHECK(parse_profile_setting("/tmp/step.json").enabled);
  CHECK(parse_profile_setting("/tmp/step.json").trace_path == "/tmp/step.json");
  CHECK(detail::readable_type_name(typeid(std::vector<int>)) == "std::vector");

  set_profiling(true);
  set_tracing(true);
  reset_profiles();
  Mesh mesh = create_mesh({{"x", 2}});
  Tensor x = copy_to_mesh(iota_array({64, 48}), Layout({"x", UNSHARDED}, mesh));
  Tensor w = copy_to_mesh(iota_array({48, 32}), Layout::replicated(mesh, 2));
  auto f = summed_relu_of_product();
  for (int i = 0; i < 3; ++i) f(x, w).full_tensor();
  const std::string report = profile_report();
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json());
  const std::filesystem::path file = std::filesystem::temp_directory_path() / ("tessera_trace_" + std::to_string(getpid()) + ".json");
  write_chrome_trace(file.string());
  set_tracing(false);
  set_profiling(false);
  CHECK(report.find("profile of summed_relu_of_product::{lambda#1} (program ") != std::string::npos);
  CHECK(nlohmann::json::parse(std::ifstream(file)) == trace);
  std::filesystem::remove(file);
  CHECK_THROWS_AS(write_chrome_trace("/nonexistent-dir/trace.json"), IOError);

  std::map<std::string, int> by_category;
  std::set<int64_t> tracks, named_tracks;
  double last_end = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") {
      named_tracks.insert(e.at("tid").get<int64_t>());
      CHECK(e.at("args").at("name") == "device " + std::to_string(e.at("tid").get<int64_t>()));
      continue;
    }
    CHECK(e.at("ph") == "X");
    CHECK(e.at("dur").get<double>() >= 0);
    // Programs besides the function's run too: full_tensor's all_reduce of the partial sum.
    const bool the_function = e.at("args").at("program").get<std::string>().find("summed_relu_of_product") != std::string::npos;
    ++by_category[(the_function ? "" : "other ") + e.at("cat").get<std::string>()];
    tracks.insert(e.at("tid").get<int64_t>());
    last_end = std::max(last_end, e.at("ts").get<double>() + e.at("dur").get<double>());
  }
  CHECK(tracks == std::set<int64_t>{0, 1});
  CHECK(named_tracks == tracks);
  // Each of the 3 runs, on each device: the function's GEMM and kernels, and the all_reduce that
  // full_tensor runs.
  CHECK(by_category["library"] == 3 * 2);
  CHECK(by_category["kernel"] >= 3 * 2);
  CHECK(by_category["other collective"] >= 3 * 2);
  CHECK(last_end > 0);
}

TEST_CASE("a kernel writes an output over an input only where each iteration reads just the element it writes, before writing it") {
  using namespace kir;
  // buffers: 0 = out (f32), 1 = in (f32), 2 = other (f32); one range loop over i.
  auto kernel = [](std::vector<StmtPtr> body, std::vector<Buffer> buffers = {{Type::F32, true}, {Type::F32, false}, {Type::F32, true}}) {
    Kernel k;
    k.name = "k";
    k.buffers = std::move(buffers);
    k.num_vars = 2;
    k.outer_extent = param(0);
    k.body = block({for_loop(0, int_const(0), param(0), std::move(body), LoopKind::Parallel)});
    return k;
  };
  const Expr i = var(0);
  const Expr in_i = load(1, Type::F32, i);
  const Expr two = float_const(2, Type::F32);
  // out[i] = in[i] * 2: in place.
  CHECK(writes_in_place(kernel({store(0, i, binary(Op::Mul, in_i, two))}), 0, 1));
  // The same load shared by two stores' values (a DAG), both before the store to out.
  CHECK(writes_in_place(kernel({store(2, i, binary(Op::Add, in_i, two)), store(0, i, binary(Op::Mul, in_i, in_i))}), 0, 1));
  // A neighbour's element: iteration i would read what iteration i - 1 wrote.
  CHECK(!writes_in_place(kernel({store(0, i, load(1, Type::F32, binary(Op::Add, i, int_const(1))))}), 0, 1));
  // A broadcast element read by every iteration.
  CHECK(!writes_in_place(kernel({store(0, i, binary(Op::Add, in_i, load(1, Type::F32, int_const(0))))}), 0, 1));
  // Read again after out was written (a renderer may load it anew there).
  CHECK(!writes_in_place(kernel({store(0, i, in_i), store(2, i, binary(Op::Mul, in_i, two))}), 0, 1));
  // An index through a variable the kernel reassigns.
  CHECK(!writes_in_place(kernel({declare(1, Type::I64, i), store(0, var(1), load(1, Type::F32, var(1))), assign(1, int_const(0))}), 0, 1));
  // Stores to out at two indices.
  CHECK(!writes_in_place(kernel({store(0, i, in_i), store(0, binary(Op::Add, i, int_const(1)), two)}), 0, 1));
  // Nothing read, or nothing written; storage types that differ.
  CHECK(!writes_in_place(kernel({store(0, i, two)}), 0, 1));
  CHECK(!writes_in_place(kernel({store(2, i, in_i)}), 0, 1));
  CHECK(!writes_in_place(kernel({store(0, i, in_i)}, {{Type::BF16, true}, {Type::F32, false}, {Type::F32, true}}), 0, 1));
}

TEST_CASE("buffers a run may write over one another are compiled without noalias or __restrict__, the others keep it") {
  const Mesh mesh = create_mesh({{"x", 2}});
  Variable w(random_normal({8, 4}, 1, Layout::replicated(mesh, 2)));
  auto step = jit([&](const Tensor& g, const Tensor& row) {
    w.assign(w.value() - g * row);
    return reduce_sum(w.value());
  });
  const Tensor g = random_normal({8, 4}, 2, Layout::replicated(mesh, 2));
  const Tensor row = random_normal({4}, 3, Layout::replicated(mesh, 1));  // broadcast: never written over
  const auto exe = step.executable(g, row);
  int marked = 0, kernels_marked = 0;
  for (const kir::Kernel& k : exe->schedule().kernels) {
    for (const kir::Buffer& b : k.buffers) marked += b.may_alias;
    if (std::none_of(k.buffers.begin(), k.buffers.end(), [](const kir::Buffer& b) { return b.may_alias; })) continue;
    ++kernels_marked;
    // The update's kernel: its output and the inputs of its shape (w, g) may share memory in a
    // run; the broadcast row keeps __restrict__.
    CHECK(k.to_string().find("may_alias") != std::string::npos);
    const std::string cuda = render_cuda({for_target(k, kir::LoopTarget::Cuda)}, {"update"});
    CAPTURE(cuda);
    int plain = 0, restricted = 0;
    std::istringstream lines(cuda);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("= (") == std::string::npos || line.find("buffers[") == std::string::npos) continue;  // a buffer's declaration
      (line.find("__restrict__") != std::string::npos ? restricted : plain) += 1;
    }
    CHECK(plain == 3);
    CHECK(restricted == 1);
  }
  CHECK(kernels_marked == 1);
  CHECK(marked == 3);
  // A program without an output of an input's shape has none.
  auto plain_step = jit([](const Tensor& a) { return reduce_sum(a * 2.0); });
  for (const kir::Kernel& k : plain_step.executable(g)->schedule().kernels)
    for (const kir::Buffer& b : k.buffers) CHECK(!b.may_alias);
}

TEST_CASE("kernels that write outputs over their inputs vectorize: their loops over the output are declared parallel to LLVM") {
  // An Adam-like update of four parameters written over p, m and v, fused into one kernel whose
  // buffers may all alias one another (too many pairs for LLVM to check at run time): once over
  // whole arrays (one loop), once scaled by a broadcast row (a loop over rows around one over
  // columns). Each function compiled is dumped (TESSERA_DUMP); with no compile cache every
  // kernel is compiled here.
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-dump-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const Mesh mesh = create_mesh({{"x", 1}});
  std::vector<Variable> p, m, v, grads;
  for (int i = 0; i < 4; ++i) {
    p.emplace_back(random_normal({24, 40}, 10 + i, Layout::replicated(mesh, 2)));
    m.emplace_back(random_normal({24, 40}, 20 + i, Layout::replicated(mesh, 2)));
    v.emplace_back(random_normal({24, 40}, 30 + i, Layout::replicated(mesh, 2)) * 0.0);
    grads.emplace_back(random_normal({24, 40}, 40 + i, Layout::replicated(mesh, 2)));
  }
  const Tensor row = random_normal({40}, 50, Layout::replicated(mesh, 1));
  auto update = [&](bool scaled) {
    return jit([&, scaled](const Tensor& scale) {
      for (int i = 0; i < 4; ++i) {
        const Tensor g = scaled ? Tensor(grads[i]) * scale : Tensor(grads[i]);
        const Tensor mi = Tensor(m[i]) * 0.875 + g * 0.125, vi = Tensor(v[i]) * 0.9375 + g * g * 0.0625;
        m[i].assign(mi), v[i].assign(vi);
        p[i].assign(Tensor(p[i]) - mi * 0.03125 / (sqrt(vi) + 0.25));
      }
      return Tensor(p[0]);
    });
  };
  ::setenv("TESSERA_DUMP", dir.c_str(), 1);
  ::setenv("TESSERA_CACHE_DIR", "off", 1);
  for (bool scaled : {false, true}) {
    auto step = update(scaled);
    (void)step(row).full_tensor();
    (void)step(row).full_tensor();  // the second call writes over the first's outputs
  }
  ::unsetenv("TESSERA_DUMP");
  ::unsetenv("TESSERA_CACHE_DIR");
  int updates = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(file.path());
    const std::string ir((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The update: a kernel storing to twelve buffers, its square root among its ops.
    for (size_t at = ir.find("\ndefine "); at != std::string::npos; at = ir.find("\ndefine ", at + 1)) {
      const std::string function = ir.substr(at, ir.find("\n}", at) - at);
      if (function.find("llvm.sqrt") == std::string::npos) continue;
      ++updates;
      CAPTURE(function.substr(0, 4000));
      CHECK(function.find("store <") != std::string::npos);  // vector stores: the loop vectorized
    }
  }
  CHECK(updates >= 2);
  std::filesystem::remove_all(dir);
}
