#include "comm/shared_memory_communicator.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/byte_pointers.hpp"
#include "comm/collective_timeout.hpp"
#include "comm/process_barrier.hpp"
#include "comm/reduce_kernels.hpp"
#include "comm/shared_buffer_pool.hpp"
#include "comm/shared_segment.hpp"
#include "dsl/array.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"

namespace tessera {
namespace {

// One slot's data area. 1 MiB keeps a 4-rank group's segment at 8 MiB while a round still
// moves enough to hide the barrier's microsecond.
constexpr int64_t kSlotCapacityBytes = int64_t(1) << 20;
// All_reduces up to this size are reduced whole by every rank (one barrier); larger ones are
// reduced a slice per rank, then gathered (two barriers, each byte reduced once).
constexpr int64_t kWholeReduceBytes = int64_t(32) << 10;
constexpr size_t kLine = 64;

// TESSERA_SHARED_POOL_MB (default 64): the pool of group buffers (all_gathers written in place).
int64_t pool_capacity_bytes() {
  const char* v = std::getenv("TESSERA_SHARED_POOL_MB");
  return (v && *v ? std::max<int64_t>(0, std::atoll(v)) : 64) << 20;
}

size_t round_up(size_t x) { return (x + kLine - 1) / kLine * kLine; }

// What a rank publishes with its data in a collective's first round, so that every rank can
// check every pair and all of them throw alike on a mismatch.
struct SlotHeader {
  int64_t count;
  int64_t root;
  int64_t pool_offset;  // all_to_all_v: where the sender's rows lie in the group buffer pool, or -1
  // followed by int64_t counts[2 * group size]: what it sends to each rank, then what it
  // expects from each
};

struct alignas(kLine) Arrival {
  std::atomic<uint64_t> barriers;  // barriers this rank has reached: who is missing on a timeout
};

// Where everything lies in the segment: the barrier, each rank's arrival count, then each
// rank's two slots (header, then data).
struct SegmentLayout {
  explicit SegmentLayout(int n)
      : size(n), header_bytes(round_up(sizeof(SlotHeader) + 2 * size_t(n) * sizeof(int64_t))),
        slot_bytes(header_bytes + size_t(kSlotCapacityBytes)),
        slots_offset(round_up(sizeof(ProcessBarrierState)) + size_t(n) * sizeof(Arrival)) {}
  size_t total_bytes() const { return slots_offset + size_t(size) * 2 * slot_bytes; }
  int size;
  size_t header_bytes, slot_bytes, slots_offset;
};

// The piece of a block of `total` elements that round k moves, `per_round` elements per round.
int64_t piece(int64_t total, int64_t k, int64_t per_round) { return std::clamp(total - k * per_round, int64_t(0), per_round); }

int64_t rounds_for(int64_t largest, int64_t per_round) { return std::max<int64_t>(1, (largest + per_round - 1) / per_round); }


void copy_bytes(void* to, const void* from, int64_t n) {
  if (n > 0 && to != from) std::memcpy(to, from, size_t(n));
}

std::atomic<int64_t> staged_bytes{0};

// A sender's copy into its slot, counted (all_to_all_v_bytes_staged).
void stage(void* to, const void* from, int64_t n) {
  copy_bytes(to, from, n);
  if (n > 0) staged_bytes.fetch_add(n, std::memory_order_relaxed);
}

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(MPI_Comm comm, std::unique_ptr<SharedSegment> segment, int size, int rank, int spin_iterations)
      : comm_(comm), segment_(std::move(segment)), layout_(size), rank_(rank),
        barrier_(reinterpret_cast<ProcessBarrierState*>(segment_->data()), size, spin_iterations),
        arrivals_(reinterpret_cast<Arrival*>(segment_->data() + round_up(sizeof(ProcessBarrierState)))),
        timeout_(collective_timeout_seconds()) {}

  ~SharedMemoryCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return layout_.size; }

