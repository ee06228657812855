// A default mesh for a scope: TensorFlow's `with dtensor.default_mesh(mesh):` and PyTorch's
// `with device_mesh:`. While a DefaultMeshScope lives on this thread, the calls that take a mesh
// (distribute_tensor, from_local, the placement factories, local_map) may omit it, or pass an
// empty Mesh{}, and get the innermost scope's mesh. Scopes nest; each thread has its own stack,
// as PyTorch's mesh stack is thread-local.
#pragma once

#include <optional>
#include <string_view>

#include "dsl/mesh.hpp"

namespace tessera {

class DefaultMeshScope {
 public:
  explicit DefaultMeshScope(Mesh mesh);  // MeshError for an empty mesh handle
  ~DefaultMeshScope();
  DefaultMeshScope(const DefaultMeshScope&) = delete;
  DefaultMeshScope& operator=(const DefaultMeshScope&) = delete;
};

// The innermost DefaultMeshScope's mesh on this thread, if any.
std::optional<Mesh> default_mesh();

// `mesh` itself when it is a mesh, else the default mesh; MeshError naming `call` when there is
// neither.
Mesh mesh_or_default(const Mesh& mesh, std::string_view call);

}  // namespace tessera
