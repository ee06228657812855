#include "comm/in_process_communicator.hpp"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "comm/byte_pointers.hpp"
#include "comm/reduce_kernels.hpp"
#include "comm/region_exchange.hpp"
#include "dsl/array.hpp"
#include "dsl/buffer_pool.hpp"
#include "comm/spin_barrier.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"

namespace tessera {
namespace {

// What one rank publishes for the collective in flight.
struct alignas(64) Slot {
  const void* send = nullptr;
  void* recv = nullptr;
  const int64_t* send_counts = nullptr;  // v-collectives: per-rank counts
  const int64_t* recv_counts = nullptr;
  int64_t count = 0;
  const ShardBox* send_block = nullptr;    // all_to_all_regions: the sender's block and regions
  const ShardBox* send_regions = nullptr;
  const ShardBox* recv_regions = nullptr;
};

// A group buffer some members have taken and others not yet.
struct GroupBuffer {
  std::shared_ptr<std::byte[]> buffer;
  int64_t bytes = 0;
  uint64_t purpose = 0;
  int takers = 0;
};

struct GroupState {
  GroupState(int n, int64_t busy_threads)
      : size(n), slots(n),
        barrier(n, spin_iterations_for(busy_threads)) {}
  const int size;
  std::vector<Slot> slots;
  SpinBarrier barrier;
  std::mutex buffers_mutex;
  std::map<int64_t, GroupBuffer> buffers;  // by allocation number
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<GroupState> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  // Each rank reduces its own slice from every rank's input and writes the result straight into
  // every rank's output: each byte is read once and written once per rank (the minimum), with
  // two barriers. In place is safe: only the slice's owner reads or writes it.
  void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    const int n = size();
    const int64_t esize = dtype_size(dtype);
    if (n == 1) {
      reduce_many(recv, &send, 1, count, dtype, op);
      return;
    }
    publish(send, recv, count);
    for (int r = 0; r < n; ++r)
      if (slot(r).count != count) mismatch("all_reduce", r, count, slot(r).count);
    const ChunkRange mine = chunk_range(count, n, rank_);
    std::vector<const void*> inputs(n);
    std::vector<void*> outputs(n);
    for (int r = 0; r < n; ++r) {
      inputs[r] = bytes(slot(r).send) + mine.start * esize;
      outputs[r] = bytes(slot(r).recv) + mine.start * esize;
    }
    reduce_many_to(outputs.data(), n, inputs.data(), n, mine.length, dtype, op);
    sync();
  }

  void all_gather_v(const void* send, int64_t send_count, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    check_counts(recv_counts, "all_gather_v");
    const int64_t esize = dtype_size(dtype);
    slots_mine().recv_counts = recv_counts.data();
    publish(send, recv, send_count);
    // Every rank checks every pair, so a mismatch throws on all ranks alike (nobody hangs).
    for (int dst = 0; dst < size(); ++dst)
      for (int src = 0; src < size(); ++src)
        if (slot(dst).recv_counts[src] != slot(src).count)
          mismatch("all_gather_v", dst, slot(dst).recv_counts[src], slot(src).count, src);
    int64_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      std::byte* block = bytes(recv) + offset * esize;
      if (recv_counts[r] > 0 && block != slot(r).send)  // a block already in place (gathered in place) stays
        std::memcpy(block, slot(r).send, size_t(recv_counts[r] * esize));
      offset += recv_counts[r];
    }
    sync();
  }

