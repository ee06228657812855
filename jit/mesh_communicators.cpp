#include "jit/mesh_communicators.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "comm/in_process_communicator.hpp"
#include "comm/hierarchical_communicator.hpp"
#include "comm/client_group.hpp"
#include "dsl/error.hpp"
#include "jit/mesh_agreement.hpp"
#include "jit/runtime.hpp"
#include "jit/backend_registry.hpp"
#include "jit/device_workers.hpp"

namespace tessera {

std::vector<int64_t> mesh_worker_indices(const Mesh& mesh) {
  // Whatever runs on a mesh's devices asks for their workers first: the clients of a mesh
  // spanning them agree on it before anything runs on it.
  check_clients_agree_on_mesh(mesh);
  std::vector<int64_t> out;
  for (const auto& device : mesh.local_device_names()) {
    // A worker thread per device: a CPU device computes on it, a GPU device queues its work from it.
    (void)device.kind();  // MeshError for a device no backend runs
    out.push_back(device.index);
  }
  return out;
}

std::vector<std::vector<int64_t>> local_device_coords(const Mesh& mesh) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t id : mesh.local_device_ids()) out.push_back(mesh.coords(id));
  return out;
}

namespace {

std::mutex& group_mutex() {
  static std::mutex m;
  return m;
}
// Sub-communicators of meshes that span clients, keyed by mesh and dim. Every client creates
// them in the same order (they build the same programs), as creating a client group requires.
std::map<std::pair<std::string, int64_t>, std::shared_ptr<Communicator>>& client_groups() {
  static auto* groups = new std::map<std::pair<std::string, int64_t>, std::shared_ptr<Communicator>>();
  return *groups;
}

std::map<std::pair<std::string, int64_t>, std::vector<std::shared_ptr<Communicator>>>& hierarchical_groups() {
  static auto* groups = new std::map<std::pair<std::string, int64_t>, std::vector<std::shared_ptr<Communicator>>>();
  return *groups;
}

// The client (rank) that owns device `id` of a mesh spanning clients.
int client_of(const Mesh& mesh, int64_t id) {
  const auto& names = mesh.global_device_names();
  if (names.empty()) throw MeshError("mesh " + mesh.to_string() + " spans clients but does not list its global devices");
  return int(names.at(size_t(id)).task);
}

bool spans_all_clients(const Mesh& mesh) { return int(clients_of(mesh).size()) == num_clients(); }

// Clients holding several devices: per group, the local members meet in shared memory and the
// clients' leaders over a communicator of a client group made by the group's clients alone
// (every client creates its groups in ascending order of their first device).
std::vector<std::shared_ptr<Communicator>> hierarchical_communicators(const Mesh& mesh, int64_t mesh_dim) {
  std::lock_guard lock(group_mutex());
  auto key = std::make_pair(mesh.to_string(), mesh_dim);
  auto& cached = hierarchical_groups()[key];
  if (!cached.empty()) return cached;
  if (spans_all_clients(mesh)) wait_for_all_clients("creating hierarchical mesh-dim communicators");
  const std::vector<int64_t> local_ids = mesh.local_device_ids(), shape = mesh.shape(), strides = mesh.strides();
  // Group base (first device id) -> the local devices' positions (local order) in it.
  std::map<int64_t, std::vector<size_t>> groups;
  for (size_t i = 0; i < local_ids.size(); ++i)
    groups[local_ids[i] - mesh.coords(local_ids[i])[mesh_dim] * strides[mesh_dim]].push_back(i);
  std::vector<std::shared_ptr<Communicator>> out(local_ids.size());
  for (const auto& [base, locals] : groups) {
    std::vector<int> owner, local_ranks;
    for (int64_t r = 0; r < shape[mesh_dim]; ++r) owner.push_back(client_of(mesh, base + r * strides[mesh_dim]));
    for (size_t i : locals) local_ranks.push_back(int(mesh.coords(local_ids[i])[mesh_dim]));
    std::vector<int> clients = owner;
    std::sort(clients.begin(), clients.end());
    clients.erase(std::unique(clients.begin(), clients.end()), clients.end());
    std::shared_ptr<ClientGroup> leaders = world_clients().subgroup(clients, int(base % 32768));
    std::vector<size_t> order(locals);  // local members in group-rank order
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return mesh.coords(local_ids[a])[mesh_dim] < mesh.coords(local_ids[b])[mesh_dim]; });
    std::sort(local_ranks.begin(), local_ranks.end());
    auto comms = create_hierarchical_group(owner, local_ranks, leaders->communicator(int64_t(local_ids.size())));
    for (size_t k = 0; k < order.size(); ++k) out[order[k]] = comms[k];
  }
  cached = out;
  return out;
}

