// all_to_all_v (dsl/local_map.hpp): the counts are exchanged and checked in the graph, then one
// node moves the rows.
//
// Every device must take the same decision about bad counts, or one would wait in a collective
// another skipped. So the count vectors are all_gathered (n * n integers): each device holds
// every device's counts, checks all of them (check_index, dsl/index_check.hpp: the step ends
// with an IndexError on every device and every client) and, when any is bad, moves nothing:
// the matrix the node reads is zeroed alike everywhere, so no device reads past its rows or
// writes past its bound. An all_to_all of the counts would tell a receiver its own counts only,
// and a device whose total is too large could not stop its senders without a second exchange.
#include "dsl/all_to_all_v.hpp"

#include "dsl/block_extents.hpp"
#include "dsl/error.hpp"
#include "dsl/index_check.hpp"
#include "dsl/indexing.hpp"
#include "dsl/local_map.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

void check_all_to_all_v_operands(const Tensor& rows, const Tensor& send_counts, const std::string& mesh_dim,
                    std::optional<int64_t> max_received_rows, Loc at) {
  const NodeRef& r = rows.node();
  const NodeRef& c = send_counts.node();
  if (!r->local || !c->local)
    throw LayoutError(std::string("all_to_all_v: functional collectives take local values (the tensors inside a local_map'ed "
                                  "function); ") + (r->local ? "send_counts" : "rows") + " is global" + at_line(at));
  if (!r->mesh.contains_dim(mesh_dim))
    throw MeshError("all_to_all_v: unknown mesh dim '" + mesh_dim + "' of mesh " + r->mesh.to_string() + at_line(at));
  const int64_t n = r->mesh.shape()[size_t(r->mesh.dim_index(mesh_dim))];
  if (rows.rank() < 1) throw ShapeError("all_to_all_v: rows must have at least one axis, got a scalar" + at_line(at));
  if (!extents_of(*r, r->mesh).axes[0].is_constant())
    throw ShapeError("all_to_all_v: rows has blocks of extents " + extents_text(extents_of(*r, r->mesh).axes[0], r->mesh) +
                     " on axis 0; every device must hold the same number of rows" + at_line(at));
  if (send_counts.dtype() != DType::i64)
    throw DTypeError("all_to_all_v: send_counts must be int64, got " + std::string(dtype_name(send_counts.dtype())) + at_line(at));
  if (send_counts.shape() != std::vector<int64_t>{n} || !all_constant(extents_of(*c, c->mesh)))
    throw ShapeError("all_to_all_v: send_counts must have shape [" + std::to_string(n) + "] (one count per device of mesh dim '" +
                     mesh_dim + "') on every device, got " + extents_string(extents_of(*c, c->mesh)) + at_line(at));
  if (max_received_rows && *max_received_rows < 0)
    throw ShapeError("all_to_all_v: max_received_rows must be at least 0, got " + std::to_string(*max_received_rows) + at_line(at));
}

}  // namespace

std::pair<Tensor, Tensor> all_to_all_v(const Tensor& rows, const Tensor& send_counts, std::string mesh_dim,
                                       std::optional<int64_t> max_received_rows, Loc at) {
  check_all_to_all_v_operands(rows, send_counts, mesh_dim, max_received_rows, at);
  const Mesh& mesh = rows.node()->mesh;
  const int64_t d = mesh.dim_index(mesh_dim), n = mesh.shape()[size_t(d)];
  const int64_t sent_rows = rows.shape()[0], bound = max_received_rows.value_or(sent_rows * n);
  // counts[i][j]: rows device i sends to device j, the same matrix on every device.
  const Tensor gathered = all_gather(reshape(send_counts, {1, n}, at), mesh_dim, 0, at);
  const Tensor counts = check_index(gathered, 0, sent_rows + 1, IndexUse::SplitSize, at);
  const Tensor sent = check_index(reduce_sum(counts, {1}, false, at), 0, sent_rows + 1, IndexUse::SplitSizesSent, at);
  const Tensor received = check_index(reduce_sum(counts, {0}, false, at), 0, bound + 1, IndexUse::SplitSizesReceived, at);
  // Above 0 when any check fails (each count bounded first, so the sums cannot overflow).
  const Tensor excess = maximum(maximum(Operand(neg(reduce_min(counts, {}, false, at), at), at),
                                        Operand(reduce_max(counts, {}, false, at) - Operand(sent_rows, at), at)),
                                maximum(Operand(reduce_max(sent, {}, false, at) - Operand(sent_rows, at), at),
                                        Operand(reduce_max(received, {}, false, at) - Operand(bound, at), at)));
  const Tensor moved = where(excess <= Operand(int64_t(0), at), Operand(counts, at), Operand(int64_t(0), at), at);
  const Tensor me = reshape(cast(axis_index(mesh_dim, at), DType::i64, at), {1}, at);
  const Tensor recv_counts = reshape(index_select(transpose(moved, {1, 0}, at), 0, me, at), {n}, at);
  return {detail::all_to_all_v_node(rows, moved, d, bound, at), recv_counts};
}

namespace detail {

Tensor all_to_all_v_node(const Tensor& rows, const Tensor& counts, int64_t mesh_dim, int64_t out_rows, Loc at) {
  const NodeRef& r = rows.node();
  std::vector<int64_t> shape = traced_shape(collective_extents(OpKind::AllToAllV, *r, mesh_dim, {out_rows}, at_line(at)));
  NodeAttrs attrs;
  attrs.axes = {mesh_dim, out_rows};
  return Tensor(make_node(OpKind::AllToAllV, r->dtype, std::move(shape), {r, counts.node()}, std::move(attrs), at));
}

}  // namespace detail
}  // namespace tessera
