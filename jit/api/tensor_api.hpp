// The DTensor entry points: building tensors from arrays or components, moving them between
// layouts, and reading them back (API.md, "distributed tensors").
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "dsl/shard_geometry.hpp"

#include "dsl/tensor.hpp"

namespace tessera {

Tensor pack(std::vector<Array> components, Layout layout);  // one per local device, in order
std::vector<Array> unpack(const Tensor& t);                 // ditto; Array::device() names it
Tensor copy_to_mesh(const Array& global, Layout layout);    // any layout: shards the copy
// Like jax.make_array_from_callback: `shard(box)` returns the values of the global region `box`
// (local_shape at global_offset) for each local device, so no global array is ever assembled
// (a data loader reads only its own rows). Called on the devices' worker threads.
Tensor make_tensor_from_callback(std::vector<int64_t> shape, Layout layout,
                                 const std::function<Array(const ShardBox& box)>& shard);
// Lazy and differentiable (a with_layout node): runs when the value is looked at.
Tensor relayout(const Tensor& t, Layout layout, SourceLocation where = SourceLocation::current());
// TensorFlow's calls (unpack, fetch_layout, to_array, printing) see what TF gives: a Partial
// value reduced into its layout without the Partial (fetch_layout's); PyTorch's calls
// (placements(), to_local()) keep it (docs/DTENSOR_USERS.md).
Layout fetch_layout(const Tensor& t);
NodeValue tensorflow_view(const Tensor& t);

// TF's call_with_layout: fn(args...)'s result in `layout`. The result is a lazy relayout of fn's
// graph, so the partitioner computes it in `layout` directly wherever it can (factories, random
// sources and elementwise ops on them: each device makes only its block), never in another
// layout first.
template <class F, class... Args>
Tensor call_with_layout(F&& fn, Layout layout, Args&&... args) {
  return relayout(Tensor(std::forward<F>(fn)(std::forward<Args>(args)...)), std::move(layout));
}
Array to_array(const Tensor& t);  // like .numpy(): LayoutError when sharded; Partial terms are summed
// PyTorch's distribute_tensor: `global` laid out by `placements` (default: Replicate on every
// mesh dim). Under mpirun the data of client `src_data_rank` is used on every client of the mesh
// (broadcast to them; the other clients' `global` is ignored and may be empty); a negative
// src_data_rank keeps each client's own data, as PyTorch's None does.
// An empty Mesh{} means the DefaultMeshScope's mesh (dsl/default_mesh.hpp), here and in from_local.
Tensor distribute_tensor(const Array& global, Mesh mesh, std::vector<Placement> placements = {}, int src_data_rank = 0);
// On the DefaultMeshScope's mesh (PyTorch's device_mesh=None inside `with mesh:`); MeshError outside one.
Tensor distribute_tensor(const Array& global, std::vector<Placement> placements = {}, int src_data_rank = 0);
// Every local device contributes `local` (as each rank does in PyTorch). Without global_shape,
// shards are assumed even (PyTorch's default). run_check: every client's local shape and dtype
// are checked against the layout (ShapeError / DTypeError naming the client), and along each
// Replicate mesh dim the data of coordinate 0 is broadcast to the others. `stride`, PyTorch's
// global stride, may only be the contiguous (row-major) strides of the global shape: Tessera's
// tensors are contiguous (LayoutError naming both otherwise).
Tensor from_local(const Array& local, Mesh mesh, std::vector<Placement> placements,
                  std::optional<std::vector<int64_t>> global_shape = {}, bool run_check = false,
                  std::optional<std::vector<int64_t>> stride = {});
// On the DefaultMeshScope's mesh.
Tensor from_local(const Array& local, std::vector<Placement> placements, std::optional<std::vector<int64_t>> global_shape = {},
                  bool run_check = false, std::optional<std::vector<int64_t>> stride = {});
// One local component per local device (uneven shards allowed; the global shape is inferred).
Tensor from_local(std::vector<Array> locals, Mesh mesh, std::vector<Placement> placements);

}  // namespace tessera
