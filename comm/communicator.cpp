#include "comm/communicator.hpp"

#include <memory>
#include <vector>

#include "dsl/array.hpp"
#include "dsl/buffer_pool.hpp"

namespace tessera {

void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  std::vector<int64_t> counts(size(), count);
  all_gather_v(send, count, recv, counts, dtype);
}

void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  std::vector<int64_t> counts(size(), count);
  reduce_scatter_v(send, recv, counts, dtype, op);
}

void Communicator::all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
  std::vector<int64_t> counts(size(), count);
  all_to_all_v(send, counts, recv, counts, dtype);
}

std::shared_ptr<std::byte[]> Communicator::allocate_group_buffer(int64_t, uint64_t) { return nullptr; }

void Communicator::all_to_all_regions(const void* send, const ShardBox& send_block, std::span<const ShardBox> send_regions,
                                      void* recv, const ShardBox& recv_block, std::span<const ShardBox> recv_regions,
                                      DType dtype) {
  const int64_t esize = dtype_size(dtype);
  std::vector<int64_t> send_counts, recv_counts;
  int64_t send_total = 0, recv_total = 0;
  for (const ShardBox& r : send_regions) send_total += send_counts.emplace_back(r.num_elements());
  for (const ShardBox& r : recv_regions) recv_total += recv_counts.emplace_back(r.num_elements());
  // Pooled buffers: fresh ones would page-fault on every call (glibc returns freed pages).
  std::shared_ptr<std::byte[]> packed = allocate_buffer(send_total * esize, false);
  std::shared_ptr<std::byte[]> received = allocate_buffer(recv_total * esize, false);
  int64_t offset = 0;
  for (const ShardBox& r : send_regions) {
    copy_region(BlockRef{static_cast<const std::byte*>(send), send_block.local_shape, send_block.global_offset},
                packed.get() + offset * esize, r.local_shape, r.global_offset, r.global_offset, r.local_shape, esize);
    offset += r.num_elements();
  }
  all_to_all_v(packed.get(), send_counts, received.get(), recv_counts, dtype);
  offset = 0;
  for (const ShardBox& r : recv_regions) {
    copy_region(BlockRef{received.get() + offset * esize, r.local_shape, r.global_offset}, static_cast<std::byte*>(recv),
                recv_block.local_shape, recv_block.global_offset, r.global_offset, r.local_shape, esize);
    offset += r.num_elements();
  }
}

}  // namespace tessera
