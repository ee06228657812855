// distribute_module: PyTorch's torch.distributed.tensor.distribute_module. Places a Module's
// parameters on a mesh and installs functions that distribute its forward inputs and outputs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dsl/mesh.hpp"
#include "nn/module.hpp"

namespace tessera {

// Called for the module (name "") and every submodule (dotted names), to replace parameters
// with distributed ones through set_parameter.
using PartitionFn = std::function<void(const std::string& name, Module& module, const Mesh& mesh)>;
// Installed as a forward pre-hook / forward hook of the module: they return the inputs forward()
// gets / the outputs its caller gets (e.g. redistributed).
using InputFn = std::function<std::vector<Tensor>(Module& module, std::vector<Tensor> inputs, const Mesh& mesh)>;
using OutputFn = std::function<std::vector<Tensor>(Module& module, std::vector<Tensor> outputs, const Mesh& mesh)>;

// For each module in named_modules() order: partition_fn(name, module, mesh), then each of its
// parameters still on a one-device mesh other than `mesh` (Tessera's plain, undistributed
// tensor) becomes Replicate on every dim of `mesh` (its value is copied, as distribute_tensor
// does). Without partition_fn every parameter is replicated so. Afterwards every parameter must
// be on `mesh`: MeshError names the first that is not. Error if the module was distributed
// before (PyTorch allows one call). Tied parameters stay tied when replicated.
void distribute_module(Module& module, Mesh mesh, PartitionFn partition_fn = {}, InputFn input_fn = {},
                       OutputFn output_fn = {});

}  // namespace tessera
