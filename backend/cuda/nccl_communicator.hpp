// Collectives among GPUs of several processes (one GPU per process, as mpirun starts them) by
// NCCL (backend/cuda/nccl_library.hpp), over device memory. Rank 0 of the ClientGroup makes
// NCCL's unique id, ClientGroup::broadcast carries it to the others, and each calls
// ncclCommInitRank on its GPU's primary context. Collectives are queued on the GPU device's
// stream, the one its programs' kernels use, so they are ordered with them without host waits;
// only barrier() waits (for the stream), polling NCCL's asynchronous error and honouring
// TESSERA_COMM_TIMEOUT (comm/collective_timeout.hpp).
//
// Results: data movement is exact. Reductions NCCL does in its own order (all_reduce, even
// reduce_scatter: sums and products of floats) differ from the CPU groups' in the last bits;
// everything else combines in rank order with the CPU's accumulators and NaN rules
// (backend/cuda/cuda_collective_kernels.hpp), so it gives the CPU group's bits: float max / min,
// integer averages, uneven reduce_scatters, and under TESSERA_DETERMINISTIC=1 every reduction.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/client_group.hpp"
#include "comm/communicator.hpp"

namespace tessera {

// This client's communicator of the group `clients` (collective: every member calls it), over
// the GPU device `gpu_device_index` ("GPU:i"). DeviceError naming the library where NCCL is
// missing on any member (checked before any GPU is touched; every member throws), CommError
// for NCCL's failures. Used by one thread at a time.
std::shared_ptr<Communicator> create_nccl_communicator(ClientGroup& clients, int64_t gpu_device_index);

}  // namespace tessera
