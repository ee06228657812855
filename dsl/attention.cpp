#include "dsl/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsl/attention_parts.hpp"
#include "dsl/error.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

thread_local std::vector<SdpBackend> allowed_backends = {SdpBackend::Flash, SdpBackend::Math};

// Below this many keys the scores are small and the math backend's GEMMs are faster. Measured
// (docs/PERFORMANCE_HISTORY.md), fused against math, attention fwd+bwd: on an AVX-512 machine 0.75-0.83x
// at 128 keys, 1.05-1.12x at 256; on an AVX2 machine, since its GEMMs reach OpenBLAS's speed,
// 0.72-0.78x at 128, 0.91-0.94x at 256, 0.98-1.02x at 384 (a GPT step at 128 keys: 0.93x). 256
// keeps the fused kernel, which never stores the scores, where it is as fast or faster on one of
// them and within 10% on the other. With Flash the only backend allowed, it runs at any length.
constexpr int64_t kFlashMinimumKeys = 256;

bool allowed(SdpBackend b) { return std::find(allowed_backends.begin(), allowed_backends.end(), b) != allowed_backends.end(); }

// An iota along `axis` of `shape` with no layout of its own (it takes its consumer's).
Tensor free_iota(const std::vector<int64_t>& shape, int64_t axis, Loc at) {
  NodeAttrs attrs;
  attrs.axes = {axis};
  return Tensor(make_node(OpKind::Iota, DType::i64, shape, {}, attrs, at));
}

// The first `size` entries of the last axis from `begin` on.
Tensor last_axis_slice(const Tensor& t, int64_t begin, int64_t size, Loc at) {
  std::vector<int64_t> b(size_t(t.rank()), 0), s = t.shape();
  b.back() = begin;
  s.back() = size;
  return slice(t, b, s, at);
}

// q k^T * scale over the last two axes, with the causal mask's hidden scores at -inf; the mask
// moved by `shift` (an i64 scalar) when there is one.
Tensor masked_scores(const Tensor& q, const Tensor& k, bool causal, double scale, const std::optional<Tensor>& shift, Loc at) {
  Tensor scores = mul(Operand(matmul(q, detail::transpose_last_two(k, at), at), at), Operand(scale, at));
  if (!causal) return scores;
  const int64_t r = q.rank();
  const std::vector<int64_t> grid = {q.shape()[size_t(r - 2)], k.shape()[size_t(r - 2)]};
  Tensor last_seen = free_iota(grid, 0, at);
  if (shift) last_seen = add(Operand(last_seen, at), Operand(*shift, at));
  Tensor visible = free_iota(grid, 1, at) <= Operand(last_seen, at);
  return where(visible, Operand(scores, at), Operand(-std::numeric_limits<double>::infinity(), at), at);
}

// The mask's shift input of an attention node of `part`, if it has one.
std::optional<Tensor> mask_shift_of(AttentionPart part, const std::vector<NodeRef>& inputs) {
  if (inputs.size() == attention_operand_count(part)) return std::nullopt;
  return Tensor(inputs.back());
}

// The parts' definitions (dsl/attention_parts.hpp) in ordinary ops, the softmax recomputed in
// the backward from the forward's logsumexp column as the fused kernels do.
Tensor forward_from_ops(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                        const std::optional<Tensor>& shift, Loc at) {
  const int64_t last = q.rank() - 1;
  Tensor scores = masked_scores(q, k, causal, scale, shift, at);
  Tensor row_max = reduce_max(scores, {last}, true, at);
  if (shift) {  // a query may see no key: its max is -inf, its row 0 and its logsumexp -inf
    const Tensor seen = row_max > Operand(-std::numeric_limits<double>::infinity(), at);
    row_max = where(seen, Operand(row_max, at), Operand(0.0, at), at);
  }
  Tensor p = exp(sub(Operand(scores, at), Operand(row_max, at)), at);
  Tensor row_sum = reduce_sum(p, {last}, true, at);
  Tensor out = matmul(p, v, at);
  if (shift) out = where(row_sum > Operand(0.0, at), Operand(div(Operand(out, at), Operand(row_sum, at)), at), Operand(0.0, at), at);
  else out = div(Operand(out, at), Operand(row_sum, at));
  Tensor logsumexp = add(Operand(row_max, at), Operand(log(row_sum, at), at));
  return concat({out, logsumexp}, last, at);
}

