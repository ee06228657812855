// Process-wide runtime: environment settings (TESSERA_LOG ...) and the client identity of
// multi-client runs. Under mpirun (detected from the launcher's environment) init() starts the
// clients' control plane (comm/client_group.hpp: MPI with MPI_THREAD_MULTIPLE, because each of a
// client's device threads may communicate), shut down at exit. Without mpirun there is one
// client and nothing else changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dsl/mesh.hpp"

namespace tessera {

void init(int& argc, char**& argv);  // optional for single-process programs
int num_clients();                   // 1 in a single process
int client_id();                     // 0 in a single process
int clients_on_this_node();          // clients sharing this machine (this one included)
bool multi_client();                 // more than one client (under mpirun)

// A mesh over every client's local devices (TESSERA_LOCAL_DEVICES per client, default 1): a
// collective. Clients that disagree (dims, device counts) all get a MeshError naming the
// ranks that differ.
Mesh create_distributed_mesh(std::vector<std::pair<std::string, int64_t>> dims, std::string device_type = "CPU");

// PyTorch's init_device_mesh: a mesh of `shape` over every client's devices (one process: that
// many virtual devices; under mpirun: create_distributed_mesh). device_type "cpu" or "CPU";
// dims are named mesh_dim_names (default "dim0", "dim1", ...).
Mesh init_device_mesh(std::string device_type, std::vector<int64_t> shape, std::vector<std::string> mesh_dim_names = {});

// Element-wise sum of `values` over all clients (identity with one client).
void sum_over_clients(std::vector<int64_t>& values);

// Waits until every client arrives (a barrier that honours TESSERA_COMM_TIMEOUT): world-level
// collectives (communicator splits, fingerprints) go through it first, so a missing client is
// reported instead of hanging the others.
void wait_for_all_clients(const char* what);

// The clients (process ranks) owning the mesh's devices, ascending ({0} with one client). The
// first call for a mesh spanning clients is where they check that they agree on it (a
// collective among them: check_clients_agree_on_mesh), so every collective on a mesh, which
// starts here, runs on a mesh they agree on.
std::vector<int> clients_of(const Mesh& mesh);

// `data` of client `root` on every client of `clients` (a collective among them alone; the
// others pass their own `data`, which is replaced, size and all).
void broadcast_among_clients(const std::vector<int>& clients, std::vector<std::byte>& data, int root);

// Every client's `values` (the same count on each), concatenated in the order of `clients`.
std::vector<int64_t> gather_among_clients(const std::vector<int>& clients, const std::vector<int64_t>& values);

// Bytes between clients of `clients` (a collective among them alone): outgoing[c] goes to
// client c, and incoming[c] is how many bytes client c sends here. Returns what arrived, by client.
std::map<int, std::vector<std::byte>> exchange_among_clients(const std::vector<int>& clients,
                                                             const std::map<int, std::vector<std::byte>>& outgoing,
                                                             const std::map<int, int64_t>& incoming);
// Every client's `value`, in rank order (a collective; {value} with one client).
std::vector<uint64_t> gather_from_clients(uint64_t value);

}  // namespace tessera
