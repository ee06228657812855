// Renders kernel IR to CUDA C source for NVRTC: pure text, no CUDA headers, so it is built and
// tested everywhere (backend/cuda/nvrtc_compiler.hpp compiles the text where NVRTC exists).
//
// Device ABI, the CPU one's (codegen/kernel_ir.hpp) passed by value:
//   struct name_args { void* buffers[B]; int64_t params[P]; int64_t begin, end; };
//   extern "C" __global__ void name(const name_args args)
// with B and P from cuda_kernel_abi(). The range loop's [begin, end) is spread over every thread
// of the grid (a grid-stride loop), so any launch shape covers it; a gpu_warp range loop over
// every warp instead, its lanes loops split over the warp's lanes and combined by shuffles; a
// gpu_block range loop over every block, its lanes loops split over the block's threads and
// combined by shuffles and then shared memory; an ordered range loop runs in thread 0 of block
// 0; other inner loops run serially in each thread.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"

namespace tessera {

// The words of a kernel's argument struct: buffer pointers, then run-time parameters (slots up
// to the highest the kernel reads), then begin and end.
struct CudaKernelAbi {
  int64_t buffer_words = 1;
  int64_t param_words = 1;
};
CudaKernelAbi cuda_kernel_abi(const kir::Kernel& kernel);

// One source: the prelude (codegen/cuda_prelude.hpp), then kernels[i] as the __global__
// function `names[i]`.
std::string render_cuda(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names);

}  // namespace tessera
