#include "dsl/placement_factories.hpp"

#include <atomic>
#include <string_view>

#include "dsl/default_mesh.hpp"

namespace tessera {
namespace {

// An empty mesh handle takes the DefaultMeshScope's mesh (PyTorch's device_mesh=None).
Layout layout_of(const Mesh& mesh, std::vector<Placement> placements, size_t rank, std::string_view call) {
  return Layout::from_placements_or_replicated(mesh_or_default(mesh, call), std::move(placements), int64_t(rank));
}

struct Generator {
  std::atomic<uint64_t> seed{0};
  std::atomic<uint64_t> draws{0};
};

Generator& generator() {
  static Generator g;
  return g;
}

// The seed of the next draw: the manual seed and the draw's number, mixed.
uint64_t next_seed() {
  Generator& g = generator();
  return hash_mix(hash_mix(0x7e55e7a5eedULL, g.seed.load()), g.draws.fetch_add(1));
}

}  // namespace

Tensor zeros(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements, DType dtype, Loc where) {
  const Layout layout = layout_of(mesh, std::move(placements), shape.size(), "zeros");
  return zeros(std::move(shape), layout, dtype, where);
}

Tensor ones(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements, DType dtype, Loc where) {
  const Layout layout = layout_of(mesh, std::move(placements), shape.size(), "ones");
  return ones(std::move(shape), layout, dtype, where);
}

Tensor empty(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements, DType dtype, Loc where) {
  const Layout layout = layout_of(mesh, std::move(placements), shape.size(), "empty");
  return empty(std::move(shape), layout, dtype, where);
}

Tensor full(std::vector<int64_t> shape, double value, const Mesh& mesh, std::vector<Placement> placements, DType dtype,
            Loc where) {
  const Layout layout = layout_of(mesh, std::move(placements), shape.size(), "full");
  return full(std::move(shape), value, layout, dtype, where);
}

Tensor rand(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements, DType dtype, Loc where) {
  const Layout layout = layout_of(mesh, std::move(placements), shape.size(), "rand");
  return random_uniform(std::move(shape), next_seed(), layout, 0, 1, dtype, where);
}

Tensor randn(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements, DType dtype, Loc where) {
  const Layout layout = layout_of(mesh, std::move(placements), shape.size(), "randn");
  return random_normal(std::move(shape), next_seed(), layout, 0, 1, dtype, where);
}

Tensor zeros(std::vector<int64_t> shape, std::vector<Placement> placements, DType dtype, Loc where) {
  return zeros(std::move(shape), Mesh{}, std::move(placements), dtype, where);
}
Tensor ones(std::vector<int64_t> shape, std::vector<Placement> placements, DType dtype, Loc where) {
  return ones(std::move(shape), Mesh{}, std::move(placements), dtype, where);
}
Tensor empty(std::vector<int64_t> shape, std::vector<Placement> placements, DType dtype, Loc where) {
  return empty(std::move(shape), Mesh{}, std::move(placements), dtype, where);
}
Tensor full(std::vector<int64_t> shape, double value, std::vector<Placement> placements, DType dtype, Loc where) {
  return full(std::move(shape), value, Mesh{}, std::move(placements), dtype, where);
}
Tensor rand(std::vector<int64_t> shape, std::vector<Placement> placements, DType dtype, Loc where) {
  return rand(std::move(shape), Mesh{}, std::move(placements), dtype, where);
}
Tensor randn(std::vector<int64_t> shape, std::vector<Placement> placements, DType dtype, Loc where) {
  return randn(std::move(shape), Mesh{}, std::move(placements), dtype, where);
}

void manual_seed(uint64_t seed) {
  generator().seed = seed;
  generator().draws = 0;
}

}  // namespace tessera
