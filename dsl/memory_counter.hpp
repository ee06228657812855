// Bytes held in each device's memory, as torch.cuda.memory_allocated counts them: buffers of
// values, not memory kept for reuse (the buffer pool's free buffers, an executable's arena
// between its runs). Allocations are charged to the counter the allocating thread has in scope
// (a device's worker, while it runs a program) and given back when their last user drops them;
// buffers made on the host for a device (a tensor's components) are charged when the tensor
// adopts them. jit/memory_stats.hpp reports them per mesh.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera {

struct MemoryCounter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  void add(int64_t bytes);
  void sub(int64_t bytes) { current.fetch_sub(bytes, std::memory_order_relaxed); }
};

// The counter of the device named `device` ("CPU:0"); made on first use, never freed.
MemoryCounter& memory_counter(const std::string& device);
// Every counter's peak becomes its current bytes.
void reset_memory_peaks();

// The counter this thread's allocations are charged to (null: none).
MemoryCounter* charged_memory_counter();
// Charges this thread's allocations to `counter` (null: to none) while it lives.
class ChargeMemoryTo {
 public:
  explicit ChargeMemoryTo(MemoryCounter* counter);
  ~ChargeMemoryTo();
  ChargeMemoryTo(const ChargeMemoryTo&) = delete;
  ChargeMemoryTo& operator=(const ChargeMemoryTo&) = delete;

 private:
  MemoryCounter* previous_;
};

// `owner`, with `bytes` charged to `counter` until the returned pointer and its copies are gone.
std::shared_ptr<std::byte[]> charged(std::shared_ptr<std::byte[]> owner, int64_t bytes, MemoryCounter& counter);

}  // namespace tessera
