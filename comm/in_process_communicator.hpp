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
std::vector<std::shared_ptr<Communicator>> create_in_process_group(int size);

}  // namespace tessera
