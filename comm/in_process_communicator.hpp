// The in-process backend: the devices of a group are threads of this process and exchange data
// by reading each other's buffers directly. Each collective publishes its buffers, meets at a
// barrier, moves data, and meets again before returning (so no buffer is reused while a peer
// still reads it). All-reduce is bandwidth-optimal: each rank reduces its own slice from every
// peer, then every rank copies the other slices from their owners.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

// Creates the `size` communicators of one group; communicator r must be used by one thread.
// `busy_threads`: the threads that run while the group meets (every device of its mesh; 0: the
// group's own), which decides whether a waiter spins (comm/spin_barrier.hpp). A group of 2 on a
// mesh of 4 devices over 2 cores must not spin: its late member is waiting for the core.
std::vector<std::shared_ptr<Communicator>> create_in_process_group(int size, int64_t busy_threads = 0);

}  // namespace tessera
