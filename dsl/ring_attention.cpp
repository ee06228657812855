#include "dsl/ring_attention.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "dsl/attention.hpp"
#include "dsl/error.hpp"
#include "dsl/gradient_rule.hpp"
#include "dsl/indexing.hpp"
#include "dsl/layout.hpp"
#include "dsl/local_map.hpp"
#include "dsl/node.hpp"
#include "dsl/program_order_scope.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// One block's attention: each query's output and logsumexp over the keys it saw ([..., C, Ev]
// and [..., C, 1]; a query that saw none has output 0 and logsumexp -inf).
struct RingBlock {
  Tensor out, logsumexp;
};

RingBlock attend(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                 const std::optional<Tensor>& mask_shift, Loc at) {
  const Tensor forward = detail::attention_with_logsumexp(q, k, v, causal, scale, mask_shift, at);
  const std::vector<Tensor> columns = split(forward, {v.shape().back(), 1}, -1, at);
  return {columns[0], columns[1]};
}

// The softmax over the union of two blocks' keys from each block's own: weights exp(lse - max).
// Written so that queries that saw no key in either block (both -inf) come out as such, with
// finite gradients (no 0/0 or -inf - -inf anywhere, even in a branch `where` drops).
RingBlock merge(const RingBlock& a, const RingBlock& b, Loc at) {
  const Tensor top = maximum(Operand(a.logsumexp, at), Operand(b.logsumexp, at));
  const Tensor reference = where(top > Operand(kMinusInfinity, at), Operand(top, at), Operand(0.0, at), at);
  const Tensor wa = exp(sub(Operand(a.logsumexp, at), Operand(reference, at)), at);
  const Tensor wb = exp(sub(Operand(b.logsumexp, at), Operand(reference, at)), at);
  const Tensor total = add(Operand(wa, at), Operand(wb, at));
  const Tensor seen = total > Operand(0.0, at);
  const Tensor safe_total = where(seen, Operand(total, at), Operand(1.0, at), at);
  const Tensor weighted = add(Operand(mul(Operand(a.out, at), Operand(wa, at)), at), Operand(mul(Operand(b.out, at), Operand(wb, at)), at));
  const Tensor out = div(Operand(weighted, at), Operand(safe_total, at));
  const Tensor lse = where(seen, Operand(add(Operand(reference, at), Operand(log(safe_total, at), at)), at),
                           Operand(kMinusInfinity, at), at);
  return {out, lse};
}

void merge_into(std::optional<RingBlock>& acc, const RingBlock& block, Loc at) {
  acc = acc ? merge(*acc, block, at) : block;
}

// The placements ring attention runs in: the sequence (axis rank-2) sharded over the ring's dim;
// a leading axis stays sharded over another dim where its blocks come out even, so the fused
// kernel's operands have one shape on every device; everything else on other dims replicated.
std::vector<Placement> ring_placements(const Tensor& q, int64_t ring_dim) {
  const Mesh& mesh = q.node()->mesh;
  const int64_t r = q.rank();
  std::vector<Placement> placements = q.placements();
  std::map<int64_t, int64_t> ways;  // per leading axis, the devices sharding it
  for (size_t d = 0; d < placements.size(); ++d) {
    const auto* s = std::get_if<Shard>(&placements[d]);
    if (int64_t(d) == ring_dim || !s || s->dim >= r - 2) {
      placements[d] = Replicate{};
      continue;
    }
    ways[s->dim] = (ways.count(s->dim) ? ways[s->dim] : 1) * mesh.shape()[d];
  }
  for (size_t d = 0; d < placements.size(); ++d)
    if (const auto* s = std::get_if<Shard>(&placements[d]); s && q.shape()[size_t(s->dim)] % ways[s->dim] != 0)
      placements[d] = Replicate{};
  placements[size_t(ring_dim)] = Shard{r - 2};
  return placements;
}

// Positions (ProgramOrderScope) for the ring's steps, increasing over every ring built.
std::atomic<int64_t> next_step_position{0};

// While alive, ops built run as one step of the ring, after the previous step's: a step's
// shifts at its start and its kernels after them, never a shift between two kernels. The devices
// meet at each shift, and their work is balanced per step, not per kernel (data flow alone would
// place each shift just before its first reader, mid-step). Inside a caller's own order (a
// pipeline's ticks) the caller's order stands.
class RingStepOrder {
 public:
  RingStepOrder() {
    if (ProgramOrderScope::current() == ProgramOrderScope::none) scope_.emplace(next_step_position++);
  }

