#include "jit/runtime.hpp"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "comm/mpi_communicator.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"
#include "jit/client_groups.hpp"

namespace tessera {

void release_mpi_communicators();  // mesh_communicators.cpp

namespace {

struct Clients {
  bool mpi = false;
  int count = 1, id = 0;
  int on_this_node = 1;
};

Clients& clients() {
  static Clients c;
  return c;
}

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}

// An exception escaping on one client must end the whole job, not leave the others waiting in
// a collective: print this client's message, then MPI_Abort.
void abort_job() {
  std::string what = "unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
  }
  std::fprintf(stderr, "tessera: client %d failed: %s\n  (ending the job with MPI_Abort)\n", clients().id, what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  release_mpi_communicators();  // sub-communicators must go before MPI_Finalize
  MPI_Finalize();
}

}  // namespace

void init(int& argc, char**& argv) {
  component_logger("jit").debug("tessera initialising");
  if (!launched_by_mpirun()) return;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
      component_logger("comm").warn("MPI provides thread level {} < MPI_THREAD_MULTIPLE: keep one local device per client", provided);
    std::atexit(finalize_mpi);
  }
  std::set_terminate(abort_job);
  Clients& c = clients();
  c.mpi = true;
  MPI_Comm_size(MPI_COMM_WORLD, &c.count);
  MPI_Comm_rank(MPI_COMM_WORLD, &c.id);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.id, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &c.on_this_node);
  MPI_Comm_free(&node);
}

int num_clients() { return clients().count; }
int client_id() { return clients().id; }
int clients_on_this_node() { return clients().on_this_node; }
bool multi_client() { return clients().mpi && clients().count > 1; }

void sum_over_clients(std::vector<int64_t>& values) {
  if (!multi_client() || values.empty()) return;
  MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
}

void wait_for_all_clients(const char* what) {
  if (!multi_client()) return;
  static std::shared_ptr<Communicator> world = make_mpi_communicator(MPI_COMM_WORLD);
  component_logger("comm").debug("all clients meet before {}", what);
  world->barrier();
}

MPI_Comm create_client_group(const std::vector<int>& clients, int tag) {
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, int(clients.size()), clients.data(), &group);
  MPI_Comm comm;
  MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return comm;
}

MPI_Comm cached_client_group(const std::vector<int>& clients) {
  static std::mutex mutex;
  static auto* groups = new std::map<std::vector<int>, MPI_Comm>();
  std::lock_guard lock(mutex);
  auto [it, inserted] = groups->try_emplace(clients, MPI_COMM_NULL);
  if (inserted) it->second = int(clients.size()) == num_clients() ? MPI_COMM_WORLD : create_client_group(clients, 32767);
  return it->second;
}

std::vector<int> clients_of(const Mesh& mesh) {
  std::set<int> owners;
  for (const DeviceName& d : mesh.global_device_names()) owners.insert(int(d.task));
  if (owners.empty()) owners.insert(client_id());  // a single-client mesh lists no global devices
  return std::vector<int>(owners.begin(), owners.end());
}

namespace {
bool is_member(const std::vector<int>& clients) {
  return std::find(clients.begin(), clients.end(), client_id()) != clients.end();
}
}  // namespace

void broadcast_among_clients(const std::vector<int>& clients, std::vector<std::byte>& data, int root) {
  if (!multi_client() || clients.size() < 2 || !is_member(clients)) return;  // a mesh with no device here
  MPI_Comm comm = cached_client_group(clients);
  const int root_rank = int(std::find(clients.begin(), clients.end(), root) - clients.begin());
  uint64_t size = data.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, root_rank, comm);
  data.resize(size);
  constexpr uint64_t kPiece = uint64_t(1) << 30;  // MPI counts are ints
  for (uint64_t at = 0; at < size; at += kPiece)
    MPI_Bcast(data.data() + at, int(std::min(kPiece, size - at)), MPI_BYTE, root_rank, comm);
}

std::map<int, std::vector<std::byte>> exchange_among_clients(const std::vector<int>& clients,
                                                             const std::map<int, std::vector<std::byte>>& outgoing,
                                                             const std::map<int, int64_t>& incoming) {
  std::map<int, std::vector<std::byte>> received;
  if (!multi_client() || clients.size() < 2 || !is_member(clients)) return received;
  const size_t n = clients.size();
  std::vector<int> send_counts(n, 0), send_offsets(n, 0), recv_counts(n, 0), recv_offsets(n, 0);
  std::vector<std::byte> send, recv;
  auto count_of = [](int64_t bytes) {
    if (bytes > std::numeric_limits<int>::max()) throw CommError("exchange_among_clients: more than 2 GiB for one client");
    return int(bytes);
  };
  for (size_t r = 0; r < n; ++r) {
    send_offsets[r] = int(send.size());
    if (auto it = outgoing.find(clients[r]); it != outgoing.end()) {
      send_counts[r] = count_of(int64_t(it->second.size()));
      send.insert(send.end(), it->second.begin(), it->second.end());
    }
    recv_offsets[r] = count_of(int64_t(recv.size()));
    if (auto it = incoming.find(clients[r]); it != incoming.end()) {
      recv_counts[r] = count_of(it->second);
      recv.resize(recv.size() + size_t(it->second));
    }
  }
  MPI_Alltoallv(send.data(), send_counts.data(), send_offsets.data(), MPI_BYTE, recv.data(), recv_counts.data(),
                recv_offsets.data(), MPI_BYTE, cached_client_group(clients));
  for (size_t r = 0; r < n; ++r)
    if (recv_counts[r] > 0)
      received[clients[r]].assign(recv.begin() + recv_offsets[r], recv.begin() + recv_offsets[r] + recv_counts[r]);
  return received;
}

