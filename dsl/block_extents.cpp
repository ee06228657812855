#include "dsl/block_extents.hpp"

#include <algorithm>

#include "dsl/dot_form.hpp"
#include "dsl/error.hpp"
#include "dsl/layout.hpp"
#include "dsl/node.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

// The coordinates of the devices that differ along `dims` only (every other dim at 0),
// row-major. An extent depends only on the coordinates of the dims it is split over, so
// comparing extents on these compares them on every device, at a cost that does not grow with
// the rest of the mesh (the dp dim of a 1,024-device plan).
std::vector<std::vector<int64_t>> coords_along(const Mesh& mesh, std::vector<int64_t> dims) {
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  const std::vector<int64_t>& shape = mesh.shape();
  std::vector<std::vector<int64_t>> out{std::vector<int64_t>(shape.size(), 0)};
  for (int64_t d : dims) {
    std::vector<std::vector<int64_t>> more;
    for (const std::vector<int64_t>& c : out)
      for (int64_t i = 0; i < shape[size_t(d)]; ++i) {
        more.push_back(c);
        more.back()[size_t(d)] = i;
      }
    out = std::move(more);
  }
  return out;
}

// The axis's extent on each of coords_along(dims)'s devices.
std::vector<int64_t> extents_along(const AxisExtent& axis, const Mesh& mesh, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  for (const auto& c : coords_along(mesh, dims)) out.push_back(extent_on(axis, mesh, c));
  return out;
}

// Every device's extent, in device order (for messages).
std::vector<int64_t> per_device(const AxisExtent& axis, const Mesh& mesh) {
  std::vector<int64_t> every_dim(size_t(mesh.ndim()));
  for (size_t d = 0; d < every_dim.size(); ++d) every_dim[d] = int64_t(d);
  return extents_along(axis, mesh, every_dim);
}

bool same_everywhere(const AxisExtent& a, const AxisExtent& b, const Mesh& mesh) {
  if (a == b) return true;
  std::vector<int64_t> dims = a.dims;
  dims.insert(dims.end(), b.dims.begin(), b.dims.end());
  return extents_along(a, mesh, dims) == extents_along(b, mesh, dims);
}

[[noreturn]] void disagree(std::string_view op, const std::string& what, const std::string& where) {
  throw ShapeError(std::string(op) + " inside local_map: " + what +
                   "; one program runs on every device, so extents that differ between devices must match the same way" +
                   where);
}

// Operands of an elementwise op or the matching axes of a product: the same extents everywhere.
AxisExtent unify(std::string_view op, const AxisExtent& a, const AxisExtent& b, const Mesh& mesh, int64_t axis,
                 const std::string& where) {
  if (same_everywhere(a, b, mesh)) return a.is_constant() ? b : a;
  disagree(op, "on axis " + std::to_string(axis) + " the operands' blocks have extents " + extents_text(a, mesh) + " and " +
                   extents_text(b, mesh) + " on the devices",
           where);
}

// An axis split once more over mesh dim `d` (reduce_scatter, local_chunk, all_to_all's split).
AxisExtent split(const AxisExtent& axis, int64_t d, const Mesh& mesh) {
  AxisExtent out = axis;
  out.dims.push_back(d);
  return normalized(out, mesh);
}

// An axis whose blocks along mesh dim `d` are concatenated (all_gather, all_to_all's concat):
// the blocks of a split over `d` (the innermost one) come back whole.
AxisExtent gathered(std::string_view op, const AxisExtent& axis, int64_t d, const Mesh& mesh, int64_t index,
                    const std::string& where) {
  if (axis.is_constant()) return AxisExtent{axis.global * mesh.shape()[size_t(d)], {}};
  if (axis.dims.back() == d) {
    AxisExtent out = axis;
    out.dims.pop_back();
    return normalized(out, mesh);
  }
  disagree(op, "axis " + std::to_string(index) + " has block extents " + extents_text(axis, mesh) +
                   " that are not the blocks of a split over mesh dim '" + mesh.dim_names()[size_t(d)] +
                   "', so the gathered extents differ between groups",
           where);
}

