// The tests' reference evaluator for sharding. It shares no code with dsl/shard_geometry or
// copy_region: it builds explicit index lists per axis by splitting them torch.chunk-style and
// gathers elements one by one.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <tessera/tessera.hpp>

namespace tessera::testing {

// Global indices that device `coords` holds on every axis under `layout`.
std::vector<std::vector<int64_t>> reference_indices(const std::vector<int64_t>& shape, const Layout& layout,
                                                    const std::vector<int64_t>& coords);

// The component a device must hold for the global array (Partial dims ignored).
Array reference_component(const Array& global, const Layout& layout, const std::vector<int64_t>& coords);

// Bitwise equality of shape, dtype and bytes.
bool same_array(const Array& a, const Array& b);

// Random integer-valued array of `dtype` in [-50, 50] (exact in every dtype).
Array random_array(const std::vector<int64_t>& shape, DType dtype, std::mt19937& rng);

// A random layout without Partial: each mesh dim replicates or shards a random axis; mesh dims
// are visited in random order, so an axis sharded by several dims gets a random nesting order.
Layout random_layout(const Mesh& mesh, int64_t rank, std::mt19937& rng);

// The meshes of the differential tests: 1 device; 1-D of 2, 3, 4, 6; 3x2, 2x2; 2x2x2.
std::vector<Mesh> test_meshes();

// Coordinates of each local device of the mesh, in local order.
std::vector<std::vector<int64_t>> coords_of(const Mesh& mesh);

}  // namespace tessera::testing