 private:
  std::optional<ProgramOrderScope> scope_;
};

// The ring over mesh dim `dim` of n devices, seen from one device inside local_map.
//
// Causal, each device's block of rows is two parts of L/2n rows: its own first half (chunk 2i of
// 2n) and the second half of device n-1-i's block (chunk 2n-1-2i), which the two swap. Queries,
// keys and values are all held so: then at every step of the ring each device has the same
// masked work (2 chunk products, 2 halves on the diagonal at step 0), not only in total, so no
// device waits at a step's shift for a busier one. Each (query part, key part) product is one
// fused kernel call with the mask shifted by their chunks' distance; wholly masked ones cost
// nothing. Not causal, a block is one part.
struct Ring {
  std::string dim;
  int64_t n = 1;
  bool causal = false;
  double scale = 1;
  Loc at;

  // The devices' mirror images, n-1-i: head-tail's swap partners.
  std::vector<int64_t> mirror() const {
    std::vector<int64_t> table(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) table[size_t(i)] = n - 1 - i;
    return table;
  }
  // Rows of the device's block as its parts (causal: the first half, and the mirror device's
  // second half, swapped in).
  std::vector<Tensor> parts_of(const Tensor& rows) const {
    if (!causal) return {rows};
    const int64_t chunk = rows.shape()[size_t(rows.rank() - 2)] / 2;
    const std::vector<Tensor> halves = split(rows, {chunk, chunk}, rows.rank() - 2, at);
    return {halves[0], permute(halves[1], dim, mirror(), at)};
  }
  // The inverse: the parts' rows back in the device's block.
  Tensor block_of(const std::vector<Tensor>& parts) const {
    if (!causal) return parts[0];
    return concat({parts[0], permute(parts[1], dim, mirror(), at)}, parts[0].rank() - 2, at);
  }
  // Several tensors' parts at once (one swap for all: they are laid side by side on the last
  // axis), each tensor's as parts_of gives them.
  std::vector<std::vector<Tensor>> parts_of_each(const std::vector<Tensor>& tensors) const {
    const int64_t r = tensors[0].rank();
    std::vector<int64_t> widths;
    for (const Tensor& t : tensors) widths.push_back(t.shape().back());
    std::vector<std::vector<Tensor>> out(tensors.size());
    for (const Tensor& rows : parts_of(concat(tensors, r - 1, at))) {
      const std::vector<Tensor> columns = split(rows, widths, r - 1, at);
      for (size_t t = 0; t < tensors.size(); ++t) out[t].push_back(columns[t]);
    }
    return out;
  }

  // The chunk (of 2n; of n when not causal) where part `part` of device `device`'s rows starts.
  Tensor chunk_of(const Tensor& device, size_t part) const {
    if (!causal) return device;
    if (part == 0) return mul(Operand(device, at), Operand(2, at));
    return sub(Operand(2 * n - 1, at), Operand(mul(Operand(device, at), Operand(2, at)), at));
  }
  // The device whose key/value parts this one holds at `step` when they move `direction` (+1 or
  // -1) each step: (i - direction * step) mod n.
  Tensor source_at(const Tensor& me, int64_t step, int64_t direction) const {
    const int64_t back = ((direction * step) % n + n) % n;
    return where(me >= Operand(back, at), Operand(sub(Operand(me, at), Operand(back, at)), at),
                 Operand(add(Operand(me, at), Operand(n - back, at)), at), at);
  }
  // The causal mask's shift for query part qp against key part kp held at `step`: the distance
  // of their first positions, in rows. None when not causal.
  std::optional<Tensor> mask_shift(size_t qp, size_t kp, int64_t step, int64_t direction, int64_t rows) const {
    if (!causal) return std::nullopt;
    const Tensor me = cast(axis_index(dim, at), DType::i64, at);
    const Tensor distance = sub(Operand(chunk_of(me, qp), at), Operand(chunk_of(source_at(me, step, direction), kp), at));
    return mul(Operand(distance, at), Operand(rows, at));
  }

