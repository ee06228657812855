// Memory shared by the processes of one MPI communicator whose ranks all run on one node: a
// POSIX shared-memory object made by rank 0 under a random name (O_EXCL, mode 0600) and mapped
// by every rank, then unlinked at once, so nothing is left behind however the job ends, and
// freeing it needs no collective.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

namespace tessera {

class SharedSegment {
 public:
  // Collective over `mpi_comm` (an MPI_Comm passed as void*, as in mpi_communicator.hpp).
  // Returns null on every rank alike when its ranks are not all on one node. When the memory
  // cannot be had, every rank raises the same CommError naming the segment, the rank and the
  // reason (the pages are reserved up front: a full /dev/shm fails here, not with SIGBUS later).
  // The memory starts zero-filled.
  static std::unique_ptr<SharedSegment> create(void* mpi_comm, size_t bytes);

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // The name the object had ("/tessera-" and 32 random hex digits), unlinked since.
  const std::string& name() const { return name_; }

 private:
  SharedSegment(std::byte* data, size_t size, std::string name) : data_(data), size_(size), name_(std::move(name)) {}
  std::byte* data_;
  size_t size_;
  std::string name_;
};

// True when every rank of `mpi_comm` runs on this node (collective).
bool ranks_share_one_node(void* mpi_comm);

}  // namespace tessera
