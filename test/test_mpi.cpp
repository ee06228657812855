// Multi-client tests, run under `mpirun -np 2` and `-np 4`: distributed meshes, redistributes
// across processes against the reference, a contraction sharded across processes (one
// all_reduce), and jit training across clients equal to the single-process result.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mpi.h>

#include <tessera/tessera.hpp>

#include "collective_checks.hpp"
#include "comm/client_group.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/shared_memory_communicator.hpp"
#include "comm/shared_segment.hpp"
#include "file_faults.hpp"
#include "reference_sharding.hpp"
#include "plan_checks.hpp"
#include "training_fixture.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

int local_devices() {
  const char* v = std::getenv("TESSERA_LOCAL_DEVICES");
  return v ? std::atoi(v) : 1;
}

// Meshes over all clients' devices: 1-D, and 2-D both ways round.
std::vector<Mesh> spanning_meshes() {
  const int n = num_clients() * local_devices();
  std::vector<Mesh> out = {create_distributed_mesh({{"x", n}})};
  if (n % 2 == 0) {
    out.push_back(create_distributed_mesh({{"x", 2}, {"y", n / 2}}));
    out.push_back(create_distributed_mesh({{"x", n / 2}, {"y", 2}}));
  }
  return out;
}

// TF's full name of the job's device `d`: client d / local_devices()'s CPU d % local_devices().
std::string worker_device(int d) {
  return "/job:worker/replica:0/task:" + std::to_string(d / local_devices()) + "/device:CPU:" + std::to_string(d % local_devices());
}

// The job's devices in global order.
std::vector<std::string> worker_devices() {
  std::vector<std::string> out;
  for (int d = 0; d < num_clients() * local_devices(); ++d) out.push_back(worker_device(d));
  return out;
}

// Two pipeline halves, each a 1-D mesh over half of the job's devices (the first half's devices,
// then the second's), so that each half's device 0 is on another client.
std::pair<Mesh, Mesh> pipeline_halves(int n) {
  std::vector<std::string> first, second;
  for (int d = 0; d < n; ++d) (d < n / 2 ? first : second).push_back(worker_device(d));
  return {create_mesh({{"dp", n / 2}}, first), create_mesh({{"dp", n / 2}}, second)};
}

// A 1-D mesh over the devices `global` in which this client claims the devices `local_ids`, as
// TF's Mesh(dim_names, global_device_ids, local_device_ids, local_devices, global_devices) makes it.
Mesh claimed_mesh(const std::vector<std::string>& global, const std::vector<int64_t>& local_ids) {
  std::vector<int64_t> ids;
  std::vector<DeviceName> global_names, local_names;
  for (size_t d = 0; d < global.size(); ++d) {
    ids.push_back(int64_t(d));
    global_names.push_back(DeviceName::parse(global[d]));
  }
  for (int64_t id : local_ids) local_names.push_back(global_names[size_t(id)]);
  return Mesh({{"x", int64_t(global.size())}}, ids, local_ids, local_names, "", global_names);
}

// This client's device ids in the job's global order.
std::vector<int64_t> own_device_ids() {
  std::vector<int64_t> out;
  for (int k = 0; k < local_devices(); ++k) out.push_back(client_id() * local_devices() + k);
  return out;
}

// The message of the MeshError that `use` raises; "" when it raises none.
template <class Use>
std::string mesh_error_of(Use use) {
  try {
    use();
  } catch (const MeshError& e) {
    return e.what();
  }
  return "";
}

