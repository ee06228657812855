#include <doctest/doctest.h>

#include <cstdlib>

#include <tessera/tessera.hpp>

#include "jit/backend_registry.hpp"

using namespace tessera;

TEST_CASE("create_mesh: the overview's 1-D and 3x2 meshes") {
  Mesh mesh_1d = create_mesh({{"x", 6}}, cpu_devices(6));
  CHECK(mesh_1d.to_string() == "|x=6|0,1,2,3,4,5|0,1,2,3,4,5|CPU:0,CPU:1,CPU:2,CPU:3,CPU:4,CPU:5");
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  CHECK(mesh.dim_names() == std::vector<std::string>{"x", "y"});
  CHECK(mesh.shape() == std::vector<int64_t>{3, 2});
  CHECK(mesh.dim_size("y") == 2);
  CHECK(mesh.size() == 6);
  CHECK(mesh.ndim() == 2);
  CHECK(mesh.contains_dim("x"));
  CHECK_FALSE(mesh.contains_dim("z"));
  CHECK(mesh.device_type() == "CPU");
  CHECK(mesh.num_local_devices() == 6);
  CHECK(mesh.local_devices() == cpu_devices(6));
  CHECK(mesh.global_device_ids() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(mesh.local_device_ids() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("strides, coords and device_location follow TF's unravel_index") {
  Mesh mesh = create_mesh({{"a", 2}, {"b", 3}, {"c", 4}});
  CHECK(mesh.strides() == std::vector<int64_t>{12, 4, 1});
  CHECK(mesh.coords(0) == std::vector<int64_t>{0, 0, 0});
  CHECK(mesh.coords(23) == std::vector<int64_t>{1, 2, 3});
  CHECK(mesh.coords(17) == std::vector<int64_t>{1, 1, 1});
  Mesh m32 = create_mesh({{"x", 3}, {"y", 2}});
  CHECK(m32.device_location(3) == std::map<std::string, int64_t>{{"x", 1}, {"y", 1}});
  CHECK(m32.device_location(4) == std::map<std::string, int64_t>{{"x", 2}, {"y", 0}});
  auto all = m32.unravel_index();
  CHECK(all.size() == 6);
  CHECK(all[5] == std::map<std::string, int64_t>{{"x", 2}, {"y", 1}});
  CHECK(m32.local_device_locations()[1] == std::map<std::string, int64_t>{{"x", 0}, {"y", 1}});
  CHECK(m32.min_global_device_id() == 0);
  CHECK_FALSE(m32.is_remote());
  CHECK(m32.host_mesh() == m32);
}

TEST_CASE("Mesh string round trip in both device spellings") {
  Mesh mesh = create_mesh({{"x", 3}, {"y", 2}});
  CHECK(Mesh::from_string(mesh.to_string()) == mesh);
  std::string long_form =
      "|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,/job:localhost/replica:0/task:0/device:CPU:1";
  Mesh parsed = Mesh::from_string(long_form);
  CHECK(parsed == create_mesh({{"x", 2}}));
  CHECK(parsed.local_devices() == std::vector<std::string>{"/job:localhost/replica:0/task:0/device:CPU:0",
                                                           "/job:localhost/replica:0/task:0/device:CPU:1"});  // as written
  CHECK(parsed.to_string() == long_form);
  Mesh remote = Mesh::from_string("|x=2|0,1|0,1|/job:worker/replica:0/task:1/device:CPU:0,/job:worker/replica:0/task:1/device:CPU:1");
  CHECK(remote.local_devices()[1] == "/job:worker/replica:0/task:1/device:CPU:1");
  CHECK(Mesh::from_string(remote.to_string()) == remote);
  Mesh named = Mesh::from_string("cpu_mesh|x=1|0|0|CPU:0");
  CHECK(named.name() == "cpu_mesh");
  CHECK(named.to_string() == "cpu_mesh|x=1|0|0|CPU:0");
  CHECK(fmt::format("{}", mesh) == "Mesh.from_string(" + mesh.to_string() + ")");
}

TEST_CASE("default meshes take TESSERA_DEVICE_TYPE; GPU devices where there are none are typed errors") {
  CHECK(default_device_type() == "CPU");
  CHECK(create_mesh({{"x", 2}}).local_devices() == cpu_devices(2));
  setenv("TESSERA_DEVICE_TYPE", "TPU", 1);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}}), doctest::Contains("TESSERA_DEVICE_TYPE='TPU'"), MeshError);
  setenv("TESSERA_DEVICE_TYPE", "GPU", 1);
  if (gpu_devices().empty()) {
    CHECK_THROWS_AS(create_mesh({{"x", 2}}), DeviceError);
    CHECK_THROWS_AS(gpu_devices(2), DeviceError);
  } else {
    CHECK(create_mesh({{"x", 2}}).local_devices() == gpu_devices(2));
  }
  unsetenv("TESSERA_DEVICE_TYPE");
  CHECK_THROWS_WITH_AS(gpu_devices(-1), doctest::Contains("cannot be negative"), DeviceError);
}