// The client group of this client's only device's group along `mesh_dim` of a mesh spanning
// clients: made by the group's clients alone (a sub-mesh such as mesh["dp"] lives on some clients
// only), ranked by their coordinate on `mesh_dim`. Collective over those clients.
std::shared_ptr<ClientGroup> group_clients(const Mesh& mesh, int64_t mesh_dim, const char* creating) {
  const int64_t id = mesh.local_device_ids().front();
  const std::vector<int64_t> coords = mesh.coords(id), strides = mesh.strides();
  const int64_t base = id - coords[mesh_dim] * strides[mesh_dim];  // the group's first device
  std::vector<int> members;
  for (int64_t r = 0; r < mesh.shape()[mesh_dim]; ++r) members.push_back(client_of(mesh, base + r * strides[mesh_dim]));
  if (spans_all_clients(mesh)) wait_for_all_clients(creating);
  return world_clients().subgroup(members, int(base % 32768));
}

// A group along `mesh_dim` spanning clients with one local device each: the communicator of its
// client group (group_clients).
std::vector<std::shared_ptr<Communicator>> client_communicators(const Mesh& mesh, int64_t mesh_dim) {
  if (mesh.num_local_devices() != 1) return hierarchical_communicators(mesh, mesh_dim);
  std::lock_guard lock(group_mutex());
  auto key = std::make_pair(mesh.to_string(), mesh_dim);
  auto& slot = client_groups()[key];
  if (!slot) slot = group_clients(mesh, mesh_dim, "creating a mesh-dim communicator")->communicator(1);
  return {slot};
}

// Device-memory communicators of meshes spanning clients (Backend::client_device_group), keyed
// like client_groups(); a null entry: the group goes through the host.
std::map<std::pair<std::string, int64_t>, std::shared_ptr<Communicator>>& client_device_groups() {
  static auto* groups = new std::map<std::pair<std::string, int64_t>, std::shared_ptr<Communicator>>();
  return *groups;
}

// client_communicators' groups over device memory, where the mesh's backend makes them (NCCL for
// GPUs, one per process): made by the same clients in the same order, so every member of a group
// creates it at once. Empty for clients holding several devices of the mesh.
std::vector<std::shared_ptr<Communicator>> client_device_communicators(const Mesh& mesh, int64_t mesh_dim) {
  if (mesh.num_local_devices() != 1) return {};
  const Backend& backend = backend_for(mesh.device_kind());
  if (!backend.client_device_group) return {};
  std::lock_guard lock(group_mutex());
  auto key = std::make_pair(mesh.to_string(), mesh_dim);
  auto [it, fresh] = client_device_groups().try_emplace(key);
  if (fresh) {
    try {
      std::shared_ptr<ClientGroup> clients = group_clients(mesh, mesh_dim, "creating a mesh-dim device communicator");
      it->second = backend.client_device_group(*clients, mesh.local_device_names().front().index);
    } catch (...) {
      client_device_groups().erase(it);
      throw;
    }
  }
  if (!it->second) return {};
  return {it->second};
}

}  // namespace

