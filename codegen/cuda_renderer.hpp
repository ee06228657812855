// Renders kernel IR to CUDA C source for NVRTC: pure text, no CUDA headers, so it is built and
// tested everywhere (jit/nvrtc_compiler.hpp compiles the text where NVRTC exists).
//
// Device ABI, the CPU one's mirror (codegen/kernel_ir.hpp):
//   extern "C" __global__ void name(void** buffers, const int64_t* params, int64_t begin, int64_t end)
// `buffers` and `params` are device arrays. The outer loop's [begin, end) is spread over every
// thread of the grid (a grid-stride loop), so any launch shape covers it; inner loops run
// serially in each thread.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"

namespace tessera {

// One source: the prelude (codegen/cuda_prelude.hpp), then kernels[i] as the __global__
// function `names[i]`.
std::string render_cuda(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names);

}  // namespace tessera
