#include "backend/cuda/nccl_communicator.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_collective_kernels.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/nccl_exchange.hpp"
#include "backend/cuda/nccl_library.hpp"
#include "backend/cuda/virtual_gpu.hpp"
#include "comm/byte_pointers.hpp"
#include "comm/collective_timeout.hpp"
#include "dsl/determinism.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {


ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  throw InternalError("nccl_type: bad dtype");
}

// bools reduce as or (sum, max) / and (product, min, and avg: the CPU's sum / n is 1 only when
// every rank holds 1), as comm/reduce_kernels does.
ncclRedOp_t nccl_op(ReduceOp op, DType d) {
  if (d == DType::u8) return op == ReduceOp::Sum || op == ReduceOp::Max ? ncclMax : ncclMin;
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // floats: a pre-multiplied sum; integers: sum, then divide
    case ReduceOp::Product: return ncclProd;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  throw InternalError("nccl_op: bad op");
}

// Device memory for one collective, taken and returned in stream order: the free is queued
// behind every use, so nobody waits for it.
class Scratch {
 public:
  Scratch(CUstream stream, int64_t size) : stream_(stream) {
    const CudaDriver& cu = cuda_driver();
    cu.check(cu.cuMemAllocAsync(&pointer_, size_t(std::max<int64_t>(size, 1)), stream_), "cuMemAllocAsync (NCCL scratch)");
  }
  ~Scratch() {
    if (const CudaDriver* cu = CudaDriver::get()) cu->cuMemFreeAsync(pointer_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::byte* get() const { return reinterpret_cast<std::byte*>(uintptr_t(pointer_)); }

 private:
  CUstream stream_;
  CUdeviceptr pointer_ = 0;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclLibrary& nccl, ncclComm_t comm, int rank, int size, VirtualGpu& gpu)
      : nccl_(nccl), comm_(comm), rank_(rank), size_(size), gpu_(gpu), timeout_(collective_timeout_seconds()) {
    const CudaDriver& cu = cuda_driver();
    gpu_.make_current();
    cu.check(cu.cuEventCreate(&waited_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    cu.check(cu.cuMemAllocAsync(&token_, sizeof(int32_t), gpu_.stream()), "cuMemAllocAsync (NCCL barrier)");
    cu.check(cu.cuMemsetD32Async(token_, 0, 1, gpu_.stream()), "cuMemsetD32Async (NCCL barrier)");
  }

  ~NcclCommunicator() override {
    const CudaDriver* cu = CudaDriver::get();
    if (!cu) return;
    gpu_.make_current();
    if (comm_) nccl_.ncclCommDestroy(comm_);  // after the collectives it queued
    cu->cuMemFreeAsync(token_, gpu_.stream());
    cu->cuEventDestroy(waited_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace memory_space() const override { return MemorySpace::Cuda; }

  void all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    begin();
    if (count <= 0) return;
    if (ordered(dtype, op, "all_reduce")) {
      // Every rank's input side by side, reduced here in rank order.
      const int64_t esize = dtype_size(dtype);
      Scratch gathered(gpu_.stream(), int64_t(size_) * count * esize);
      check(nccl_.ncclAllGather(send, gathered.get(), size_t(count), nccl_type(dtype), comm_, gpu_.stream()), "ncclAllGather (all_reduce)");
      std::vector<const void*> ins;
      for (int r = 0; r < size_; ++r) ins.push_back(gathered.get() + int64_t(r) * count * esize);
      launch_device_reduce(gpu_.gpu(), gpu_.stream(), &recv, 1, ins.data(), size_, count, dtype, op);
    } else {
      check(nccl_.ncclAllReduce(send, recv, size_t(count), nccl_type(dtype), nccl_op(op, dtype), comm_, gpu_.stream()),
            "ncclAllReduce");
    }
    end("all_reduce");
  }

  void all_gather_v(const void* send, int64_t send_count, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    check_counts(recv_counts, "all_gather_v");
    if (recv_counts[size_t(rank_)] != send_count)
      throw CommError(fmt::format("all_gather_v: rank {} sends {} elements but its block holds {}", rank_, send_count,
                                  recv_counts[size_t(rank_)]));
    begin();
    if (even(recv_counts)) {
      // In place where send is this rank's block of recv, as NCCL allows.
      if (send_count > 0)
        check(nccl_.ncclAllGather(send, recv, size_t(send_count), nccl_type(dtype), comm_, gpu_.stream()), "ncclAllGather");
    } else {
      exchange(send, recv, exchange_transfers(rank_, same_block(size_, send_count), packed_blocks(recv_counts), "all_gather_v"),
               dtype);
    }
    end("all_gather_v");
  }

  void reduce_scatter_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype, ReduceOp op) override {
    check_counts(counts, "reduce_scatter_v");
    begin();
    const int64_t esize = dtype_size(dtype), mine = counts[size_t(rank_)];
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    if (total == 0) return;
    const bool rank_ordered = ordered(dtype, op, "reduce_scatter_v");
    if (even(counts) && !rank_ordered) {
      check(nccl_.ncclReduceScatter(send, recv, size_t(mine), nccl_type(dtype), nccl_op(op, dtype), comm_, gpu_.stream()),
            "ncclReduceScatter");
    } else if (size_ <= kMaxReduceOperands) {
      // Uneven blocks (NCCL's reduce-scatter takes one count) or a rank-ordered reduction: each
      // rank's block from every rank (an all_to_all: the bytes a reduce-scatter moves), reduced
      // here in rank order, so the CPU's bits.
      Scratch received(gpu_.stream(), int64_t(size_) * mine * esize);
      exchange(send, received.get(),
               exchange_transfers(rank_, packed_blocks(counts), equal_blocks(size_, mine), "reduce_scatter_v"), dtype);
      std::vector<const void*> ins;
      for (int p = 0; p < size_; ++p) ins.push_back(received.get() + int64_t(p) * mine * esize);
      launch_device_reduce(gpu_.gpu(), gpu_.stream(), &recv, 1, ins.data(), size_, mine, dtype, op);
    } else {
      // More ranks than one reduction kernel takes: the whole all_reduce, then this rank's block.
      Scratch reduced(gpu_.stream(), total * esize);
      check(nccl_.ncclAllReduce(send, reduced.get(), size_t(total), nccl_type(dtype), nccl_op(op, dtype), comm_, gpu_.stream()),
            "ncclAllReduce (reduce_scatter_v)");
      int64_t offset = 0;
      for (int p = 0; p < rank_; ++p) offset += counts[size_t(p)];
      copy(recv, reduced.get() + offset * esize, mine * esize);
    }
    end("reduce_scatter_v");
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv, std::span<const int64_t> recv_counts,
                    DType dtype) override {
    check_counts(send_counts, "all_to_all_v");
    check_counts(recv_counts, "all_to_all_v");
    const std::vector<PeerTransfer> transfers =
        exchange_transfers(rank_, packed_blocks(send_counts), packed_blocks(recv_counts), "all_to_all_v");
    begin();
    exchange(send, recv, transfers, dtype);
    end("all_to_all_v");
  }

  // The base class packs on the host; here the regions are packed and unpacked on the device
  // (one region copy kernel each) around one exchange.
  void all_to_all_regions(const void* send, const ShardBox& send_block, std::span<const ShardBox> send_regions, void* recv,
                          const ShardBox& recv_block, std::span<const ShardBox> recv_regions, DType dtype) override {
    if (int(send_regions.size()) != size_ || int(recv_regions.size()) != size_)
      throw CommError(fmt::format("all_to_all_regions: {} send and {} receive regions for a group of {}", send_regions.size(),
                                  recv_regions.size(), size_));
    begin();
    const int64_t esize = dtype_size(dtype);
    std::vector<int64_t> send_counts, recv_counts;
    int64_t send_total = 0, recv_total = 0;
    for (const ShardBox& r : send_regions) send_total += send_counts.emplace_back(r.num_elements());
    for (const ShardBox& r : recv_regions) recv_total += recv_counts.emplace_back(r.num_elements());
    Scratch packed(gpu_.stream(), send_total * esize), received(gpu_.stream(), recv_total * esize);
    const std::vector<PeerTransfer> transfers =
        exchange_transfers(rank_, packed_blocks(send_counts), packed_blocks(recv_counts), "all_to_all_regions");
    for (const PeerTransfer& t : transfers) {
      const ShardBox& r = send_regions[size_t(t.peer)];
      if (t.send.count > 0)
        launch_device_copy_region(gpu_.gpu(), gpu_.stream(), send, send_block.local_shape, send_block.global_offset,
                                  packed.get() + t.send.offset * esize, r.local_shape, r.global_offset, r.global_offset,
                                  r.local_shape, esize);
    }
    exchange(packed.get(), received.get(), transfers, dtype);
    for (const PeerTransfer& t : transfers) {
      const ShardBox& r = recv_regions[size_t(t.peer)];
      if (t.recv.count > 0)
        launch_device_copy_region(gpu_.gpu(), gpu_.stream(), received.get() + t.recv.offset * esize, r.local_shape,
                                  r.global_offset, recv, recv_block.local_shape, recv_block.global_offset, r.global_offset,
                                  r.local_shape, esize);
    }
    end("all_to_all_regions");
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= size_) throw CommError(fmt::format("broadcast: root {} is not a rank of a group of {}", root, size_));
    begin();
    if (count <= 0) return;
    check(nccl_.ncclBroadcast(buffer, buffer, size_t(count), nccl_type(dtype), root, comm_, gpu_.stream()), "ncclBroadcast");
    end("broadcast");
  }

  // A one-element all_reduce that every rank's stream passes only when all have queued it, then
  // a wait for this stream: work queued anywhere before the barrier is done when it returns.
  void barrier() override {
    begin();
    check(nccl_.ncclAllReduce(reinterpret_cast<const void*>(uintptr_t(token_)), reinterpret_cast<void*>(uintptr_t(token_)), 1,
                              ncclInt32, ncclMax, comm_, gpu_.stream()),
          "ncclAllReduce (barrier)");
    end("barrier");
    wait_for_stream("barrier");
  }

 private:
  void begin() {
    if (!comm_) throw CommError("NCCL communicator used after an asynchronous error aborted it");
    ++sequence_;
    gpu_.make_current();
  }

  // NCCL reports a failed peer or network asynchronously: a collective that follows one throws.
  void end(const char* what) { check_async(what); }

  void check(ncclResult_t result, const char* what) {
    if (result != ncclSuccess) {
      check_async(what);  // the communicator's own error says more than the call's
      nccl_.check(result, what);
    }
  }

  void check_async(const char* what) {
    ncclResult_t state = ncclSuccess;
    nccl_.check(nccl_.ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state == ncclSuccess || state == ncclInProgress) return;
    const char* text = nccl_.ncclGetErrorString(state);
    nccl_.ncclCommAbort(comm_);  // what it queued will never complete
    comm_ = nullptr;
    throw CommError(fmt::format("NCCL: {} (collective #{} of rank {} of {}) failed asynchronously: {}", what, sequence_, rank_,
                                size_, text ? text : "no error text"));
  }

  // Rank-ordered reduction through device scratch: under TESSERA_DETERMINISTIC=1, and where
  // NCCL's own result would not be the CPU group's: float max / min (the CPU propagates NaN)
  // and integer averages (the CPU divides the exact sum once). One reduction kernel takes at
  // most kMaxReduceOperands inputs; past that NCCL reduces, unless determinism is asked for.
  bool ordered(DType dtype, ReduceOp op, const char* what) const {
    const bool deterministic = deterministic_mode();
    const bool cpu_rule = dtype != DType::u8 && (is_floating(dtype) ? op == ReduceOp::Max || op == ReduceOp::Min : op == ReduceOp::Avg);
    if (size_ <= kMaxReduceOperands) return deterministic || cpu_rule;
    if (deterministic)
      throw CommError(fmt::format("{}: a rank-ordered (TESSERA_DETERMINISTIC=1) NCCL reduction over {} ranks; at most {}", what,
                                  size_, kMaxReduceOperands));
    return false;
  }

  bool even(std::span<const int64_t> counts) const {
    for (int64_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }

  // Queues `transfers` (backend/cuda/nccl_exchange.hpp: element blocks of `send` and `recv` per
  // peer) as one NCCL group. Blocks of zero elements are left out on both sides (the counts agree
  // by contract), and so is a rank's own block already in place; its other own block moves by
  // ncclSend/ncclRecv to itself.
  void exchange(const void* send, void* recv, const std::vector<PeerTransfer>& transfers, DType dtype) {
    const ncclDataType_t type = nccl_type(dtype);
    const int64_t esize = dtype_size(dtype);
    check(nccl_.ncclGroupStart(), "ncclGroupStart");
    try {
      for (const PeerTransfer& t : transfers) {
        const std::byte* from = bytes(send) + t.send.offset * esize;
        std::byte* to = bytes(recv) + t.recv.offset * esize;
        if (t.peer == rank_ && from == to) continue;  // already in place
        if (t.send.count > 0) check(nccl_.ncclSend(from, size_t(t.send.count), type, t.peer, comm_, gpu_.stream()), "ncclSend");
        if (t.recv.count > 0) check(nccl_.ncclRecv(to, size_t(t.recv.count), type, t.peer, comm_, gpu_.stream()), "ncclRecv");
      }
    } catch (...) {
      nccl_.ncclGroupEnd();  // leave no group open on this thread
      throw;
    }
    check(nccl_.ncclGroupEnd(), "ncclGroupEnd");
  }

  void copy(void* to, const void* from, int64_t count_bytes) {
    if (count_bytes <= 0 || to == from) return;
    const CudaDriver& cu = cuda_driver();
    cu.check(cu.cuMemcpyDtoDAsync(device_pointer(to), device_pointer(from), size_t(count_bytes), gpu_.stream()),
             "cuMemcpyDtoDAsync (NCCL collective)");
  }

  // Waits for the stream, watching NCCL's error state and the collective timeout: a peer that
  // never arrives leaves the stream waiting forever.
  void wait_for_stream(const char* what) {
    const CudaDriver& cu = cuda_driver();
    cu.check(cu.cuEventRecord(waited_, gpu_.stream()), "cuEventRecord");
    const auto start = std::chrono::steady_clock::now();
    for (int64_t polls = 0;; ++polls) {
      const CUresult state = cu.cuEventQuery(waited_);
      if (state == CUDA_SUCCESS) return;
      if (state != CUDA_ERROR_NOT_READY) cu.check(state, "cuEventQuery (NCCL barrier)");
      check_async(what);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_ > 0 && waited > timeout_) {
        nccl_.ncclCommAbort(comm_);
        comm_ = nullptr;
        abort_on_device_collective_timeout(
            what, sequence_, timeout_,
            fmt::format("rank {} of an NCCL group of {}: NCCL does not say which ranks never arrived", rank_, size_));
      }
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void check_counts(std::span<const int64_t> counts, const char* what) const {
    if (int(counts.size()) != size_) throw CommError(fmt::format("{}: {} counts for a group of {}", what, counts.size(), size_));
  }

  const NcclLibrary& nccl_;
  ncclComm_t comm_;
  const int rank_, size_;
  VirtualGpu& gpu_;
  const double timeout_;
  int64_t sequence_ = 0;
  CUevent waited_ = nullptr;
  CUdeviceptr token_ = 0;  // the barrier's one int32
};

}  // namespace

std::shared_ptr<Communicator> create_nccl_communicator(ClientGroup& clients, int64_t gpu_device_index) {
  // Every member learns whether all can take part before any blocks in ncclCommInitRank: the
  // library first (no GPU is touched without it), then the GPU device.
  const NcclLibrary* library = NcclLibrary::get();
  std::string why = library ? std::string() : NcclLibrary::why_unavailable();
  VirtualGpu* gpu = nullptr;
  if (library) {
    try {
      gpu = &VirtualGpu::get(gpu_device_index);
      gpu->make_current();
    } catch (const DeviceError& e) {
      why = fmt::format("NCCL communicator on GPU:{}: {}", gpu_device_index, e.what());
    }
  }
  if (clients.size() > 1) {
    std::vector<int64_t> failed{why.empty() ? 0 : 1};
    clients.all_reduce_sum(failed);
    if (why.empty() && failed[0] > 0)
      throw DeviceError(fmt::format("NCCL communicator: {} of the {} clients of the group cannot make theirs (no NCCL or "
                                    "no such GPU device there)",
                                    failed[0], clients.size()));
  }
  if (!why.empty()) throw DeviceError(why);
  ncclUniqueId id{};
  std::vector<std::byte> id_bytes(sizeof id);
  if (clients.rank() == 0) {
    library->check(library->ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::memcpy(id_bytes.data(), &id, sizeof id);
  }
  clients.broadcast(id_bytes, 0);
  if (id_bytes.size() != sizeof id) throw InternalError("NCCL unique id: broadcast returned the wrong size");
  std::memcpy(&id, id_bytes.data(), sizeof id);
  ncclComm_t comm = nullptr;
  library->check(library->ncclCommInitRank(&comm, clients.size(), id, clients.rank()),
                 fmt::format("ncclCommInitRank (rank {} of {} on GPU:{})", clients.rank(), clients.size(), gpu_device_index).c_str());
  return std::make_shared<NcclCommunicator>(*library, comm, clients.rank(), clients.size(), *gpu);
}

}  // namespace tessera