TEST_CASE("device kinds and capabilities: what dsl/ asks instead of comparing device-type strings") {
  CHECK(device_kind_from_name("CPU") == DeviceKind::CPU);
  CHECK(device_kind_from_name("GPU") == DeviceKind::GPU);
  CHECK(!device_kind_from_name("cpu"));  // names are exact; init_device_mesh takes PyTorch's spellings
  CHECK(!device_kind_from_name("TPU"));
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::GPU}) CHECK(device_kind_from_name(device_kind_name(kind)) == kind);
  Mesh mesh = create_mesh({{"x", 2}}, cpu_devices(2));
  CHECK(mesh.device_kind() == DeviceKind::CPU);
  CHECK(mesh.device_type() == "CPU");
  // What each backend runs as one library kernel (its Target's library).
  const Target cpu = target_for(DeviceKind::CPU, false);
  CHECK(cpu.device == DeviceKind::CPU);
  CHECK(!cpu.arch.empty());  // LLVM's name of this CPU
  for (LibraryOp op : {LibraryOp::Gemm, LibraryOp::OrderedGemm, LibraryOp::Bf16Gemm, LibraryOp::OrderedBf16Gemm,
                       LibraryOp::AttentionForward, LibraryOp::AttentionGradQ, LibraryOp::AttentionGradKV})
    CHECK(cpu.runs(op));
  CHECK(target_for(DeviceKind::CPU, true).deterministic);
  if (has_backend(DeviceKind::GPU)) {  // no GPU needed to ask the CUDA backend's table
    CHECK_NOTHROW(library_kernel(DeviceKind::GPU, LibraryOp::Gemm));
    CHECK_NOTHROW(library_kernel(DeviceKind::GPU, LibraryOp::AttentionForward));  // backend/cuda/flash_attention.cu
    CHECK_NOTHROW(library_kernel(DeviceKind::GPU, LibraryOp::GroupedGemm));       // backend/cuda/grouped_gemm.cu
    CHECK_NOTHROW(library_kernel(DeviceKind::GPU, LibraryOp::GroupedWeightGradGemm));
    CHECK_THROWS_WITH_AS(library_kernel(DeviceKind::GPU, LibraryOp::OrderedBf16Gemm),
                         doctest::Contains("the GPU backend has no ordered_bf16_gemm kernel"), DeviceError);
  }
  CHECK(DeviceName::parse("/job:localhost/replica:0/task:0/device:GPU:3").kind() == DeviceKind::GPU);
  DeviceName unknown = DeviceName::parse("CPU:0");
  unknown.type = "TPU";
  CHECK_THROWS_WITH_AS(unknown.kind(), doctest::Contains("TPU:0 has no backend"), MeshError);
}

TEST_CASE("Mesh equality") {
  CHECK(create_mesh({{"x", 2}}) == create_mesh({{"x", 2}}));
  CHECK(create_mesh({{"x", 2}}) != create_mesh({{"y", 2}}));
  CHECK(create_mesh({{"x", 2}}) != create_mesh({{"x", 2}}, {"CPU:2", "CPU:3"}));
  CHECK(create_mesh({{"x", 2}, {"y", 1}}) != create_mesh({{"x", 2}}));
}