std::vector<int64_t> gather_among_clients(const std::vector<int>& clients, const std::vector<int64_t>& values) {
  if (!multi_client() || clients.size() < 2 || !is_member(clients)) return values;
  std::vector<int64_t> all(values.size() * clients.size());
  MPI_Allgather(values.data(), int(values.size()), MPI_INT64_T, all.data(), int(values.size()), MPI_INT64_T,
                cached_client_group(clients));
  return all;
}

std::vector<uint64_t> gather_from_clients(uint64_t value) {
  if (!multi_client()) return {value};
  wait_for_all_clients("comparing program fingerprints");
  std::vector<uint64_t> all(static_cast<size_t>(num_clients()));
  MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

Mesh init_device_mesh(std::string device_type, std::vector<int64_t> shape, std::vector<std::string> mesh_dim_names) {
  std::string type = device_type;
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  if (type == "CUDA") type = "GPU";
  if (type != "CPU")
    throw MeshError("init_device_mesh: device type '" + device_type + "' has no backend in this build (use \"cpu\")");
  if (shape.empty()) throw MeshError("init_device_mesh: the mesh shape is empty");
  if (mesh_dim_names.empty())
    for (size_t i = 0; i < shape.size(); ++i) mesh_dim_names.push_back("dim" + std::to_string(i));
  if (mesh_dim_names.size() != shape.size())
    throw MeshError("init_device_mesh: " + std::to_string(mesh_dim_names.size()) + " mesh_dim_names for a " +
                    std::to_string(shape.size()) + "-D shape");
  std::vector<std::pair<std::string, int64_t>> dims;
  for (size_t i = 0; i < shape.size(); ++i) dims.emplace_back(mesh_dim_names[i], shape[i]);
  return create_distributed_mesh(std::move(dims), type);
}

Mesh create_distributed_mesh(std::vector<std::pair<std::string, int64_t>> dims, std::string device_type) {
  if (device_type != "CPU") throw MeshError("create_distributed_mesh: device type '" + device_type + "' has no backend in this build");
  int64_t local = 1;
  if (const char* v = std::getenv("TESSERA_LOCAL_DEVICES"); v && *v) local = std::max(1, std::atoi(v));
  if (!multi_client()) {
    int64_t product = 1;
    for (const auto& d : dims) product *= std::max<int64_t>(d.second, 1);
    return create_mesh(std::move(dims), cpu_devices(int(product)));
  }
  // Every client checks that all agree on the dims and on their device counts (so all throw
  // alike instead of some hanging in a later collective).
  std::string text = join(dims, ",", [](const auto& d) { return d.first + "=" + std::to_string(d.second); });
  wait_for_all_clients("create_distributed_mesh");
  int64_t mine[2] = {int64_t(hash_text(0, text)), local};
  const int n = num_clients();
  std::vector<int64_t> all(size_t(2 * n));
  MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, MPI_COMM_WORLD);
  std::vector<std::string> differ;
  for (int r = 0; r < n; ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      differ.push_back(std::to_string(r));
  if (!differ.empty())
    throw MeshError("create_distributed_mesh: clients disagree on the mesh (dims or local device counts): ranks " +
                    join(differ, ", ", [](const std::string& s) { return s; }) + " differ from rank 0 (this client: [" + text +
                    "], " + std::to_string(local) + " local devices)");
  int64_t product = 1;
  for (const auto& d : dims) product *= d.second;
  if (product != local * n)
    throw MeshError("create_distributed_mesh: the mesh [" + text + "] has " + std::to_string(product) + " devices but " +
                    std::to_string(n) + " clients x " + std::to_string(local) + " local devices give " + std::to_string(local * n));
  std::vector<int64_t> global_ids(static_cast<size_t>(product)), local_ids;
  std::vector<DeviceName> local_devices, global_devices;
  for (int64_t g = 0; g < product; ++g) {
    global_ids[g] = g;
    DeviceName name{"worker", 0, g / local, "CPU", g % local};
    global_devices.push_back(name);
    if (g / local == client_id()) {
      local_ids.push_back(g);
      local_devices.push_back(name);
    }
  }
  return Mesh(std::move(dims), global_ids, local_ids, local_devices, "", global_devices);
}

}  // namespace tessera