void require_same_along(std::string_view op, const BlockExtents& e, int64_t d, const std::string& where,
                        int64_t except_axis = -1) {
  for (size_t a = 0; a < e.axes.size(); ++a)
    if (int64_t(a) != except_axis && std::find(e.axes[a].dims.begin(), e.axes[a].dims.end(), d) != e.axes[a].dims.end())
      disagree(op, "axis " + std::to_string(a) + " has block extents " + extents_text(e.axes[a], e.mesh) +
                       " that are split over mesh dim '" + e.mesh.dim_names()[size_t(d)] + "', whose devices it combines",
               where);
}

// Reshape: axes pass through when they only gain or lose size-1 neighbours; groups of axes
// that merge or split must have the same extent everywhere.
std::vector<AxisExtent> reshaped(const BlockExtents& in, const std::vector<int64_t>& in_shape,
                                 const std::vector<int64_t>& out_shape, const std::string& where) {
  std::vector<AxisExtent> out(out_shape.size());
  for (size_t a = 0; a < out_shape.size(); ++a) out[a] = AxisExtent{out_shape[a], {}};
  auto big = [](const std::vector<int64_t>& shape, const std::vector<AxisExtent>* axes) {
    std::vector<size_t> r;
    for (size_t a = 0; a < shape.size(); ++a)
      if (shape[a] != 1 || (axes && !(*axes)[a].is_constant())) r.push_back(a);
    return r;
  };
  const std::vector<size_t> ib = big(in_shape, &in.axes), ob = big(out_shape, nullptr);
  size_t i = 0, o = 0;
  while (i < ib.size() || o < ob.size()) {
    // One group: the fewest axes on each side with equal products.
    size_t i_end = i, o_end = o;
    int64_t pi = 1, po = 1;
    bool any_varying = false;
    do {
      if (pi <= po && i_end < ib.size()) {
        pi *= in_shape[ib[i_end]];
        any_varying |= !in.axes[ib[i_end]].is_constant();
        ++i_end;
      } else if (o_end < ob.size()) {
        po *= out_shape[ob[o_end]];
        ++o_end;
      } else {
        break;
      }
    } while (pi != po || i_end == i || o_end == o);
    if (any_varying) {
      if (i_end - i != 1 || o_end - o != 1)
        disagree("reshape", "it merges or splits an axis whose block extents " + extents_text(in.axes[ib[i]], in.mesh) +
                                " differ between devices",
                 where);
      out[ob[o]] = in.axes[ib[i]];
    }
    i = i_end;
    o = o_end;
  }
  return out;
}

}  // namespace

int64_t extent_on(const AxisExtent& axis, const Mesh& mesh, const std::vector<int64_t>& coords) {
  int64_t e = axis.global;
  const std::vector<int64_t>& shape = mesh.shape();
  for (int64_t d : axis.dims) e = chunk_range(e, shape[size_t(d)], coords[size_t(d)]).length;
  return e;
}

std::vector<int64_t> extents_on(const BlockExtents& extents, const std::vector<int64_t>& coords) {
  std::vector<int64_t> out;
  for (const AxisExtent& a : extents.axes) out.push_back(extent_on(a, extents.mesh, coords));
  return out;
}

AxisExtent normalized(AxisExtent axis, const Mesh& mesh) {
  if (axis.is_constant()) return axis;
  const std::vector<int64_t> e = extents_along(axis, mesh, axis.dims);
  if (std::all_of(e.begin(), e.end(), [&](int64_t v) { return v == e.front(); })) return AxisExtent{e.front(), {}};
  return axis;
}

bool varies_along(const AxisExtent& axis, const Mesh& mesh, int64_t d) {
  if (std::find(axis.dims.begin(), axis.dims.end(), d) == axis.dims.end()) return false;
  for (auto c : coords_along(mesh, axis.dims)) {
    const int64_t first = extent_on(axis, mesh, c);
    for (c[size_t(d)] = 0; c[size_t(d)] < mesh.shape()[size_t(d)]; ++c[size_t(d)])
      if (extent_on(axis, mesh, c) != first) return true;
  }
  return false;
}

