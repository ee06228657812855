#include "comm/hierarchical_communicator.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "comm/byte_pointers.hpp"
#include "comm/reduce_kernels.hpp"
#include "comm/spin_barrier.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

// What one local member publishes for the collective in flight.
struct MemberBuffers {
  const void* send = nullptr;
  void* recv = nullptr;
  const int64_t* send_counts = nullptr;
  const int64_t* recv_counts = nullptr;
};

// What the members of one group that this client holds share.
struct LocalMembers {
  LocalMembers(std::vector<int> owner_, std::vector<int> local_ranks_, std::shared_ptr<Communicator> leaders_)
      : owner(std::move(owner_)), local_ranks(std::move(local_ranks_)), leaders(std::move(leaders_)),
        slots(local_ranks.size()), barrier(int(local_ranks.size()), 2000) {
    for (int c : owner)
      if (std::find(clients.begin(), clients.end(), c) == clients.end()) clients.push_back(c);
    std::sort(clients.begin(), clients.end());
    for (size_t r = 0; r < owner.size(); ++r) members_of[owner[r]].push_back(int(r));
  }
  std::vector<int> owner, local_ranks, clients;  // clients in leader-rank order
  std::map<int, std::vector<int>> members_of;     // client -> its group ranks, ascending
  std::shared_ptr<Communicator> leaders;          // MPI among leaders (rank = index in `clients`)
  std::vector<MemberBuffers> slots;
  SpinBarrier barrier;
  std::vector<std::byte> scratch, scratch2;       // the leader's work buffers
};


