// CommDebugMode's records, tracing table and JSON dump, and CommModuleScope.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <tessera/tessera.hpp>

#include "jit/driver.hpp"
#include "reference_sharding.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::string here(int line) { return "test_comm_debug_mode.cpp:" + std::to_string(line); }

Array iota(std::vector<int64_t> shape) {
  Array a(shape, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) store_from_double(a.mutable_bytes(), DType::f32, i, double(i));
  return a;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("a redistribute Shard -> Replicate on a 2x2 mesh is one all_gather record at its line") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Array a = iota({8, 6});
  Tensor t = copy_to_mesh(a, Layout({"x", UNSHARDED}, mesh));
  CommDebugMode comm;
  const int line = __LINE__ + 1;
  Tensor r = t.redistribute({Replicate{}, Replicate{}});
  // Tessera is lazy, but reading the counts computes what was built inside the mode, as an
  // eager system would have run it at the call; looking at the value afterwards runs nothing.
  CHECK(comm.get_total_counts() == 1);
  CHECK(same_array(to_array(r), a));
  // Two groups (one per y coordinate) ran the gather over x: one record, as a rank sees it.
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(records.size() == 1);
  const CollectiveRecord& g = records[0];
  CHECK(g.kind == "all_gather");
  CHECK(g.mesh_dim == "x");
  CHECK(g.mesh == mesh.to_string());
  CHECK(g.dtype == "float32");
  CHECK(g.source_line == here(line));
  CHECK(g.module == "");
  CHECK(g.bytes == 4 * 24 * 4);  // each of 4 devices receives the other 24-element half
  CHECK(comm.counts() == std::map<std::string, int64_t>{{"all_gather", 1}});
  CHECK(comm.total_bytes() == g.bytes);

  // The same structure again (a cached program) is reported at its own line and module.
  Tensor t2 = copy_to_mesh(iota({8, 6}), Layout({"x", UNSHARDED}, mesh));
  int line2 = 0;
  Tensor r2;
  {
    CommModuleScope scope("again");
    line2 = __LINE__ + 1;
    r2 = t2.redistribute({Replicate{}, Replicate{}});
  }
  const int64_t hits = driver_stats().executable_cache_hits;
  to_array(r2);
  CHECK(driver_stats().executable_cache_hits == hits + 1);
  REQUIRE(comm.records().size() == 2);
  CHECK(comm.records()[1].source_line == here(line2));
  CHECK(comm.records()[1].module == "again");
}

TEST_CASE("a matmul over a sharded contraction is Partial; its reduction is an all_reduce record at the matmul's line") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Tensor x = copy_to_mesh(iota({4, 6}), Layout({UNSHARDED, "y"}, mesh));
  Tensor w = copy_to_mesh(iota({6, 3}), Layout({"y", UNSHARDED}, mesh));
  const int line = __LINE__ + 1;
  Tensor c = matmul(x, w);
  CommDebugMode comm;
  (void)c.to_local();  // PyTorch's call: this device's Partial term, nothing to reduce
  (void)c.components();
  CHECK(comm.records().empty());
  c.full_tensor();
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].kind == "all_reduce");
  CHECK(records[0].mesh_dim == "y");
  CHECK(records[0].source_line == here(line));
  CHECK(records[0].bytes > 0);
  CHECK(records[0].bytes == comm.bytes_by_kind()["all_reduce"]);
}

TEST_CASE("CommModuleScope nests into dotted paths, captured when the op is built") {
  CHECK(CommModuleScope::current() == "");
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Tensor x = copy_to_mesh(iota({4, 6}), Layout({UNSHARDED, "y"}, mesh));
  Tensor w = copy_to_mesh(iota({6, 3}), Layout({"y", UNSHARDED}, mesh));
  Tensor inner_out, outer_out;
  int inner_line = 0;
  {
    CommModuleScope outer("outer");
    CHECK(CommModuleScope::current() == "outer");
    {
      CommModuleScope inner("inner");
      CHECK(CommModuleScope::current() == "outer.inner");
      inner_line = __LINE__ + 1;
      inner_out = matmul(x, w);
    }
    CHECK(CommModuleScope::current() == "outer");
    outer_out = copy_to_mesh(iota({8, 2}), Layout({"x", UNSHARDED}, mesh)).redistribute({Replicate{}, Replicate{}});
  }
  CHECK(CommModuleScope::current() == "");
  // Forced outside every module: the collectives still belong to the modules that built the ops.
  CommDebugMode comm;
  inner_out.full_tensor();
  to_array(outer_out);
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].module == "outer.inner");
  CHECK(records[0].source_line == here(inner_line));
  CHECK(records[1].module == "outer");
  const std::string table = comm.generate_comm_debug_tracing_table();
  CAPTURE(table);
  CHECK(table.find("Global: 2 collectives") != std::string::npos);
  CHECK(table.find("\n  outer: 2 collectives") != std::string::npos);  // counts include submodules
  CHECK(table.find("\n    outer.inner: 1 collective,") != std::string::npos);
  CHECK(table.find("all_reduce  over y") != std::string::npos);
  CHECK(table.find(here(inner_line)) != std::string::npos);
  CHECK(table.find(mesh.to_string()) == std::string::npos);  // the mesh only from noise level 1
  CHECK(comm.generate_comm_debug_tracing_table(1).find("on mesh " + mesh.to_string()) != std::string::npos);
}

