// Buffers shared by the clients of one node: every member of a group gets the same physical
// memory for the same allocation, so an all_gather can be written in place by all of them (each
// writes its own block, then one barrier) as devices in one process already do.
//
// Allocation is collective in order: the n-th allocate() of every member is the same buffer.
// Whichever member comes first carves it out of the pool and leaves a ticket; the others take
// it from the ticket, so members need not meet. A buffer returns to the pool when every member
// has dropped it. All bookkeeping lives in the segment, under a process-shared spinlock.
#pragma once

#include <cstdint>
#include <memory>

namespace tessera {

class SharedSegment;

class SharedBufferPool {
 public:
  // Collective over `mpi_comm` (an MPI_Comm passed as void*) of `members` ranks; null on every
  // member alike when the segment cannot be made (with a warning naming it and why).
  static std::shared_ptr<SharedBufferPool> create(void* mpi_comm, int members, int64_t capacity_bytes);

  // The group's next shared buffer of `bytes` (64-byte aligned), or null on every member alike
  // when the pool has no room (the caller then moves data the usual way).
  std::shared_ptr<std::byte[]> allocate(int64_t bytes, uint64_t purpose = 0);

  // Where `bytes` at `p` lie in the pool, as an offset every member can resolve with at() (the
  // members map the pool at different addresses), or -1 when they are not all inside it.
  int64_t offset_of(const void* p, int64_t bytes) const;
  const std::byte* at(int64_t offset) const { return data_area() + offset; }

  ~SharedBufferPool();

 private:
  struct Control;
  static int64_t control_bytes();  // the bookkeeping ahead of the buffers, a whole number of lines
  SharedBufferPool(std::unique_ptr<SharedSegment> segment, int size);
  Control& control() const;
  std::byte* data_area() const;
  int64_t carve(int64_t bytes);  // under the lock: a block's offset, or -1
  void release(int64_t offset);

  std::unique_ptr<SharedSegment> segment_;
  const int size_;
  int64_t capacity_ = 0;
  int64_t tickets_taken_ = 0;
  std::weak_ptr<SharedBufferPool> self_;
};

}  // namespace tessera