struct SoftmaxGradients {
  Tensor p;         // the attention weights
  Tensor d_scores;  // d(loss) / d(q k^T), the scale applied
};

// d_forward: the adjoint of the forward's output and logsumexp column. A logsumexp's adjoint
// adds p times it to each score's, so it enters as a term of row_dot.
SoftmaxGradients softmax_gradients(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& forward,
                                   const Tensor& d_forward, bool causal, double scale, const std::optional<Tensor>& shift,
                                   Loc at) {
  const int64_t last = q.rank() - 1, ev = v.shape().back();
  Tensor out = last_axis_slice(forward, 0, ev, at), logsumexp = last_axis_slice(forward, ev, 1, at);
  Tensor d_out = last_axis_slice(d_forward, 0, ev, at), d_logsumexp = last_axis_slice(d_forward, ev, 1, at);
  Tensor scores = masked_scores(q, k, causal, scale, shift, at);
  Tensor p = exp(sub(Operand(scores, at), Operand(logsumexp, at)), at);
  if (shift) p = where(scores > Operand(-std::numeric_limits<double>::infinity(), at), Operand(p, at), Operand(0.0, at), at);
  Tensor d_p = matmul(d_out, detail::transpose_last_two(v, at), at);
  Tensor row_dot = sub(Operand(reduce_sum(mul(Operand(d_out, at), Operand(out, at)), {last}, true, at), at), Operand(d_logsumexp, at));
  Tensor d_scores = mul(Operand(mul(Operand(p, at), Operand(sub(Operand(d_p, at), Operand(row_dot, at)), at)), at), Operand(scale, at));
  return {p, d_scores};
}

Tensor math_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Loc at) {
  return matmul(softmax(masked_scores(q, k, causal, scale, std::nullopt, at), -1, at), v, at);
}

// The fused primitive's result dtype for q, k and v of `data`: f64's own, f32 for f32 and the
// 16-bit dtypes, which it reads as they are and sums in f32 (FlashAttention-2's contract), so
// its logsumexp column and gradients stay f32.
DType attention_result_dtype(DType data) { return data == DType::f64 ? DType::f64 : DType::f32; }

// Why the fused primitive cannot take this call ("" when it can). The same on every target: one
// whose backend has no fused kernel computes the primitive from its parts below the graph
// (attention_part_from_ops), so a program's graph never depends on where it runs.
std::string flash_refusal(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t r = q.rank();
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) return "q, k and v differ in dtype";
  if (q.dtype() != DType::f32 && q.dtype() != DType::f64 && !is_16_bit_float(q.dtype()))
    return "its kernel is f32, f64, bf16 and f16 only";
  for (int64_t a = 0; a < r - 2; ++a)
    if (q.shape()[size_t(a)] != k.shape()[size_t(a)] || q.shape()[size_t(a)] != v.shape()[size_t(a)])
      return "q, k and v differ in their leading axes (no broadcasting)";
  // The CUDA kernel's widest head (kFlashAttentionMaxHead, backend/cuda/cuda_flash_attention.hpp).
  constexpr int64_t kGpuMaxHead = 256;
  if (q.node()->mesh.is_valid() && q.node()->mesh.device_kind() == DeviceKind::GPU &&
      (q.shape().back() > kGpuMaxHead || v.shape().back() > kGpuMaxHead))
    return "heads wider than " + std::to_string(kGpuMaxHead) + " columns on GPU meshes";
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->node()->extents) return "local blocks of uneven extents take the math backend";
    for (int64_t e : t->shape())
      if (e == 0) return "an operand has no elements";
  }
  return "";
}