// Runs something on `mesh`: a sharded iota gathered back.
std::vector<int32_t> gathered_iota(const Mesh& mesh) {
  std::vector<int32_t> values(size_t(2 * mesh.size()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = int32_t(i + 1);
  return copy_to_mesh(Array::from<int32_t>(values, {int64_t(values.size())}), Layout({"x"}, mesh)).full_tensor().to_vector<int32_t>();
}

}  // namespace

TEST_CASE("a distributed mesh spans every client") {
  if (local_devices() != 1) return;  // written for one device per client
  const int n = num_clients();
  CHECK(n == std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE") ? std::getenv("OMPI_COMM_WORLD_SIZE") : "1"));
  Mesh mesh = create_distributed_mesh({{"x", n}});
  CHECK(mesh.size() == n);
  CHECK(mesh.num_local_devices() == 1);
  CHECK(mesh.local_device_ids() == std::vector<int64_t>{client_id()});
  CHECK(mesh.local_devices()[0] == "/job:worker/replica:0/task:" + std::to_string(client_id()) + "/device:CPU:0");
  CHECK(Mesh::from_string(mesh.to_string()) == mesh);
}

TEST_CASE("create_mesh with an explicit global device list keeps this client's devices") {
  const int n = num_clients() * local_devices();
  Mesh explicit_mesh = create_mesh({{"x", n}}, worker_devices());
  CHECK(explicit_mesh == create_distributed_mesh({{"x", n}}));
  CHECK(explicit_mesh.num_local_devices() == local_devices());
  Tensor t = copy_to_mesh(Array{1, 2, 3, 4, 5, 6, 7, 8}, Layout({"x"}, explicit_mesh));
  CHECK(t.full_tensor().to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("checkpoints across clients: saved once, loadable into any mesh") {
  const int n = num_clients() * local_devices();
  Mesh mesh = create_distributed_mesh({{"x", n}});
  const std::string dir = "/tmp/tessera-mpi-ckpt-" + std::to_string(gather_from_clients(uint64_t(getpid()))[0]);
  std::map<std::string, Variable> saved = {{"w", Variable(random_normal({7, 5}, 3, Layout({"x", UNSHARDED}, mesh)))},
                                           {"b", Variable(random_normal({5}, 4, Layout::replicated(mesh, 1)))}};
  save(dir, saved);
  // Into this client's own single-device mesh...
  Mesh own = create_mesh({{"x", 1}});
  std::map<std::string, Variable> local = {{"w", Variable(zeros({7, 5}, Layout::replicated(own, 2)))},
                                           {"b", Variable(zeros({5}, Layout::replicated(own, 1)))}};
  load(dir, local);
  // ...and into the distributed mesh in another layout.
  std::map<std::string, Variable> other = {{"w", Variable(zeros({7, 5}, Layout({UNSHARDED, "x"}, mesh)))},
                                           {"b", Variable(zeros({5}, Layout({"x"}, mesh)))}};
  load(dir, other);
  for (const std::string name : {"w", "b"}) {
    CAPTURE(name);
    Array expected = saved.at(name).value().full_tensor();
    CHECK(same_array(to_array(local.at(name).value()), expected));
    CHECK(same_array(other.at(name).value().full_tensor(), expected));
  }
  wait_for_all_clients("test cleanup");
  if (client_id() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("checkpoints of pipeline stages on meshes of their own across clients: each stage's data in files of its own") {
  const int n = num_clients() * local_devices();
  if (n % 2 != 0) return;
  // Each stage's device 0 is on another client, and both used to write a file named after
  // device 0, one over the other.
  const auto [stage0, stage1] = pipeline_halves(n);
  const Mesh all = create_distributed_mesh({{"x", n}});
  Array a({6, 4}, DType::f32), b({6, 4}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = float(i), b.mutable_data<float>()[i] = float(100 + i);
  std::map<std::string, Variable> saved = {{"stage0.w", Variable(distribute_tensor(a, stage0, {Shard{0}}, -1))},
                                           {"stage1.w", Variable(distribute_tensor(b, stage1, {Shard{0}}, -1))}};  // every client has the data
  const std::string dir = "/tmp/tessera-mpi-stages-" + std::to_string(gather_from_clients(uint64_t(getpid()))[0]);
  save(dir, saved);
  std::map<std::string, Variable> loaded = {{"stage0.w", Variable(zeros({6, 4}, Layout({UNSHARDED, "x"}, all)))},
                                            {"stage1.w", Variable(zeros({6, 4}, Layout({"x", UNSHARDED}, all)))}};
  load(dir, loaded);
  CHECK(same_array(loaded.at("stage0.w").value().full_tensor(), a));
  CHECK(same_array(loaded.at("stage1.w").value().full_tensor(), b));
  wait_for_all_clients("test cleanup");
  if (client_id() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("a save that fails on one client fails on every client with its IOError, and no client's files stay") {
  const int n = num_clients() * local_devices();
  Mesh mesh = create_distributed_mesh({{"x", n}});
  const std::string dir = "/tmp/tessera-mpi-failed-save-" + std::to_string(gather_from_clients(uint64_t(getpid()))[0]);
  std::map<std::string, Variable> vars = {{"w", Variable(random_normal({8, 64}, 3, Layout({"x", UNSHARDED}, mesh)))}};
  save(dir, vars);
  wait_for_all_clients("the first save");
  const std::map<std::string, std::string> previous = folder_contents(dir);
  wait_for_all_clients("looking at the first save");  // before anyone starts the next
  {
    // The last client's disk is full: its data file (of 8 / n rows of 64 floats) cannot be written.
    std::optional<FileSizeLimit> full;
    if (client_id() == num_clients() - 1) full.emplace(512);
    const std::string failing = "client " + std::to_string(num_clients() - 1) + ": writing checkpoint file";
    CHECK_THROWS_WITH_AS(save(dir, vars), doctest::Contains(failing.c_str()), IOError);
  }
  wait_for_all_clients("the failed save");
  CHECK(folder_contents(dir) == previous);
  wait_for_all_clients("test cleanup");
  if (client_id() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("clients that disagree on the mesh all get a MeshError") {
  if (local_devices() != 1) return;
  const int n = num_clients();
  auto dims = client_id() == n - 1 ? std::vector<std::pair<std::string, int64_t>>{{"y", n}}
                                   : std::vector<std::pair<std::string, int64_t>>{{"x", n}};
  const std::string differ = "ranks " + std::to_string(n - 1);
  CHECK_THROWS_WITH_AS(create_distributed_mesh(dims), doctest::Contains(differ.c_str()), MeshError);
  CHECK_THROWS_WITH_AS(create_distributed_mesh({{"x", n + 1}}), doctest::Contains("clients x 1 local devices"), MeshError);
}

TEST_CASE("clients listing a mesh's global devices in different orders all get a MeshError naming both orders") {
  const int n = num_clients() * local_devices();
  auto turned = [](int client) {  // client `client`'s order: the job's devices turned by its rank
    std::vector<std::string> devices = worker_devices();
    std::rotate(devices.begin(), devices.begin() + client, devices.end());
    return devices;
  };
  auto text = [](const std::vector<std::string>& devices) {
    std::string out;
    for (const std::string& d : devices) out += (out.empty() ? "" : ",") + d;
    return out;
  };
  const std::string mine = text(turned(client_id())), other = text(turned(client_id() == 0 ? 1 : 0));
  const std::string message = mesh_error_of([&] { (void)gathered_iota(create_mesh({{"x", n}}, turned(client_id()))); });
  CAPTURE(message);
  CHECK(message.find("different orders") != std::string::npos);
  CHECK(message.find("this client (" + std::to_string(client_id()) + "): " + mine) != std::string::npos);
  CHECK(message.find("client " + std::to_string(client_id() == 0 ? 1 : 0) + ": " + other) != std::string::npos);
  // Listed alike, the same devices make a mesh that runs.
  std::vector<int32_t> expected(size_t(2 * n));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = int32_t(i + 1);
  CHECK(gathered_iota(create_mesh({{"x", n}}, worker_devices())) == expected);
}

TEST_CASE("clients claiming the same device, or a device no client owns, all get a MeshError before anything runs") {
  const std::vector<std::string> devices = worker_devices();
  SUBCASE("every client claims client 0's devices") {
    std::vector<int64_t> first;
    for (int k = 0; k < local_devices(); ++k) first.push_back(k);
    const std::string message = mesh_error_of([&] { (void)gathered_iota(claimed_mesh(devices, first)); });
    CAPTURE(message);
    CHECK(message.find("mesh device id 0 (" + devices[0] + ") is local to clients 0, 1") != std::string::npos);
    CHECK(message.find("local_device_ids overlap") != std::string::npos);
  }
  SUBCASE("the last client claims its own devices and device 0") {
    std::vector<int64_t> mine = own_device_ids();
    if (client_id() == num_clients() - 1) mine.insert(mine.begin(), 0);
    const std::string message = mesh_error_of([&] { (void)gathered_iota(claimed_mesh(devices, mine)); });
    CAPTURE(message);
    const std::string clients = "is local to clients 0, " + std::to_string(num_clients() - 1);
    CHECK(message.find("mesh device id 0 (" + devices[0] + ") " + clients) != std::string::npos);
  }
  SUBCASE("the last client leaves its devices out") {
    const std::vector<int64_t> mine = client_id() == num_clients() - 1 ? std::vector<int64_t>{} : own_device_ids();
    const int64_t unclaimed = int64_t(num_clients() - 1) * local_devices();
    const std::string message = mesh_error_of([&] { (void)gathered_iota(claimed_mesh(devices, mine)); });
    CAPTURE(message);
    CHECK(message.find("mesh device id " + std::to_string(unclaimed) + " (" + devices[size_t(unclaimed)] + ") is local to no client") !=
          std::string::npos);
  }
  SUBCASE("a device of a task the job does not have") {
    std::vector<std::string> more = devices;
    const std::string missing = "/job:worker/replica:0/task:" + std::to_string(num_clients()) + "/device:CPU:0";
    more.push_back(missing);
    const std::string message = mesh_error_of([&] { (void)gathered_iota(claimed_mesh(more, own_device_ids())); });
    CAPTURE(message);
    const std::string owner = "mesh device id " + std::to_string(devices.size()) + " (" + missing + ") is on task " +
                              std::to_string(num_clients()) + ", but the job has " + std::to_string(num_clients()) + " clients";
    CHECK(message.find(owner) != std::string::npos);
  }
  // The same devices, each claimed by its own client, make a mesh that runs.
  std::vector<int32_t> expected(2 * devices.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = int32_t(i + 1);
  CHECK(gathered_iota(claimed_mesh(devices, own_device_ids())) == expected);
}

TEST_CASE("relayout across processes matches the reference, bitwise") {
  std::mt19937 rng(77);  // the same draws on every client
  for (const Mesh& mesh : spanning_meshes()) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<int64_t> shape = {int64_t(rng() % 7), int64_t(1 + rng() % 6)};
      Array global = random_array(shape, trial % 2 ? DType::i32 : DType::f32, rng);
      Layout l1 = random_layout(mesh, 2, rng), l2 = random_layout(mesh, 2, rng);
      CAPTURE(l1.to_string());
      CAPTURE(l2.to_string());
      Tensor moved = relayout(copy_to_mesh(global, l1), l2);
      auto locals = unpack(moved);
      for (size_t i = 0; i < locals.size(); ++i)
        CHECK(same_array(locals[i], reference_component(global, l2, mesh.coords(mesh.local_device_ids()[i]))));
      CHECK(same_array(moved.full_tensor(), global));
    }
  }
}

TEST_CASE("every collective through the MPI and the shared-memory backend") {
  if (local_devices() != 1) return;
  for (bool shared : {false, true}) {
    CAPTURE(shared);
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    std::shared_ptr<Communicator> c = shared ? make_shared_memory_communicator(dup, 64) : make_mpi_communicator(dup);
    REQUIRE(c);  // mpirun starts every client on this machine
    check_all_reduce(*c);
    check_uneven_collectives(*c);
    check_all_to_all_regions(*c);
    if (shared) CHECK(check_mismatches_raise(*c) == 2);  // MPI itself cannot tell
  }
}

TEST_CASE("group buffers: the same memory on every client, back in the pool once all drop it") {
  if (local_devices() != 1) return;
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  std::shared_ptr<Communicator> c = make_shared_memory_communicator(dup, 64);
  REQUIRE(c);
  std::shared_ptr<std::byte[]> shared = c->allocate_group_buffer(1000);
  REQUIRE(shared);
  auto* slots = reinterpret_cast<int32_t*>(shared.get());
  slots[c->rank()] = 10 + c->rank();
  c->barrier();
  for (int r = 0; r < c->size(); ++r) CHECK(slots[r] == 10 + r);
  // More than the pool holds: null on every client alike (they then gather the usual way).
  CHECK(c->allocate_group_buffer(int64_t(1) << 40) == nullptr);
  // 40 x 10 MB through a 64 MB pool: only works if dropped buffers return to it.
  for (int i = 0; i < 40; ++i) {
    std::shared_ptr<std::byte[]> big = c->allocate_group_buffer(int64_t(10) << 20);
    REQUIRE(big);
    big[size_t(c->rank())] = std::byte(i);
    c->barrier();
    CHECK(big[0] == std::byte(i));
    big.reset();
  }
  c->barrier();
  // Clients out of step (each names another gather): whoever asks second gets an InternalError
  // instead of the other's memory.
  int32_t threw = 0, total = 0;
  try {
    (void)c->allocate_group_buffer(4096, 7 + uint64_t(c->rank()));
  } catch (const InternalError& e) {
    threw = 1;
    CHECK(std::string(e.what()).find("fell out of step") != std::string::npos);
  }
  c->all_reduce(&threw, &total, 1, DType::i32, ReduceOp::Sum);
  CHECK(total == c->size() - 1);
}

TEST_CASE("shared-memory segments have random names: one pre-created under the old predictable name does not push the group onto MPI") {
  // The name used to be /tessera-<rank 0's pid>-<count>: another local user could make it
  // first, and the group then ran on MPI (3.4x slower) without a word.
  const uint64_t rank0_pid = gather_from_clients(uint64_t(getpid()))[0];
  struct Squatted {  // removed however the case ends
    std::vector<std::string> names;
    ~Squatted() {
      for (const std::string& name : names) shm_unlink(name.c_str());
    }
  } squatted;
  if (client_id() == 0)
    for (int count = 0; count < 200; ++count) {
      const std::string name = "/tessera-" + std::to_string(rank0_pid) + "-" + std::to_string(count);
      const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd >= 0) close(fd), squatted.names.push_back(name);
    }
  wait_for_all_clients("squatting the old names");
  // The group's communicator, as a mesh gets it: shared memory (its group buffers are shared)
  // unless TESSERA_SHARED_MEMORY=0 keeps it on MPI, as documented.
  const char* setting = std::getenv("TESSERA_SHARED_MEMORY");
  const bool shared_memory_wanted = !(setting && std::string(setting) == "0");
  std::shared_ptr<Communicator> c = world_clients().communicator(1);
  CHECK((c->allocate_group_buffer(64) != nullptr) == shared_memory_wanted);
  c.reset();
  // Two segments: names of 32 random hex digits, different, naming no process.
  MPI_Comm first, second;
  MPI_Comm_dup(MPI_COMM_WORLD, &first);
  MPI_Comm_dup(MPI_COMM_WORLD, &second);
  {
    const auto a = SharedSegment::create(first, 4096), b = SharedSegment::create(second, 4096);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->name().size() == std::string("/tessera-").size() + 32);
    CHECK(a->name() != b->name());
    CHECK(a->name().rfind("/tessera-" + std::to_string(rank0_pid) + "-", 0) != 0);
    const std::vector<uint64_t> names = gather_from_clients(uint64_t(std::hash<std::string>{}(a->name())));
    CHECK(std::all_of(names.begin(), names.end(), [&](uint64_t n) { return n == names[0]; }));  // one for the group
  }
  MPI_Comm_free(&first);
  MPI_Comm_free(&second);
}

TEST_CASE("a shared-memory segment that cannot be made is a CommError on every client naming it and why, not a silent fall back") {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  // 1 PiB: more than /dev/shm holds, as a full /dev/shm would refuse a small one.
  const size_t too_much = size_t(1) << 50;
  CHECK_THROWS_WITH_AS(SharedSegment::create(dup, too_much), doctest::Contains("shared-memory segment /dev/shm/tessera-"), CommError);
  CHECK_THROWS_WITH_AS(SharedSegment::create(dup, too_much), doctest::Contains("on rank 0 failed: "), CommError);
  MPI_Comm_free(&dup);
}

TEST_CASE("Partial values reduce across processes") {
  if (local_devices() != 1) return;
  const int n = num_clients();
  Mesh mesh = create_distributed_mesh({{"x", n}});
  Tensor p = from_local(Array{float(client_id() + 1), -1.0f}, mesh, {Partial{ReduceOp::Sum}});
  CHECK(p.full_tensor().to_vector<float>() == std::vector<float>{float(n * (n + 1) / 2), float(-n)});
  Tensor m = from_local(Array{float(client_id())}, mesh, {Partial{ReduceOp::Max}});
  CHECK(m.redistribute({Replicate{}}).to_local().to_vector<float>()[0] == float(n - 1));
}

TEST_CASE("a matmul contracted across processes needs exactly one all_reduce") {
  const int n = num_clients() * local_devices();
  Mesh mesh = create_distributed_mesh({{"x", n}});
  Array a({4, 6}, DType::f32), b({6, 3}, DType::f32);
  for (int i = 0; i < 24; ++i) a.mutable_data<float>()[i] = float(i % 5) - 2;
  for (int i = 0; i < 18; ++i) b.mutable_data<float>()[i] = float(i % 4) - 1;
  Tensor ta = copy_to_mesh(a, Layout({UNSHARDED, "x"}, mesh)), tb = copy_to_mesh(b, Layout({"x", UNSHARDED}, mesh));
  CommDebugMode comm;
  Array c = to_array(matmul(ta, tb));
  CHECK(comm.counts() == std::map<std::string, int64_t>{{"all_reduce", 1}});
  Mesh local = create_mesh({{"x", 1}});
  CHECK(same_array(c, to_array(matmul(copy_to_mesh(a, Layout::replicated(local, 2)), copy_to_mesh(b, Layout::replicated(local, 2))))));
}

TEST_CASE("jit training across clients gives the single-process losses") {
  const int steps = 10;
  Mesh one = create_mesh({{"batch", 1}}), spread_mesh = create_distributed_mesh({{"batch", num_clients() * local_devices()}});
  std::vector<float> single = train_losses(one, Layout::replicated(one, 2), Layout::replicated(one, 2), "batch", steps);
  std::vector<float> spread = train_losses(spread_mesh, Layout::replicated(spread_mesh, 2), Layout::replicated(spread_mesh, 2), "batch", steps);
  for (int s = 0; s < steps; ++s) CHECK(spread[s] == doctest::Approx(single[s]).epsilon(1e-5));
}

TEST_CASE("clients building different programs get a CommError naming the ranks") {
  if (local_devices() != 1) return;
  const int n = num_clients();
  Mesh mesh = create_distributed_mesh({{"x", n}});
  Tensor t = ones({4, 2}, Layout({"x", UNSHARDED}, mesh));
  Tensor different = client_id() == n - 1 ? t * 3.0 : t + 1.0;  // a divergent program
  const std::string ranks = "ranks " + std::to_string(n - 1);
  CHECK_THROWS_WITH_AS(different.full_tensor(), doctest::Contains(ranks.c_str()), CommError);
}

int main(int argc, char** argv) {
  init(argc, argv);
  doctest::Context context(argc, argv);
  if (client_id() != 0) context.setOption("success", false);
  return context.run();
}

TEST_CASE("distribute_tensor takes the data of src_data_rank on every client") {
  const int me = client_id();
  for (const Mesh& mesh : spanning_meshes()) {
    CAPTURE(mesh.to_string());
    // Each client holds different data; client 0's (or the last client's) is the one used.
    Array mine = Array::from<float>({float(me), float(me) + 0.5f, 2, 3, 4, 5, 6}, {7});
    for (int src : {0, num_clients() - 1}) {
      Array want = Array::from<float>({float(src), float(src) + 0.5f, 2, 3, 4, 5, 6}, {7});
      for (std::vector<Placement> p : {std::vector<Placement>{}, std::vector<Placement>(size_t(mesh.ndim()), Shard{0})}) {
        Tensor t = distribute_tensor(me == src ? mine : Array(std::vector<int64_t>{0}, DType::f32), mesh, p, src);
        CHECK(same_array(t.full_tensor(), want));
      }
    }
    // A negative src_data_rank keeps each client's own data (PyTorch's None).
    Tensor own = distribute_tensor(mine, mesh, {}, -1);
    CHECK(same_array(own.to_local(), mine));
    CHECK_THROWS_WITH_AS(distribute_tensor(mine, mesh, {}, num_clients()), doctest::Contains("is not a client of the mesh"), MeshError);
  }
}

TEST_CASE("from_local(run_check) checks shapes across clients and broadcasts Replicate data from the first rank") {
  const int me = client_id();
  const int n = num_clients() * local_devices();
  if (n % 2 != 0) return;
  Mesh mesh = create_distributed_mesh({{"dp", 2}, {"tp", n / 2}});
  // Replicate over dp, Shard over tp: without the check each client keeps its own values and
  // the full tensor mixes them; with it, coordinate 0 of dp wins.
  Array local = Array::from<float>({float(me), float(me)}, {1, 2});
  Tensor checked = from_local(local, mesh, {Replicate{}, Shard{0}}, std::nullopt, true);
  Array full = checked.full_tensor();
  CHECK(full.shape() == std::vector<int64_t>{n / 2, 2});
  for (int64_t row = 0; row < n / 2; ++row) {
    // Row `row` comes from the device at (dp 0, tp row), whose client is row / local_devices().
    const float owner = float(row / local_devices());
    CHECK(full.to_vector<float>()[size_t(2 * row)] == owner);
  }
  // Shapes that do not fit the layout raise on every client, naming the culprit.
  Array odd = me == num_clients() - 1 ? Array::from<float>({1, 2, 3}, {1, 3}) : local;
  if (num_clients() > 1)
    CHECK_THROWS_WITH_AS(from_local(odd, mesh, {Replicate{}, Shard{0}}, std::nullopt, true),
                         doctest::Contains(("client " + std::to_string(num_clients() - 1) + " passed a local tensor of shape (1, 3)").c_str()),
                         ShapeError);
  Array wrong_type = me == 0 ? Array::from<int32_t>({1, 2}, {1, 2}) : local;
  if (num_clients() > 1)
    CHECK_THROWS_AS(from_local(wrong_type, mesh, {Replicate{}, Shard{0}}, std::nullopt, true), DTypeError);
}

TEST_CASE("sub-meshes across clients: mesh[\"dp\"] is the group through this client's devices") {
  if (local_devices() != 1 || num_clients() % 2 != 0) return;
  const int me = client_id(), n = num_clients();
  Mesh mesh = init_device_mesh("cpu", {2, n / 2}, {"dp", "tp"});
  Mesh dp = mesh["dp"], tp = mesh["tp"];
  CHECK(dp.size() == 2);
  CHECK(dp.num_local_devices() == 1);
  CHECK(tp.size() == n / 2);
  // Each dp group holds the clients me % (n/2) and that + n/2; a sum over it adds their ids.
  Tensor t = from_local(Array::from<float>({float(me)}, {1}), dp, {Shard{0}});
  const float partner = float(me < n / 2 ? me + n / 2 : me - n / 2);
  CHECK(reduce_sum(t).full_tensor().to_vector<float>() == std::vector<float>{float(me) + partner});
  Tensor across_tp = distribute_tensor(Array::from<float>({1, 2, 3, 4, 5}, {5}), tp, {Shard{0}}, clients_of(tp).front());
  CHECK(reduce_sum(across_tp).full_tensor().to_vector<float>() == std::vector<float>{15});
}

TEST_CASE("redistribute between meshes across clients: one pipeline half to the other, and gradients back") {
  const int n = num_clients() * local_devices();
  if (n % 2 != 0) return;
  auto [stage0, stage1] = pipeline_halves(n);
  Mesh all = create_distributed_mesh({{"x", n}});
  Array a(std::vector<int64_t>{6, 5}, DType::f64);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<double>()[i] = 0.1 * double(i) - 1.0;
  Tensor x = distribute_tensor(a, stage0, {Shard{0}});
  CommDebugMode comm;
  Tensor y = tanh(x).redistribute(stage1, {Shard{1}});      // stage 0 -> stage 1: every byte changes client
  Tensor z = y.redistribute(all, {Replicate{}});            // onto every client, to look at it
  Array got = z.full_tensor();
  CHECK(comm.get_comm_counts().at("mesh_transfer") == 2);
  Tensor g = gradients(reduce_sum(square(z)), {x})[0];
  CHECK(g.device_mesh() == stage0);
  Array grad = g.redistribute(all, {Replicate{}}).full_tensor();
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double t = std::tanh(a.data<double>()[i]);
    CHECK(got.data<double>()[i] == doctest::Approx(t).epsilon(1e-12));
    CHECK(grad.data<double>()[i] == doctest::Approx(2 * t * (1 - t * t)).epsilon(1e-12));
  }
}

TEST_CASE("local_map over uneven shards across clients: blocks of different extents, one program") {
  for (const Mesh& mesh : spanning_meshes()) {
    CAPTURE(mesh.to_string());
    const int64_t ways = mesh.shape()[0];
    Array a({7, 5}, DType::f64);
    for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<double>()[i] = double(i % 11) / 10.0 - 0.5;
    std::vector<Placement> rows(size_t(mesh.ndim()), Replicate{});
    rows[0] = Shard{0};
    Tensor t = distribute_tensor(a, mesh, rows);
    auto f = local_map([](const Tensor& b) {
      Tensor gathered = all_gather(b, "x", 0);  // all 7 rows on every device
      return reduce_scatter(exp(gathered), ReduceOp::Sum, "x", 0) + b * b;
    }, {rows}, {rows}, mesh);
    Tensor out = f(t);
    std::vector<Tensor> grad = gradients(reduce_sum(out), {t});
    Array got = out.full_tensor(), g = grad[0].full_tensor();
    REQUIRE(got.shape() == std::vector<int64_t>{7, 5});
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double x = a.data<double>()[i];
      CHECK(got.data<double>()[i] == doctest::Approx(double(ways) * std::exp(x) + x * x).epsilon(1e-12));
      CHECK(g.data<double>()[i] == doctest::Approx(double(ways) * std::exp(x) + 2 * x).epsilon(1e-12));
    }
  }
}

TEST_CASE("unpack of a tensor moved from a 1-D mesh onto a 2x2 mesh of the same devices across clients, gradient included") {
  const int n = num_clients() * local_devices();
  if (n != 4) return;  // 2 clients x 2 devices, or 4 x 1
  Mesh line = create_distributed_mesh({{"x", 4}});
  Mesh square_mesh = create_distributed_mesh({{"a", 2}, {"b", 2}});
  Array a(std::vector<int64_t>{7, 4}, DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.mutable_data<float>()[i] = 0.5f * float(i) - 3.0f;
  Tensor x = distribute_tensor(a, line, {Shard{0}});
  Tensor y = x.redistribute(square_mesh, {Replicate{}, Shard{0}});
  const Layout layout = Layout::from_placements(square_mesh, {Replicate{}, Shard{0}}, 2);
  const std::vector<Array> parts = unpack(y);
  const std::vector<int64_t> mine = square_mesh.local_device_ids();
  REQUIRE(parts.size() == mine.size());
  for (size_t k = 0; k < parts.size(); ++k)
    CHECK(same_array(parts[k], reference_component(a, layout, square_mesh.coords(mine[k]))));
  CHECK(same_array(y.to_local(), parts.front()));
  Tensor g = gradients(reduce_sum(square(y)), {x})[0];
  CHECK(g.device_mesh() == line);
  const std::vector<float> got = g.full_tensor().to_vector<float>();
  for (int64_t i = 0; i < a.numel(); ++i) CHECK(got[size_t(i)] == 2 * a.data<float>()[i]);
}

TEST_CASE("an index out of range stops the step with an IndexError on every client, and the next step runs") {
  const int n = num_clients() * local_devices();
  Mesh mesh = create_distributed_mesh({{"x", n}});
  Array logits(std::vector<int64_t>{6, 4}, DType::f32);
  Tensor tl = distribute_tensor(logits, mesh, {Shard{0}});
  auto loss_of = [&](std::vector<int32_t> labels) {
    return reduce_mean(sparse_softmax_cross_entropy_with_logits(distribute_tensor(Array::from<int32_t>(labels, {6}), mesh, {Shard{0}}), tl));
  };
  // The bad label lies on the last device's shard: its client finds it, and the executor shares
  // the failure among the mesh's clients, so every client raises it and all go on in step.
  CHECK_THROWS_WITH_AS(loss_of({0, 1, 2, 3, 0, 7}).full_tensor(), doctest::Contains("label 7 is outside the valid range [0, 4)"), IndexError);
  CHECK(loss_of({0, 1, 2, 3, 0, 1}).full_tensor().to_vector<float>()[0] == doctest::Approx(std::log(4.0)));
}

TEST_CASE("all_to_all_v across clients: rows by run-time counts, the round trip, gradients, and bad counts failing everywhere") {
  const int64_t n = num_clients() * local_devices(), rows_per_device = 2 * n, features = 3;
  Mesh mesh = create_distributed_mesh({{"x", n}});
  // counts[i][j] rows from device i to device j: uneven, and device 1 sends nothing.
  auto count = [](int64_t i, int64_t j) { return i == 1 ? int64_t(0) : (i + 2 * j) % 3; };
  std::vector<int64_t> flat;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) flat.push_back(count(i, j));
  Array rows({n * rows_per_device, features}, DType::f64);
  for (int64_t i = 0; i < rows.numel(); ++i) rows.mutable_data<double>()[i] = double(i + 1);
  Tensor x = distribute_tensor(rows, mesh, {Shard{0}});
  auto counts_of = [&](std::vector<int64_t> c) { return distribute_tensor(Array::from<int64_t>(c, {n * n}), mesh, {Shard{0}}); };
  auto step = jit([&](const Tensor& a, const Tensor& c) {
    auto f = local_map([](const Tensor& r, const Tensor& sc) {
      auto [received, recv_counts] = all_to_all_v(r, sc, "x");
      auto [back, back_counts] = all_to_all_v(received, recv_counts, "x", r.shape()[0]);
      return std::make_tuple(received, back);
    }, {{Shard{0}}, {Shard{0}}}, {{Shard{0}}, {Shard{0}}}, mesh);
    auto [received, back] = f(a, c);
    return std::vector<Tensor>{received, back, gradients(reduce_sum(received * received), {a})[0]};
  });
  const int64_t staged = all_to_all_v_bytes_staged();
  std::vector<Tensor> out = step(x, counts_of(flat));
  // On shared memory every exchanged value, forward and backward, was written into a group
  // buffer by the step producing it, and read from there: nothing staged.
  const char* setting = std::getenv("TESSERA_SHARED_MEMORY");
  if (local_devices() == 1 && !(setting && std::string(setting) == "0")) CHECK(all_to_all_v_bytes_staged() == staged);
  const Array received = out[0].full_tensor(), back = out[1].full_tensor(), grad = out[2].full_tensor();
  const int64_t bound = rows_per_device * n;
  for (int64_t j = 0; j < n; ++j) {  // the hand rule: device j gets, from i = 0..n-1, the rows addressed to it
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t start = 0;
      for (int64_t k = 0; k < j; ++k) start += count(i, k);
      for (int64_t r = 0; r < count(i, j); ++r, ++at)
        for (int64_t f = 0; f < features; ++f)
          CHECK(received.data<double>()[(j * bound + at) * features + f] == rows.data<double>()[(i * rows_per_device + start + r) * features + f]);
    }
    for (; at < bound; ++at) CHECK(received.data<double>()[(j * bound + at) * features] == 0.0);
  }
  for (int64_t i = 0; i < n; ++i) {  // back where they were; rows never sent come back zero, with zero gradient
    int64_t sent = 0;
    for (int64_t j = 0; j < n; ++j) sent += count(i, j);
    for (int64_t r = 0; r < rows_per_device; ++r)
      for (int64_t f = 0; f < features; ++f) {
        const int64_t e = (i * rows_per_device + r) * features + f;
        CHECK(back.data<double>()[e] == (r < sent ? rows.data<double>()[e] : 0.0));
        CHECK(grad.data<double>()[e] == (r < sent ? 2 * rows.data<double>()[e] : 0.0));
      }
  }
  // A negative count on the last device: every client raises it, and the next step runs.
  std::vector<int64_t> bad = flat;
  bad.back() = -2;
  CHECK_THROWS_WITH_AS(step(x, counts_of(bad))[0].full_tensor(), doctest::Contains("all_to_all_v: send count -2"), IndexError);
  CHECK(same_array(step(x, counts_of(flat))[1].full_tensor(), back));
}

TEST_CASE("all_to_all_v from group buffers: rows read in place, beside senders that stage, with the same values") {
  if (local_devices() != 1) return;
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  std::shared_ptr<Communicator> c = make_shared_memory_communicator(dup, 64);
  REQUIRE(c);
  CHECK(c->exchanges_from_group_buffers());
  const int n = c->size(), me = c->rank();
  // Rank r sends count(r, p) floats to rank p: uneven, some blocks larger than a staging round
  // (1 MiB over the group), so staged senders take several rounds beside direct ones.
  auto count = [](int r, int p) { return int64_t((r + 2 * p) % 3) * 150000 + 5 + r; };
  std::vector<int64_t> send_counts, recv_counts;
  int64_t block = 0, received = 0;
  for (int p = 0; p < n; ++p) {
    send_counts.push_back(count(me, p));
    recv_counts.push_back(count(p, me));
    received += recv_counts.back();
  }
  for (int r = 0; r < n; ++r) {
    int64_t sent = 0;
    for (int p = 0; p < n; ++p) sent += count(r, p);
    block = std::max(block, sent);
  }
  std::shared_ptr<std::byte[]> group = c->allocate_group_buffer(block * 4 * n);
  REQUIRE(group);
  float* in_group = reinterpret_cast<float*>(group.get() + block * 4 * me);
  std::vector<float> in_private(static_cast<size_t>(block));
  for (int64_t k = 0; k < block; ++k) in_group[k] = in_private[size_t(k)] = float(me * 1000000 + k);
  // 0: every rank's rows in the group buffer; 1: rank 0's in private memory; 2: every rank's.
  for (int mode = 0; mode < 3; ++mode) {
    CAPTURE(mode);
    const bool direct = mode == 0 || (mode == 1 && me != 0);
    std::vector<float> recv(size_t(received), -1.0f);
    const int64_t staged = all_to_all_v_bytes_staged();
    c->all_to_all_v(direct ? in_group : in_private.data(), send_counts, recv.data(), recv_counts, DType::f32);
    CHECK((all_to_all_v_bytes_staged() == staged) == direct);
    int64_t at = 0, wrong = 0;
    for (int src = 0; src < n; ++src) {
      int64_t start = 0;  // where src's rows for this rank begin among its rows
      for (int q = 0; q < me; ++q) start += count(src, q);
      for (int64_t k = 0; k < count(src, me); ++k, ++at) wrong += recv[size_t(at)] != float(src * 1000000 + start + k);
    }
    CHECK(wrong == 0);
  }
  // A count mismatch with every sender in place: each rank raises it, and the group goes on.
  std::vector<int64_t> expected = recv_counts;
  if (me == 0) expected[size_t(n - 1)] += 1;
  std::vector<float> recv(size_t(received + 1));
  CHECK_THROWS_AS(c->all_to_all_v(in_group, send_counts, recv.data(), expected, DType::f32), CommError);
  c->all_to_all_v(in_group, send_counts, recv.data(), recv_counts, DType::f32);
  int64_t first = 0;  // rank 0's first row for this rank
  for (int q = 0; q < me; ++q) first += count(0, q);
  CHECK(recv[0] == float(first));
}

TEST_CASE("a plan's peak bytes and collective bytes are what each client's devices really hold and move") {
  // The samples' training steps on meshes over all clients. The GPT (one block: every block is
  // the same program) data parallel on an uneven batch of 6, tensor parallel with sequence
  // parallelism, FSDP, and both on a 2-D mesh; the MNIST MLP data and tensor parallel.
  const int n = num_clients() * local_devices();
  struct Case {
    std::vector<std::pair<std::string, int64_t>> dims;
    bool sequence_parallel = false, fsdp = false;
  };
  std::vector<Case> cases = {Case{{{"dp", n}}}, Case{{{"tp", n}}, true}, Case{{{"dp", n}}, false, true}};
  if (n % 2 == 0 && n > 2) cases.push_back(Case{{{"dp", 2}, {"tp", n / 2}}, true, true});
  GptConfig config;
  config.vocab = 24, config.context = 12, config.layers = 1, config.width = 16, config.heads = 4;
  for (const Case& c : cases) {
    if (config.heads % c.dims.back().second != 0) continue;
    const Mesh mesh = create_distributed_mesh(c.dims);
    CAPTURE(mesh.to_string());
    CAPTURE(c.sequence_parallel);
    CAPTURE(c.fsdp);
    GptTrainingStep step(config, mesh, c.sequence_parallel, c.fsdp);
    const auto [ids, targets] = gpt_batch(mesh, config, 6);
    check_plan_is_measured(mesh, [&] { return step.plan(ids, targets); }, [&] { (void)step(ids, targets); });
  }
  for (const bool tensor_parallel : {false, true}) {
    const Mesh mesh = create_distributed_mesh({{tensor_parallel ? "model" : "batch", n}});
    CAPTURE(mesh.to_string());
    MnistTrainingStep step(mesh, tensor_parallel);
    check_plan_is_measured(mesh, [&] { return step.plan(); }, [&] { step.run(); });
  }
}
