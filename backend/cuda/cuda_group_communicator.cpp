#include "backend/cuda/cuda_group_communicator.hpp"

#include <fmt/format.h>

#include <string>

#include "comm/byte_pointers.hpp"
#include "comm/region_exchange.hpp"
#include "comm/spin_barrier.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"
#include "backend/cuda/cuda_collective_kernels.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/virtual_gpu.hpp"

namespace tessera {
namespace {


// What one member publishes for the collective in flight.
struct alignas(64) Slot {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  const int64_t* send_counts = nullptr;  // v-collectives: per-rank counts
  const int64_t* recv_counts = nullptr;
  const ShardBox* send_block = nullptr;  // all_to_all_regions: the sender's block and regions
  const ShardBox* send_regions = nullptr;
  const ShardBox* recv_regions = nullptr;
  CUevent ready = nullptr;  // recorded when the member's earlier work (its send buffer) is queued
  CUevent done = nullptr;   // recorded after the member's part of the collective
};

struct GroupState {
  GroupState(std::vector<VirtualGpu*> members)
      : gpus(std::move(members)), slots(gpus.size()), barrier(int(gpus.size()), spin_iterations_for(int64_t(gpus.size()))) {
    const CudaDriver& cu = cuda_driver();
    for (size_t r = 0; r < gpus.size(); ++r) {
      gpus[r]->make_current();
      cu.check(cu.cuEventCreate(&slots[r].ready, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      cu.check(cu.cuEventCreate(&slots[r].done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
  }
  ~GroupState() {
    const CudaDriver* cu = CudaDriver::get();
    if (!cu) return;
    for (size_t r = 0; r < gpus.size(); ++r) {
      gpus[r]->make_current();
      cu->cuEventDestroy(slots[r].ready);
      cu->cuEventDestroy(slots[r].done);
    }
  }
  const std::vector<VirtualGpu*> gpus;
  std::vector<Slot> slots;
  SpinBarrier barrier;
};

class CudaGroupCommunicator final : public Communicator {
 public:
  CudaGroupCommunicator(std::shared_ptr<GroupState> group, int rank)
      : group_(std::move(group)), rank_(rank), gpu_(*group_->gpus[size_t(rank)]) {}

  int rank() const override { return rank_; }
  int size() const override { return int(group_->gpus.size()); }
  MemorySpace memory_space() const override { return MemorySpace::Cuda; }

  // Each member reduces its slice of every member's input into every member's output: each
  // byte is read once and written once per member. In place is safe: a slice is read and
  // written by its owner's kernel only.
  void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    begin(send, recv, count);
    for (int r = 0; r < size(); ++r)
      if (slot(r).count != count) mismatch("all_reduce", r, count, slot(r).count);
    const ChunkRange mine = chunk_range(count, size(), rank_);
    const int64_t esize = dtype_size(dtype);
    std::vector<const void*> ins(static_cast<size_t>(size()));
    std::vector<void*> outs(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      ins[size_t(r)] = bytes(slot(r).send) + mine.start * esize;
      outs[size_t(r)] = bytes(slot(r).recv) + mine.start * esize;
    }
    launch_device_reduce(gpu_.gpu(), gpu_.stream(), outs.data(), size(), ins.data(), size(), mine.length, dtype, op);
    end();
  }

  void all_gather_v(const void* send, int64_t send_count, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    check_counts(recv_counts, "all_gather_v");
    mine().recv_counts = recv_counts.data();
    begin(send, recv, send_count);
    for (int dst = 0; dst < size(); ++dst)
      for (int src = 0; src < size(); ++src)
        if (slot(dst).recv_counts[src] != slot(src).count)
          mismatch("all_gather_v", dst, slot(dst).recv_counts[src], slot(src).count, src);
    const int64_t esize = dtype_size(dtype);
    int64_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      copy(bytes(recv) + offset * esize, slot(r).send, recv_counts[size_t(r)] * esize);
      offset += recv_counts[size_t(r)];
    }
    end();
  }

  void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype, ReduceOp op) override {
    check_counts(counts, "reduce_scatter_v");
    mine().send_counts = counts.data();
    begin(send, recv, 0);
    for (int r = 0; r < size(); ++r)
      for (int b = 0; b < size(); ++b)
        if (slot(r).send_counts[b] != counts[size_t(b)]) mismatch("reduce_scatter_v", r, counts[size_t(b)], slot(r).send_counts[b], b);
    int64_t offset = 0;
    for (int r = 0; r < rank_; ++r) offset += counts[size_t(r)];
    const int64_t esize = dtype_size(dtype);
    std::vector<const void*> ins(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) ins[size_t(r)] = bytes(slot(r).send) + offset * esize;
    launch_device_reduce(gpu_.gpu(), gpu_.stream(), &recv, 1, ins.data(), size(), counts[size_t(rank_)], dtype, op);
    end();
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    check_counts(send_counts, "all_to_all_v");
    check_counts(recv_counts, "all_to_all_v");
    mine().send_counts = send_counts.data();
    mine().recv_counts = recv_counts.data();
    begin(send, recv, 0);
    for (int dst = 0; dst < size(); ++dst)
      for (int src = 0; src < size(); ++src)
        if (slot(dst).recv_counts[src] != slot(src).send_counts[dst])
          mismatch("all_to_all_v", dst, slot(dst).recv_counts[src], slot(src).send_counts[dst], src);
    const int64_t esize = dtype_size(dtype);
    int64_t recv_offset = 0;
    for (int src = 0; src < size(); ++src) {
      int64_t send_offset = 0;
      for (int r = 0; r < rank_; ++r) send_offset += slot(src).send_counts[r];
      copy(bytes(recv) + recv_offset * esize, bytes(slot(src).send) + send_offset * esize, recv_counts[size_t(src)] * esize);
      recv_offset += recv_counts[size_t(src)];
    }
    end();
  }

  // Each member copies the regions meant for it straight out of its peers' blocks, one region
  // copy kernel per peer.
  void all_to_all_regions(const void* send, const ShardBox& send_block, std::span<const ShardBox> send_regions, void* recv,
                          const ShardBox& recv_block, std::span<const ShardBox> recv_regions, DType dtype) override {
    if (int(send_regions.size()) != size() || int(recv_regions.size()) != size())
      throw CommError(fmt::format("all_to_all_regions: {} send and {} receive regions for a group of {}", send_regions.size(),
                                  recv_regions.size(), size()));
    mine().send_block = &send_block;
    mine().send_regions = send_regions.data();
    mine().recv_regions = recv_regions.data();
    begin(send, recv, 0);
    if (auto bad = first_region_mismatch(
            size(), [&](int src, int dst) -> const ShardBox& { return slot(src).send_regions[dst]; },
            [&](int dst, int src) -> const ShardBox& { return slot(dst).recv_regions[src]; }))
      mismatch("all_to_all_regions", bad->receiver, bad->expected, bad->got, bad->sender);
    for (int src = 0; src < size(); ++src) {
      const ShardBox& region = recv_regions[size_t(src)];
      if (region.num_elements() == 0) continue;
      const ShardBox& theirs = *slot(src).send_block;
      launch_device_copy_region(gpu_.gpu(), gpu_.stream(), slot(src).send, theirs.local_shape, theirs.global_offset, recv,
                                recv_block.local_shape, recv_block.global_offset, region.global_offset, region.local_shape,
                                dtype_size(dtype));
    }
    end();
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= size())
      throw CommError(fmt::format("broadcast: root {} is not a rank of a group of {}", root, size()));
    begin(buffer, buffer, count);
    if (rank_ != root) copy(buffer, slot(root).send, count * dtype_size(dtype));
    end();
  }

  // Work queued on any member before the barrier is done before work any member queues after it.
  void barrier() override {
    begin(nullptr, nullptr, 0);
    end();
  }

 private:
  const Slot& slot(int r) const { return group_->slots[size_t(r)]; }
  Slot& mine() { return group_->slots[size_t(rank_)]; }

  // Publishes this member's buffers with an event behind its queued work, meets the others, and
  // queues this stream behind every member's event.
  void begin(const void* send, void* recv, int64_t count) {
    const CudaDriver& cu = cuda_driver();
    gpu_.make_current();
    Slot& s = mine();
    s.send = send;
    s.recv = recv;
    s.count = count;
    cu.check(cu.cuEventRecord(s.ready, gpu_.stream()), "cuEventRecord");
    group_->barrier.arrive_and_wait();
    wait_for_every(&Slot::ready);
  }

  // Marks this member's part done, meets the others, and queues this stream behind every
  // member's part (a later kernel here may overwrite what a peer is still reading). A peer
  // records its next events only after the next begin's barrier, which this member reaches
  // after these waits are queued.
  void end() {
    const CudaDriver& cu = cuda_driver();
    cu.check(cu.cuEventRecord(mine().done, gpu_.stream()), "cuEventRecord");
    group_->barrier.arrive_and_wait();
    wait_for_every(&Slot::done);
  }

  void wait_for_every(CUevent Slot::*event) {
    const CudaDriver& cu = cuda_driver();
    for (int r = 0; r < size(); ++r)
      if (r != rank_) cu.check(cu.cuStreamWaitEvent(gpu_.stream(), slot(r).*event, 0), "cuStreamWaitEvent");
  }

  void copy(void* to, const void* from, int64_t count_bytes) {
    if (count_bytes <= 0 || to == from) return;
    const CudaDriver& cu = cuda_driver();
    cu.check(cu.cuMemcpyDtoDAsync(device_pointer(to), device_pointer(from), size_t(count_bytes), gpu_.stream()),
             "cuMemcpyDtoDAsync (collective)");
  }

  // Thrown by every member after the publishing barrier; the closing barrier keeps them in step.
  [[noreturn]] void mismatch(const char* what, int rank, int64_t expected, int64_t got, int peer = -1) {
    group_->barrier.arrive_and_wait();
    throw CommError(fmt::format("{}: rank {} expects {} elements{} but the group provides {}", what, rank, expected,
                                peer >= 0 ? fmt::format(" from rank {}", peer) : std::string(), got));
  }

  void check_counts(std::span<const int64_t> counts, const char* what) const {
    if (int(counts.size()) != size())
      throw CommError(fmt::format("{}: {} counts for a group of {}", what, counts.size(), size()));
  }

  std::shared_ptr<GroupState> group_;
  const int rank_;
  VirtualGpu& gpu_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> create_cuda_group(const std::vector<int64_t>& devices) {
  if (devices.empty() || int64_t(devices.size()) > kMaxReduceOperands) return {};
  std::vector<VirtualGpu*> gpus;
  for (int64_t d : devices) {
    gpus.push_back(&VirtualGpu::get(d));
    if (gpus.back()->gpu().ordinal() != gpus.front()->gpu().ordinal()) return {};
  }
  auto state = std::make_shared<GroupState>(std::move(gpus));
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < int(devices.size()); ++r) out.push_back(std::make_shared<CudaGroupCommunicator>(state, r));
  return out;
}

}  // namespace tessera