void release_client_communicators() {
  std::lock_guard lock(group_mutex());
  client_groups().clear();
  hierarchical_groups().clear();
  client_device_groups().clear();  // NCCL's communicators go before MPI shuts down
}

namespace {

// Each local device's group along `mesh_dim` of a mesh all in this process: the members' local
// indices in rank order, and the device's rank among them.
struct LocalGroup {
  std::vector<int64_t> members;
  int64_t rank = 0;
};

std::vector<LocalGroup> local_groups(const Mesh& mesh, int64_t mesh_dim) {
  const std::vector<int64_t> shape = mesh.shape(), strides = mesh.strides();
  std::vector<int64_t> local_of(mesh.size(), -1);  // position of each global device id in the local list
  const std::vector<int64_t> local_ids = mesh.local_device_ids();
  for (size_t i = 0; i < local_ids.size(); ++i) local_of[local_ids[i]] = int64_t(i);
  std::vector<LocalGroup> out(local_ids.size());
  for (size_t i = 0; i < local_ids.size(); ++i) {
    const std::vector<int64_t> coords = mesh.coords(local_ids[i]);
    const int64_t base = local_ids[i] - coords[mesh_dim] * strides[mesh_dim];
    for (int64_t r = 0; r < shape[mesh_dim]; ++r) out[i].members.push_back(local_of[base + r * strides[mesh_dim]]);
    out[i].rank = coords[mesh_dim];
  }
  return out;
}

}  // namespace

std::vector<std::shared_ptr<Communicator>> mesh_dim_communicators(const Mesh& mesh, int64_t mesh_dim) {
  static std::mutex mutex;
  // Keyed by the members' worker indices in rank order and by the mesh's device threads (they
  // decide whether a waiting member spins): two meshes of a size over the same devices share.
  static std::map<std::pair<std::vector<int64_t>, int64_t>, std::vector<std::shared_ptr<Communicator>>> groups;
  if (mesh.num_local_devices() != mesh.size()) return client_communicators(mesh, mesh_dim);
  const std::vector<int64_t> workers = mesh_worker_indices(mesh);
  const int64_t busy_threads = mesh.size() * clients_on_this_machine();
  std::vector<std::shared_ptr<Communicator>> out;
  std::lock_guard lock(mutex);
  for (const LocalGroup& g : local_groups(mesh, mesh_dim)) {
    std::vector<int64_t> members;
    for (int64_t m : g.members) members.push_back(workers[size_t(m)]);
    auto& group = groups[{members, busy_threads}];
    if (group.empty()) group = create_in_process_group(int(members.size()), busy_threads);
    out.push_back(group[size_t(g.rank)]);
  }
  return out;
}

std::vector<std::shared_ptr<Communicator>> mesh_dim_device_communicators(const Mesh& mesh, int64_t mesh_dim) {
  static std::mutex mutex;
  // Keyed by the members' kind and device indices in rank order; an empty entry: no device group.
  static std::map<std::pair<DeviceKind, std::vector<int64_t>>, std::vector<std::shared_ptr<Communicator>>> groups;
  if (mesh.num_local_devices() != mesh.size()) return client_device_communicators(mesh, mesh_dim);
  const Backend& backend = backend_for(mesh.device_kind());
  if (!backend.device_group) return {};
  const auto names = mesh.local_device_names();
  std::vector<std::shared_ptr<Communicator>> out;
  std::lock_guard lock(mutex);
  for (const LocalGroup& g : local_groups(mesh, mesh_dim)) {
    std::vector<int64_t> members;
    for (int64_t m : g.members) members.push_back(names[size_t(m)].index);
    auto [it, fresh] = groups.try_emplace({backend.kind, members});
    if (fresh) it->second = backend.device_group(members);
    if (it->second.empty()) return {};
    out.push_back(it->second[size_t(g.rank)]);
  }
  return out;
}

}  // namespace tessera
