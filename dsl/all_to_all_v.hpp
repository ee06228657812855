// The graph node behind all_to_all_v (dsl/local_map.hpp), shared by the op and its adjoint.
// The node moves rows by a counts matrix that is the same on every device of the mesh dim:
// counts[i][j] rows go from device i to device j. Each device reads its row (what it sends)
// and its column (what it receives) when the step runs, so the counts are run-time values and
// one compiled program serves any of them. The adjoint is the same node on the gradient with
// the matrix transposed.
#pragma once

#include <cstdint>

#include "dsl/ops.hpp"

namespace tessera::detail {

// `rows` [R, ...] (local) moved by `counts` ([n, n] i64, already checked: every device's row
// sum at most R, column sum at most `out_rows`), received into [out_rows, ...], zero past the
// received total.
Tensor all_to_all_v_node(const Tensor& rows, const Tensor& counts, int64_t mesh_dim, int64_t out_rows, Loc where);

}  // namespace tessera::detail
