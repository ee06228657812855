#include "codegen/index_arithmetic.hpp"

namespace tessera {

using namespace kir;

Expr IndexArithmetic::dim(const SymbolicDim& d) const { return d.is_constant() ? int_const(d.constant) : param(d.param); }
Expr IndexArithmetic::extent(int value, int64_t axis) const { return dim(node(value).local_shape[size_t(axis)]); }
Expr IndexArithmetic::offset(int value, int64_t axis) const { return dim(node(value).local_offset[size_t(axis)]); }

bool IndexArithmetic::extent_is_one(int value, int64_t axis) const {
  const SymbolicDim& d = node(value).local_shape[size_t(axis)];
  return d.is_constant() && d.constant == 1;
}

Expr IndexArithmetic::numel(int value) const {
  Expr n = int_const(1);
  for (int64_t a = 0; a < node(value).rank(); ++a) n = binary(Op::Mul, n, extent(value, a));
  return n;
}

Expr IndexArithmetic::linearize(int value, const std::vector<Expr>& axes) const {
  Expr flat = int_const(0), stride = int_const(1);
  for (int64_t a = node(value).rank() - 1; a >= 0; --a) {
    flat = binary(Op::Add, flat, binary(Op::Mul, axes[size_t(a)], stride));
    stride = binary(Op::Mul, stride, extent(value, a));
  }
  return flat;
}

Expr IndexArithmetic::linear(int value, const ElementIndex& idx) const { return idx.flat ? idx.flat : linearize(value, idx.axes); }

ElementIndex IndexArithmetic::permuted_source(int value, const ElementIndex& idx) const {
  const LocalNode& n = node(value);
  ElementIndex i;
  i.axes.resize(size_t(n.rank()));
  for (int64_t a = 0; a < n.rank(); ++a) i.axes[size_t(n.attrs.axes[size_t(a)])] = idx.axes[size_t(a)];
  return i;
}

ElementIndex IndexArithmetic::broadcast_source(int value, const ElementIndex& idx) const {
  const LocalNode& n = node(value);
  const int in = n.inputs[0];
  ElementIndex i = idx;
  // Broadcast where the input's block has extent 1 and the result's does not (local extents: a
  // local value's global shape is only the one its blocks were cut from).
  const SymbolicDim one{1, -1};
  for (int64_t a = 0; a < n.rank(); ++a)
    if (node(in).local_shape[size_t(a)] == one && n.local_shape[size_t(a)] != one) i.axes[size_t(a)] = int_const(0);
  return i;
}

// Reshape, one group of axes at a time: the shortest runs of input and output axes with equal
// products (size-1 axes aside). An axis passing through keeps its index; a split axis is the
// linear index of its pieces (no division); merged axes are the pieces of their one index, so
// the divisions depend only on outer loops and leave inner loops contiguous. The partitioner
// shards a group only on its outermost axis, so the local extents of a group match too.
ElementIndex IndexArithmetic::reshaped_source(int value, const ElementIndex& idx) const {
  const int in = node(value).inputs[0];
  // The same block extents (local_map's views of one block): the same elements.
  if (node(value).local_shape == node(in).local_shape) return idx;
  const auto& out_shape = node(value).global_shape;
  const auto& in_shape = node(in).global_shape;
  std::vector<int64_t> out_big, in_big;
  for (size_t a = 0; a < out_shape.size(); ++a) if (out_shape[a] != 1) out_big.push_back(int64_t(a));
  for (size_t a = 0; a < in_shape.size(); ++a) if (in_shape[a] != 1) in_big.push_back(int64_t(a));
  ElementIndex i;
  i.axes.assign(in_shape.size(), int_const(0));
  // Flattens the output axes [o0, o1) and unflattens that index over the input axes [i0, i1).
  auto regroup = [&](size_t o0, size_t o1, size_t i0, size_t i1) {
    Expr flat;
    for (size_t k = o0; k < o1; ++k)
      flat = flat ? binary(Op::Add, binary(Op::Mul, flat, extent(value, out_big[k])), idx.axes[size_t(out_big[k])]) : idx.axes[size_t(out_big[k])];
    for (size_t k = i1; k-- > i0;) {
      if (k == i0) {
        i.axes[size_t(in_big[k])] = flat;
        break;
      }
      Expr ext = extent(in, in_big[k]);
      i.axes[size_t(in_big[k])] = binary(Op::Rem, flat, ext);
      flat = binary(Op::Div, flat, ext);
    }
  };
  size_t o = 0, n = 0;
  while (o < out_big.size() && n < in_big.size()) {
    const size_t o0 = o, n0 = n;
    int64_t out_product = out_shape[size_t(out_big[o++])], in_product = in_shape[size_t(in_big[n++])];
    while (out_product != in_product && out_product != 0 && in_product != 0) {
      if (out_product < in_product && o < out_big.size()) out_product *= out_shape[size_t(out_big[o++])];
      else if (in_product < out_product && n < in_big.size()) in_product *= in_shape[size_t(in_big[n++])];
      else break;
    }
    if (out_product != in_product || out_product == 0) {  // empty values: one group of everything left
      o = out_big.size();
      n = in_big.size();
    }
    regroup(o0, o, n0, n);
  }
  return i;
}

ElementIndex IndexArithmetic::sliced_source(int value, const ElementIndex& idx) const {
  const LocalNode& n = node(value);
  ElementIndex i = idx;
  for (int64_t a = 0; a < n.rank(); ++a) i.axes[size_t(a)] = binary(Op::Add, idx.axes[size_t(a)], int_const(n.attrs.lo[size_t(a)]));
  return i;
}

IndexArithmetic::Padded IndexArithmetic::padded_source(int value, const ElementIndex& idx) const {
  const LocalNode& n = node(value);
  const int in = n.inputs[0];
  Padded out{idx, int_const(1, Type::I1)};
  bool any = false;
  for (int64_t a = 0; a < n.rank(); ++a) {
    if (n.attrs.lo[size_t(a)] == 0 && n.attrs.hi[size_t(a)] == 0) continue;
    Expr shifted = binary(Op::Sub, idx.axes[size_t(a)], int_const(n.attrs.lo[size_t(a)]));
    Expr ext = extent(in, a);
    Expr ok = binary(Op::And, binary(Op::Le, int_const(0), shifted), binary(Op::Lt, shifted, ext));
    out.inside = any ? binary(Op::And, out.inside, ok) : ok;
    any = true;
    out.source.axes[size_t(a)] = binary(Op::Max, int_const(0), binary(Op::Min, shifted, binary(Op::Sub, ext, int_const(1))));
  }
  return out;
}

std::vector<std::pair<Expr, ElementIndex>> IndexArithmetic::concatenated_sources(int value, const ElementIndex& idx) const {
  const LocalNode& n = node(value);
  const size_t axis = size_t(n.attrs.axes[0]);
  std::vector<std::pair<Expr, ElementIndex>> parts;
  Expr start = int_const(0);
  for (int input : n.inputs) {
    Expr ext = extent(input, int64_t(axis));
    ElementIndex i = idx;
    Expr local = binary(Op::Sub, idx.axes[axis], start);
    i.axes[axis] = binary(Op::Max, int_const(0), binary(Op::Min, local, binary(Op::Sub, ext, int_const(1))));
    Expr end = binary(Op::Add, start, ext);
    parts.push_back({binary(Op::Lt, idx.axes[axis], end), std::move(i)});
    start = end;
  }
  return parts;
}

ElementIndex IndexArithmetic::chunk_source(int value, const ElementIndex& idx) const {
  const LocalNode& n = node(value);
  const int in = n.inputs[0];
  ElementIndex i;
  for (int64_t a = 0; a < n.rank(); ++a)
    i.axes.push_back(binary(Op::Add, idx.axes[size_t(a)], binary(Op::Sub, offset(value, a), offset(in, a))));
  return i;
}

}  // namespace tessera