TEST_CASE("Mesh errors name what is wrong") {
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 3}}, cpu_devices(4)), doctest::Contains("needs 3 devices"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}, {"x", 2}}), doctest::Contains("names dimension 'x' twice"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"", 2}}), doctest::Contains("empty dimension name"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 0}}, {}), doctest::Contains("'x' has size 0"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", -2}}, cpu_devices(1)), doctest::Contains("'x' has size -2"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 1}}, {"TPU:0"}), doctest::Contains("unknown device type 'TPU'"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 1}}, {"GPU:4096"}), doctest::Contains("unknown device 'GPU:4096'"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 1}}, {"CPU:x"}), doctest::Contains("bad device index"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}}, {"CPU:1", "CPU:1"}), doctest::Contains("CPU:1 appears twice"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"unsharded", 2}}), doctest::Contains("reserved"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({}), doctest::Contains("at least one dimension"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("x=2|0,1|0,1|CPU:0,CPU:1"), doctest::Contains("malformed mesh string"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x2|0,1|0,1|CPU:0,CPU:1"), doctest::Contains("'x2' is not name=size"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x=a|0|0|CPU:0"), doctest::Contains("bad size"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,q|0,1|CPU:0,CPU:1"), doctest::Contains("bad global device id 'q'"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0,1|CPU:0"), doctest::Contains("2 local device ids but 1 local devices"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,5|0,1|CPU:0,CPU:1"), doctest::Contains("increment sequentially from 0"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0,1|/job:localhost/device:CPU:0,/jb:/device:CPU:1"),
                       doctest::Contains("malformed device name"), MeshError);
  CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}}, {"CPU:0", "/job:localhost/replica:0/task:0"}),
                       doctest::Contains("no device field"), MeshError);
  Mesh mesh = create_mesh({{"x", 2}});
  CHECK_THROWS_WITH_AS(mesh.dim_size("z"), doctest::Contains("no dimension 'z'"), MeshError);
  CHECK_THROWS_WITH_AS(mesh.coords(2), doctest::Contains("device id 2 is outside"), MeshError);
  CHECK_THROWS_AS(Mesh().size(), MeshError);
  CHECK_THROWS_AS(cpu_devices(0), MeshError);
}

TEST_CASE("init_device_mesh and sub-meshes: mesh[\"dp\"], mesh[{\"dp\", \"tp\"}], usable anywhere a Mesh is") {
  Mesh mesh = init_device_mesh("cpu", {2, 3}, {"dp", "tp"});
  CHECK(mesh.dim_names() == std::vector<std::string>{"dp", "tp"});
  CHECK(mesh.shape() == std::vector<int64_t>{2, 3});
  CHECK(init_device_mesh("CPU", {4}).dim_names() == std::vector<std::string>{"dim0"});
  // Through this client's first local device (CPU:0): the other dims' coordinates are 0.
  Mesh dp = mesh["dp"], tp = mesh["tp"];
  CHECK(dp.shape() == std::vector<int64_t>{2});
  CHECK(dp.local_devices() == std::vector<std::string>{"CPU:0", "CPU:3"});
  CHECK(tp.local_devices() == std::vector<std::string>{"CPU:0", "CPU:1", "CPU:2"});
  CHECK(mesh[{"dp", "tp"}] == mesh);
  Mesh cube = create_mesh({{"a", 2}, {"b", 2}, {"c", 2}});
  Mesh ac = cube[{"a", "c"}];
  CHECK(ac.dim_names() == std::vector<std::string>{"a", "c"});
  CHECK(ac.local_devices() == std::vector<std::string>{"CPU:0", "CPU:1", "CPU:4", "CPU:5"});
  // A computation on a sub-mesh runs on its devices and matches the reference.
  Array a = Array::from<float>({1, 2, 3, 4, 5}, {5});
  Tensor t = distribute_tensor(a, tp, {Shard{0}});
  CHECK(t.to_local().to_vector<float>() == std::vector<float>{1, 2});
  CHECK(reduce_sum(t * 2.0f).full_tensor().to_vector<float>() == std::vector<float>{30});
  CHECK_THROWS_WITH_AS(mesh["pp"], doctest::Contains("no dimension 'pp'"), MeshError);
  CHECK_THROWS_WITH_AS((mesh[{"tp", "dp"}]), doctest::Contains("in the mesh's order"), MeshError);
  CHECK_THROWS_WITH_AS(init_device_mesh("tpu", {2}, {"x"}), doctest::Contains("unknown device type 'tpu'"), MeshError);
  if (gpu_devices().empty()) CHECK_THROWS_AS(init_device_mesh("cuda", {2}, {"x"}), DeviceError);
  CHECK_THROWS_WITH_AS(init_device_mesh("cpu", {2, 2}, {"x"}), doctest::Contains("1 mesh_dim_names for a 2-D shape"), MeshError);
  CHECK_THROWS_AS(init_device_mesh("cpu", {0}, {"x"}), MeshError);
}