std::vector<int64_t> extents_global_shape(const BlockExtents& extents) {
  std::vector<int64_t> out;
  for (const AxisExtent& a : extents.axes) out.push_back(a.global);
  return out;
}

Layout extents_layout(const BlockExtents& extents) {
  std::vector<std::vector<int64_t>> dims;
  for (const AxisExtent& a : extents.axes) dims.push_back(a.dims);
  return Layout(extents.mesh, std::move(dims));
}

BlockExtents constant_extents(const Mesh& mesh, const std::vector<int64_t>& shape) {
  BlockExtents out{mesh, {}};
  for (int64_t e : shape) out.axes.push_back(AxisExtent{e, {}});
  return out;
}

bool all_constant(const BlockExtents& extents) {
  return std::all_of(extents.axes.begin(), extents.axes.end(), [](const AxisExtent& a) { return a.is_constant(); });
}

std::string extents_text(const AxisExtent& axis, const Mesh& mesh) {
  if (axis.is_constant()) return std::to_string(axis.global) + " on every device";
  return "[" + join(per_device(axis, mesh), ", ", [](int64_t v) { return std::to_string(v); }) + "]";
}

std::string extents_string(const BlockExtents& extents) {
  return "(" + join(extents.axes, ", ", [&](const AxisExtent& a) { return extents_text(a, extents.mesh); }) + ")";
}

BlockExtents extents_of(const Node& n, const Mesh& mesh) {
  if (n.extents) return *n.extents;
  return constant_extents(mesh, n.shape);
}

std::vector<int64_t> traced_shape(const BlockExtents& extents) {
  return extents_on(extents, std::vector<int64_t>(size_t(extents.mesh.ndim()), 0));
}

std::optional<BlockExtents> broadcast_extents(const std::vector<std::shared_ptr<const Node>>& operands,
                                              const std::vector<int64_t>& shape) {
  std::optional<BlockExtents> out;
  for (const auto& n : operands) {
    if (!n->extents) continue;
    if (!out) out = constant_extents(n->extents->mesh, shape);
    const size_t lead = shape.size() - n->shape.size();
    for (size_t a = 0; a < n->shape.size(); ++a)
      if (!n->extents->axes[a].is_constant() && out->axes[lead + a].is_constant()) out->axes[lead + a] = n->extents->axes[a];
  }
  return out;
}

int64_t assembled_extent(const AxisExtent& local, const std::vector<int64_t>& dims, const Mesh& mesh, int64_t axis,
                         const std::string& what) {
  int64_t ways = 1;
  for (int64_t d : dims) ways *= mesh.shape()[size_t(d)];
  const int64_t global = local.is_constant() ? local.global * ways : local.global;
  if (!same_everywhere(normalized(AxisExtent{global, dims}, mesh), local, mesh))
    throw ShapeError("local_map: " + what + " has blocks of extents " + extents_text(local, mesh) + " on axis " +
                     std::to_string(axis) + ", which are not the blocks that its out_placements give a tensor of extent " +
                     std::to_string(global));
  return global;
}