class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(std::shared_ptr<LocalMembers> s, int local_index) : s_(std::move(s)), local_(local_index) {}

  int rank() const override { return s_->local_ranks[local_]; }
  int size() const override { return int(s_->owner.size()); }

  void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    const int64_t esize = dtype_size(dtype);
    const ReduceOp combine = op == ReduceOp::Avg ? ReduceOp::Sum : op;
    publish(send, recv);
    if (leader()) {
      s_->scratch.resize(size_t(std::max<int64_t>(count * esize, 1)));
      std::vector<const void*> inputs;
      for (const MemberBuffers& slot : s_->slots) inputs.push_back(slot.send);
      reduce_many(s_->scratch.data(), inputs.data(), int(inputs.size()), count, dtype, combine);
      s_->leaders->all_reduce(s_->scratch.data(), s_->scratch.data(), count, dtype, combine);
      if (op == ReduceOp::Avg)
        for (int64_t i = 0; i < count; ++i)
          store_from_double(s_->scratch.data(), dtype, i, load_as_double(s_->scratch.data(), dtype, i) / size());
    }
    sync();
    if (count > 0) std::memcpy(recv, s_->scratch.data(), size_t(count * esize));
    sync();
  }

  void all_gather_v(const void* send, int64_t send_count, void* recv, std::span<const int64_t> recv_counts, DType dtype) override {
    const int64_t esize = dtype_size(dtype);
    (void)send_count;
    publish(send, recv, nullptr, recv_counts.data());
    if (leader()) {
      // Client-major concatenation: each client's members' blocks in rank order.
      std::vector<int64_t> per_client;
      int64_t total = 0;
      for (int c : s_->clients) {
        int64_t n = 0;
        for (int r : s_->members_of[c]) n += recv_counts[r];
        per_client.push_back(n);
        total += n;
      }
      std::vector<std::byte> mine;
      for (size_t k = 0; k < s_->local_ranks.size(); ++k) {
        const int64_t n = recv_counts[s_->local_ranks[k]];
        mine.insert(mine.end(), bytes(s_->slots[k].send), bytes(s_->slots[k].send) + n * esize);
      }
      s_->scratch.resize(size_t(std::max<int64_t>(total * esize, 1)));
      s_->leaders->all_gather_v(mine.data(), int64_t(mine.size()) / std::max<int64_t>(esize, 1), s_->scratch.data(), per_client, dtype);
    }
    sync();
    // Reorder into group-rank order.
    std::vector<int64_t> rank_offset(size_t(size()), 0);
    for (int r = 1; r < size(); ++r) rank_offset[r] = rank_offset[r - 1] + recv_counts[r - 1];
    int64_t at = 0;
    for (int c : s_->clients)
      for (int r : s_->members_of[c]) {
        if (recv_counts[r]) std::memcpy(bytes(recv) + rank_offset[r] * esize, s_->scratch.data() + at * esize, size_t(recv_counts[r] * esize));
        at += recv_counts[r];
      }
    sync();
  }

  void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype, ReduceOp op) override {
    const int64_t esize = dtype_size(dtype);
    const ReduceOp combine = op == ReduceOp::Avg ? ReduceOp::Sum : op;
    publish(send, recv, counts.data());
    int64_t total = 0;
    std::vector<int64_t> rank_offset(size_t(size()), 0);
    for (int r = 0; r < size(); ++r) {
      rank_offset[r] = total;
      total += counts[r];
    }
    if (leader()) {
      std::vector<std::byte> summed(size_t(std::max<int64_t>(total * esize, 1)));
      std::vector<const void*> inputs;
      for (const MemberBuffers& slot : s_->slots) inputs.push_back(slot.send);
      reduce_many(summed.data(), inputs.data(), int(inputs.size()), total, dtype, combine);
      // Client-major order, so each leader's share is contiguous.
      s_->scratch2.resize(summed.size());
      std::vector<int64_t> per_client;
      int64_t at = 0;
      for (int c : s_->clients) {
        int64_t n = 0;
        for (int r : s_->members_of[c]) {
          if (counts[r]) std::memcpy(s_->scratch2.data() + at * esize, summed.data() + rank_offset[r] * esize, size_t(counts[r] * esize));
          at += counts[r];
          n += counts[r];
        }
        per_client.push_back(n);
      }
      const int me = int(std::find(s_->clients.begin(), s_->clients.end(), s_->owner[rank()]) - s_->clients.begin());
      s_->scratch.resize(size_t(std::max<int64_t>(per_client[me] * esize, 1)));
      s_->leaders->reduce_scatter_v(s_->scratch2.data(), s_->scratch.data(), per_client, dtype, combine);
      if (op == ReduceOp::Avg)
        for (int64_t i = 0; i < per_client[me]; ++i)
          store_from_double(s_->scratch.data(), dtype, i, load_as_double(s_->scratch.data(), dtype, i) / size());
    }
    sync();
    // This client's share holds its members' blocks in rank order.
    int64_t at = 0;
    for (int r : s_->local_ranks) {
      if (r == rank() && counts[r]) std::memcpy(recv, s_->scratch.data() + at * esize, size_t(counts[r] * esize));
      at += counts[r];
    }
    sync();
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    const int64_t esize = dtype_size(dtype);
    publish(send, recv, send_counts.data(), recv_counts.data());
    if (leader()) {
      // Bundle for client c: for each local source s (rank order), for each member d of c: block s->d.
      std::vector<int64_t> send_per_client, recv_per_client;
      std::vector<std::byte> out;
      for (int c : s_->clients) {
        int64_t n = 0;
        for (size_t k = 0; k < s_->local_ranks.size(); ++k) {
          const int64_t* sc = s_->slots[k].send_counts;
          int64_t offset = 0;
          std::vector<int64_t> offsets(size_t(size()), 0);
          for (int d = 0; d < size(); ++d) offsets[d] = offset, offset += sc[d];
          for (int d : s_->members_of[c]) {
            out.insert(out.end(), bytes(s_->slots[k].send) + offsets[d] * esize, bytes(s_->slots[k].send) + (offsets[d] + sc[d]) * esize);
            n += sc[d];
          }
        }
        send_per_client.push_back(n);
        // From client c: for each of its sources s, for each local destination d: recv_counts_d[s].
        int64_t m = 0;
        for (int src : s_->members_of[c])
          for (size_t k = 0; k < s_->local_ranks.size(); ++k) m += s_->slots[k].recv_counts[src];
        recv_per_client.push_back(m);
      }
      int64_t total = 0;
      for (int64_t m : recv_per_client) total += m;
      s_->scratch.resize(size_t(std::max<int64_t>(total * esize, 1)));
      s_->leaders->all_to_all_v(out.data(), send_per_client, s_->scratch.data(), recv_per_client, dtype);
    }
    sync();
    // Unpack this member's blocks, in source-rank order.
    std::vector<int64_t> recv_offset(size_t(size()), 0);
    for (int r = 1; r < size(); ++r) recv_offset[r] = recv_offset[r - 1] + recv_counts[r - 1];
    int64_t at = 0;
    for (int c : s_->clients)
      for (int src : s_->members_of[c])
        for (size_t k = 0; k < s_->local_ranks.size(); ++k) {
          const int64_t n = s_->slots[k].recv_counts[src];
          if (s_->local_ranks[k] == rank() && n)
            std::memcpy(bytes(recv) + recv_offset[src] * esize, s_->scratch.data() + at * esize, size_t(n * esize));
          at += n;
        }
    sync();
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    const int64_t esize = dtype_size(dtype);
    publish(buffer, buffer);
    if (leader()) {
      s_->scratch.resize(size_t(std::max<int64_t>(count * esize, 1)));
      auto it = std::find(s_->local_ranks.begin(), s_->local_ranks.end(), root);
      if (it != s_->local_ranks.end() && count) std::memcpy(s_->scratch.data(), s_->slots[it - s_->local_ranks.begin()].send, size_t(count * esize));
      const int root_leader = int(std::find(s_->clients.begin(), s_->clients.end(), s_->owner[root]) - s_->clients.begin());
      s_->leaders->broadcast(s_->scratch.data(), count, dtype, root_leader);
    }
    sync();
    if (rank() != root && count) std::memcpy(buffer, s_->scratch.data(), size_t(count * esize));
    sync();
  }

  void barrier() override {
    sync();
    if (leader()) s_->leaders->barrier();
    sync();
  }

 private:
  bool leader() const { return local_ == 0; }
  void sync() { s_->barrier.arrive_and_wait(); }
  void publish(const void* send, void* recv, const int64_t* send_counts = nullptr, const int64_t* recv_counts = nullptr) {
    s_->slots[local_] = {send, recv, send_counts, recv_counts};
    sync();
  }

  std::shared_ptr<LocalMembers> s_;
  int local_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> create_hierarchical_group(std::vector<int> owner, std::vector<int> local_ranks,
                                                                     std::shared_ptr<Communicator> leaders) {
  auto shared = std::make_shared<LocalMembers>(std::move(owner), std::move(local_ranks), std::move(leaders));
  std::vector<std::shared_ptr<Communicator>> out;
  for (size_t k = 0; k < shared->local_ranks.size(); ++k) out.push_back(std::make_shared<HierarchicalCommunicator>(shared, int(k)));
  return out;
}

}  // namespace tessera