TEST_CASE("TF's mesh validation: ids increment sequentially from 0, no device twice, one device type") {
  SUBCASE("global device ids that do not increment sequentially from 0") {
    // A permutation of 0..n-1 is not enough: TF requires the ids in order.
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|1,0|0,1|CPU:0,CPU:1"),
                         doctest::Contains("increment sequentially from 0: position 0 holds 1, expected 0"), MeshError);
    CHECK_THROWS_WITH_AS(Mesh({{"x", 3}}, {0, 2, 1}, {0, 1, 2}, {DeviceName::parse("CPU:0"), DeviceName::parse("CPU:1"), DeviceName::parse("CPU:2")}),
                         doctest::Contains("position 1 holds 2, expected 1 (ids 0,2,1)"), MeshError);
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,5|0,1|CPU:0,CPU:1"), doctest::Contains("position 1 holds 5, expected 1"), MeshError);
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|1,2|1|CPU:0"), doctest::Contains("position 0 holds 1, expected 0"), MeshError);
  }
  SUBCASE("a device or a local device id listed twice") {
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0,1|CPU:0,CPU:0"), doctest::Contains("device CPU:0 appears twice"), MeshError);
    // The same device in its two spellings is still one device.
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0,1|CPU:1,/job:localhost/replica:0/task:0/device:CPU:1"),
                         doctest::Contains("appears twice"), MeshError);
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0,0|CPU:0,CPU:1"), doctest::Contains("local device id 0 appears twice"), MeshError);
    CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}}, {"CPU:1", "CPU:1"}), doctest::Contains("CPU:1 appears twice"), MeshError);
    // In the global device list of a mesh spanning clients.
    const std::string task0 = "/job:worker/replica:0/task:0/device:CPU:0", task1 = "/job:worker/replica:0/task:1/device:CPU:0";
    const std::string twice = "global device " + task0 + " appears twice (ids 0 and 1)";
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0|" + task0 + "|" + task0 + "," + task0), doctest::Contains(twice.c_str()), MeshError);
    const std::string task1_twice = task1 + " appears twice";
    CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}}, {task1, task1}), doctest::Contains(task1_twice.c_str()), MeshError);
    // A local device must be the global device of its id.
    const std::string not_its_own = "local device id 0 is " + task1 + " but the global devices list " + task0 + " as id 0";
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0|" + task1 + "|" + task0 + "," + task1), doctest::Contains(not_its_own.c_str()),
                         MeshError);
  }
  SUBCASE("one device type per mesh") {
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0,1|CPU:0,GPU:1"),
                         doctest::Contains("mesh mixes device types: CPU:0 is a CPU device, GPU:1 a GPU device"), MeshError);
    // Before asking whether the GPU exists: the mix is the fault.
    CHECK_THROWS_WITH_AS(create_mesh({{"x", 2}}, {"CPU:0", "GPU:1"}), doctest::Contains("CPU:0 is a CPU device, GPU:1 a GPU device"),
                         MeshError);
    const std::string cpu = "/job:worker/replica:0/task:0/device:CPU:0", gpu = "/job:worker/replica:0/task:1/device:GPU:0";
    const std::string mixed = cpu + " is a CPU device, " + gpu + " a GPU device";
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|0|" + cpu + "|" + cpu + "," + gpu), doctest::Contains(mixed.c_str()), MeshError);
    CHECK_THROWS_WITH_AS(Mesh::from_string("|x=2|0,1|||" + cpu + "," + gpu), doctest::Contains("mesh mixes device types"), MeshError);
  }
}

