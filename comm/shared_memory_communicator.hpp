// The backend for a multi-client group whose clients all run on one node: collectives meet in a
// shared segment instead of passing MPI messages. Each rank owns two staging slots, used by
// successive rounds in turn; a round copies this rank's data into its slot, meets the others at
// a process barrier and reads what it needs straight from theirs. Collectives larger than a slot
// run in several rounds. An all_to_all_v reads a sender's rows straight out of its group buffer
// (allocate_group_buffer) when they lie in one: one copy instead of two.
//
// Why: Open MPI's shared-memory transport (vader) moves large messages with process_vm_readv,
// about 6.5 GB/s on the machines here, and small ones with several microseconds of latency;
// memcpy through a shared segment moves 20-40 GB/s and the barrier costs about a microsecond.
//
// Two slots make one barrier per round enough: a rank writes slot parity p in round j only
// after passing round j-1's barrier, which every peer reached after finishing its reads of
// round j-2, the last round that used parity p.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace tessera {

// A shared-memory communicator over the ranks of `mpi_comm` (an MPI_Comm passed as void*, as in
// mpi_communicator.hpp), or null on every rank alike when they are not all on one node (then the
// caller keeps using MPI). A segment that cannot be made is a CommError on every rank alike
// naming it and why, not a quiet fall back to MPI. Collective. On success the result owns
// `mpi_comm` (used to name ranks when a collective times out, and freed with it).
// `spin_iterations`: how long a rank waiting at a barrier spins before it sleeps.
std::shared_ptr<Communicator> make_shared_memory_communicator(void* mpi_comm, int spin_iterations);

// The bytes this process's all_to_all_v calls have staged through their slots so far: zero
// growth shows the rows were read straight from group buffers (for tests and benchmarks).
int64_t all_to_all_v_bytes_staged();

}  // namespace tessera
