// Ops that need a whole axis on every device (ranking a short row for topk or sort, the running
// sum a multinomial draws from) gather it once before computing, as PyTorch's strategies for
// them do. Computed on the blocks instead, their result is a Partial sum, a term per device:
// reading it costs an all_reduce on top of the gathers the comparisons need, and in floating
// point its value depends on how the mesh splits the sum (multinomial's draws would then
// depend on the layout).
#pragma once

#include <cstdint>

#include "dsl/ops.hpp"

namespace tessera::detail {

// x with `axis` whole on every device and no Partial sums, its other axes sharded as they are
// now (the layout sharding propagation gives x; no kernel runs). x itself where `axis` is whole
// already, and for values without a mesh (local_map's local values).
Tensor whole_along(const Tensor& x, int64_t axis, Loc where);

}  // namespace tessera::detail
