// One device's all_to_all_v step (dsl/all_to_all_v.hpp) in a compiled program: the counts matrix
// is read when the step runs, so the sizes are run-time values and the program compiles once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "dsl/array.hpp"

namespace tessera {

class Device;

// `rows` [R, ...] moved over `comm` by `counts` (n * n, row-major, host memory; row i: device
// i's send counts, in rows) into a fresh array of `out_shape` [bound, ...]: the blocks from
// ranks 0..n-1 back to back, zero past them. `received` gets the elements that came from other
// ranks. `device`: where a communicator over device memory takes its buffers; null: host.
// `into`: the output's buffer (its arena slot), in the communicator's memory; null: a fresh one.
Array run_all_to_all_v_step(Communicator& comm, const Array& rows, std::span<const int64_t> counts,
                            const std::vector<int64_t>& out_shape, DType dtype, int64_t& received, Device* device,
                            const Array* into = nullptr);

}  // namespace tessera
