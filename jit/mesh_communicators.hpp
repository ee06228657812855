// Maps a mesh onto the runtime: which worker thread runs each local device, and which
// communicator each local device uses for a collective along one mesh dimension.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "dsl/mesh.hpp"

namespace tessera {

// Worker (virtual device) index of each local device of the mesh, in local order. For a mesh
// spanning clients, the first call is a collective among them (check_clients_agree_on_mesh).
std::vector<int64_t> mesh_worker_indices(const Mesh& mesh);

// Mesh coordinates of each local device, in local order.
std::vector<std::vector<int64_t>> local_device_coords(const Mesh& mesh);

// For each local device (local order), its communicator over the group along `mesh_dim`:
// the devices sharing its coordinates on every other mesh dim, ranked by their coordinate on
// `mesh_dim`. Groups are created once and reused.
std::vector<std::shared_ptr<Communicator>> mesh_dim_communicators(const Mesh& mesh, int64_t mesh_dim);

// The same groups over device memory, where the mesh's backend has them (jit/backend_registry.hpp):
// Backend::device_group for a mesh whose devices are all in this process (the CUDA backend's for
// virtual GPUs of one physical GPU), Backend::client_device_group for a mesh spanning clients
// with one local device each (NCCL, one GPU per process). Empty otherwise (CPU meshes, clients
// holding several devices of a mesh spanning clients, a group spanning physical GPUs, no NCCL):
// those groups move device values through host memory.
std::vector<std::shared_ptr<Communicator>> mesh_dim_device_communicators(const Mesh& mesh, int64_t mesh_dim);

}  // namespace tessera