TEST_CASE("TF's full device names round-trip through Mesh::from_string and to_string unchanged") {
  const std::string cpu0 = "/job:localhost/replica:0/task:0/device:CPU:0", cpu1 = "/job:localhost/replica:0/task:0/device:CPU:1",
                    cpu2 = "/job:localhost/replica:0/task:0/device:CPU:2", cpu3 = "/job:localhost/replica:0/task:0/device:CPU:3";
  SUBCASE("a 2-device mesh") {
    const std::string text = "|x=2|0,1|0,1|" + cpu0 + "," + cpu1;
    Mesh mesh = Mesh::from_string(text);
    CHECK(mesh.to_string() == text);
    CHECK(mesh.local_devices() == std::vector<std::string>{cpu0, cpu1});
    CHECK(mesh == create_mesh({{"x", 2}}));  // the same devices, spelled another way
    CHECK(Mesh::from_string(mesh.to_string()).to_string() == text);
  }
  SUBCASE("a 2x2 mesh, named, with mixed spellings") {
    const std::string text = "tf_mesh|x=2,y=2|0,1,2,3|0,1,2,3|" + cpu0 + ",CPU:1," + cpu2 + "," + cpu3;
    Mesh mesh = Mesh::from_string(text);
    CHECK(mesh.to_string() == text);
    CHECK(mesh.local_devices() == std::vector<std::string>{cpu0, "CPU:1", cpu2, cpu3});
    CHECK(mesh == create_mesh({{"x", 2}, {"y", 2}}));
    CHECK(mesh["y"].to_string() == "|y=2|0,1|0,1|" + cpu0 + ",CPU:1");  // sub-meshes keep the spelling
  }
  SUBCASE("create_mesh keeps the spelling it was given") {
    CHECK(create_mesh({{"x", 2}}, {cpu0, cpu1}).to_string() == "|x=2|0,1|0,1|" + cpu0 + "," + cpu1);
    CHECK(create_mesh({{"x", 2}}, {cpu0, cpu1}).local_devices() == std::vector<std::string>{cpu0, cpu1});
  }
  CHECK(DeviceName::parse(cpu0).to_string() == cpu0);
  CHECK(DeviceName::parse("CPU:0").to_string() == "CPU:0");
  CHECK(DeviceName::parse(cpu0) == DeviceName::parse("CPU:0"));
}

TEST_CASE("TF's Mesh(devices, dims): the Layout docs' form, ids 0..n-1, all local") {
  Mesh mesh({"CPU:0", "CPU:1", "CPU:2", "CPU:3", "CPU:4", "CPU:5"}, {{"x", 6}});
  CHECK(mesh.to_string() == "|x=6|0,1,2,3,4,5|0,1,2,3,4,5|CPU:0,CPU:1,CPU:2,CPU:3,CPU:4,CPU:5");
  CHECK(mesh == create_mesh({{"x", 6}}));
  Mesh mesh_3x2({"CPU:0", "CPU:1", "CPU:2", "CPU:3", "CPU:4", "CPU:5"}, {{"x", 3}, {"y", 2}});
  CHECK(mesh_3x2.shape() == std::vector<int64_t>{3, 2});
  CHECK(mesh_3x2.local_device_ids() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(Layout({"x", UNSHARDED}, mesh_3x2).num_shards(0) == 3);
  // The docs' own devices: Tessera has no TPU backend.
  CHECK_THROWS_WITH_AS(Mesh({"TPU:0", "TPU:1", "TPU:2", "TPU:3", "TPU:4", "TPU:5"}, {{"x", 6}}),
                       doctest::Contains("malformed device name 'TPU:0': unknown device type 'TPU'"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh({"CPU:0", "CPU:1"}, {{"x", 3}}), doctest::Contains("needs 3 devices"), MeshError);
  CHECK_THROWS_WITH_AS(Mesh({"CPU:0", "CPU:0"}, {{"x", 2}}), doctest::Contains("CPU:0 appears twice"), MeshError);
}
