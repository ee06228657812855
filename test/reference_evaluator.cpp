#include "reference_evaluator.hpp"

#include "reference_sharding.hpp"

#include "dsl/attention_parts.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

namespace tessera::testing {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t a = int64_t(shape.size()) - 1; a >= 0; --a) {
    idx[a] = shape[a] ? flat % shape[a] : 0;
    flat = shape[a] ? flat / shape[a] : 0;
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (size_t a = 0; a < shape.size(); ++a) flat = flat * shape[a] + idx[a];
  return flat;
}

// A fused attention part (dsl/attention_parts.hpp) from its definition, one query row at a time:
// the softmax with the row's own max for the forward; the gradients from the lse and output the
// forward node hands them, as the primitive defines them: P = exp(S - lse), dS = P (dO v^T - delta)
// with delta = rowsum(dO * O) - d(lse), dq = scale dS k, dk = scale dS^T q, dv = P^T dO. A causal
// node with a shift input: key j is visible to query i when j <= i + shift; a query that sees
// no key has output 0 and logsumexp -inf.
std::vector<double> attention_part(const Node& n, const std::vector<const RefArray*>& in) {
  const AttentionAttrs a = attention_attrs(n.attrs);
  const RefArray &q = *in[0], &k = *in[1], &v = *in[2];
  const size_t r = q.shape.size();
  const int64_t lq = q.shape[r - 2], e = q.shape[r - 1], lk = k.shape[r - 2], ev = v.shape[r - 1];
  const int64_t batch = numel_of(q.shape) / std::max<int64_t>(1, lq * e);
  const int64_t shift = in.size() > attention_operand_count(a.part) ? int64_t(in.back()->data.at(0)) : 0;
  std::vector<double> out(size_t(numel_of(n.shape)), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < lq; ++i) {
      auto qv = [&](int64_t c) { return q.data[size_t((b * lq + i) * e + c)]; };
      std::vector<double> s(size_t(lk), -std::numeric_limits<double>::infinity());
      for (int64_t j = 0; j < lk && (!a.causal || j <= i + shift); ++j) {
        double dot = 0;
        for (int64_t c = 0; c < e; ++c) dot += qv(c) * k.data[size_t((b * lk + j) * e + c)];
        s[size_t(j)] = dot * a.scale;
      }
      if (a.part == AttentionPart::Forward) {
        double top = -std::numeric_limits<double>::infinity(), total = 0;
        for (double x : s) top = std::max(top, x);
        for (double x : s) total += std::exp(x - top);
        double* o = out.data() + (b * lq + i) * (ev + 1);
        if (std::isinf(top)) {  // no key seen
          o[ev] = top;
          continue;
        }
        for (int64_t j = 0; j < lk; ++j)
          for (int64_t c = 0; c < ev; ++c) o[c] += std::exp(s[size_t(j)] - top) / total * v.data[size_t((b * lk + j) * ev + c)];
        o[ev] = top + std::log(total);
        continue;
      }
      const double* forward = in[3]->data.data() + (b * lq + i) * (ev + 1);
      const double* d_out = in[4]->data.data() + (b * lq + i) * (ev + 1);
      double delta = -d_out[ev];
      for (int64_t c = 0; c < ev; ++c) delta += d_out[c] * forward[c];
      for (int64_t j = 0; j < lk; ++j) {
        const double p = std::isinf(s[size_t(j)]) ? 0.0 : std::exp(s[size_t(j)] - forward[ev]);
        double dp = 0;
        for (int64_t c = 0; c < ev; ++c) dp += d_out[c] * v.data[size_t((b * lk + j) * ev + c)];
        const double ds = p * (dp - delta);
        if (a.part == AttentionPart::GradQ) {
          for (int64_t c = 0; c < e; ++c) out[size_t((b * lq + i) * e + c)] += a.scale * ds * k.data[size_t((b * lk + j) * e + c)];
          continue;
        }
        double* kv = out.data() + (b * lk + j) * (e + ev);
        for (int64_t c = 0; c < e; ++c) kv[c] += a.scale * ds * qv(c);
        for (int64_t c = 0; c < ev; ++c) kv[e + c] += p * d_out[c];
      }
    }
  return out;
}

// Rounds a double to what `dtype` can hold (integers wrap like two's complement).
// numpy's maximum / minimum: a NaN operand gives NaN.
double nan_max(double a, double b) { return std::isnan(a) ? a : std::isnan(b) ? b : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) ? a : std::isnan(b) ? b : std::min(a, b); }

