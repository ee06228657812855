#include "jit/memory_stats.hpp"

#include <algorithm>

#include "dsl/memory_counter.hpp"

namespace tessera {

MemoryStats memory_stats(const Mesh& mesh) {
  MemoryStats stats;
  for (const std::string& device : mesh.local_devices()) {
    const MemoryCounter& c = memory_counter(device);
    stats.peak_bytes = std::max(stats.peak_bytes, c.peak.load());
    stats.current_bytes = std::max(stats.current_bytes, c.current.load());
  }
  return stats;
}

void reset_peak_memory_stats() { reset_memory_peaks(); }

}  // namespace tessera
