// Communicator: collectives over one group of devices (the devices of a mesh that share their
// coordinates on every other mesh dim). Backends: in-process threads now; MPI and NCCL later,
// behind this same interface (MLX's group interface is the model).
//
// Every call is made by every member of the group, from that member's own thread, in the same
// order (SPMD). Buffers are raw memory of `dtype` elements; counts are element counts. The v-
// variants take one count per rank; blocks are laid out contiguously in rank order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "dsl/dtype.hpp"
#include "dsl/memory_space.hpp"
#include "dsl/placement.hpp"
#include "dsl/shard_geometry.hpp"

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers it is handed live: host memory, or device memory for a GPU group
  // (backend/cuda/cuda_group_communicator.hpp), whose buffers are device pointers.
  virtual MemorySpace memory_space() const { return MemorySpace::Host; }

  // recv[i] = op over ranks of send[i]. send == recv is allowed (in place).
  virtual void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) = 0;
  // recv = concatenation of every rank's send block; recv_counts[r] = rank r's send_count.
  // send may already lie at its own block's place in recv (in place).
  virtual void all_gather_v(const void* send, int64_t send_count, void* recv,
                            std::span<const int64_t> recv_counts, DType dtype) = 0;
  // send holds one block per rank (counts[r] elements for rank r); recv = op over ranks of block `rank`.
  virtual void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts,
                                DType dtype, ReduceOp op) = 0;
  // send block r (send_counts[r]) goes to rank r; recv block r (recv_counts[r]) comes from rank r.
  virtual void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                            std::span<const int64_t> recv_counts, DType dtype) = 0;
  // all_to_all of regions of one global array, like MPI_Alltoallw with subarray types. This rank
  // holds the block `send_block` of the array at `send` and will hold `recv_block` at `recv`;
  // send_regions[r] (global coordinates, inside send_block) goes to rank r, recv_regions[r]
  // (inside recv_block) comes from rank r. The default packs the regions, calls all_to_all_v and
  // unpacks; a backend that reaches its peers' memory copies each region once, in place.
  virtual void all_to_all_regions(const void* send, const ShardBox& send_block, std::span<const ShardBox> send_regions,
                                  void* recv, const ShardBox& recv_block, std::span<const ShardBox> recv_regions,
                                  DType dtype);
  virtual void broadcast(void* buffer, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  // A buffer of `bytes` that every member of the group sees (the same memory), or null where the
  // backend has none. Collective in order: the members' n-th calls return the same buffer, so
  // each can write its block of an all_gather's output in place; a barrier then completes it.
  // Null answers come to every member alike. `purpose` names what the buffer is for (the
  // program and its gather): members whose n-th calls name different purposes or sizes have
  // fallen out of step, and get an InternalError rather than each other's memory.
  virtual std::shared_ptr<std::byte[]> allocate_group_buffer(int64_t bytes, uint64_t purpose = 0);
  // Whether all_to_all_v reads a sender's rows straight from its memory only when they lie in a
  // group buffer (and stages them through a copy otherwise): then whoever produces an
  // all_to_all_v's input should write it into one. Backends that reach any peer memory (devices
  // of one process) or none (MPI) say no.
  virtual bool exchanges_from_group_buffers() const { return false; }

  // Even variants: every rank contributes `count` elements per block.
  void all_gather(const void* send, void* recv, int64_t count, DType dtype);
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op);
  void all_to_all(const void* send, void* recv, int64_t count, DType dtype);
};

}  // namespace tessera
