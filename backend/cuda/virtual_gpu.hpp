// A GPU device as meshes name it ("GPU:3"): gpu_devices(n) makes n of them, placed round-robin
// on the physical GPUs (TensorFlow's logical devices), so a 2x2 mesh runs on one GPU. Each has
// its own stream, so devices sharing a GPU queue work independently, and its own cuBLAS handle.
// Process-lifetime objects: arrays made on a device keep pointers to them.
#pragma once

#include "backend/cuda/cuda_api.hpp"

#include <cstdint>
#include <mutex>

#include "backend/cuda/cuda_gpu.hpp"

namespace tessera {

class VirtualGpu {
 public:
  // The GPU device `index` ("GPU:index"); DeviceError if gpu_devices() has no such device.
  static VirtualGpu& get(int64_t index);

  CudaGpu& gpu() const { return gpu_; }
  CUstream stream() const { return stream_; }
  // Makes the GPU's context current on the calling thread (once per thread).
  void make_current() const { gpu_.make_current(); }
  cublasHandle_t cublas_handle();  // created on first use, bound to the stream
  // Waits for everything queued on the stream.
  void synchronize() const;

 private:
  VirtualGpu(int64_t index, CudaGpu& gpu);

  int64_t index_;
  CudaGpu& gpu_;
  CUstream stream_ = nullptr;
  std::once_flag cublas_once_;
  cublasHandle_t cublas_ = nullptr;
};

// How many GPU devices there are (gpu_devices().size()), and how to have at least n.
int64_t virtual_gpu_count();
void ensure_virtual_gpus(int64_t n);

}  // namespace tessera
