// Alpha-beta cost of moving data: every collective costs alpha (its fixed latency) plus beta per
// byte received across the mesh. Local steps are free. The constants were measured on the
// reference machine (2-vCPU Sapphire Rapids, in-process collectives; docs/PERFORMANCE_HISTORY.md):
// ~1 us per 2-device collective and ~8.4 GB/s of all-reduce bandwidth, i.e. alpha is worth about
// 8 KB of traffic. Costs are expressed in bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "partitioner/redistribute_plan.hpp"

namespace tessera {

constexpr int64_t kCollectiveAlphaBytes = 8 * 1024;

// What a byte a device does not have to read from memory is worth in communicated bytes. On the
// reference machine a 2-device reduce_scatter moves ~4 GB/s, while a GEMM reading a weight it
// did not write itself streams it at ~10-12 GB/s (docs/PERFORMANCE_HISTORY.md, weight-stationary dots).
constexpr int64_t kLocalBytesPerCommunicatedByte = 3;

int64_t plan_cost(const std::vector<RedistributeStep>& plan);

}  // namespace tessera
