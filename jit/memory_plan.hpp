// The memory plan of an executable: every intermediate a kernel or GEMM writes gets an offset in
// one arena per device, reused across runs. Offsets come from liveness: two values share memory
// only when their lifetimes (producing step .. last reading step) do not overlap, so a kernel
// never writes where it reads. Program outputs are not planned: they are handed to the user.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/schedule.hpp"
#include "partitioner/local_program.hpp"

namespace tessera {

struct MemoryPlan {
  std::vector<int64_t> offset;  // per local node: byte offset in the arena, -1 when not planned
  std::vector<int64_t> size;    // per local node: bytes reserved (0 when not planned)
  int64_t arena_bytes = 0;
};

MemoryPlan plan_memory(const LocalProgram& program, const Schedule& schedule);

}  // namespace tessera