  // Forward: the device's rows of the output and of each query's logsumexp. Keys and values
  // travel apart, each received straight into the buffer the kernel reads.
  std::vector<Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v) const {
    const int64_t r = q.rank(), ev = v.shape().back();
    const std::vector<std::vector<Tensor>> qkv = parts_of_each({q, k, v});
    const std::vector<Tensor>& queries = qkv[0];
    std::vector<Tensor> keys = qkv[1], values = qkv[2];
    const int64_t rows = queries[0].shape()[size_t(r - 2)];
    std::vector<std::optional<RingBlock>> acc(queries.size());
    for (int64_t step = 0; step < n; ++step) {
      if (step > 0) {
        const RingStepOrder step_start;
        for (size_t kp = 0; kp < keys.size(); ++kp) keys[kp] = shift(keys[kp], dim, 1, at), values[kp] = shift(values[kp], dim, 1, at);
      }
      const RingStepOrder step_work;
      for (size_t qp = 0; qp < queries.size(); ++qp)
        for (size_t kp = 0; kp < keys.size(); ++kp)
          merge_into(acc[qp], attend(queries[qp], keys[kp], values[kp], causal, scale, mask_shift(qp, kp, step, 1, rows), at), at);
    }
    std::vector<Tensor> out_rows;  // each part's output and logsumexp side by side: one swap back
    for (const auto& a : acc) out_rows.push_back(concat({a->out, a->logsumexp}, r - 1, at));
    const Tensor block_rows = block_of(out_rows);
    return split(block_rows, {ev, 1}, r - 1, at);
  }

  // Backward (FlashAttention's, block by block, with the merged output and logsumexp): the keys
  // and values go around the ring again, the other way (the forward's received blocks are
  // different values, so none is kept for the backward; on 2 devices both ways are one), with
  // their adjoints' running sums beside them, and after the last step the sums take one more
  // step home. Each device holds one key/value block at a time, as in the forward.
  std::vector<Tensor> backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& logsumexp,
                               const Tensor& d_out) const {
    const int64_t r = q.rank(), e = k.shape().back(), ev = v.shape().back();
    std::vector<std::pair<int64_t, int64_t>> one_more_column(size_t(r), {0, 0});
    one_more_column.back() = {0, 1};
    // The forward's rows (output and logsumexp) and their adjoint (the logsumexp's is 0: it is
    // internal), swapped with q, k and v at once.
    const Tensor forward_rows = concat({out, logsumexp}, r - 1, at), d_forward = pad(d_out, one_more_column, 0.0, at);
    const std::vector<std::vector<Tensor>> all = parts_of_each({q, k, v, forward_rows, d_forward});
    const std::vector<Tensor> &queries = all[0], &forwards = all[3], &d_forwards = all[4];
    std::vector<Tensor> keys = all[1], values = all[2];
    const int64_t rows = queries[0].shape()[size_t(r - 2)];
    std::vector<std::optional<Tensor>> dq(queries.size()), dkv(keys.size());  // dkv: [dk, dv] as the kernel writes them
    for (int64_t step = 0; step < n; ++step) {
      if (step > 0) {
        const RingStepOrder step_start;
        for (size_t kp = 0; kp < keys.size(); ++kp) {
          keys[kp] = shift(keys[kp], dim, -1, at), values[kp] = shift(values[kp], dim, -1, at);
          dkv[kp] = shift(*dkv[kp], dim, -1, at);
        }
      }
      const RingStepOrder step_work;
      for (size_t qp = 0; qp < queries.size(); ++qp)
        for (size_t kp = 0; kp < keys.size(); ++kp) {
          const auto [dq_p, dkv_p] = detail::attention_gradients(queries[qp], keys[kp], values[kp], forwards[qp], d_forwards[qp], causal,
                                                                 scale, mask_shift(qp, kp, step, -1, rows), at);
          dq[qp] = dq[qp] ? add(Operand(*dq[qp], at), Operand(dq_p, at)) : dq_p;
          dkv[kp] = dkv[kp] ? add(Operand(*dkv[kp], at), Operand(dkv_p, at)) : dkv_p;
        }
    }
    const RingStepOrder homecoming;
    std::vector<Tensor> gradient_rows;  // each part's dq, dk and dv side by side: one swap back
    for (size_t p = 0; p < queries.size(); ++p) gradient_rows.push_back(concat({*dq[p], shift(*dkv[p], dim, -1, at)}, r - 1, at));
    const Tensor block_rows = block_of(gradient_rows);
    return split(block_rows, {e, e, ev}, r - 1, at);  // dq, dk, dv
  }
};

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::string mesh_dim, std::optional<double> scale,
                      Loc at) {
  auto shapes = [&] { return shape_string(q.shape()) + ", " + shape_string(k.shape()) + ", " + shape_string(v.shape()); };
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    throw ShapeError("ring_attention: q, k and v need the same rank >= 2, got " + shapes() + at_line(at));
  const int64_t r = q.rank();
  for (int64_t a = 0; a < r - 2; ++a)
    if (k.shape()[size_t(a)] != q.shape()[size_t(a)] || v.shape()[size_t(a)] != q.shape()[size_t(a)])
      throw ShapeError("ring_attention: q, k and v need the same leading axes (no broadcasting), got " + shapes() + at_line(at));
  const int64_t length = q.shape()[size_t(r - 2)], e = q.shape().back();
  if (k.shape()[size_t(r - 2)] != length || v.shape()[size_t(r - 2)] != length || k.shape().back() != e)
    throw ShapeError("ring_attention: q, k and v need one sequence length and q and k one embedding size, got " + shapes() +
                     at_line(at));
  detail::check_meshes("ring_attention", {q.node(), k.node(), v.node()}, at);
  const Mesh& mesh = q.node()->mesh;
  if (!mesh.contains_dim(mesh_dim))
    throw MeshError("ring_attention: mesh " + mesh.to_string() + " has no dim '" + mesh_dim + "'" + at_line(at));
  const int64_t ring_dim = mesh.dim_index(mesh_dim), n = mesh.shape()[size_t(ring_dim)];
  const double s = scale.value_or(1.0 / std::sqrt(double(e)));
  if (n == 1) return scaled_dot_product_attention(q, k, v, causal, s, at);
  const int64_t pieces = causal ? 2 * n : n;
  if (length % pieces != 0 || length == 0)
    throw ShapeError("ring_attention: the sequence of " + std::to_string(length) + " must divide into " + std::to_string(pieces) +
                     (causal ? " chunks (2 per device of mesh dim '" + mesh_dim + "', for the causal load balance)"
                             : " blocks (1 per device of mesh dim '" + mesh_dim + "')") +
                     at_line(at));
  for (const Tensor* t : {&q, &k, &v})
    if (t->dtype() != q.dtype() || !is_floating(t->dtype()))
      throw DTypeError("ring_attention: q, k and v need one floating dtype, got " + std::string(dtype_name(q.dtype())) + ", " +
                       std::string(dtype_name(k.dtype())) + ", " + std::string(dtype_name(v.dtype())) + at_line(at));
  // 16-bit operands run widened (exact), their merged result rounded once.
  const DType compute = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  auto widened = [&](const Tensor& t) { return t.dtype() == compute ? t : cast(t, compute, at); };
  const std::vector<Placement> placements = ring_placements(q, ring_dim);
  const Ring ring{mesh_dim, n, causal, s, at};
  auto forward = local_map([ring](const Tensor& lq, const Tensor& lk, const Tensor& lv) { return ring.forward(lq, lk, lv); },
                           {placements, placements}, {placements, placements, placements}, mesh, true, at);
  const Tensor wq = widened(q), wk = widened(k), wv = widened(v);
  const std::vector<Tensor> result = forward(wq, wk, wv);
  auto rule = std::make_shared<GradientRule>();
  rule->inputs = {wq.node(), wk.node(), wv.node(), result[1].node()};
  rule->vjp = [ring, placements, mesh](const NodeRef& out, const std::vector<NodeRef>& in, const Tensor& g) {
    auto backward = local_map(
        [ring](const Tensor& lq, const Tensor& lk, const Tensor& lv, const Tensor& lo, const Tensor& ll, const Tensor& lg) {
          return ring.backward(lq, lk, lv, lo, ll, lg);
        },
        {placements, placements, placements}, std::vector<std::vector<Placement>>(6, placements), mesh, true, ring.at);
    const std::vector<Tensor> d = backward(Tensor(in[0]), Tensor(in[1]), Tensor(in[2]), Tensor(out), Tensor(in[3]), g);
    return std::vector<std::optional<Tensor>>{d[0], d[1], d[2], std::nullopt};
  };
  const Tensor out = with_gradient_rule(result[0], Layout::from_placements(mesh, placements, r), std::move(rule), at);
  return out.dtype() == q.dtype() ? out : cast(out, q.dtype(), at);
}

}  // namespace tessera