NodeRef attention_node(AttentionPart part, std::vector<int64_t> shape, std::vector<NodeRef> inputs, DType dtype, bool causal,
                       double scale, Loc at) {
  return make_node(OpKind::Attention, dtype, std::move(shape), std::move(inputs), attention_node_attrs({part, causal, scale}), at);
}

std::vector<int64_t> with_last_two(std::vector<int64_t> shape, int64_t rows, int64_t cols) {
  shape[shape.size() - 2] = rows;
  shape.back() = cols;
  return shape;
}

}  // namespace

SdpaKernel::SdpaKernel(std::vector<SdpBackend> backends) : previous_(allowed_backends) {
  if (backends.empty()) throw Error("SdpaKernel: no backend listed");
  allowed_backends = std::move(backends);
}

SdpaKernel::~SdpaKernel() { allowed_backends = previous_; }

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale,
                                    Loc at) {
  auto shapes = [&] { return shape_string(q.shape()) + ", " + shape_string(k.shape()) + ", " + shape_string(v.shape()); };
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    throw ShapeError("scaled_dot_product_attention: q, k and v need the same rank >= 2, got " + shapes() + at_line(at));
  const int64_t r = q.rank();
  const int64_t lq = q.shape()[size_t(r - 2)], e = q.shape()[size_t(r - 1)], ev = v.shape()[size_t(r - 1)];
  if (e != k.shape()[size_t(r - 1)] || k.shape()[size_t(r - 2)] != v.shape()[size_t(r - 2)])
    throw ShapeError("scaled_dot_product_attention: q and k need one embedding size and k and v one length, got " + shapes() +
                     at_line(at));
  detail::check_meshes("scaled_dot_product_attention", {q.node(), k.node(), v.node()}, at);
  const double s = scale.value_or(1.0 / std::sqrt(double(e)));
  // 16-bit q, k, v (mixed precision): the fused primitive reads them as they are and gives f32
  // (its sums, rescaling and logsumexp are f32), rounded once to q's dtype here; GPU kernels run
  // its products on tensor cores. Short keys keep the math backend in the 16-bit dtype: the
  // GPT sample's bf16 step at context 128 ran at 19.9k tokens/s through the fused kernel
  // against 23.6k.
  const bool short_keys = k.shape()[size_t(r - 2)] < kFlashMinimumKeys && allowed(SdpBackend::Math);
  const std::string refusal = allowed(SdpBackend::Flash) ? flash_refusal(q, k, v) : "not allowed by SdpaKernel";
  if (!refusal.empty() || short_keys) {
    if (!allowed(SdpBackend::Math))
      throw Error("scaled_dot_product_attention: the flash backend cannot run this call (" + refusal +
                  ") and SdpaKernel allows no other" + at_line(at));
    return math_attention(q, k, v, causal, s, at);
  }
  NodeRef forward = attention_node(AttentionPart::Forward, with_last_two(q.shape(), lq, ev + 1), {q.node(), k.node(), v.node()},
                                   attention_result_dtype(q.dtype()), causal, s, at);
  const Tensor out = last_axis_slice(Tensor(forward), 0, ev, at);
  return out.dtype() == q.dtype() ? out : cast(out, q.dtype(), at);
}

