#include "dsl/whole_axis.hpp"

#include "dsl/node.hpp"

namespace tessera::detail {

Tensor whole_along(const Tensor& x, int64_t axis, Loc where) {
  if (x.node()->local || !x.node()->mesh.is_valid()) return x;
  const Layout now = x.layout();
  std::vector<std::vector<int64_t>> mesh_dims = now.axis_mesh_dims();
  if (mesh_dims[size_t(axis)].empty()) return x;
  mesh_dims[size_t(axis)].clear();
  return with_layout(x, Layout(now.mesh(), mesh_dims), where);
}

}  // namespace tessera::detail
