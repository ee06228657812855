#include "comm/shared_segment.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>

namespace tessera {
namespace {

// Maps the object `name`, reserving its pages; null on failure.
std::byte* map_object(const char* name, size_t bytes, bool create) {
  const int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0600);
  if (fd < 0) return nullptr;
  bool ok = true;
  if (create) ok = ftruncate(fd, off_t(bytes)) == 0 && posix_fallocate(fd, 0, off_t(bytes)) == 0;
  void* p = ok ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

}  // namespace

bool ranks_share_one_node(void* mpi_comm) {
  MPI_Comm comm = static_cast<MPI_Comm>(mpi_comm), node;
  int size = 0, node_size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int all = node_size == size ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm);
  return all == 1;
}

std::unique_ptr<SharedSegment> SharedSegment::create(void* mpi_comm, size_t bytes) {
  MPI_Comm comm = static_cast<MPI_Comm>(mpi_comm);
  if (!ranks_share_one_node(mpi_comm)) return nullptr;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  static std::atomic<int> made{0};
  std::array<char, 64> name{};
  std::byte* data = nullptr;
  if (rank == 0) {
    std::snprintf(name.data(), name.size(), "/tessera-%d-%d", int(getpid()), made++);
    data = map_object(name.data(), bytes, true);
    if (!data) name[0] = '\0';
  }
  MPI_Bcast(name.data(), int(name.size()), MPI_CHAR, 0, comm);
  if (rank != 0 && name[0] != '\0') data = map_object(name.data(), bytes, false);
  int all = data ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm);  // everyone has mapped it (or failed)
  if (rank == 0 && name[0] != '\0') shm_unlink(name.data());
  if (all != 1) {
    if (data) munmap(data, bytes);
    return nullptr;
  }
  return std::unique_ptr<SharedSegment>(new SharedSegment(data, bytes));
}

SharedSegment::~SharedSegment() { munmap(data_, size_); }

}  // namespace tessera
