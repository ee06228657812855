// The clients of a run (one process each; several under mpirun) and groups of them: the
// control plane. Meshes, program fingerprints, checkpoints and mesh transfers agree through a
// ClientGroup, and the communicators of mesh-dim groups that span clients are made from one
// (a GPU backend's bootstrap, such as NCCL's unique id, is a broadcast over one). jit/ sees only
// this interface: MPI lives in comm/mpi_client_group.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

class ClientGroup {
 public:
  virtual ~ClientGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;          // this client's rank in the group
  virtual int members_on_this_node() const = 0;

  // Waits for every member (honouring TESSERA_COMM_TIMEOUT, so a missing client is reported).
  virtual void barrier() = 0;
  // `root`'s bytes on every member (the others' `data` is replaced, size and all).
  virtual void broadcast(std::vector<std::byte>& data, int root) = 0;
  // Every member's bytes in rank order, at `root` (empty elsewhere).
  virtual std::vector<std::vector<std::byte>> gather(const std::vector<std::byte>& data, int root) = 0;
  // Every member's `values` (the same count on each), concatenated in rank order.
  virtual std::vector<int64_t> all_gather(const std::vector<int64_t>& values) = 0;
  // Element-wise sums over the members, in place.
  virtual void all_reduce_sum(std::vector<int64_t>& values) = 0;
  // outgoing[r] goes to member r; incoming[r] bytes arrive from member r. Returns them by rank.
  virtual std::vector<std::vector<std::byte>> exchange(const std::vector<std::vector<std::byte>>& outgoing,
                                                       const std::vector<int64_t>& incoming) = 0;
  // A group of `members` (ranks of this group, in the order they take as ranks), made by those
  // members alone; `tag` tells apart groups created at once from overlapping members.
  virtual std::shared_ptr<ClientGroup> subgroup(const std::vector<int>& members, int tag) = 0;
  // A data-plane communicator over the members, one device each (shared memory when all run on
  // this node and TESSERA_SHARED_MEMORY is not 0, messages otherwise; a shared segment that
  // cannot be made is a CommError, not a quiet fall back to messages). Collective.
  // `threads_per_client`: busy threads per client, which sets how long barriers spin.
  virtual std::shared_ptr<Communicator> communicator(int64_t threads_per_client) = 0;
};

// Every client of the run: a group of one unless start_clients found a launcher.
ClientGroup& world_clients();
// Under mpirun (found from the launcher's environment), starts the clients' control plane
// (MPI with MPI_THREAD_MULTIPLE: each device thread may communicate); an exception escaping on
// one client then ends the whole job, and the clients shut down at exit after
// `before_shutdown` (which releases communicators that must go first). Otherwise nothing.
void start_clients(int& argc, char**& argv, std::function<void()> before_shutdown);
// The processes mpirun started (OMPI_COMM_WORLD_SIZE); 1 when not launched by it. Without
// start_clients (tessera::init), a process of a larger job still runs as its own one-client job:
// world_clients() warns once, and create_distributed_mesh refuses.
int launcher_world_size();
// The group of the world's `clients` (ranks, ascending), made once per set by its members and
// kept for the life of the process (the world itself when all are listed).
std::shared_ptr<ClientGroup> cached_client_group(const std::vector<int>& clients);

}  // namespace tessera
