#include "reference_evaluator.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <unordered_map>

namespace tessera::testing {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t a = int64_t(shape.size()) - 2; a >= 0; --a) s[a] = s[a + 1] * shape[a + 1];
  return s;
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

// Rounds a double to what `dtype` can hold (integers wrap like two's complement).
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
    RefArray r = compute(n);
    for (double& v : r.data) v = round_to(v, n->dtype);
    return memo_.emplace(n.get(), std::move(r)).first->second;
  }

 private:
  RefArray compute(const NodeRef& n) {
    if (auto it = leaves_.find(n.get()); it != leaves_.end()) return ref_from_array(it->second);
    if (n->value()) return ref_from_array(Tensor(n).full_tensor());
    RefArray out{n->shape, n->dtype, std::vector<double>(size_t(numel_of(n->shape)))};
    const std::vector<int64_t> out_strides = strides_of(n->shape);
    std::vector<const RefArray*> in;
    for (const auto& i : n->inputs) in.push_back(&eval(i));
    const NodeAttrs& at = n->attrs;
    auto each = [&](const std::function<double(const std::vector<int64_t>&, int64_t)>& f) {
      for (int64_t i = 0; i < out.numel(); ++i) out.data[i] = f(unravel(i, n->shape), i);
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
      case OpKind::Maximum: each([&](auto&, int64_t i) { return std::max(in[0]->data[i], in[1]->data[i]); }); break;
      case OpKind::Minimum: each([&](auto&, int64_t i) { return std::min(in[0]->data[i], in[1]->data[i]); }); break;
      case OpKind::Pow: each([&](auto&, int64_t i) { return std::pow(in[0]->data[i], in[1]->data[i]); }); break;
      case OpKind::Equal: each([&](auto&, int64_t i) { return double(in[0]->data[i] == in[1]->data[i]); }); break;
      case OpKind::NotEqual: each([&](auto&, int64_t i) { return double(in[0]->data[i] != in[1]->data[i]); }); break;
      case OpKind::Less: each([&](auto&, int64_t i) { return double(in[0]->data[i] < in[1]->data[i]); }); break;
      case OpKind::LessEqual: each([&](auto&, int64_t i) { return double(in[0]->data[i] <= in[1]->data[i]); }); break;
      case OpKind::Where: each([&](auto&, int64_t i) { return in[0]->data[i] != 0 ? in[1]->data[i] : in[2]->data[i]; }); break;
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
        const int64_t r = n->rank(), k = a.shape[r - 1];
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
      case OpKind::WithLayout: case OpKind::LayoutHint: out.data = in[0]->data; break;
      case OpKind::Leaf: throw Error("reference_eval: leaf without a value");
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
        case OpKind::ReduceMax: acc = std::max(acc, v); break;
        case OpKind::ReduceMin: acc = std::min(acc, v); break;
        case OpKind::ArgMax:
          if (v > acc) {
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
};

RefArray reference_eval(const Tensor& t, const std::map<const Node*, Array>& leaves) {
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