BlockExtents collective_extents(OpKind op, const Node& input, int64_t d, const std::vector<int64_t>& axes,
                                const std::string& where) {
  const std::string_view name = op_name(op);
  BlockExtents e = extents_of(input, input.mesh);
  switch (op) {
    case OpKind::AllReduce: case OpKind::Shift: require_same_along(name, e, d, where); break;
    case OpKind::AllGather:
      require_same_along(name, e, d, where, axes[0]);
      e.axes[size_t(axes[0])] = gathered(name, e.axes[size_t(axes[0])], d, e.mesh, axes[0], where);
      break;
    case OpKind::ReduceScatter: case OpKind::LocalChunk: {
      require_same_along(name, e, d, where);
      AxisExtent& a = e.axes[size_t(axes[0])];
      if (!a.is_constant() && std::find(a.dims.begin(), a.dims.end(), d) != a.dims.end())
        disagree(name, "axis " + std::to_string(axes[0]) + " is already split over mesh dim '" + e.mesh.dim_names()[size_t(d)] + "'",
                 where);
      a = split(a, d, e.mesh);
      break;
    }
    case OpKind::AllToAll: {
      require_same_along(name, e, d, where, axes[1]);
      AxisExtent& s = e.axes[size_t(axes[0])];
      if (!s.is_constant() && std::find(s.dims.begin(), s.dims.end(), d) != s.dims.end())
        disagree(name, "the split axis " + std::to_string(axes[0]) + " is already split over mesh dim '" +
                           e.mesh.dim_names()[size_t(d)] + "'",
                 where);
      s = split(s, d, e.mesh);
      e.axes[size_t(axes[1])] = gathered(name, e.axes[size_t(axes[1])], d, e.mesh, axes[1], where);
      break;
    }
    case OpKind::AllToAllV:  // the rows of every device, so the same rows everywhere; axes[0] rows out
      require_same_along(name, e, d, where);
      if (!e.axes[0].is_constant()) disagree(name, "the rows' extent differs between devices", where);
      e.axes[0] = AxisExtent{axes[0], {}};
      break;
    default: throw InternalError("collective_extents: " + std::string(name) + " is no collective");
  }
  return e;
}