  void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype,
                        ReduceOp op) override {
    check_counts(counts, "reduce_scatter_v");
    const int n = size();
    const int64_t esize = dtype_size(dtype);
    slots_mine().send_counts = counts.data();
    publish(send, recv, 0);
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < n; ++b)
        if (slot(r).send_counts[b] != counts[b]) mismatch("reduce_scatter_v", r, counts[b], slot(r).send_counts[b], b);
    int64_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[r];
    std::vector<const void*> inputs(n);
    for (int r = 0; r < n; ++r) inputs[r] = bytes(slot(r).send) + offset * esize;
    reduce_many(recv, inputs.data(), n, counts[rank_], dtype, op);
    sync();
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    check_counts(send_counts, "all_to_all_v");
    check_counts(recv_counts, "all_to_all_v");
    const int n = size();
    const int64_t esize = dtype_size(dtype);
    slots_mine().send_counts = send_counts.data();
    slots_mine().recv_counts = recv_counts.data();
    publish(send, recv, 0);
    for (int dst = 0; dst < n; ++dst)
      for (int src = 0; src < n; ++src)
        if (slot(dst).recv_counts[src] != slot(src).send_counts[dst])
          mismatch("all_to_all_v", dst, slot(dst).recv_counts[src], slot(src).send_counts[dst], src);
    int64_t recv_offset = 0;
    for (int src = 0; src < n; ++src) {
      const int64_t* their_counts = slot(src).send_counts;
      int64_t send_offset = 0;
      for (int r = 0; r < rank_; ++r) send_offset += their_counts[r];
      if (recv_counts[src] > 0)
        std::memcpy(bytes(recv) + recv_offset * esize, bytes(slot(src).send) + send_offset * esize,
                    size_t(recv_counts[src] * esize));
      recv_offset += recv_counts[src];
    }
    sync();
  }

  // Each rank copies the regions meant for it straight out of its peers' blocks: one copy of
  // each byte, where packing, exchanging and unpacking made three.
  void all_to_all_regions(const void* send, const ShardBox& send_block, std::span<const ShardBox> send_regions, void* recv,
                          const ShardBox& recv_block, std::span<const ShardBox> recv_regions, DType dtype) override {
    if (int(send_regions.size()) != size() || int(recv_regions.size()) != size())
      throw CommError("all_to_all_regions: " + std::to_string(send_regions.size()) + " send and " +
                      std::to_string(recv_regions.size()) + " receive regions for a group of " + std::to_string(size()));
    slots_mine().send_block = &send_block;
    slots_mine().send_regions = send_regions.data();
    slots_mine().recv_regions = recv_regions.data();
    publish(send, recv, 0);
    if (auto bad = first_region_mismatch(
            size(), [&](int src, int dst) -> const ShardBox& { return slot(src).send_regions[dst]; },
            [&](int dst, int src) -> const ShardBox& { return slot(dst).recv_regions[src]; }))
      mismatch("all_to_all_regions", bad->receiver, bad->expected, bad->got, bad->sender);
    const int64_t esize = dtype_size(dtype);
    for (int src = 0; src < size(); ++src) {
      const ShardBox& region = recv_regions[src];
      const ShardBox& theirs = *slot(src).send_block;
      copy_region(BlockRef{bytes(slot(src).send), theirs.local_shape, theirs.global_offset}, bytes(recv),
                  recv_block.local_shape, recv_block.global_offset, region.global_offset, region.local_shape, esize);
    }
    sync();
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= size())
      throw CommError("broadcast: root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size()));
    publish(buffer, buffer, count);
    if (rank_ != root && count > 0) std::memcpy(buffer, slot(root).send, size_t(count * dtype_size(dtype)));
    sync();
  }

  void barrier() override { sync(); }

  // Every member of an in-process group sees all memory: the first member to ask for its n-th
  // buffer allocates it, the others take the same one.
  std::shared_ptr<std::byte[]> allocate_group_buffer(int64_t bytes, uint64_t purpose) override {
    const int64_t number = ++buffers_taken_;
    GroupState& g = *group_;
    std::lock_guard lock(g.buffers_mutex);
    GroupBuffer& entry = g.buffers[number];
    if (entry.takers == 0) entry = {allocate_buffer(bytes, false), bytes, purpose, 0};
    if (entry.bytes != bytes || entry.purpose != purpose)
      throw InternalError(fmt::format("group buffer #{}: rank {} asks for {} bytes for {:016x}, another member for {} bytes for "
                                      "{:016x} (the members run different programs or fell out of step)",
                                      number, rank_, bytes, purpose, entry.bytes, entry.purpose));
    std::shared_ptr<std::byte[]> out = entry.buffer;
    if (++entry.takers == g.size) g.buffers.erase(number);
    return out;
  }

 private:
  const Slot& slot(int r) const { return group_->slots[r]; }
  Slot& slots_mine() { return group_->slots[rank_]; }
  void sync() { group_->barrier.arrive_and_wait(); }

  // Thrown by every rank after the publishing barrier; the closing barrier keeps them in step.
  [[noreturn]] void mismatch(const char* what, int rank, int64_t expected, int64_t got, int peer = -1) {
    sync();
    throw CommError(std::string(what) + ": rank " + std::to_string(rank) + " expects " + std::to_string(expected) +
                    " elements" + (peer >= 0 ? " from rank " + std::to_string(peer) : std::string()) +
                    " but the group provides " + std::to_string(got));
  }

  void publish(const void* send, void* recv, int64_t count) {
    Slot& s = slots_mine();
    s.send = send;
    s.recv = recv;
    s.count = count;
    sync();
  }

  void check_counts(std::span<const int64_t> counts, const char* what) const {
    if (int(counts.size()) != size())
      throw CommError(std::string(what) + ": " + std::to_string(counts.size()) + " counts for a group of " +
                      std::to_string(size()));
  }

  std::shared_ptr<GroupState> group_;
  const int rank_;
  int64_t buffers_taken_ = 0;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> create_in_process_group(int size, int64_t busy_threads) {
  if (size < 1) throw CommError("an in-process group needs at least one rank, got " + std::to_string(size));
  auto state = std::make_shared<GroupState>(size, busy_threads > 0 ? busy_threads : size);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_shared<InProcessCommunicator>(state, r));
  return out;
}

}  // namespace tessera
