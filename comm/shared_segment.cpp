#include "comm/shared_segment.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>

#include "dsl/error.hpp"

namespace tessera {
namespace {

// 128 random bits: another local user cannot make the object ahead of this job (a predictable
// name let them, and the group then fell back to MPI, 3.4x slower, without a word).
std::string random_segment_name() {
  std::array<uint64_t, 2> bits{};
  if (::getrandom(bits.data(), sizeof bits, 0) != ssize_t(sizeof bits)) {
    std::random_device device;  // getrandom unavailable (an old kernel): the C++ library's source
    for (uint64_t& b : bits) b = (uint64_t(device()) << 32) ^ device();
  }
  return fmt::format("/tessera-{:016x}{:016x}", bits[0], bits[1]);
}

// The steps of making or opening the object, as an error names them.
enum class MappingStep : int { Create, Open, Size, Reserve, Map };

const char* step_name(MappingStep step) {
  switch (step) {
    case MappingStep::Create: return "creating it";
    case MappingStep::Open: return "opening it";
    case MappingStep::Size: return "sizing it";
    case MappingStep::Reserve: return "reserving its pages";
    case MappingStep::Map: return "mapping it";
  }
  return "?";
}

// How mapping went: the memory, or the step that failed and its errno.
struct Mapping {
  std::byte* data = nullptr;
  int error = 0;
  MappingStep step = MappingStep::Create;
};

// Maps the object `name`: made afresh (O_EXCL, mode 0600, its pages reserved) when `create`,
// opened otherwise. An object this call made and could not map is unlinked again.
Mapping map_object(const char* name, size_t bytes, bool create) {
  const int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0600);
  if (fd < 0) return {nullptr, errno, create ? MappingStep::Create : MappingStep::Open};
  Mapping m;
  if (create && ftruncate(fd, off_t(bytes)) != 0)
    m = {nullptr, errno, MappingStep::Size};
  else if (const int error = create ? posix_fallocate(fd, 0, off_t(bytes)) : 0; error != 0)
    m = {nullptr, error, MappingStep::Reserve};
  if (m.error == 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      m = {nullptr, errno, MappingStep::Map};
    else
      m.data = static_cast<std::byte*>(p);
  }
  close(fd);
  if (create && !m.data) shm_unlink(name);
  return m;
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
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Rank 0 chooses the name and makes the object; the others open it by the name it sends.
  std::array<char, 64> name{};
  Mapping mapping;
  if (rank == 0) {
    const std::string chosen = random_segment_name();
    std::memcpy(name.data(), chosen.c_str(), chosen.size() + 1);
    mapping = map_object(name.data(), bytes, true);
  }
  int made = rank == 0 && mapping.data ? 1 : 0;
  MPI_Bcast(name.data(), int(name.size()), MPI_CHAR, 0, comm);
  MPI_Bcast(&made, 1, MPI_INT, 0, comm);
  if (rank != 0 && made) mapping = map_object(name.data(), bytes, false);
  // The lowest rank that failed, if any (everyone has mapped it or failed by then).
  int failed = mapping.error != 0 ? rank : size;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MIN, comm);
  if (made && rank == 0) shm_unlink(name.data());  // mapped everywhere it could be: the name can go
  if (failed == size) return std::unique_ptr<SharedSegment>(new SharedSegment(mapping.data, bytes, name.data()));
  // Every rank raises the same error, naming the segment, the rank and why.
  std::array<int, 2> why = {mapping.error, int(mapping.step)};
  MPI_Bcast(why.data(), 2, MPI_INT, failed, comm);
  if (mapping.data) munmap(mapping.data, bytes);
  throw CommError(fmt::format("shared-memory segment /dev/shm{} ({} bytes) for a group of {} processes: {} on rank {} failed: {} "
                              "(make room in /dev/shm, or set TESSERA_SHARED_MEMORY=0 on every client to use MPI)",
                              name.data(), bytes, size, step_name(MappingStep(why[1])), failed, std::strerror(why[0])));
}

SharedSegment::~SharedSegment() { munmap(data_, size_); }

}  // namespace tessera