namespace detail {

Tensor attention_with_logsumexp(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                const std::optional<Tensor>& mask_shift, Loc at) {
  if (const std::string refusal = flash_refusal(q, k, v); !refusal.empty())
    throw Error("attention_with_logsumexp: the fused attention cannot run this call (" + refusal + ")" + at_line(at));
  std::vector<NodeRef> inputs = {q.node(), k.node(), v.node()};
  if (mask_shift) {
    if (!causal) throw InternalError("attention_with_logsumexp: a mask shift without a causal mask");
    if (mask_shift->dtype() != DType::i64 || mask_shift->rank() != 0)
      throw DTypeError("attention_with_logsumexp: the mask shift must be an i64 scalar" + at_line(at));
    inputs.push_back(mask_shift->node());
  }
  const int64_t lq = q.shape()[size_t(q.rank() - 2)], ev = v.shape().back();
  return Tensor(attention_node(AttentionPart::Forward, with_last_two(q.shape(), lq, ev + 1), std::move(inputs),
                               attention_result_dtype(q.dtype()), causal, scale, at));
}

NodeRef attention_part_from_ops(const AttentionAttrs& a, const std::vector<NodeRef>& inputs, Loc at) {
  // 16-bit operands widened to the primitive's f32 (exact), as its kernels read them.
  auto operand = [&](size_t i) {
    const Tensor t(inputs.at(i));
    return is_16_bit_float(t.dtype()) ? cast(t, DType::f32, at) : t;
  };
  const Tensor q = operand(0), k = operand(1), v = operand(2);
  const std::optional<Tensor> shift = mask_shift_of(a.part, inputs);
  if (a.part == AttentionPart::Forward) return forward_from_ops(q, k, v, a.causal, a.scale, shift, at).node();
  const Tensor d_forward(inputs.at(4));
  const auto [p, d_scores] = softmax_gradients(q, k, v, Tensor(inputs.at(3)), d_forward, a.causal, a.scale, shift, at);
  if (a.part == AttentionPart::GradQ) return matmul(d_scores, k, at).node();
  Tensor dk = matmul(detail::transpose_last_two(d_scores, at), q, at);
  Tensor dv = matmul(detail::transpose_last_two(p, at), last_axis_slice(d_forward, 0, v.shape().back(), at), at);
  return concat({dk, dv}, q.rank() - 1, at).node();
}

std::array<Tensor, 2> attention_gradients(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& forward,
                                          const Tensor& d_forward, bool causal, double scale,
                                          const std::optional<Tensor>& mask_shift, Loc at) {
  const int64_t r = q.rank(), e = q.shape()[size_t(r - 1)], ev = v.shape()[size_t(r - 1)], lk = k.shape()[size_t(r - 2)];
  std::vector<NodeRef> inputs = {q.node(), k.node(), v.node(), forward.node(), d_forward.node()};
  if (mask_shift) inputs.push_back(mask_shift->node());
  const DType result = attention_result_dtype(q.dtype());
  Tensor dq(attention_node(AttentionPart::GradQ, q.shape(), inputs, result, causal, scale, at));
  Tensor dkv(attention_node(AttentionPart::GradKV, with_last_two(q.shape(), lk, e + ev), inputs, result, causal, scale, at));
  return {dq, dkv};
}

std::array<Tensor, 3> flash_attention_vjp(const NodeRef& forward, const std::vector<NodeRef>& forward_inputs,
                                          const Tensor& d_forward, Loc at) {
  const AttentionAttrs a = attention_attrs(forward->attrs);
  const Tensor q(forward_inputs.at(0)), k(forward_inputs.at(1)), v(forward_inputs.at(2));
  const auto [dq, dkv] = attention_gradients(q, k, v, Tensor(forward), d_forward, a.causal, a.scale,
                                             mask_shift_of(AttentionPart::Forward, forward_inputs), at);
  const int64_t e = k.shape().back(), ev = v.shape().back();
  // Each gradient in its operand's dtype (16-bit operands' f32 gradients rounded once).
  auto in_dtype_of = [&](const Tensor& g, const Tensor& operand) { return g.dtype() == operand.dtype() ? g : cast(g, operand.dtype(), at); };
  return {in_dtype_of(dq, q), in_dtype_of(last_axis_slice(dkv, 0, e, at), k), in_dtype_of(last_axis_slice(dkv, e, ev, at), v)};
}

}  // namespace detail
}  // namespace tessera
