#include "jit/mesh_communicators.hpp"

#include <map>
#include <mutex>

#include "comm/in_process_communicator.hpp"
#include "dsl/error.hpp"

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

std::vector<std::shared_ptr<Communicator>> mesh_dim_communicators(const Mesh& mesh, int64_t mesh_dim) {
  static std::mutex mutex;
  // Keyed by the members' worker indices in rank order: two meshes over the same devices share.
  static std::map<std::vector<int64_t>, std::vector<std::shared_ptr<Communicator>>> groups;
  if (mesh.num_local_devices() != mesh.size())
    throw CommError("mesh spans other clients; the in-process backend needs every device local");
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
