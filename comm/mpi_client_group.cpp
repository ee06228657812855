#include "comm/mpi_client_group.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>

#include "comm/mpi_communicator.hpp"
#include "comm/shared_memory_communicator.hpp"
#include "comm/spin_barrier.hpp"
#include "dsl/error.hpp"
#include "dsl/logging.hpp"

namespace tessera {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// An exception escaping on one client must end the whole job, not leave the others waiting in
// a collective: print this client's message, then MPI_Abort.
void abort_job() {
  std::string what = "unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
  }
  std::fprintf(stderr, "tessera: client %d failed: %s\n  (ending the job with MPI_Abort)\n", world_rank(), what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

std::function<void()>& shutdown_hook() {
  static auto* hook = new std::function<void()>();
  return *hook;
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (shutdown_hook()) shutdown_hook()();  // communicators over sub-groups go before MPI_Finalize
  MPI_Finalize();
}

int count_of(int64_t bytes) {
  if (bytes > std::numeric_limits<int>::max()) throw CommError("client exchange: more than 2 GiB for one client");
  return int(bytes);
}

class MpiClientGroup final : public ClientGroup {
 public:
  // Owns `comm` unless it is MPI_COMM_WORLD.
  MpiClientGroup(MPI_Comm comm, int on_this_node) : comm_(comm), on_this_node_(on_this_node) {
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
  }
  ~MpiClientGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  int size() const override { return size_; }
  int rank() const override { return rank_; }
  int members_on_this_node() const override { return on_this_node_; }

  void barrier() override {
    // Through a communicator's barrier, which honours TESSERA_COMM_TIMEOUT.
    // The world's is MPI_COMM_WORLD itself: a duplicate would wait for a missing client untimed.
    if (!barrier_comm_) barrier_comm_ = make_mpi_communicator(comm_ == MPI_COMM_WORLD ? MPI_COMM_WORLD : duplicate());
    barrier_comm_->barrier();
  }

  void broadcast(std::vector<std::byte>& data, int root) override {
    uint64_t size = data.size();
    MPI_Bcast(&size, 1, MPI_UINT64_T, root, comm_);
    data.resize(size);
    constexpr uint64_t kPiece = uint64_t(1) << 30;  // MPI counts are ints
    for (uint64_t at = 0; at < size; at += kPiece)
      MPI_Bcast(data.data() + at, int(std::min(kPiece, size - at)), MPI_BYTE, root, comm_);
  }

  std::vector<std::vector<std::byte>> gather(const std::vector<std::byte>& data, int root) override {
    int size = count_of(int64_t(data.size()));
    std::vector<int> sizes(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_), 0);
    MPI_Gather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[size_t(r)] = count_of(total);
      total += sizes[size_t(r)];
    }
    std::vector<std::byte> all(rank_ == root ? size_t(total) : 0);
    MPI_Gatherv(data.data(), size, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, root, comm_);
    std::vector<std::vector<std::byte>> out;
    if (rank_ != root) return out;
    for (int r = 0; r < size_; ++r)
      out.emplace_back(all.begin() + displs[size_t(r)], all.begin() + displs[size_t(r)] + sizes[size_t(r)]);
    return out;
  }

  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override {
    std::vector<int64_t> all(values.size() * size_t(size_));
    MPI_Allgather(values.data(), int(values.size()), MPI_INT64_T, all.data(), int(values.size()), MPI_INT64_T, comm_);
    return all;
  }

  void all_reduce_sum(std::vector<int64_t>& values) override {
    if (values.empty()) return;
    MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT64_T, MPI_SUM, comm_);
  }

  std::vector<std::vector<std::byte>> exchange(const std::vector<std::vector<std::byte>>& outgoing,
                                               const std::vector<int64_t>& incoming) override {
    const size_t n = size_t(size_);
    std::vector<int> send_counts(n, 0), send_offsets(n, 0), recv_counts(n, 0), recv_offsets(n, 0);
    std::vector<std::byte> send, recv;
    for (size_t r = 0; r < n; ++r) {
      send_offsets[r] = count_of(int64_t(send.size()));
      send_counts[r] = count_of(int64_t(outgoing[r].size()));
      send.insert(send.end(), outgoing[r].begin(), outgoing[r].end());
      recv_offsets[r] = count_of(int64_t(recv.size()));
      recv_counts[r] = count_of(incoming[r]);
      recv.resize(recv.size() + size_t(incoming[r]));
    }
    MPI_Alltoallv(send.data(), send_counts.data(), send_offsets.data(), MPI_BYTE, recv.data(), recv_counts.data(),
                  recv_offsets.data(), MPI_BYTE, comm_);
    std::vector<std::vector<std::byte>> received(n);
    for (size_t r = 0; r < n; ++r)
      received[r].assign(recv.begin() + recv_offsets[r], recv.begin() + recv_offsets[r] + recv_counts[r]);
    return received;
  }

  std::shared_ptr<ClientGroup> subgroup(const std::vector<int>& members, int tag) override {
    MPI_Group mine, group;
    MPI_Comm_group(comm_, &mine);
    MPI_Group_incl(mine, int(members.size()), members.data(), &group);
    MPI_Comm comm;
    MPI_Comm_create_group(comm_, group, tag, &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&mine);
    return std::make_shared<MpiClientGroup>(comm, on_this_node_);
  }

  std::shared_ptr<Communicator> communicator(int64_t threads_per_client) override {
    const char* setting = std::getenv("TESSERA_SHARED_MEMORY");
    if (!setting || std::string(setting) != "0") {
      const int spin = spin_iterations_for(int64_t(on_this_node_) * threads_per_client);
      MPI_Comm comm = duplicate();
      std::shared_ptr<Communicator> shared;
      try {
        shared = make_shared_memory_communicator(comm, spin);
      } catch (const CommError&) {
        MPI_Comm_free(&comm);
        throw;
      }
      if (shared) return shared;
      MPI_Comm_free(&comm);
    }
    return make_mpi_communicator(duplicate());
  }

 private:
  // The communicators made from the group own their MPI communicator: each gets its own copy.
  MPI_Comm duplicate() {
    MPI_Comm copy;
    MPI_Comm_dup(comm_, &copy);
    return copy;
  }

  MPI_Comm comm_;
  int size_ = 1, rank_ = 0, on_this_node_ = 1;
  std::shared_ptr<Communicator> barrier_comm_;
};

}  // namespace

std::unique_ptr<ClientGroup> start_mpi_clients(int& argc, char**& argv, std::function<void()> before_shutdown) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
      component_logger("comm").warn("MPI provides thread level {} < MPI_THREAD_MULTIPLE: keep one local device per client", provided);
    shutdown_hook() = std::move(before_shutdown);
    std::atexit(finalize_mpi);
  }
  std::set_terminate(abort_job);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  int on_this_node = 1;
  MPI_Comm_size(node, &on_this_node);
  MPI_Comm_free(&node);
  return std::make_unique<MpiClientGroup>(MPI_COMM_WORLD, on_this_node);
}

}  // namespace tessera
