#include "dsl/memory_counter.hpp"

#include <map>
#include <mutex>

namespace tessera {
namespace {

struct Counters {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<MemoryCounter>> by_device;
};

Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: buffers may drop during static destruction
  return *c;
}

// initial-exec: read on every allocation, without a call into the dynamic loader.
__attribute__((tls_model("initial-exec"))) thread_local MemoryCounter* charged_counter = nullptr;

}  // namespace

void MemoryCounter::add(int64_t bytes) {
  const int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

MemoryCounter& memory_counter(const std::string& device) {
  Counters& c = counters();
  std::lock_guard lock(c.mutex);
  auto& slot = c.by_device[device];
  if (!slot) slot = std::make_unique<MemoryCounter>();
  return *slot;
}

void reset_memory_peaks() {
  Counters& c = counters();
  std::lock_guard lock(c.mutex);
  for (auto& [device, counter] : c.by_device) counter->peak.store(counter->current.load());
}

MemoryCounter* charged_memory_counter() { return charged_counter; }

ChargeMemoryTo::ChargeMemoryTo(MemoryCounter* counter) : previous_(charged_counter) { charged_counter = counter; }
ChargeMemoryTo::~ChargeMemoryTo() { charged_counter = previous_; }

std::shared_ptr<std::byte[]> charged(std::shared_ptr<std::byte[]> owner, int64_t bytes, MemoryCounter& counter) {
  counter.add(bytes);
  std::byte* data = owner.get();
  return std::shared_ptr<std::byte[]>(data, [owner = std::move(owner), bytes, &counter](std::byte*) mutable {
    counter.sub(bytes);
    owner.reset();
  });
}

}  // namespace tessera
