#include "dsl/buffer_pool.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "dsl/error.hpp"
#include "dsl/memory_counter.hpp"

namespace tessera {
namespace {

constexpr int64_t kPooledMinimum = 16 * 1024;
constexpr int64_t kPoolCapacity = int64_t(2) << 30;  // beyond this, freed buffers go back to the system

struct Pool {
  std::mutex mutex;
  std::multimap<int64_t, std::byte*> free;
  BufferPoolStats stats;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: Arrays may be released during static destruction
  return *p;
}

// Null when the machine cannot hold it (the caller raises a tessera::Error; the nothrow form
// also keeps sanitizers, whose throwing new aborts, out of the way).
std::byte* raw_allocate(size_t size) {
  return static_cast<std::byte*>(::operator new[](size, std::align_val_t(64), std::nothrow));
}
void raw_free(std::byte* p) { ::operator delete[](p, std::align_val_t(64)); }

}  // namespace

namespace {

// `counter` (null: none) holds `nbytes` while the buffer lives: charged in the same deleter, so a
// charged buffer costs no second control block.
std::shared_ptr<std::byte[]> pooled_buffer(int64_t nbytes, bool zero_fill, MemoryCounter* counter) {
  const int64_t size = std::max<int64_t>(nbytes, 1);
  std::byte* data = nullptr;
  if (size >= kPooledMinimum) {
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    if (auto it = p.free.find(size); it != p.free.end()) {
      data = it->second;
      p.free.erase(it);
      p.stats.pooled_bytes -= size;
      ++p.stats.reused;
    } else {
      ++p.stats.allocated;
    }
  }
  if (!data) {
    data = raw_allocate(size_t(size));
    if (!data) throw Error("cannot allocate " + std::to_string(size) + " bytes: the machine does not have that much memory free");
  }
  if (zero_fill) std::memset(data, 0, size_t(size));
  if (counter) counter->add(nbytes);
  if (size < kPooledMinimum)
    return std::shared_ptr<std::byte[]>(data, [counter, nbytes](std::byte* d) {
      if (counter) counter->sub(nbytes);
      raw_free(d);
    });
  return std::shared_ptr<std::byte[]>(data, [size, counter, nbytes](std::byte* d) {
    if (counter) counter->sub(nbytes);
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    if (p.stats.pooled_bytes + size > kPoolCapacity) {
      raw_free(d);
      return;
    }
    p.free.emplace(size, d);
    p.stats.pooled_bytes += size;
  });
}

}  // namespace

std::shared_ptr<std::byte[]> allocate_buffer(int64_t nbytes, bool zero_fill) {
  return pooled_buffer(nbytes, zero_fill, charged_memory_counter());
}

BufferPoolStats buffer_pool_stats() {
  std::lock_guard lock(pool().mutex);
  return pool().stats;
}

}  // namespace tessera
