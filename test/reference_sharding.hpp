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

// Coordinates of each local device of the mesh, in local order.
std::vector<std::vector<int64_t>> coords_of(const Mesh& mesh);

}  // namespace tessera::testing
