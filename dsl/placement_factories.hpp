// PyTorch's torch.distributed.tensor factories: zeros / ones / empty / full / rand / randn given
// a device mesh (or the DefaultMeshScope's) and placements (default: Replicate on every mesh
// dim), in default_dtype() unless a dtype is given. They are the Layout
// factories of ops.hpp under PyTorch's spelling; rand and randn draw their seeds from a
// process-wide generator set by manual_seed, so SPMD programs (every client making the same
// calls) agree, and values never depend on the placements.
#pragma once

#include <cstdint>
#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

Tensor zeros(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
             DType dtype = default_dtype(), Loc where = Loc::current());
Tensor ones(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
            DType dtype = default_dtype(), Loc where = Loc::current());
Tensor empty(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
             DType dtype = default_dtype(), Loc where = Loc::current());
Tensor full(std::vector<int64_t> shape, double value, const Mesh& mesh, std::vector<Placement> placements = {},
            DType dtype = default_dtype(), Loc where = Loc::current());
// Uniform on [0, 1) and standard normal.
Tensor rand(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
            DType dtype = default_dtype(), Loc where = Loc::current());
Tensor randn(std::vector<int64_t> shape, const Mesh& mesh, std::vector<Placement> placements = {},
             DType dtype = default_dtype(), Loc where = Loc::current());

// The same on the DefaultMeshScope's mesh (PyTorch's device_mesh=None inside `with mesh:`);
// MeshError outside one. (Passing an empty Mesh{} to the forms above does the same.)
Tensor zeros(std::vector<int64_t> shape, std::vector<Placement> placements = {}, DType dtype = default_dtype(),
             Loc where = Loc::current());
Tensor ones(std::vector<int64_t> shape, std::vector<Placement> placements = {}, DType dtype = default_dtype(),
            Loc where = Loc::current());
Tensor empty(std::vector<int64_t> shape, std::vector<Placement> placements = {}, DType dtype = default_dtype(),
             Loc where = Loc::current());
Tensor full(std::vector<int64_t> shape, double value, std::vector<Placement> placements = {}, DType dtype = default_dtype(),
            Loc where = Loc::current());
Tensor rand(std::vector<int64_t> shape, std::vector<Placement> placements = {}, DType dtype = default_dtype(),
            Loc where = Loc::current());
Tensor randn(std::vector<int64_t> shape, std::vector<Placement> placements = {}, DType dtype = default_dtype(),
             Loc where = Loc::current());

// PyTorch's torch.manual_seed for rand / randn: the same seed gives the same sequence of tensors.
void manual_seed(uint64_t seed);

}  // namespace tessera
