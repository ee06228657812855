// Redistribute between two meshes (a 4-device mesh to a 2-device one, one half of a mesh to the
// other as pipeline stages need). Neither reference system has it. The value moves as a
// `mesh_transfer` graph node, so gradients flow back to the source mesh; the node is computed
// ahead of the program that reads it (a program runs on one mesh): its input is forced on the
// source mesh, and every target block is assembled from the source blocks it intersects,
// taking each region from a replica on the same device when there is one, so the bytes that
// move between devices are the fewest possible. CommDebugMode counts the moved bytes as one
// "mesh_transfer". Across clients, every client holding a device of either mesh takes part and
// the regions that change client travel in one all_to_all among them. A transfer cannot be
// traced by jit (LayoutError): force it before the step.
#pragma once

#include "dsl/ops.hpp"

namespace tessera {

// `x`'s value in `layout`, a layout on another mesh (lazy, differentiable). MeshError between
// an abstract mesh (abstract_mesh) and a real one, either way.
Tensor mesh_transfer(const Tensor& x, Layout layout, Loc where = Loc::current());

// Computes every pending mesh_transfer node reachable from `outputs` (called before partitioning).
void compute_mesh_transfers(const std::vector<NodeRef>& outputs);

}  // namespace tessera
