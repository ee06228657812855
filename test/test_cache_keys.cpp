// The executable cache never serves a program of another meaning. A program is found in the
// cache by a key over its graph's canonical structure (jit/driver.cpp); whatever the partitioner
// reads must be in that key. Every suite runs with each hit checked against the graph
// partitioned afresh (TESSERA_VERIFY_CACHE_KEYS=1, test/meson.build); here, the values: the case
// that once went wrong, and random programs run in shuffled orders from a cold cache, a warm
// in-memory cache and a warm disk cache, which must give the same bits.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <tessera/tessera.hpp>

#include "jit/driver.hpp"

using namespace tessera;

namespace {

Array ints(std::vector<int32_t> values, std::vector<int64_t> shape) { return Array::from<int32_t>(values, shape); }

// The TensorFlow guide's contracted-axis matmul: Partial(sum) over x, read through full_tensor().
Array contracted_matmul(const Mesh& mesh) {
  Tensor a = copy_to_mesh(ints({1, 2, 3, 4, 5, 6}, {2, 3}), Layout({UNSHARDED, "x"}, mesh));
  Tensor b = copy_to_mesh(ints({6, 5, 4, 3, 2, 1}, {3, 2}), Layout({"x", UNSHARDED}, mesh));
  return matmul(a, b).full_tensor();
}

// Lines "seed digest" of test/fuzz_programs --digests run with `env` and `args`.
std::multimap<uint64_t, std::string> digests(const std::string& env, const std::string& args) {
  const std::string command = env + " " + TESSERA_TEST_BUILD_DIR + "/fuzz_programs --digests " + args;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  std::multimap<uint64_t, std::string> out;
  char line[4096];
  while (fgets(line, sizeof line, pipe)) {
    std::istringstream in(line);
    uint64_t seed = 0;
    std::string digest;
    in >> seed;
    std::getline(in >> std::ws, digest);
    out.emplace(seed, digest);
  }
  CHECK(pclose(pipe) == 0);
  return out;
}

}  // namespace

TEST_CASE("reading a factory made Partial first never changes what a later read of a Partial value gives") {
  // Once, reading ones(..., {Partial, Replicate}) cached a program that took each Partial input
  // as its own sum: every later read of a real Partial(sum) value of that shape returned device
  // 0's term ([[6 5] [24 20]] for the guide's [[20 14] [56 41]]).
  for (const auto& dims : std::vector<std::vector<std::pair<std::string, int64_t>>>{{{"x", 3}, {"y", 2}}, {{"x", 3}}}) {
    const Mesh mesh = create_mesh(dims);
    std::vector<Placement> partial_first(size_t(mesh.ndim()), Replicate{});
    partial_first[0] = Partial{};
    CAPTURE(mesh.to_string());
    const Array fill = ones({2, 2}, mesh, partial_first, DType::i32).full_tensor();
    CHECK(fill.to_vector<int32_t>() == std::vector<int32_t>{1, 1, 1, 1});
    CHECK(contracted_matmul(mesh).to_vector<int32_t>() == std::vector<int32_t>{20, 14, 56, 41});
    CHECK(to_array(ones({2, 2}, mesh, partial_first, DType::i32)).to_vector<int32_t>() == std::vector<int32_t>{1, 1, 1, 1});
    CHECK(contracted_matmul(mesh).to_vector<int32_t>() == std::vector<int32_t>{20, 14, 56, 41});
  }
  const Mesh m4 = create_mesh({{"x", 4}});
  CHECK(zeros({2}, m4, {Partial{}}).full_tensor().to_vector<float>() == std::vector<float>{0, 0});
  const Tensor terms = from_local(Array::from<float>({1, 2}, {2}), m4, {Partial{}});
  CHECK(terms.full_tensor().to_vector<float>() == std::vector<float>{4, 8});
  CHECK(zeros({2}, m4, {Partial{}}).full_tensor().to_vector<float>() == std::vector<float>{0, 0});
  CHECK(from_local(Array::from<float>({1, 2}, {2}), m4, {Partial{}}).full_tensor().to_vector<float>() == std::vector<float>{4, 8});
}

TEST_CASE("two graphs that share an executable-cache key have equal canonical programs") {
  // The check every suite runs is on here (meson's default test setup turns it on).
  REQUIRE(verify_cache_keys());
  const Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  const DriverStats before = driver_stats();
  for (int round = 0; round < 3; ++round) {
    // The same structure from new values each round: hits after the first, each one verified.
    Tensor a = copy_to_mesh(Array::from<float>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}), Layout({"y", "x"}, mesh));
    CHECK(reduce_sum(exp(a) * 2.0, {1}).full_tensor().shape() == std::vector<int64_t>{2});
  }
  CHECK(driver_stats().executable_cache_hits - before.executable_cache_hits >= 2);
}

TEST_CASE("random programs give the same bits from a cold cache, a warm in-memory cache and a warm disk cache, in any order") {
  const char* cases_env = std::getenv("TESSERA_CACHE_FUZZ_CASES");
  const std::string cases = cases_env ? cases_env : "300";
  const auto disk = std::filesystem::temp_directory_path() / ("tessera-cache-keys-" + std::to_string(::getpid()));
  std::filesystem::remove_all(disk);
  const std::string range = "--cases " + cases + " --seed 1";
  // Cold: no disk cache, every executable forgotten before each program.
  const auto cold = digests("TESSERA_CACHE_DIR=off", range + " --cold");
  // A fresh disk cache filled in one order, then the same programs again in another (warm memory).
  const auto warm_memory = digests("TESSERA_CACHE_DIR='" + disk.string() + "'", range + " --order-seed 7 --passes 2");
  // A new process over the filled disk cache (cold memory, warm disk), in a third order.
  const auto warm_disk = digests("TESSERA_CACHE_DIR='" + disk.string() + "'", range + " --order-seed 11");
  std::filesystem::remove_all(disk);
  REQUIRE(cold.size() == size_t(std::stoul(cases)));
  REQUIRE(warm_memory.size() == 2 * cold.size());
  REQUIRE(warm_disk.size() == cold.size());
  int threw = 0;
  for (const auto& [seed, digest] : cold) {
    CAPTURE(seed);
    threw += digest.starts_with("threw");
    auto [first, last] = warm_memory.equal_range(seed);
    for (auto it = first; it != last; ++it) CHECK(it->second == digest);
    CHECK(warm_disk.find(seed)->second == digest);
  }
  CHECK(threw == 0);  // the programs are all valid: a throw is a failure (test_fuzz names it)
}