TEST_CASE("gradients' collectives belong to the module of the forward op") {
  Mesh mesh = create_mesh({{"dp", 4}});
  Tensor x = copy_to_mesh(iota({8, 3}), Layout({"dp", UNSHARDED}, mesh));
  Tensor w = copy_to_mesh(iota({3, 2}), Layout::replicated(mesh, 2));
  Tensor loss;
  {
    CommModuleScope model("model");
    CommModuleScope fc("fc");
    loss = reduce_sum(matmul(x, w));
  }
  Tensor dw = gradients(loss, {w})[0];
  CommDebugMode comm;
  dw.components();
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(!records.empty());
  for (const CollectiveRecord& r : records) {
    CAPTURE(r.source_line);
    CHECK(r.kind == "all_reduce");
    CHECK(r.mesh_dim == "dp");
    CHECK(r.module == "model.fc");
  }
}

TEST_CASE("a jit function's collectives are reported at its traced line and module") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  const int line = __LINE__ + 1;
  auto gather = jit([](const Tensor& t) { return t.redistribute({Replicate{}, Replicate{}}); });
  Tensor t = copy_to_mesh(iota({8, 4}), Layout({"x", UNSHARDED}, mesh));
  CommDebugMode comm;
  {
    CommModuleScope scope("jitted");
    gather(t);
  }
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].kind == "all_gather");
  CHECK(records[0].source_line == here(line));
  CHECK(records[0].module == "jitted");
}

TEST_CASE("the JSON dump parses and holds the same records") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Tensor x = copy_to_mesh(iota({4, 6}), Layout({UNSHARDED, "y"}, mesh));
  Tensor w = copy_to_mesh(iota({6, 3}), Layout({"y", UNSHARDED}, mesh));
  Tensor c, r;
  {
    CommModuleScope scope("layer");
    c = matmul(x, w);
  }
  r = copy_to_mesh(iota({8, 6}), Layout({"x", "y"}, mesh)).redistribute({Replicate{}, Replicate{}});
  CommDebugMode comm;
  c.full_tensor();
  to_array(r);
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(records.size() >= 3);
  for (int noise : {0, 1}) {
    CAPTURE(noise);
    const nlohmann::json j = nlohmann::json::parse(comm.generate_json_dump(noise));
    CHECK(j["total_count"] == comm.total_count());
    CHECK(j["total_bytes"] == comm.total_bytes());
    CHECK(j["counts"].get<std::map<std::string, int64_t>>() == comm.counts());
    CHECK(j["bytes_by_kind"].get<std::map<std::string, int64_t>>() == comm.bytes_by_kind());
    REQUIRE(j["collectives"].size() == records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      CAPTURE(i);
      const nlohmann::json& e = j["collectives"][i];
      auto text = [&](const char* key) { return e[key].get<std::string>(); };
      CollectiveRecord got{text("kind"), text("mesh_dim"), noise >= 1 ? text("mesh") : records[i].mesh, text("dtype"),
                           text("source_line"), text("module"), e["bytes"].get<int64_t>()};
      CHECK(got == records[i]);
      CHECK(e.contains("mesh") == (noise >= 1));
    }
  }
  CHECK(records[0].module == "layer");
  CHECK(records[1].module == "");
}

TEST_CASE("work written inside the mode is counted when the counts are read, and only once") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  const Array a = iota({8, 6});
  Tensor t = copy_to_mesh(a, Layout({"x", "y"}, mesh));
  Tensor before = t.redistribute({Replicate{}, Shard{1}});  // built before the mode
  CommDebugMode comm;
  Tensor gathered = t.redistribute({Replicate{}, Replicate{}});
  Tensor doubled = gathered * 2.0;  // consumes `gathered`, which the test also holds
  Tensor unused = t.redistribute({Shard{1}, Replicate{}}) + 1.0;
  unused = Tensor();  // dropped before anything looked at it: it never runs, as nothing uses it
  CAPTURE(comm.generate_comm_debug_tracing_table());
  CHECK(comm.get_comm_counts() == std::map<std::string, int64_t>{{"all_gather", 2}});  // over x, then y
  // Both values are computed, in one program; looking at them (or reading again) runs nothing.
  const int64_t programs = driver_stats().executables_built + driver_stats().executable_cache_hits;
  CHECK(same_array(to_array(gathered), a));
  CHECK(to_array(doubled).element_as_double(7 * 6 + 5) == 2.0 * (7 * 6 + 5));
  CHECK(driver_stats().executables_built + driver_stats().executable_cache_hits == programs);
  CHECK(comm.get_total_counts() == 2);
  // A value built before the mode is not computed by reading the counts; it counts when it
  // runs: its gather over x, then full_tensor's over y.
  CHECK(comm.get_total_counts() == 2);
  CHECK(same_array(before.full_tensor(), a));
  CHECK(comm.get_total_counts() == 4);
}