std::optional<BlockExtents> derive_block_extents(OpKind op, const std::vector<int64_t>& shape,
                                                 const std::vector<std::shared_ptr<const Node>>& inputs,
                                                 const NodeAttrs& attrs, const Mesh& mesh, const std::string& where) {
  const std::string_view name = op_name(op);
  auto in = [&](size_t i) { return extents_of(*inputs[i], mesh); };
  BlockExtents out = constant_extents(mesh, shape);
  const OpCategory category = op_category(op);
  if (op == OpKind::ToLocal) {
    const Layout layout = attrs.layout->without_partial();
    for (size_t a = 0; a < shape.size(); ++a)
      out.axes[a] = normalized(AxisExtent{inputs[0]->shape[a], layout.axis_mesh_dims()[a]}, mesh);
  } else if (category == OpCategory::Collective) {
    std::vector<int64_t> axes(attrs.axes.begin() + 1, attrs.axes.end());
    out = collective_extents(op, *inputs[0], attrs.axes[0], axes, where);
  } else if (category == OpCategory::Unary || category == OpCategory::Binary || category == OpCategory::Compare ||
             category == OpCategory::Ternary || category == OpCategory::Cast || category == OpCategory::Constraint) {
    out = in(0);
    for (size_t i = 1; i < inputs.size(); ++i) {
      const BlockExtents other = in(i);
      for (size_t a = 0; a < shape.size(); ++a) out.axes[a] = unify(name, out.axes[a], other.axes[a], mesh, int64_t(a), where);
    }
  } else if (category == OpCategory::Reduce) {
    const BlockExtents x = in(0);
    out.axes.clear();
    for (size_t a = 0; a < x.axes.size(); ++a)
      if (std::find(attrs.axes.begin(), attrs.axes.end(), int64_t(a)) == attrs.axes.end()) out.axes.push_back(x.axes[a]);
  } else if (op == OpKind::GroupedDot) {  // (x [N, K], w [E, K, F], ends [E]) -> [N, F]
    const BlockExtents x = in(0), w = in(1), ends = in(2);
    unify(name, x.axes[1], w.axes[1], mesh, 1, where);
    unify(name, w.axes[0], ends.axes[0], mesh, 0, where);
    out.axes[0] = x.axes[0];
    out.axes[1] = w.axes[2];
  } else if (op == OpKind::GroupedWeightGrad) {  // (x [N, K], dy [N, F], ends [E]) -> [E, K, F]
    const BlockExtents x = in(0), dy = in(1), ends = in(2);
    unify(name, x.axes[0], dy.axes[0], mesh, 0, where);
    out.axes[0] = ends.axes[0];
    out.axes[1] = x.axes[1];
    out.axes[2] = dy.axes[1];
  } else if (category == OpCategory::Dot) {
    const BlockExtents a = in(0), b = in(1);
    const size_t r = a.axes.size();
    switch (dot_form(int64_t(r), int64_t(b.axes.size()), int64_t(shape.size()))) {
      case DotForm::Batched:
        for (size_t k = 0; k + 2 < r; ++k) out.axes[k] = unify(name, a.axes[k], b.axes[k], mesh, int64_t(k), where);
        unify(name, a.axes[r - 1], b.axes[r - 2], mesh, int64_t(r - 1), where);
        out.axes[r - 2] = a.axes[r - 2];
        out.axes[r - 1] = b.axes[r - 1];
        break;
      case DotForm::Rows:
        for (size_t k = 0; k + 1 < r; ++k) out.axes[k] = a.axes[k];
        unify(name, a.axes[r - 1], b.axes[0], mesh, int64_t(r - 1), where);
        out.axes[r - 1] = b.axes[1];
        break;
      case DotForm::ContractRows:
        for (size_t k = 0; k + 1 < r; ++k) unify(name, a.axes[k], b.axes[k], mesh, int64_t(k), where);
        out.axes[0] = a.axes[r - 1];
        out.axes[1] = b.axes[r - 1];
        break;
    }
  } else {
    switch (op) {
      case OpKind::Permute: {
        const BlockExtents x = in(0);
        for (size_t a = 0; a < shape.size(); ++a) out.axes[a] = x.axes[size_t(attrs.axes[a])];
        break;
      }
      case OpKind::Expand: {
        const BlockExtents x = in(0);
        for (size_t a = 0; a < shape.size(); ++a) {
          if (inputs[0]->shape[a] == shape[a]) out.axes[a] = x.axes[a];
          else if (attrs.extents) out.axes[a] = attrs.extents->axes[a];
        }
        break;
      }
      case OpKind::Reshape: out.axes = reshaped(in(0), inputs[0]->shape, shape, where); break;
      case OpKind::Slice: case OpKind::Pad: {
        const BlockExtents x = in(0);
        for (size_t a = 0; a < shape.size(); ++a) {
          if (x.axes[a].is_constant()) continue;
          const bool whole = attrs.lo[a] == 0 && shape[a] == inputs[0]->shape[a];
          if (!whole)
            disagree(name, "axis " + std::to_string(a) + " has block extents " + extents_text(x.axes[a], mesh) +
                               " that differ between devices, so it can only be taken whole",
                     where);
          out.axes[a] = x.axes[a];
        }
        break;
      }
      case OpKind::Concat: {
        const int64_t axis = attrs.axes[0];
        for (size_t i = 0; i < inputs.size(); ++i) {
          const BlockExtents x = in(i);
          for (size_t a = 0; a < shape.size(); ++a) {
            if (int64_t(a) == axis) {
              if (!x.axes[a].is_constant())
                disagree(name, "operand " + std::to_string(i) + " has block extents " + extents_text(x.axes[a], mesh) +
                                   " along the concat axis that differ between devices",
                         where);
            } else {
              out.axes[a] = unify(name, out.axes[a], x.axes[a], mesh, int64_t(a), where);
            }
          }
        }
        break;
      }
      default: break;  // sources are never local
    }
  }
  for (AxisExtent& a : out.axes) a = normalized(std::move(a), mesh);
  std::vector<int64_t> used;
  for (const AxisExtent& a : out.axes)
    for (int64_t d : a.dims) {
      if (std::find(used.begin(), used.end(), d) != used.end())
        disagree(name, "two axes of its result have block extents that differ along the same mesh dim '" +
                           mesh.dim_names()[size_t(d)] + "', which one program cannot express",
                 where);
      used.push_back(d);
    }
  if (all_constant(out)) return std::nullopt;
  return out;
}

}  // namespace tessera
