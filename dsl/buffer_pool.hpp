// Host buffers for Arrays: 64-byte aligned, and above 16 KB recycled. glibc maps large
// allocations afresh, and hands the pages of freed medium ones back to the kernel (madvise),
// so each new buffer page-faults on first touch (15 ms for 64 MB here; a third of a 100 KB
// all_to_all's time). Buffers of 16 KB or more go back to a pool keyed by exact size when their
// last Array drops them, and the next allocation of that size (the next step's) takes them warm.
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