TEST_CASE("a forward alone is counted at its modules, nested in the table") {
  Mesh mesh = create_mesh({{"tp", 4}});
  Tensor x = copy_to_mesh(iota({4, 6}), Layout::replicated(mesh, 2));
  Tensor w1 = copy_to_mesh(iota({6, 8}), Layout({UNSHARDED, "tp"}, mesh));  // colwise
  Tensor w2 = copy_to_mesh(iota({8, 3}), Layout({"tp", UNSHARDED}, mesh));  // rowwise
  CommDebugMode comm;
  Tensor y;
  int line = 0;
  {
    CommModuleScope model("model");
    Tensor h;
    {
      CommModuleScope fc1("fc1");
      h = relu(matmul(x, w1));
    }
    CommModuleScope fc2("fc2");
    line = __LINE__ + 1;
    y = matmul(h, w2).redistribute({Replicate{}});
  }
  const std::vector<CollectiveRecord> records = comm.records();
  REQUIRE(records.size() == 1);  // Megatron's MLP: one all_reduce, as PyTorch counts it
  CHECK(records[0].kind == "all_reduce");
  CHECK(records[0].module == "model.fc2");
  CHECK(records[0].source_line == here(line));
  const std::string table = comm.generate_comm_debug_tracing_table();
  CAPTURE(table);
  CHECK(table.find("\n  model: 1 collective,") != std::string::npos);
  CHECK(table.find("\n    model.fc2: 1 collective,") != std::string::npos);
  y.full_tensor();
  CHECK(comm.get_total_counts() == 1);
}

TEST_CASE("a grad() alone counts what computing the gradients runs") {
  Mesh mesh = create_mesh({{"dp", 2}, {"tp", 2}});
  auto build = [&] {
    Tensor x = copy_to_mesh(iota({8, 6}), Layout({"dp", UNSHARDED}, mesh));
    Tensor w = copy_to_mesh(iota({6, 4}), Layout({UNSHARDED, "tp"}, mesh));
    Tensor loss = reduce_sum(relu(matmul(x, w)) * 0.01);
    return std::pair{w, gradients(loss, {w})[0]};
  };
  std::vector<CollectiveRecord> counted_on_read;
  Array read_value;
  {
    CommDebugMode comm;
    auto [w, dw] = build();
    counted_on_read = comm.records();
    dw.components();  // this device's blocks: nothing more runs
    CHECK(comm.records() == counted_on_read);
    read_value = dw.full_tensor();
  }
  // The same gradient computed explicitly: the same collectives, the same value.
  std::vector<CollectiveRecord> counted_forcing;
  {
    auto [w, dw] = build();
    CommDebugMode comm;
    dw.components();
    counted_forcing = comm.records();
    CHECK(same_array(dw.full_tensor(), read_value));
  }
  CHECK(!counted_on_read.empty());
  CHECK(counted_on_read.size() == counted_forcing.size());
  for (size_t i = 0; i < std::min(counted_on_read.size(), counted_forcing.size()); ++i) {
    CHECK(counted_on_read[i].kind == counted_forcing[i].kind);
    CHECK(counted_on_read[i].bytes == counted_forcing[i].bytes);
  }
}

TEST_CASE("reading the counts inside a jit trace computes nothing of the trace") {
  Mesh mesh = create_mesh({{"x", 4}});
  CommDebugMode comm;
  int64_t seen_inside = -1;
  auto step = jit([&](const Tensor& t) {
    Tensor r = t.redistribute({Replicate{}});
    seen_inside = comm.get_total_counts();  // the traced value has no value to compute
    return r;
  });
  Tensor t = copy_to_mesh(iota({8, 2}), Layout({"x", UNSHARDED}, mesh));
  Tensor r = step(t);
  CHECK(seen_inside == 0);
  CHECK(comm.get_total_counts() == 1);
  to_array(r);
  CHECK(comm.get_total_counts() == 1);
}

TEST_CASE("the reports go to files; an unwritable path is an IOError naming it") {
  Mesh mesh = create_mesh({{"x", 2}, {"y", 2}});
  Tensor r = copy_to_mesh(iota({4, 2}), Layout({"x", UNSHARDED}, mesh)).redistribute({Replicate{}, Replicate{}});
  CommDebugMode comm;
  to_array(r);
  const std::string dir = std::string(TESSERA_TEST_BUILD_DIR);
  comm.log_comm_debug_tracing_table_to_file(dir + "/comm_trace_table.txt", 1);
  comm.generate_json_dump_to_file(dir + "/comm_trace.json");
  CHECK(read_file(dir + "/comm_trace_table.txt") == comm.generate_comm_debug_tracing_table(1));
  CHECK(read_file(dir + "/comm_trace.json") == comm.generate_json_dump());
  const std::string bad = "/nonexistent-tessera-dir/sub/trace.txt";
  CHECK_THROWS_WITH_AS(comm.log_comm_debug_tracing_table_to_file(bad), doctest::Contains(bad.c_str()), IOError);
  CHECK_THROWS_WITH_AS(comm.generate_json_dump_to_file(bad), doctest::Contains(bad.c_str()), IOError);
}
