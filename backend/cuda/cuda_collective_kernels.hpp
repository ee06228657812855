// The device kernels behind the GPU communicators and the CUDA device's copies: the elementwise
// reduction every reducing collective runs (out[o][i] = in[0][i] op in[1][i] op ... for each
// output o), for every dtype and ReduceOp, and the copy of a box of one block into another.
// Inputs combine in rank order with the CPU backends' accumulator types and NaN rules
// (comm/reduce_kernels.hpp), so a GPU group gives the bits an in-process CPU group gives.
// Compiled by NVRTC once per GPU architecture (through the disk compile cache) and loaded once
// per GPU.
#pragma once

#include "backend/cuda/cuda_api.hpp"

#include <cstdint>
#include <vector>

#include "dsl/dtype.hpp"
#include "dsl/placement.hpp"

namespace tessera {

class CudaGpu;

// The most buffers one reduction takes on each side (the launch's by-value argument holds their
// pointers): GPU groups are at most this large (backend/cuda/cuda_group_communicator.hpp).
inline constexpr int kMaxReduceOperands = 32;

// Queues out[o][0..count) = in[0] op ... op in[n_in - 1] (Avg: the sum over n_in) for each of
// the n_out outputs on `stream`. Outputs may alias inputs element for element.
void launch_device_reduce(CudaGpu& gpu, CUstream stream, void* const* outs, int n_out, const void* const* ins, int n_in,
                          int64_t count, DType dtype, ReduceOp op);

// The most axes a region copy takes (more: the caller copies through the host).
inline constexpr int kMaxRegionRank = 8;

// Queues the copy of the box `region_shape` at global `region_offset` from the row-major block
// `src` (shape src_shape, at global src_offset) into the block `dst` (dst_shape at dst_offset),
// elements of `element_size` bytes: copy_region (dsl/array.hpp) in device memory.
void launch_device_copy_region(CudaGpu& gpu, CUstream stream, const void* src, const std::vector<int64_t>& src_shape,
                               const std::vector<int64_t>& src_offset, void* dst, const std::vector<int64_t>& dst_shape,
                               const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                               const std::vector<int64_t>& region_shape, int64_t element_size);

}  // namespace tessera
