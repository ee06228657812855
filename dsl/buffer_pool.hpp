// Host buffers for Arrays: 64-byte aligned, and for large sizes recycled. glibc maps every large
// allocation afresh and page-faults it on first touch (15 ms for 64 MB here), so buffers of
// 256 KB or more go back to a pool keyed by exact size when their last Array drops them, and the
// next allocation of that size (the next step's output, usually) takes them warm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tessera {

std::shared_ptr<std::byte[]> allocate_buffer(int64_t nbytes, bool zero_fill);

struct BufferPoolStats {
  int64_t reused = 0, allocated = 0, pooled_bytes = 0;
};
BufferPoolStats buffer_pool_stats();

}  // namespace tessera
