#include "backend/cuda/cuda_gpu.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>

#include "dsl/error.hpp"
#include "backend/cuda/cuda_driver.hpp"

namespace tessera {

int64_t CudaGpu::count() {
  static const int64_t n = [] {
    const CudaDriver* driver = CudaDriver::get();
    int count = 0;
    if (!driver || driver->cuDeviceGetCount(&count) != CUDA_SUCCESS) return int64_t(0);
    return int64_t(count);
  }();
  return n;
}

CudaGpu& CudaGpu::get(int64_t ordinal) {
  static std::mutex mutex;
  static auto* gpus = new std::map<int64_t, std::unique_ptr<CudaGpu>>();  // lives until exit
  std::lock_guard lock(mutex);
  if (ordinal < 0 || ordinal >= count())
    throw DeviceError(fmt::format("CUDA: no GPU {} (this process sees {}{})", ordinal, count(),
                                  count() == 0 ? ": " + CudaDriver::why_unavailable() : ""));
  auto& gpu = (*gpus)[ordinal];
  if (!gpu) gpu.reset(new CudaGpu(ordinal));
  return *gpu;
}

CudaGpu::CudaGpu(int64_t ordinal) : ordinal_(ordinal) {
  const CudaDriver& cu = cuda_driver();
  cu.check(cu.cuDeviceGet(&device_, int(ordinal)), "cuDeviceGet");
  char name[256] = {};
  cu.check(cu.cuDeviceGetName(name, sizeof name, device_), "cuDeviceGetName");
  name_ = name;
  int major = 0, minor = 0, sms = 0, shared = 0;
  cu.check(cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_), "cuDeviceGetAttribute");
  cu.check(cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_), "cuDeviceGetAttribute");
  cu.check(cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_), "cuDeviceGetAttribute");
  cu.check(cu.cuDeviceGetAttribute(&shared, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device_), "cuDeviceGetAttribute");
  compute_capability_ = major * 10 + minor;
  multiprocessors_ = sms;
  max_shared_bytes_ = shared;
  cu.check(cu.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  make_current();
  // Freed memory stays in the pool instead of returning to the system at every synchronize:
  // steps allocate and free the same sizes every run.
  CUmemoryPool pool = nullptr;
  cu.check(cu.cuDeviceGetDefaultMemPool(&pool, device_), "cuDeviceGetDefaultMemPool");
  uint64_t keep_everything = UINT64_MAX;
  cu.check(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_everything), "cuMemPoolSetAttribute");
}

void CudaGpu::make_current() const {
  thread_local CUcontext current = nullptr;
  if (current == context_) return;
  const CudaDriver& cu = cuda_driver();
  cu.check(cu.cuCtxSetCurrent(context_), "cuCtxSetCurrent");
  current = context_;
}

std::vector<const CudaKernel*> CudaGpu::load(const std::string& key, const std::string& image,
                                             const std::vector<std::string>& names, const std::vector<CudaKernel>& abi) {
  std::lock_guard lock(mutex_);
  if (auto it = modules_.find(key); it != modules_.end()) return it->second;
  const CudaDriver& cu = cuda_driver();
  make_current();
  // The JIT's error log: where a PTX image does not assemble, it says why.
  char log[8192] = {};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(uintptr_t(sizeof log))};
  CUmodule module = nullptr;
  if (CUresult r = cu.cuModuleLoadDataEx(&module, image.c_str(), 2, options, values); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cu.cuGetErrorName(r, &name);
    throw DeviceError(fmt::format("CUDA: loading kernel module {} on GPU {} ({}, sm_{}) failed: {}{}{}", key, ordinal_, name_,
                                  compute_capability_, name ? name : "unknown error", log[0] ? "\n" : "", log));
  }
  std::vector<const CudaKernel*> out;
  for (size_t i = 0; i < names.size(); ++i) {
    CudaKernel kernel = abi[i];
    cu.check(cu.cuModuleGetFunction(&kernel.function, module, names[i].c_str()), "cuModuleGetFunction");
    kernels_.push_back(kernel);
    out.push_back(&kernels_.back());
  }
  modules_[key] = out;
  return out;
}

}  // namespace tessera
