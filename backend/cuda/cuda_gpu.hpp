// One physical GPU of this process: its primary context (which cuBLAS and NCCL share), its
// properties, and the kernel modules loaded on it. Process-lifetime objects, made on first use.
#pragma once

#include "backend/cuda/cuda_api.hpp"

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tessera {

// A loaded kernel and its ABI: one by-value parameter holding `buffer_words` buffer pointers,
// `param_words` run-time parameters, then begin and end (codegen/cuda_renderer.hpp).
struct CudaKernel {
  CUfunction function = nullptr;
  int64_t buffer_words = 0;
  int64_t param_words = 0;
};

class CudaGpu {
 public:
  static int64_t count();                  // 0 where there is no driver or no GPU
  static CudaGpu& get(int64_t ordinal);    // DeviceError when there is no such GPU

  int64_t ordinal() const { return ordinal_; }
  const std::string& name() const { return name_; }
  int compute_capability() const { return compute_capability_; }  // 90 for sm_90
  int64_t multiprocessors() const { return multiprocessors_; }
  int64_t max_shared_bytes_per_block() const { return max_shared_bytes_; }  // with the opt-in attribute

  // Makes the primary context current on the calling thread (once per thread and GPU).
  void make_current() const;

  // The module `image` (a CUBIN or PTX), loaded once per `key`; its functions `names`, in order.
  // The returned kernels live as long as the process.
  std::vector<const CudaKernel*> load(const std::string& key, const std::string& image,
                                      const std::vector<std::string>& names, const std::vector<CudaKernel>& abi);

 private:
  explicit CudaGpu(int64_t ordinal);

  int64_t ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::string name_;
  int compute_capability_ = 0;
  int64_t multiprocessors_ = 0;
  int64_t max_shared_bytes_ = 0;
  std::mutex mutex_;
  std::map<std::string, std::vector<const CudaKernel*>> modules_;
  std::deque<CudaKernel> kernels_;  // stable addresses
};

}  // namespace tessera
