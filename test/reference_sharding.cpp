#include "reference_sharding.hpp"

#include <algorithm>
#include <cstring>

namespace tessera::testing {

std::vector<std::vector<int64_t>> reference_indices(const std::vector<int64_t>& shape, const Layout& layout,
                                                    const std::vector<int64_t>& coords) {
  std::vector<int64_t> mesh_shape = layout.mesh().shape();
  std::vector<std::vector<int64_t>> out;
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    std::vector<int64_t> held;
    for (int64_t i = 0; i < shape[axis]; ++i) held.push_back(i);
    for (int64_t d : layout.axis_mesh_dims()[axis]) {
      // torch.chunk: pieces of ceil(len / k) taken in order; the last ones short or empty.
      int64_t piece = (int64_t(held.size()) + mesh_shape[d] - 1) / mesh_shape[d];
      std::vector<std::vector<int64_t>> pieces(mesh_shape[d]);
      for (size_t j = 0; j < held.size(); ++j) pieces[j / piece].push_back(held[j]);
      held = pieces[coords[d]];
    }
    out.push_back(held);
  }
  return out;
}

Array reference_component(const Array& global, const Layout& layout, const std::vector<int64_t>& coords) {
  auto indices = reference_indices(global.shape(), layout, coords);
  std::vector<int64_t> local_shape;
  for (const auto& list : indices) local_shape.push_back(int64_t(list.size()));
  Array out(local_shape, global.dtype());
  const int64_t esize = dtype_size(global.dtype());
  const int64_t n = out.numel();
  std::vector<int64_t> gshape = global.shape();
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rest = flat, global_flat = 0, stride = 1;
    for (int64_t a = int64_t(local_shape.size()) - 1; a >= 0; --a) {
      int64_t local_index = rest % local_shape[a];
      rest /= local_shape[a];
      global_flat += indices[a][local_index] * stride;
      stride *= gshape[a];
    }
    std::memcpy(out.mutable_bytes() + flat * esize, global.bytes() + global_flat * esize, size_t(esize));
  }
  return out;
}

bool same_array(const Array& a, const Array& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.bytes(), b.bytes(), size_t(a.nbytes())) == 0;
}

Array random_array(const std::vector<int64_t>& shape, DType dtype, std::mt19937& rng) {
  Array out(shape, dtype);
  std::uniform_int_distribution<int> value(-50, 50);
  for (int64_t i = 0; i < out.numel(); ++i) store_from_double(out.mutable_bytes(), dtype, i, value(rng));
  return out;
}

Layout random_layout(const Mesh& mesh, int64_t rank, std::mt19937& rng) {
  std::vector<std::vector<int64_t>> axes(rank);
  std::vector<int64_t> order(mesh.ndim());
  for (int64_t d = 0; d < mesh.ndim(); ++d) order[d] = d;
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t d : order) {
    int choice = std::uniform_int_distribution<int>(0, int(rank))(rng);
    if (choice < rank) axes[choice].push_back(d);
  }
  return Layout(mesh, axes);
}

std::vector<Mesh> test_meshes() {
  return {create_mesh({{"x", 1}}), create_mesh({{"x", 2}}), create_mesh({{"x", 3}}), create_mesh({{"x", 4}}),
          create_mesh({{"x", 6}}), create_mesh({{"x", 3}, {"y", 2}}), create_mesh({{"x", 2}, {"y", 2}}),
          create_mesh({{"x", 2}, {"y", 2}, {"z", 2}})};
}

std::vector<std::vector<int64_t>> coords_of(const Mesh& mesh) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t id : mesh.local_device_ids()) out.push_back(mesh.coords(id));
  return out;
}

}  // namespace tessera::testing
