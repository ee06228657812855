#include "jit/runtime.hpp"

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

#include "comm/client_group.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"
#include "jit/mesh_agreement.hpp"

namespace tessera {

void release_client_communicators();  // mesh_communicators.cpp

void init(int& argc, char**& argv) {
  component_logger("jit").debug("tessera initialising");
  start_clients(argc, argv, release_client_communicators);
}

int num_clients() { return world_clients().size(); }
int client_id() { return world_clients().rank(); }
int clients_on_this_node() { return world_clients().members_on_this_node(); }
bool multi_client() { return num_clients() > 1; }

void sum_over_clients(std::vector<int64_t>& values) {
  if (multi_client()) world_clients().all_reduce_sum(values);
}

void wait_for_all_clients(const char* what) {
  if (!multi_client()) return;
  component_logger("comm").debug("all clients meet before {}", what);
  world_clients().barrier();
}

std::vector<int> clients_of(const Mesh& mesh) {
  check_clients_agree_on_mesh(mesh);  // before anything runs on it (once per mesh)
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
  const int root_rank = int(std::find(clients.begin(), clients.end(), root) - clients.begin());
  cached_client_group(clients)->broadcast(data, root_rank);
}

std::map<int, std::vector<std::byte>> exchange_among_clients(const std::vector<int>& clients,
                                                             const std::map<int, std::vector<std::byte>>& outgoing,
                                                             const std::map<int, int64_t>& incoming) {
  std::map<int, std::vector<std::byte>> received;
  if (!multi_client() || clients.size() < 2 || !is_member(clients)) return received;
  std::vector<std::vector<std::byte>> out(clients.size());
  std::vector<int64_t> counts(clients.size(), 0);
  for (size_t r = 0; r < clients.size(); ++r) {
    if (auto it = outgoing.find(clients[r]); it != outgoing.end()) out[r] = it->second;
    if (auto it = incoming.find(clients[r]); it != incoming.end()) counts[r] = it->second;
  }
  std::vector<std::vector<std::byte>> arrived = cached_client_group(clients)->exchange(out, counts);
  for (size_t r = 0; r < clients.size(); ++r)
    if (!arrived[r].empty()) received[clients[r]] = std::move(arrived[r]);
  return received;
}

std::vector<int64_t> gather_among_clients(const std::vector<int>& clients, const std::vector<int64_t>& values) {
  if (!multi_client() || clients.size() < 2 || !is_member(clients)) return values;
  return cached_client_group(clients)->all_gather(values);
}

std::vector<uint64_t> gather_from_clients(uint64_t value) {
  if (!multi_client()) return {value};
  wait_for_all_clients("comparing program fingerprints");
  std::vector<uint64_t> all;
  for (int64_t v : world_clients().all_gather({int64_t(value)})) all.push_back(uint64_t(v));
  return all;
}

Mesh init_device_mesh(std::string device_type, std::vector<int64_t> shape, std::vector<std::string> mesh_dim_names) {
  const std::optional<DeviceKind> kind = device_kind_from_user_name(device_type);
  if (!kind)
    throw MeshError("init_device_mesh: unknown device type '" + device_type + "' (\"cpu\", \"cuda\" or \"gpu\")");
  if (shape.empty()) throw MeshError("init_device_mesh: the mesh shape is empty");
  if (mesh_dim_names.empty())
    for (size_t i = 0; i < shape.size(); ++i) mesh_dim_names.push_back("dim" + std::to_string(i));
  if (mesh_dim_names.size() != shape.size())
    throw MeshError("init_device_mesh: " + std::to_string(mesh_dim_names.size()) + " mesh_dim_names for a " +
                    std::to_string(shape.size()) + "-D shape");
  std::vector<std::pair<std::string, int64_t>> dims;
  for (size_t i = 0; i < shape.size(); ++i) dims.emplace_back(mesh_dim_names[i], shape[i]);
  return create_distributed_mesh(std::move(dims), std::string(device_kind_name(*kind)));
}

Mesh create_distributed_mesh(std::vector<std::pair<std::string, int64_t>> dims, std::string device_type) {
  const std::optional<DeviceKind> kind = device_kind_from_name(device_type);
  if (!kind) throw MeshError("create_distributed_mesh: unknown device type '" + device_type + "' (CPU or GPU)");
  if (kind == DeviceKind::GPU && multi_client())
    throw MeshError("create_distributed_mesh: GPU meshes across processes need the NCCL communicator, not built yet; "
                    "use GPU meshes within one process");
  int64_t local = 1;
  if (const char* v = std::getenv("TESSERA_LOCAL_DEVICES"); v && *v) local = std::max(1, std::atoi(v));
  if (!multi_client() && launcher_world_size() > 1)
    throw MeshError("create_distributed_mesh: this process is one of " + std::to_string(launcher_world_size()) +
                    " started by mpirun, but tessera::init(argc, argv) was not called, so it cannot reach the others; "
                    "call init first");
  if (!multi_client()) {
    const int64_t product = mesh_device_count(dims);
    return create_mesh(std::move(dims), kind == DeviceKind::GPU ? gpu_devices(int(product)) : cpu_devices(int(product)));
  }
  // Every client checks that all agree on the dims and on their device counts (so all throw
  // alike instead of some hanging in a later collective).
  std::string text = join(dims, ",", [](const auto& d) { return d.first + "=" + std::to_string(d.second); });
  wait_for_all_clients("create_distributed_mesh");
  const int n = num_clients();
  const std::vector<int64_t> all = world_clients().all_gather({int64_t(hash_text(0, text)), local});
  std::vector<std::string> differ;
  for (int r = 0; r < n; ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      differ.push_back(std::to_string(r));
  if (!differ.empty())
    throw MeshError("create_distributed_mesh: clients disagree on the mesh (dims or local device counts): ranks " +
                    join(differ, ", ") + " differ from rank 0 (this client: [" + text +
                    "], " + std::to_string(local) + " local devices)");
  const int64_t product = mesh_device_count(dims);
  if (product != local * n)
    throw MeshError("create_distributed_mesh: the mesh [" + text + "] has " + std::to_string(product) + " devices but " +
                    std::to_string(n) + " clients x " + std::to_string(local) + " local devices give " + std::to_string(local * n));
  std::vector<int64_t> global_ids(static_cast<size_t>(product)), local_ids;
  std::vector<DeviceName> local_devices, global_devices;
  for (int64_t g = 0; g < product; ++g) {
    global_ids[g] = g;
    DeviceName name{"worker", 0, g / local, std::string(device_kind_name(DeviceKind::CPU)), g % local};
    global_devices.push_back(name);
    if (g / local == client_id()) {
      local_ids.push_back(g);
      local_devices.push_back(name);
    }
  }
  Mesh mesh(std::move(dims), global_ids, local_ids, local_devices, "", global_devices);
  check_clients_agree_on_mesh(mesh);  // all are here: agreed now, not at its first use
  return mesh;
}

}  // namespace tessera