  void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    const char* what = "all_reduce";
    start(what);
    const int n = size();
    const int64_t esize = dtype_size(dtype), per_round = kSlotCapacityBytes / esize;
    std::vector<const void*> inputs(size_t(n), nullptr);
    for (int64_t k = 0, done = 0; k == 0 || done < count; ++k, flip()) {
      const int64_t m = std::min(per_round, count - done);
      header(rank_).count = count;
      copy_bytes(data(rank_), bytes(send) + done * esize, m * esize);
      sync();
      if (k == 0)
        for (int r = 0; r < n; ++r)
          if (header(r).count != count) mismatch(r, count, header(r).count);
      std::byte* out = bytes(recv) + done * esize;
      if (m * esize <= kWholeReduceBytes) {
        for (int r = 0; r < n; ++r) inputs[size_t(r)] = data(r);
        reduce_many(out, inputs.data(), n, m, dtype, op);
      } else {
        // Reduce this rank's slice into its slot (for the others) and its output, then gather.
        const ChunkRange mine = chunk_range(m, n, rank_);
        for (int r = 0; r < n; ++r) inputs[size_t(r)] = data(r) + mine.start * esize;
        void* outs[2] = {data(rank_) + mine.start * esize, out + mine.start * esize};
        reduce_many_to(outs, 2, inputs.data(), n, mine.length, dtype, op);
        sync();
        for (int r = 0; r < n; ++r) {
          if (r == rank_) continue;
          const ChunkRange theirs = chunk_range(m, n, r);
          copy_bytes(out + theirs.start * esize, data(r) + theirs.start * esize, theirs.length * esize);
        }
      }
      done += m;
    }
  }

  void all_gather_v(const void* send, int64_t send_count, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    const char* what = "all_gather_v";
    start(what);
    check_counts(recv_counts);
    const int n = size();
    const int64_t esize = dtype_size(dtype), per_round = kSlotCapacityBytes / esize;
    const std::vector<int64_t> offsets = block_offsets(recv_counts);
    int64_t rounds = 1;
    for (int64_t k = 0; k < rounds; ++k, flip()) {
      if (k == 0) {
        header(rank_).count = send_count;
        std::copy(recv_counts.begin(), recv_counts.end(), expected_counts(rank_));
      }
      copy_bytes(data(rank_), bytes(send) + k * per_round * esize, piece(send_count, k, per_round) * esize);
      sync();
      if (k == 0) {
        for (int dst = 0; dst < n; ++dst)
          for (int src = 0; src < n; ++src)
            if (expected_counts(dst)[src] != header(src).count) mismatch(dst, expected_counts(dst)[src], header(src).count, src);
        rounds = rounds_for(*std::max_element(recv_counts.begin(), recv_counts.end()), per_round);
        copy_bytes(bytes(recv) + offsets[size_t(rank_)] * esize, send, send_count * esize);  // own block, whole
      }
      for (int r = 0; r < n; ++r)
        if (r != rank_)
          copy_bytes(bytes(recv) + (offsets[size_t(r)] + k * per_round) * esize, data(r), piece(recv_counts[r], k, per_round) * esize);
    }
  }

  void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype,
                        ReduceOp op) override {
    const char* what = "reduce_scatter_v";
    start(what);
    check_counts(counts);
    const int n = size();
    const int64_t esize = dtype_size(dtype), per_round = piece_elements(esize);
    const std::vector<int64_t> offsets = block_offsets(counts);
    const int64_t rounds = rounds_for(*std::max_element(counts.begin(), counts.end()), per_round);
    std::vector<const void*> inputs(size_t(n), nullptr);
    for (int64_t k = 0; k < rounds; ++k, flip()) {
      if (k == 0) std::copy(counts.begin(), counts.end(), sent_counts(rank_));
      for (int b = 0; b < n; ++b)
        copy_bytes(data(rank_) + b * per_round * esize, bytes(send) + (offsets[size_t(b)] + k * per_round) * esize,
             piece(counts[b], k, per_round) * esize);
      sync();
      if (k == 0)
        for (int r = 0; r < n; ++r)
          for (int b = 0; b < n; ++b)
            if (sent_counts(r)[b] != counts[b]) mismatch(r, counts[b], sent_counts(r)[b], b);
      for (int r = 0; r < n; ++r) inputs[size_t(r)] = data(r) + rank_ * per_round * esize;
      reduce_many(bytes(recv) + k * per_round * esize, inputs.data(), n, piece(counts[rank_], k, per_round), dtype, op);
    }
  }

  // A sender whose rows lie in a group buffer (the runtime puts an all_to_all_v's input there,
  // jit/device_run.cpp) is read straight from it: one copy of each byte and no system call,
  // where staging copies twice and MPI's single copy (process_vm_readv) is a system call per
  // message. The others stage their rows through their slots, round by round. A last barrier
  // keeps direct senders here until every receiver has read them.
  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    const char* what = "all_to_all_v";
    start(what);
    check_counts(send_counts);
    check_counts(recv_counts);
    const int n = size();
    const int64_t esize = dtype_size(dtype), per_round = piece_elements(esize);
    const std::vector<int64_t> send_offsets = block_offsets(send_counts), recv_offsets = block_offsets(recv_counts);
    const int64_t sent = send_offsets.back() + send_counts.back();
    const int64_t mine_in_pool = pool_ ? pool_->offset_of(send, sent * esize) : -1;
    std::vector<int64_t> in_pool(size_t(n), -1);  // per sender: where its rows for this rank lie in the pool
    bool any_in_pool = false;
    int64_t rounds = 1;
    for (int64_t k = 0; k < rounds; ++k, flip()) {
      if (k == 0) {
        header(rank_).pool_offset = mine_in_pool;
        std::copy(send_counts.begin(), send_counts.end(), sent_counts(rank_));
        std::copy(recv_counts.begin(), recv_counts.end(), expected_counts(rank_));
      }
      if (mine_in_pool < 0)
        for (int d = 0; d < n; ++d)
          if (d != rank_) stage(data(rank_) + d * per_round * esize, bytes(send) + (send_offsets[size_t(d)] + k * per_round) * esize,
                                piece(send_counts[d], k, per_round) * esize);
      sync();
      if (k == 0) {
        int64_t largest = 0;  // the largest block staged
        for (int dst = 0; dst < n; ++dst)
          for (int src = 0; src < n; ++src) {
            if (expected_counts(dst)[src] != sent_counts(src)[dst])
              mismatch(dst, expected_counts(dst)[src], sent_counts(src)[dst], src);
            if (header(src).pool_offset < 0) largest = std::max(largest, sent_counts(src)[dst]);
          }
        rounds = rounds_for(largest, per_round);
        for (int src = 0; src < n; ++src) {
          if (src == rank_ || header(src).pool_offset < 0) continue;
          int64_t before = 0;  // the rows it sends to lower ranks
          for (int r = 0; r < rank_; ++r) before += sent_counts(src)[r];
          in_pool[size_t(src)] = header(src).pool_offset + before * esize;
          any_in_pool = true;
        }
        copy_bytes(bytes(recv) + recv_offsets[size_t(rank_)] * esize, bytes(send) + send_offsets[size_t(rank_)] * esize,
                   recv_counts[rank_] * esize);  // own block, whole
        for (int src = 0; src < n; ++src)
          if (in_pool[size_t(src)] >= 0)
            copy_bytes(bytes(recv) + recv_offsets[size_t(src)] * esize, pool_->at(in_pool[size_t(src)]), recv_counts[src] * esize);
      }
      for (int src = 0; src < n; ++src)
        if (src != rank_ && in_pool[size_t(src)] < 0)
          copy_bytes(bytes(recv) + (recv_offsets[size_t(src)] + k * per_round) * esize, data(src) + rank_ * per_round * esize,
                     piece(recv_counts[src], k, per_round) * esize);
    }
    if (any_in_pool || mine_in_pool >= 0) sync();
  }

  // Each rank packs its regions straight into its slot and unpacks its peers' straight out of
  // theirs: two copies where packing, staging, reading and unpacking make four. Regions larger
  // than a round's piece take the packing default (every rank learns the largest in round 0).
  void all_to_all_regions(const void* send, const ShardBox& send_block, std::span<const ShardBox> send_regions, void* recv,
                          const ShardBox& recv_block, std::span<const ShardBox> recv_regions, DType dtype) override {
    start("all_to_all_regions");
    const int n = size();
    if (int(send_regions.size()) != n || int(recv_regions.size()) != n)
      throw CommError("all_to_all_regions: " + std::to_string(send_regions.size()) + " send and " +
                      std::to_string(recv_regions.size()) + " receive regions for a group of " + std::to_string(n));
    const int64_t esize = dtype_size(dtype), per_round = piece_elements(esize);
    int64_t largest = 0;
    for (int r = 0; r < n; ++r) {
      sent_counts(rank_)[r] = send_regions[r].num_elements();
      expected_counts(rank_)[r] = recv_regions[r].num_elements();
      largest = std::max({largest, sent_counts(rank_)[r], expected_counts(rank_)[r]});
    }
    header(rank_).count = largest;
    const BlockRef mine{bytes(send), send_block.local_shape, send_block.global_offset};
    if (largest <= per_round)
      for (int d = 0; d < n; ++d)
        if (d != rank_)
          copy_region(mine, data(rank_) + d * per_round * esize, send_regions[d].local_shape, send_regions[d].global_offset,
                      send_regions[d].global_offset, send_regions[d].local_shape, esize);
    sync();
    for (int dst = 0; dst < n; ++dst)
      for (int src = 0; src < n; ++src) {
        if (expected_counts(dst)[src] != sent_counts(src)[dst]) mismatch(dst, expected_counts(dst)[src], sent_counts(src)[dst], src);
        largest = std::max(largest, header(src).count);
      }
    if (largest > per_round) {
      flip();
      Communicator::all_to_all_regions(send, send_block, send_regions, recv, recv_block, recv_regions, dtype);
      return;
    }
    for (int src = 0; src < n; ++src) {
      const ShardBox& region = recv_regions[src];
      const BlockRef theirs = src == rank_ ? mine : BlockRef{data(src) + rank_ * per_round * esize, region.local_shape, region.global_offset};
      copy_region(theirs, bytes(recv), recv_block.local_shape, recv_block.global_offset, region.global_offset, region.local_shape, esize);
    }
    flip();
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    const char* what = "broadcast";
    start(what);
    if (root < 0 || root >= size())
      throw CommError("broadcast: root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size()));
    const int64_t esize = dtype_size(dtype), per_round = kSlotCapacityBytes / esize;
    const int64_t rounds = rounds_for(count, per_round);
    for (int64_t k = 0; k < rounds; ++k, flip()) {
      header(rank_).count = count;
      header(rank_).root = root;
      std::byte* at = bytes(buffer) + k * per_round * esize;
      const int64_t length = piece(count, k, per_round) * esize;
      if (rank_ == root) copy_bytes(data(rank_), at, length);
      sync();
      if (k == 0)
        for (int r = 0; r < size(); ++r) {
          if (header(r).count != count) mismatch(r, count, header(r).count);
          if (header(r).root != root)
            mismatch_text("rank " + std::to_string(r) + " broadcasts from root " + std::to_string(header(r).root) +
                          " but this rank from " + std::to_string(root));
        }
      if (rank_ != root) copy_bytes(at, data(root), length);
    }
  }

  void barrier() override {
    start("barrier");
    sync();
  }

  // From a pool made on first use (a collective: every member's first call is the same one).
  std::shared_ptr<std::byte[]> allocate_group_buffer(int64_t bytes, uint64_t purpose) override {
    if (!pool_made_) {
      pool_made_ = true;
      pool_ = SharedBufferPool::create(comm_, size(), pool_capacity_bytes());
    }
    return pool_ ? pool_->allocate(bytes, purpose) : nullptr;
  }

  bool exchanges_from_group_buffers() const override { return true; }

 private:
  std::byte* slot(int r) const { return segment_->data() + layout_.slots_offset + (size_t(r) * 2 + parity_) * layout_.slot_bytes; }
  SlotHeader& header(int r) const { return *reinterpret_cast<SlotHeader*>(slot(r)); }
  int64_t* sent_counts(int r) const { return reinterpret_cast<int64_t*>(slot(r) + sizeof(SlotHeader)); }
  int64_t* expected_counts(int r) const { return sent_counts(r) + size(); }
  std::byte* data(int r) const { return slot(r) + layout_.header_bytes; }
  void flip() { parity_ ^= 1; }

  // Elements per destination block in one round of the collectives that stage a block for
  // every rank; a multiple of a cache line, so that each block starts on its own line.
  int64_t piece_elements(int64_t esize) const {
    return int64_t(size_t(kSlotCapacityBytes / size()) / kLine * kLine) / esize;
  }

  void start(const char* what) {
    what_ = what;
    ++sequence_;
  }

  void sync() {
    arrivals_[rank_].barriers.store(++barriers_, std::memory_order_relaxed);
    barrier_.arrive_and_wait(timeout_, [this] { report_timeout(); });
  }

  [[noreturn]] void report_timeout() {
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r)
      if (arrivals_[r].barriers.load(std::memory_order_relaxed) < barriers_) missing.push_back(r);
    abort_on_collective_timeout(comm_, what_, sequence_, timeout_, missing);
  }

  // Every rank finds the same mismatch after the same barrier, so all of them throw (the parity
  // flips as if the round had ended: the ranks stay in step for the next collective).
  [[noreturn]] void mismatch(int rank, int64_t expected, int64_t got, int peer = -1) {
    mismatch_text("rank " + std::to_string(rank) + " expects " + std::to_string(expected) + " elements" +
                  (peer >= 0 ? " from rank " + std::to_string(peer) : std::string()) + " but the group provides " +
                  std::to_string(got));
  }
  [[noreturn]] void mismatch_text(const std::string& text) {
    flip();
    throw CommError(std::string(what_) + ": " + text);
  }

  void check_counts(std::span<const int64_t> counts) const {
    if (int(counts.size()) != size())
      throw CommError(std::string(what_) + ": " + std::to_string(counts.size()) + " counts for a group of " +
                      std::to_string(size()));
  }

  static std::vector<int64_t> block_offsets(std::span<const int64_t> counts) {
    std::vector<int64_t> out(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) out[i] = out[i - 1] + counts[i - 1];
    return out;
  }

  MPI_Comm comm_;
  std::unique_ptr<SharedSegment> segment_;
  const SegmentLayout layout_;
  const int rank_;
  ProcessBarrier barrier_;
  Arrival* arrivals_;
  const double timeout_;
  int parity_ = 0;
  uint64_t barriers_ = 0;
  int64_t sequence_ = 0;
  const char* what_ = "";
  bool pool_made_ = false;
  std::shared_ptr<SharedBufferPool> pool_;
};

}  // namespace

int64_t all_to_all_v_bytes_staged() { return staged_bytes.load(std::memory_order_relaxed); }

std::shared_ptr<Communicator> make_shared_memory_communicator(void* mpi_comm, int spin_iterations) {
  MPI_Comm comm = static_cast<MPI_Comm>(mpi_comm);
  int size = 0, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const SegmentLayout layout(size);
  auto segment = SharedSegment::create(mpi_comm, layout.total_bytes());
  if (!segment) return nullptr;
  return std::make_shared<SharedMemoryCommunicator>(comm, std::move(segment), size, rank, spin_iterations);
}

}  // namespace tessera
