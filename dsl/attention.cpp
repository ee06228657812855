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

// Below this many keys the scores are small and the math backend's GEMMs are faster (a GPT step
// at 64 keys: 0.91x the math backend's speed; at 128: 0.94-1.07x, so the fused kernel, which
// never stores the scores; at 512: 1.43x; docs/PERFORMANCE.md). With Flash the only backend
// allowed, it runs at any length.
constexpr int64_t kFlashMinimumKeys = 128;

bool allowed(SdpBackend b) { return std::find(allowed_backends.begin(), allowed_backends.end(), b) != allowed_backends.end(); }

// An iota along `axis` of `shape` with no layout of its own (it takes its consumer's).
Tensor free_iota(const std::vector<int64_t>& shape, int64_t axis, Loc at) {
  NodeAttrs attrs;
  attrs.axes = {axis};
  return Tensor(make_node(OpKind::Iota, DType::i64, shape, {}, attrs, at));
}

Tensor math_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, Loc at) {
  const int64_t r = q.rank();
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) perm[size_t(d)] = d;
  std::swap(perm[size_t(r - 1)], perm[size_t(r - 2)]);
  Tensor scores = mul(Operand(matmul(q, transpose(k, perm, at), at), at), Operand(scale, at));
  if (causal) {
    const std::vector<int64_t> grid = {q.shape()[size_t(r - 2)], k.shape()[size_t(r - 2)]};
    Tensor visible = free_iota(grid, 1, at) <= Operand(free_iota(grid, 0, at), at);
    scores = where(visible, Operand(scores, at), Operand(-std::numeric_limits<double>::infinity(), at), at);
  }
  return matmul(softmax(scores, -1, at), v, at);
}

// Why the fused kernel cannot take this call ("" when it can).
std::string flash_refusal(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t r = q.rank();
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) return "q, k and v differ in dtype";
  if (q.dtype() != DType::f32 && q.dtype() != DType::f64) return "its kernel is f32 and f64 only";
  for (int64_t a = 0; a < r - 2; ++a)
    if (q.shape()[size_t(a)] != k.shape()[size_t(a)] || q.shape()[size_t(a)] != v.shape()[size_t(a)])
      return "q, k and v differ in their leading axes (no broadcasting)";
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->node()->local) return "local_map's local values take the math backend";
    for (int64_t e : t->shape())
      if (e == 0) return "an operand has no elements";
  }
  const DeviceKind kind = detail::device_kind_of({q.node(), k.node(), v.node()});
  if (!has_capability(kind, Capability::FusedAttention))
    return "its kernel runs on CPU meshes only (this is a " + std::string(device_kind_name(kind)) + " mesh)";
  return "";
}

NodeRef attention_node(AttentionPart part, std::vector<int64_t> shape, std::vector<NodeRef> inputs, DType dtype, bool causal,
                       double scale, Loc at) {
  return make_node(OpKind::Attention, dtype, std::move(shape), std::move(inputs), attention_node_attrs({part, causal, scale}), at);
}

// The first `size` entries of the last axis from `begin` on.
Tensor last_axis_slice(const Tensor& t, int64_t begin, int64_t size, Loc at) {
  std::vector<int64_t> b(size_t(t.rank()), 0), s = t.shape();
  b.back() = begin;
  s.back() = size;
  return slice(t, b, s, at);
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
  const std::string refusal = allowed(SdpBackend::Flash) ? flash_refusal(q, k, v) : "not allowed by SdpaKernel";
  const bool short_keys = k.shape()[size_t(r - 2)] < kFlashMinimumKeys && allowed(SdpBackend::Math);
  if (!refusal.empty() || short_keys) {
    if (!allowed(SdpBackend::Math))
      throw Error("scaled_dot_product_attention: the flash backend cannot run this call (" + refusal +
                  ") and SdpaKernel allows no other" + at_line(at));
    return math_attention(q, k, v, causal, s, at);
  }
  NodeRef forward = attention_node(AttentionPart::Forward, with_last_two(q.shape(), lq, ev + 1), {q.node(), k.node(), v.node()},
                                   q.dtype(), causal, s, at);
  return last_axis_slice(Tensor(forward), 0, ev, at);
}

namespace detail {

std::array<Tensor, 3> flash_attention_vjp(const NodeRef& forward, const Tensor& d_out, Loc at) {
  const AttentionAttrs a = attention_attrs(forward->attrs);
  const NodeRef &q = forward->inputs[0], &k = forward->inputs[1], &v = forward->inputs[2];
  const int64_t r = q->rank(), e = q->shape[size_t(r - 1)], ev = v->shape[size_t(r - 1)], lk = k->shape[size_t(r - 2)];
  const std::vector<NodeRef> inputs = {q, k, v, forward, d_out.node()};
  Tensor dq(attention_node(AttentionPart::GradQ, q->shape, inputs, q->dtype, a.causal, a.scale, at));
  Tensor dkv(attention_node(AttentionPart::GradKV, with_last_two(q->shape, lk, e + ev), inputs, q->dtype, a.causal, a.scale, at));
  return {dq, last_axis_slice(dkv, 0, e, at), last_axis_slice(dkv, e, ev, at)};
}

}  // namespace detail
}  // namespace tessera