double round_to(double v, DType dtype) {
  switch (dtype) {
    case DType::f32: return double(float(v));
    case DType::f64: return v;
    case DType::bf16: return bf16_to_float(float_to_bf16(float(v)));
    case DType::f16: return f16_to_float(float_to_f16(float(v)));
    case DType::u8: return v != 0 ? 1 : 0;
    case DType::i32: return std::isfinite(v) ? double(int32_t(uint32_t(int64_t(v)))) : 0;
    case DType::i64: return std::isfinite(v) ? double(int64_t(v)) : 0;
  }
  return v;
}

}  // namespace

std::array<uint32_t, 4> reference_philox(uint64_t counter, uint64_t key) {
  uint32_t c[4] = {uint32_t(counter), uint32_t(counter >> 32), 0, 0};
  uint32_t k[2] = {uint32_t(key), uint32_t(key >> 32)};
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    uint32_t next[4] = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
    std::copy(next, next + 4, c);
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return {c[0], c[1], c[2], c[3]};
}

RefArray ref_from_array(const Array& a) {
  RefArray r{a.shape(), a.dtype(), std::vector<double>(size_t(a.numel()))};
  for (int64_t i = 0; i < a.numel(); ++i) r.data[i] = a.element_as_double(i);
  return r;
}

class Evaluator {
 public:
  explicit Evaluator(const std::map<const Node*, Array>& leaves) : leaves_(leaves) {}

  const RefArray& eval(const NodeRef& n) {
    if (auto it = memo_.find(n.get()); it != memo_.end()) return it->second;
    RefArray r;
    if (auto it = leaves_.find(n.get()); it != leaves_.end()) r = ref_from_array(it->second);
    else if (n->value()) r = ref_from_array(Tensor(n).full_tensor());
    else if (n->op == OpKind::FromLocal) r = assemble(n);
    else {
      std::vector<const RefArray*> in;
      for (const auto& i : n->inputs) in.push_back(&eval(i));
      r = compute(n, in);
    }
    for (double& v : r.data) v = round_to(v, n->dtype);
    return memo_.emplace(n.get(), std::move(r)).first->second;
  }

  // local_map: the block of local value `n` on the device at `coords` (every device of the
  // mesh is simulated, not only this process's).
  const RefArray& eval_local(const NodeRef& n, const std::vector<int64_t>& coords) {
    auto key = std::make_pair(n.get(), coords);
    if (auto it = local_memo_.find(key); it != local_memo_.end()) return it->second;
    RefArray r;
    if (n->op == OpKind::ToLocal) r = block_of(n, coords);
    else if (is_functional_collective(n->op)) r = collective(n, coords);
    else {
      std::vector<const RefArray*> in;
      for (const auto& i : n->inputs) in.push_back(i->local ? &eval_local(i, coords) : &eval(i));
      r = compute(n, in, n->extents ? extents_on(*n->extents, coords) : n->shape);
    }
    for (double& v : r.data) v = round_to(v, n->dtype);
    return local_memo_.emplace(key, std::move(r)).first->second;
  }

 private:
  // to_local: the device's block of the global value; a Partial mesh dim splits it as Tessera
  // documents (coordinate 0 keeps a sum's or product's value, the others the identity).
  RefArray block_of(const NodeRef& n, const std::vector<int64_t>& coords) {
    const Layout& layout = *n->attrs.layout;
    const RefArray& global = eval(n->inputs[0]);
    const auto indices = reference_indices(global.shape, layout, coords);
    std::vector<int64_t> shape;  // this device's block (blocks may be uneven)
    for (const auto& list : indices) shape.push_back(int64_t(list.size()));
    RefArray out{shape, n->dtype, std::vector<double>(size_t(numel_of(shape)))};
    for (int64_t i = 0; i < out.numel(); ++i) {
      std::vector<int64_t> idx = unravel(i, shape);
      for (size_t a = 0; a < idx.size(); ++a) idx[a] = indices[a][size_t(idx[a])];
      out.data[size_t(i)] = global.data[size_t(ravel(idx, global.shape))];
    }
    for (size_t d = 0; d < layout.partial_ops().size(); ++d) {
      const auto op = layout.partial_ops()[d];
      if (op && coords[d] != 0 && (*op == ReduceOp::Sum || *op == ReduceOp::Product))
        for (double& v : out.data) v = *op == ReduceOp::Sum ? 0 : 1;
    }
    return out;
  }

