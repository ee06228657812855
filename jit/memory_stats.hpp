// The bytes really held on a mesh's devices during runs, as torch.cuda.max_memory_allocated
// reports them, to check a plan's predicted peak (plan/plan_report.hpp) against: values'
// buffers and, while a program runs, its arena; not memory kept for reuse between runs. CPU
// devices are counted (dsl/memory_counter.hpp); a GPU's own pool is not yet.
#pragma once

#include <cstdint>

#include "dsl/mesh.hpp"

namespace tessera {

struct MemoryStats {
  int64_t peak_bytes = 0;     // the most any of the mesh's local devices held since the reset
  int64_t current_bytes = 0;  // the most any of them holds now
};

MemoryStats memory_stats(const Mesh& mesh);
// Every device's peak becomes what it holds now (torch.cuda.reset_peak_memory_stats).
void reset_peak_memory_stats();

}  // namespace tessera
