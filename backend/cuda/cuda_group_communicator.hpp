// Collectives among GPU devices of this process that share one physical GPU (gpu_devices(n)
// places virtual GPUs round-robin; on one GPU they share its address space). Buffers are device
// memory. A collective never waits on the host for the GPU: each member publishes its buffers and
// an event recorded on its stream, the members meet at a host barrier, each queues its part (a
// reduction kernel over its slice of every member's input, written into every member's output,
// or device copies) on its own stream behind the others' events, records a second event, and
// after a second barrier every member's stream waits for all of them, so no buffer is reused
// while a peer's stream still reads it. Inputs combine in rank order, as the CPU's in-process
// group combines them (comm/reduce_kernels.hpp): the same bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

// The communicators of one group over the virtual GPUs `devices` ("GPU:i" indices), in rank
// order; communicator r must be used by one thread at a time. Empty when the devices are not all
// on one physical GPU or the group is larger than backend/cuda/cuda_collective_kernels.hpp's
// kMaxReduceOperands: such groups move data through host memory.
std::vector<std::shared_ptr<Communicator>> create_cuda_group(const std::vector<int64_t>& devices);

}  // namespace tessera
