#include "jit/mesh_communicators.hpp"

#include <map>
#include <mutex>

#include <mpi.h>

#include "comm/in_process_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "dsl/error.hpp"
#include "jit/runtime.hpp"

namespace tessera {

std::vector<int64_t> mesh_worker_indices(const Mesh& mesh) {
  std::vector<int64_t> out;
  for (const auto& device : mesh.local_device_names()) {
    if (device.type != "CPU")
      throw MeshError("device " + device.to_string() + " has no backend in this build (only virtual CPU devices)");
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

std::mutex& mpi_mutex() {
  static std::mutex m;
  return m;
}
// Sub-communicators of meshes that span clients, keyed by mesh and dim. Every client creates
// them in the same order (they build the same programs), as MPI_Comm_split requires.
std::map<std::pair<std::string, int64_t>, std::shared_ptr<Communicator>>& mpi_groups() {
  static auto* groups = new std::map<std::pair<std::string, int64_t>, std::shared_ptr<Communicator>>();
  return *groups;
}

// A group along `mesh_dim` spanning clients: one MPI sub-communicator (one local device per client).
std::vector<std::shared_ptr<Communicator>> mpi_communicators(const Mesh& mesh, int64_t mesh_dim) {
  if (mesh.num_local_devices() != 1)
    throw CommError("a mesh spanning clients needs one local device per client for now (got " +
                    std::to_string(mesh.num_local_devices()) + "); hierarchical groups are not built yet");
  std::lock_guard lock(mpi_mutex());
  auto key = std::make_pair(mesh.to_string(), mesh_dim);
  auto& slot = mpi_groups()[key];
  if (!slot) {
    const int64_t id = mesh.local_device_ids().front();
    const std::vector<int64_t> coords = mesh.coords(id), strides = mesh.strides();
    const int64_t color = id - coords[mesh_dim] * strides[mesh_dim];  // the group's first device
    wait_for_all_clients("creating a mesh-dim communicator");
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, int(color), int(coords[mesh_dim]), &sub);
    slot = make_mpi_communicator(sub);
  }
  return {slot};
}

}  // namespace

void release_mpi_communicators() {
  std::lock_guard lock(mpi_mutex());
  mpi_groups().clear();
}

std::vector<std::shared_ptr<Communicator>> mesh_dim_communicators(const Mesh& mesh, int64_t mesh_dim) {
  static std::mutex mutex;
  // Keyed by the members' worker indices in rank order: two meshes over the same devices share.
  static std::map<std::vector<int64_t>, std::vector<std::shared_ptr<Communicator>>> groups;
  if (mesh.num_local_devices() != mesh.size()) return mpi_communicators(mesh, mesh_dim);
  const std::vector<int64_t> workers = mesh_worker_indices(mesh);
  const std::vector<int64_t> shape = mesh.shape(), strides = mesh.strides();
  // Position of each global device id in the local list.
  std::vector<int64_t> local_of(mesh.size(), -1);
  const std::vector<int64_t> local_ids = mesh.local_device_ids();
  for (size_t i = 0; i < local_ids.size(); ++i) local_of[local_ids[i]] = int64_t(i);

  std::vector<std::shared_ptr<Communicator>> out(local_ids.size());
  std::lock_guard lock(mutex);
  for (size_t i = 0; i < local_ids.size(); ++i) {
    std::vector<int64_t> coords = mesh.coords(local_ids[i]);
    std::vector<int64_t> members;
    int64_t base = local_ids[i] - coords[mesh_dim] * strides[mesh_dim];
    for (int64_t r = 0; r < shape[mesh_dim]; ++r) members.push_back(workers[local_of[base + r * strides[mesh_dim]]]);
    auto& group = groups[members];
    if (group.empty()) group = create_in_process_group(int(members.size()));
    out[i] = group[coords[mesh_dim]];
  }
  return out;
}

}  // namespace tessera
