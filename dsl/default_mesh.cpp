#include "dsl/default_mesh.hpp"

#include <string>
#include <vector>

#include "dsl/error.hpp"

namespace tessera {
namespace {

std::vector<Mesh>& mesh_stack() {
  thread_local std::vector<Mesh> stack;
  return stack;
}

}  // namespace

DefaultMeshScope::DefaultMeshScope(Mesh mesh) {
  if (!mesh.is_valid()) throw MeshError("DefaultMeshScope: an empty mesh handle; pass a mesh made by create_mesh or the like");
  mesh_stack().push_back(std::move(mesh));
}

DefaultMeshScope::~DefaultMeshScope() { mesh_stack().pop_back(); }

std::optional<Mesh> default_mesh() {
  if (mesh_stack().empty()) return std::nullopt;
  return mesh_stack().back();
}

Mesh mesh_or_default(const Mesh& mesh, std::string_view call) {
  if (mesh.is_valid()) return mesh;
  if (auto scoped = default_mesh()) return *scoped;
  throw MeshError(std::string(call) + ": no mesh given and no DefaultMeshScope open (TF's default_mesh, PyTorch's "
                  "`with mesh:`); pass a mesh or open a DefaultMeshScope");
}

}  // namespace tessera