  static std::vector<std::vector<int64_t>> all_coords(const Mesh& mesh) {
    std::vector<std::vector<int64_t>> out;
    const auto shape = mesh.shape();
    for (int64_t i = 0; i < mesh.size(); ++i) out.push_back(unravel(i, shape));
    return out;
  }

  static double combine(ReduceOp op, double a, double b) {
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: return a + b;
      case ReduceOp::Product: return a * b;
      case ReduceOp::Max: return nan_max(a, b);
      case ReduceOp::Min: return nan_min(a, b);
    }
    return a;
  }

  // from_local: every device's block put at its place; Partial dims combined, Replicate dims
  // read at coordinate 0.
  RefArray assemble(const NodeRef& n) {
    const Layout& layout = *n->attrs.layout;
    const Mesh& mesh = layout.mesh();
    RefArray out{n->shape, n->dtype, std::vector<double>(size_t(numel_of(n->shape)))};
    std::vector<bool> seen(out.data.size(), false);
    std::vector<bool> shards(size_t(mesh.ndim()), false);
    for (const auto& dims : layout.axis_mesh_dims())
      for (int64_t d : dims) shards[size_t(d)] = true;
    const auto& partial = layout.partial_ops();
    std::optional<ReduceOp> op;
    int64_t terms = 1;
    for (size_t d = 0; d < partial.size(); ++d)
      if (partial[d]) {
        op = partial[d];
        terms *= mesh.shape()[d];
      }
    for (const auto& coords : all_coords(mesh)) {
      bool read = true;
      for (size_t d = 0; d < coords.size(); ++d) read &= shards[d] || partial[d] || coords[d] == 0;
      if (!read) continue;
      const RefArray& block = n->inputs[0]->local ? eval_local(n->inputs[0], coords) : eval(n->inputs[0]);
      const auto indices = reference_indices(n->shape, layout.without_partial(), coords);
      for (int64_t i = 0; i < block.numel(); ++i) {
        std::vector<int64_t> idx = unravel(i, block.shape);
        for (size_t a = 0; a < idx.size(); ++a) idx[a] = indices[a][size_t(idx[a])];
        const size_t o = size_t(ravel(idx, n->shape));
        out.data[o] = seen[o] ? combine(*op, out.data[o], block.data[size_t(i)]) : block.data[size_t(i)];
        seen[o] = true;
      }
    }
    if (op == ReduceOp::Avg)
      for (double& v : out.data) v /= double(terms);
    return out;
  }

  static RefArray chunk(const RefArray& a, int64_t axis, int64_t i, int64_t ways) {
    RefArray out{a.shape, a.dtype, {}};
    const int64_t n = a.shape[size_t(axis)], size = (n + ways - 1) / ways;  // torch.chunk: ceil, trailing ones smaller
    const int64_t start = std::min(i * size, n);
    out.shape[size_t(axis)] = std::min(size, n - start);
    out.data.resize(size_t(numel_of(out.shape)));
    for (int64_t k = 0; k < out.numel(); ++k) {
      std::vector<int64_t> idx = unravel(k, out.shape);
      idx[size_t(axis)] += start;
      out.data[size_t(k)] = a.data[size_t(ravel(idx, a.shape))];
    }
    return out;
  }

  static RefArray concatenate(const std::vector<RefArray>& parts, int64_t axis) {
    RefArray out{parts[0].shape, parts[0].dtype, {}};
    out.shape[size_t(axis)] = 0;
    for (const RefArray& p : parts) out.shape[size_t(axis)] += p.shape[size_t(axis)];
    out.data.resize(size_t(numel_of(out.shape)));
    for (int64_t k = 0; k < out.numel(); ++k) {
      std::vector<int64_t> idx = unravel(k, out.shape);
      for (const RefArray& p : parts) {
        if (idx[size_t(axis)] < p.shape[size_t(axis)]) {
          out.data[size_t(k)] = p.data[size_t(ravel(idx, p.shape))];
          break;
        }
        idx[size_t(axis)] -= p.shape[size_t(axis)];
      }
    }
    return out;
  }

  // A functional collective, from the blocks of every device along its mesh dim.
  RefArray collective(const NodeRef& n, const std::vector<int64_t>& coords) {
    const int64_t dim = n->attrs.axes[0], ways = n->mesh.shape()[size_t(dim)], me = coords[size_t(dim)];
    std::vector<RefArray> blocks;
    for (int64_t r = 0; r < ways; ++r) {
      std::vector<int64_t> c = coords;
      c[size_t(dim)] = r;
      blocks.push_back(eval_local(n->inputs[0], c));
    }
    const ReduceOp op = ReduceOp(int(n->attrs.scalar));
    auto reduced = [&] {
      RefArray out = blocks[0];
      for (int64_t r = 1; r < ways; ++r)
        for (size_t i = 0; i < out.data.size(); ++i) out.data[i] = combine(op, out.data[i], blocks[size_t(r)].data[i]);
      if (op == ReduceOp::Avg)
        for (double& v : out.data) v /= double(ways);
      return out;
    };
    switch (n->op) {
      case OpKind::AllReduce: return reduced();
      case OpKind::AllGather: return concatenate(blocks, n->attrs.axes[1]);
      case OpKind::ReduceScatter: return chunk(reduced(), n->attrs.axes[1], me, ways);
      case OpKind::AllToAll: {
        std::vector<RefArray> received;
        for (const RefArray& b : blocks) received.push_back(chunk(b, n->attrs.axes[1], me, ways));
        return concatenate(received, n->attrs.axes[2]);
      }
      case OpKind::Shift: {  // attrs.axes[1 + i]: where device i's block goes
        for (int64_t from = 0; from < ways; ++from)
          if (n->attrs.axes[size_t(1 + from)] == me) return blocks[size_t(from)];
        throw Error("reference_eval: shift's destinations name device " + std::to_string(me) + " nowhere");
      }
      case OpKind::LocalChunk: return chunk(blocks[size_t(me)], n->attrs.axes[1], me, ways);
      case OpKind::AllToAllV: {  // counts[i][j] rows from device i to j, taken in order; from source 0 on
        const RefArray& counts = n->inputs[1]->local ? eval_local(n->inputs[1], coords) : eval(n->inputs[1]);
        RefArray out{blocks[0].shape, blocks[0].dtype, {}};
        out.shape[0] = n->attrs.axes[1];
        const int64_t row = out.shape[0] == 0 ? 0 : numel_of(out.shape) / out.shape[0];
        out.data.assign(size_t(numel_of(out.shape)), 0.0);
        int64_t filled = 0;
        for (int64_t from = 0; from < ways; ++from) {
          int64_t start = 0;
          for (int64_t to = 0; to < me; ++to) start += int64_t(counts.data[size_t(from * ways + to)]);
          const int64_t count = int64_t(counts.data[size_t(from * ways + me)]);
          for (int64_t i = 0; i < count * row; ++i) out.data[size_t(filled * row + i)] = blocks[size_t(from)].data[size_t(start * row + i)];
          filled += count;
        }
        return out;
      }
      default: throw Error("reference_eval: " + std::string(op_name(n->op)) + " is no collective");
    }
  }

  // `shape`: the result's shape (a local value's block on one device may differ from n->shape).
  RefArray compute(const NodeRef& n, const std::vector<const RefArray*>& in) { return compute(n, in, n->shape); }
  RefArray compute(const NodeRef& n, const std::vector<const RefArray*>& in, const std::vector<int64_t>& shape) {
    RefArray out{shape, n->dtype, std::vector<double>(size_t(numel_of(shape)))};
    const NodeAttrs& at = n->attrs;
    auto each = [&](const std::function<double(const std::vector<int64_t>&, int64_t)>& f) {
      for (int64_t i = 0; i < out.numel(); ++i) out.data[i] = f(unravel(i, shape), i);
    };
    switch (n->op) {
      case OpKind::Full: each([&](auto&, int64_t) { return at.scalar; }); break;
      case OpKind::Iota: each([&](auto& idx, int64_t) { return double(idx[at.axes[0]]); }); break;
      case OpKind::RandomUniform: case OpKind::RandomNormal:
        each([&](auto&, int64_t flat) {
          auto bits = reference_philox(uint64_t(flat), at.seed);
          const bool f64 = n->dtype == DType::f64;
          auto unit = [&](uint32_t lo, uint32_t hi, bool open) {
            double u = f64 ? double(((uint64_t(hi) >> 11) << 32) + lo + (open ? 1 : 0)) * std::ldexp(1.0, -53)
                           : double((lo >> 8) + (open ? 1 : 0)) * std::ldexp(1.0, -24);
            return u;
          };
          if (n->op == OpKind::RandomUniform) return at.scalar + (at.scalar2 - at.scalar) * unit(bits[0], bits[1], false);
          double u1 = unit(bits[0], bits[1], true), u2 = unit(bits[2], bits[3], false);
          return at.scalar + at.scalar2 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
        });
        break;
      case OpKind::Neg: each([&](auto&, int64_t i) { return -in[0]->data[i]; }); break;
      case OpKind::Abs: each([&](auto&, int64_t i) { return std::fabs(in[0]->data[i]); }); break;
      case OpKind::Exp: each([&](auto&, int64_t i) { return std::exp(in[0]->data[i]); }); break;
      case OpKind::Log: each([&](auto&, int64_t i) { return std::log(in[0]->data[i]); }); break;
      case OpKind::Sqrt: each([&](auto&, int64_t i) { return std::sqrt(in[0]->data[i]); }); break;
      case OpKind::Tanh: each([&](auto&, int64_t i) { return std::tanh(in[0]->data[i]); }); break;
      case OpKind::Sin: each([&](auto&, int64_t i) { return std::sin(in[0]->data[i]); }); break;
      case OpKind::Cos: each([&](auto&, int64_t i) { return std::cos(in[0]->data[i]); }); break;
      case OpKind::Add: each([&](auto&, int64_t i) { return in[0]->data[i] + in[1]->data[i]; }); break;
      case OpKind::Sub: each([&](auto&, int64_t i) { return in[0]->data[i] - in[1]->data[i]; }); break;
      case OpKind::Mul: each([&](auto&, int64_t i) { return in[0]->data[i] * in[1]->data[i]; }); break;
      case OpKind::Div:
        each([&](auto&, int64_t i) {
          double a = in[0]->data[i], b = in[1]->data[i];
          if (is_floating(n->dtype)) return a / b;
          return b == 0 ? 0.0 : std::trunc(a / b);
        });
        break;
      case OpKind::Maximum: each([&](auto&, int64_t i) { return nan_max(in[0]->data[i], in[1]->data[i]); }); break;
      case OpKind::Minimum: each([&](auto&, int64_t i) { return nan_min(in[0]->data[i], in[1]->data[i]); }); break;
      case OpKind::Pow: each([&](auto&, int64_t i) { return std::pow(in[0]->data[i], in[1]->data[i]); }); break;
      case OpKind::Equal: each([&](auto&, int64_t i) { return double(in[0]->data[i] == in[1]->data[i]); }); break;
      case OpKind::NotEqual: each([&](auto&, int64_t i) { return double(in[0]->data[i] != in[1]->data[i]); }); break;
      case OpKind::Less: each([&](auto&, int64_t i) { return double(in[0]->data[i] < in[1]->data[i]); }); break;
      case OpKind::LessEqual: each([&](auto&, int64_t i) { return double(in[0]->data[i] <= in[1]->data[i]); }); break;
      case OpKind::Where: each([&](auto&, int64_t i) { return in[0]->data[i] != 0 ? in[1]->data[i] : in[2]->data[i]; }); break;
      case OpKind::CheckIndex: case OpKind::StopGradient: case OpKind::ReducePartials: each([&](auto&, int64_t i) { return in[0]->data[i]; }); break;
      case OpKind::Cast:
        each([&](auto&, int64_t i) {
          double v = in[0]->data[i];
          return is_floating(n->dtype) || n->dtype == DType::u8 ? v : std::trunc(v);
        });
        break;
      case OpKind::ReduceSum: case OpKind::ReduceProd: case OpKind::ReduceMax: case OpKind::ReduceMin: case OpKind::ArgMax:
        reduce(*n, *in[0], out);
        break;
      case OpKind::Reshape: out.data = in[0]->data; break;
      case OpKind::Permute:
        each([&](auto& idx, int64_t) {
          std::vector<int64_t> src(idx.size());
          for (size_t a = 0; a < idx.size(); ++a) src[at.axes[a]] = idx[a];
          return in[0]->data[ravel(src, in[0]->shape)];
        });
        break;
      case OpKind::Expand:
        each([&](auto& idx, int64_t) {
          std::vector<int64_t> src = idx;
          for (size_t a = 0; a < idx.size(); ++a)
            if (in[0]->shape[a] == 1) src[a] = 0;
          return in[0]->data[ravel(src, in[0]->shape)];
        });
        break;
      case OpKind::Slice:
        each([&](auto& idx, int64_t) {
          std::vector<int64_t> src = idx;
          for (size_t a = 0; a < idx.size(); ++a) src[a] += at.lo[a];
          return in[0]->data[ravel(src, in[0]->shape)];
        });
        break;
      case OpKind::Pad:
        each([&](auto& idx, int64_t) {
          std::vector<int64_t> src = idx;
          for (size_t a = 0; a < idx.size(); ++a) {
            src[a] -= at.lo[a];
            if (src[a] < 0 || src[a] >= in[0]->shape[a]) return at.scalar;
          }
          return in[0]->data[ravel(src, in[0]->shape)];
        });
        break;
      case OpKind::Concat:
        each([&](auto& idx, int64_t) {
          std::vector<int64_t> src = idx;
          int64_t axis = at.axes[0];
          for (const RefArray* part : in) {
            if (src[axis] < part->shape[axis]) return part->data[ravel(src, part->shape)];
            src[axis] -= part->shape[axis];
          }
          return 0.0;
        });
        break;
      case OpKind::Dot: {
        const RefArray &a = *in[0], &b = *in[1];
        const int64_t r = n->rank(), k = a.shape.back();
        if (b.shape.size() == 2 && a.shape.size() > 2) {  // Rows: a's leading axes are rows
          each([&](auto& idx, int64_t flat) {
            const int64_t row = flat / shape.back(), col = idx.back();
            double acc = 0;
            for (int64_t j = 0; j < k; ++j) acc += a.data[size_t(row * k + j)] * b.data[size_t(j * shape.back() + col)];
            return acc;
          });
          break;
        }
        if (r == 2 && a.shape.size() > 2) {  // ContractRows: a^T b over every row
          const int64_t rows = int64_t(a.data.size()) / k, cols = b.shape.back();
          each([&](auto& idx, int64_t) {
            double acc = 0;
            for (int64_t row = 0; row < rows; ++row) acc += a.data[size_t(row * k + idx[0])] * b.data[size_t(row * cols + idx[1])];
            return acc;
          });
          break;
        }
        each([&](auto& idx, int64_t) {
          double acc = 0;
          std::vector<int64_t> ia = idx, ib = idx;
          for (int64_t j = 0; j < k; ++j) {
            ia[r - 1] = j;
            ib[r - 2] = j;
            acc += a.data[ravel(ia, a.shape)] * b.data[ravel(ib, b.shape)];
          }
          return acc;
        });
        break;
      }
      case OpKind::Attention: out.data = attention_part(*n, in); break;
      case OpKind::GroupedDot: case OpKind::GroupedWeightGrad: {
        // Group e is rows [ends[e - 1], ends[e]); rows of no group give zeros (out starts zero).
        const RefArray &x = *in[0], &other = *in[1], &ends = *in[2];
        const int64_t rows = x.shape[0], k = x.shape[1], f = other.shape.back();
        int64_t begin = 0;
        for (int64_t e = 0; e < int64_t(ends.data.size()); ++e) {
          const int64_t end = std::min(rows, int64_t(ends.data[size_t(e)]));
          for (int64_t row = begin; row < end; ++row)
            for (int64_t c = 0; c < f; ++c)
              for (int64_t j = 0; j < k; ++j) {
                if (n->op == OpKind::GroupedDot)  // out[row, c] += x[row, j] w[e, j, c]
                  out.data[size_t(row * f + c)] += x.data[size_t(row * k + j)] * other.data[size_t((e * k + j) * f + c)];
                else  // out[e, j, c] += x[row, j] dy[row, c]
                  out.data[size_t((e * k + j) * f + c)] += x.data[size_t(row * k + j)] * other.data[size_t(row * f + c)];
              }
          begin = std::max(begin, end);
        }
        break;
      }
      case OpKind::TakeRows: {
        const RefArray &table = *in[0], &ids = *in[1];
        const int64_t rows = table.shape[0], cols = table.shape[1];
        each([&](auto& idx, int64_t flat) {
          const int64_t id = int64_t(ids.data[size_t(flat / cols)]);  // ids [...] -> [..., cols]
          return id >= 0 && id < rows ? table.data[size_t(id * cols + idx.back())] : 0.0;
        });
        break;
      }
      case OpKind::ScatterAddRows: {
        const RefArray &g = *in[0], &ids = *in[1];
        const int64_t rows = shape[0], cols = shape[1];
        for (int64_t r = 0; r < int64_t(ids.data.size()); ++r) {  // g [..., cols], ids [...]
          const int64_t id = int64_t(ids.data[size_t(r)]);
          if (id < 0 || id >= rows) continue;
          for (int64_t c = 0; c < cols; ++c) out.data[size_t(id * cols + c)] += g.data[size_t(r * cols + c)];
        }
        break;
      }
      case OpKind::WithLayout: case OpKind::LayoutHint: case OpKind::MeshTransfer: out.data = in[0]->data; break;
      case OpKind::Leaf: throw Error("reference_eval: leaf without a value");
      default: throw Error("reference_eval: " + std::string(op_name(n->op)) + " is evaluated per device");
    }
    return out;
  }

  void reduce(const Node& n, const RefArray& in, RefArray& out) {
    const auto& axes = n.attrs.axes;
    std::vector<bool> seen(out.data.size(), false);
    std::vector<int64_t> best_at(out.data.size(), 0);
    for (int64_t i = 0; i < in.numel(); ++i) {
      std::vector<int64_t> idx = unravel(i, in.shape), out_idx;
      for (int64_t a = 0; a < int64_t(idx.size()); ++a)
        if (std::find(axes.begin(), axes.end(), a) == axes.end()) out_idx.push_back(idx[a]);
      int64_t o = ravel(out_idx, out.shape);
      double v = in.data[i];
      double& acc = out.data[o];
      if (!seen[o]) {
        seen[o] = true;
        acc = v;
        best_at[o] = idx[axes[0]];
        continue;
      }
      switch (n.op) {
        case OpKind::ReduceSum: acc += v; break;
        case OpKind::ReduceProd: acc *= v; break;
        case OpKind::ReduceMax: acc = nan_max(acc, v); break;
        case OpKind::ReduceMin: acc = nan_min(acc, v); break;
        case OpKind::ArgMax:
          if (v > acc || (std::isnan(v) && !std::isnan(acc))) {  // the first NaN wins
            acc = v;
            best_at[o] = idx[axes[0]];
          }
          break;
        default: break;
      }
    }
    for (size_t o = 0; o < out.data.size(); ++o) {
      if (n.op == OpKind::ArgMax) out.data[o] = double(best_at[o]);
      else if (!seen[o]) {  // an empty reduction: the identity
        double inf = std::numeric_limits<double>::infinity();
        out.data[o] = n.op == OpKind::ReduceSum ? 0 : n.op == OpKind::ReduceProd ? 1 : n.op == OpKind::ReduceMax ? -inf : inf;
      }
    }
  }

  const std::map<const Node*, Array>& leaves_;
  std::unordered_map<const Node*, RefArray> memo_;
  std::map<std::pair<const Node*, std::vector<int64_t>>, RefArray> local_memo_;
};

RefArray reference_eval(const Tensor& t, const std::map<const Node*, Array>& leaves) {
  if (t.node()->local) throw Error("reference_eval: a local value of local_map has no global value");
  Evaluator e(leaves);
  return e.eval(t.node());
}

std::string compare_with_reference(const Array& got, const RefArray& want, double tol) {
  if (got.shape() != want.shape)
    return "shape " + fmt::format("{}", fmt::join(got.shape(), ",")) + " != " + fmt::format("{}", fmt::join(want.shape, ","));
  if (got.dtype() != want.dtype) return "dtype differs";
  if (want.dtype == DType::bf16) tol = std::max(tol, 2e-2);
  if (want.dtype == DType::f16) tol = std::max(tol, 2e-3);
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.element_as_double(i), w = want.data[i];
    bool ok;
    if (!is_floating(want.dtype)) ok = g == w;
    else if (std::isnan(w)) ok = std::isnan(g);
    else if (std::isinf(w)) ok = g == w;
    else ok = std::fabs(g - w) <= tol * (1 + std::fabs(w));
    if (!ok) return fmt::format("element {}: got {} want {}", i, g, w);
  }
  return "";
}

}  // namespace tessera::testing
