#include "backend/cuda/cuda_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "codegen/cuda_renderer.hpp"
#include "dsl/device_name.hpp"
#include "dsl/error.hpp"
#include "dsl/memory_counter.hpp"
#include "jit/compile_cache.hpp"
#include "backend/cuda/cublas_library.hpp"
#include "backend/cuda/cuda_collective_kernels.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/cuda_flash_attention.hpp"
#include "backend/cuda/cuda_grouped_gemm.hpp"
#include "backend/cuda/cuda_ordered_gemm.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/virtual_gpu.hpp"

namespace tessera {
namespace {

constexpr int64_t kThreadsPerBlock = 256;
constexpr int64_t kWarpSize = 32;
// Grid-stride kernels need no more blocks than keep every multiprocessor full.
constexpr int64_t kBlocksPerMultiprocessor = 16;


// The physical GPU an array's device name is on, or -1 for names that are not GPU devices.
int64_t physical_gpu_of(const Array& array) {
  if (array.memory_space() != MemorySpace::Cuda) return -1;
  const DeviceName name = DeviceName::parse(array.device());
  return name.kind() == DeviceKind::GPU ? VirtualGpu::get(name.index).gpu().ordinal() : -1;
}

}  // namespace

CudaDevice::CudaDevice(std::string name, int64_t index, const Target& target)
    : name_(std::move(name)), gpu_(VirtualGpu::get(index)), deterministic_(target.deterministic), graph_runs_(gpu_) {}

std::shared_ptr<std::byte[]> CudaDevice::allocate(int64_t bytes) {
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  CUdeviceptr p = 0;
  // A byte at least: empty blocks still need a distinct address.
  cu.check(cu.cuMemAllocAsync(&p, size_t(std::max<int64_t>(bytes, 1)), gpu_.stream()),
           fmt::format("cuMemAllocAsync of {} bytes on {}", bytes, name_).c_str());
  VirtualGpu* owner = &gpu_;
  // Back to the pool in stream order: after every kernel queued before the last reference
  // dropped. Errors are ignored: at exit the driver may be gone first.
  std::shared_ptr<std::byte[]> memory(reinterpret_cast<std::byte*>(uintptr_t(p)), [owner](std::byte* q) {
    if (const CudaDriver* driver = CudaDriver::get()) {
      owner->make_current();
      driver->cuMemFreeAsync(device_pointer(q), owner->stream());
    }
  });
  // Charged to the device whose run allocates it (memory_stats), as a CPU device's buffers are.
  if (MemoryCounter* counter = charged_memory_counter()) return charged(std::move(memory), bytes, *counter);
  return memory;
}

void CudaDevice::copy_from_host(const std::byte* host, std::byte* device, int64_t bytes) {
  if (bytes == 0) return;
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  // From pageable memory the call returns once `host` has been staged: it may be freed after.
  cu.check(cu.cuMemcpyHtoDAsync(device_pointer(device), host, size_t(bytes), gpu_.stream()), "cuMemcpyHtoDAsync");
}

void CudaDevice::copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) {
  if (bytes == 0) return;
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  cu.check(cu.cuMemcpyDtoHAsync(host, device_pointer(device), size_t(bytes), gpu_.stream()), "cuMemcpyDtoHAsync");
  gpu_.synchronize();
}

void CudaDevice::copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                             const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                             const std::vector<int64_t>& region_shape) {
  if (src.dtype() != dst.dtype()) throw InternalError("copy_region: dtypes differ");
  const int64_t ordinal = gpu_.gpu().ordinal();
  if (physical_gpu_of(src) == ordinal && physical_gpu_of(dst) == ordinal && int64_t(region_shape.size()) <= kMaxRegionRank) {
    launch_device_copy_region(gpu_.gpu(), gpu_.stream(), src.device_bytes(), src.shape(), src_offset, dst.device_bytes(),
                              dst.shape(), dst_offset, region_offset, region_shape, dtype_size(src.dtype()));
    return;
  }
  // Host blocks, another GPU's or ranks past the kernel's: through host memory. dst is read
  // into a fresh host array, never through its host mirror, which would keep what dst held
  // before this copy.
  if (dst.memory_space() == MemorySpace::Host) {
    tessera::copy_region(src, src_offset, dst, dst_offset, region_offset, region_shape);
    return;
  }
  if (physical_gpu_of(dst) != ordinal) throw InternalError("copy_region into " + dst.device() + " asked of " + name_);
  Array host = Array::uninitialized(dst.shape(), dst.dtype());
  copy_to_host(dst.device_bytes(), host.mutable_bytes(), dst.nbytes());
  tessera::copy_region(src, src_offset, host, dst_offset, region_offset, region_shape);
  copy_from_host(host.bytes(), dst.device_bytes(), dst.nbytes());
  gpu_.synchronize();  // `host` is freed on return
}

void CudaDevice::fill(std::byte* device, int64_t count, DType dtype, double value) {
  if (count == 0) return;
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  std::byte pattern[8] = {};
  store_from_double(pattern, dtype, 0, value);
  const int64_t size = dtype_size(dtype);
  uint32_t word = 0;
  std::memcpy(&word, pattern, std::min<size_t>(4, size_t(size)));
  const CUdeviceptr p = device_pointer(device);
  if (size == 1) {
    cu.check(cu.cuMemsetD8Async(p, uint8_t(word), size_t(count), gpu_.stream()), "cuMemsetD8Async");
  } else if (size == 2) {
    cu.check(cu.cuMemsetD16Async(p, uint16_t(word), size_t(count), gpu_.stream()), "cuMemsetD16Async");
  } else if (size == 4) {
    cu.check(cu.cuMemsetD32Async(p, word, size_t(count), gpu_.stream()), "cuMemsetD32Async");
  } else if (std::memcmp(pattern, pattern + 4, 4) == 0) {  // 8-byte values with equal halves (zero)
    cu.check(cu.cuMemsetD32Async(p, word, size_t(count * 2), gpu_.stream()), "cuMemsetD32Async");
  } else {
    Array host({count}, dtype);
    for (int64_t i = 0; i < count; ++i) std::memcpy(host.mutable_bytes() + i * size, pattern, size_t(size));
    copy_from_host(host.bytes(), device, host.nbytes());
    gpu_.synchronize();  // `host` is freed on return
  }
}

void CudaDevice::copy_bytes(const std::byte* from, std::byte* to, int64_t bytes) {
  if (bytes <= 0 || from == to) return;
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  cu.check(cu.cuMemcpyDtoDAsync(device_pointer(to), device_pointer(from), size_t(bytes), gpu_.stream()), "cuMemcpyDtoDAsync");
}

Array CudaDevice::view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype) {
  VirtualGpu* gpu = &gpu_;
  Array out = Array::device_view(std::move(owner), data, std::move(shape), dtype, MemorySpace::Cuda,
                                 [gpu](const std::byte* device, std::byte* host, int64_t bytes) {
                                   const CudaDriver& cu = cuda_driver();
                                   gpu->make_current();
                                   cu.check(cu.cuMemcpyDtoHAsync(host, device_pointer(device), size_t(bytes), gpu->stream()),
                                            "cuMemcpyDtoHAsync");
                                   gpu->synchronize();
                                 });
  return out.on_device(name_);
}

Array CudaDevice::to_device(const Array& array) {
  if (physical_gpu_of(array) == gpu_.gpu().ordinal()) return array;  // one address space per GPU
  Array out = new_array(array.shape(), array.dtype());
  copy_from_host(array.bytes(), out.device_bytes(), array.nbytes());
  return out;
}

Array CudaDevice::copy(const Array& array) {
  if (physical_gpu_of(array) != gpu_.gpu().ordinal()) return to_device(array);  // a fresh copy already
  Array out = new_array(array.shape(), array.dtype());
  if (array.nbytes() > 0) {
    const CudaDriver& cu = cuda_driver();
    gpu_.make_current();
    cu.check(cu.cuMemcpyDtoDAsync(device_pointer(out.device_bytes()), device_pointer(array.device_bytes()),
                                   size_t(array.nbytes()), gpu_.stream()),
             "cuMemcpyDtoDAsync");
  }
  return out;
}

std::string CudaDevice::kernel_home() const { return fmt::format("cuda:{}", gpu_.gpu().ordinal()); }

std::vector<const void*> CudaDevice::load_kernels(const std::vector<kir::Kernel>& kernels) {
  CudaGpu& gpu = gpu_.gpu();
  std::vector<CudaKernel> abi;
  for (const kir::Kernel& k : kernels) {
    // Lowered for this target (codegen/lower_kernel.hpp): the range loop a GPU's threads or warps.
    if (!kir::is_gpu_range(k.range_loop()) && k.range_loop() != kir::LoopKind::Ordered)
      throw InternalError("kernel " + k.name + " reached a GPU lowered for another target");
    const CudaKernelAbi words = cuda_kernel_abi(k);
    abi.push_back(CudaKernel{nullptr, words.buffer_words, words.param_words});
  }
  NvrtcCompiler compiler(gpu.compute_capability(), deterministic_);
  static CompileCache cache(".cubin");
  const std::string key = CompileCache::key_of(compiler, kernels);
  std::vector<std::string> names;
  for (size_t i = 0; i < kernels.size(); ++i) names.push_back(fmt::format("tessera_cuda_{}_{}", key, i));
  const CachedArtifact image = cache.get(key, [&] { return compiler.compile(kernels, names, key); });
  std::vector<const void*> entries;
  for (const CudaKernel* k : gpu.load(key, image.bytes, names, abi)) entries.push_back(k);
  return entries;
}

void CudaDevice::launch(const KernelLaunch& launch) {
  const auto& kernel = *static_cast<const CudaKernel*>(launch.entry);
  const int64_t extent = kir::evaluate(launch.kernel.outer_extent, launch.params);
  if (extent <= 0) return;
  // The argument struct: buffers, parameters, begin, end (codegen/cuda_renderer.hpp).
  launch_words_.assign(size_t(kernel.buffer_words + kernel.param_words + 2), 0);
  const size_t buffers = launch.kernel.buffers.size();
  for (size_t b = 0; b < buffers; ++b) launch_words_[b] = int64_t(reinterpret_cast<uintptr_t>(launch.buffers[b]));
  std::copy(launch.params, launch.params + std::min(kernel.param_words, launch.param_count),
            launch_words_.begin() + kernel.buffer_words);
  launch_words_[size_t(kernel.buffer_words + kernel.param_words + 1)] = extent;
  int64_t blocks = 1, threads = 1;  // an ordered range loop runs in one thread
  const kir::LoopKind range = launch.kernel.range_loop();
  if (kir::is_gpu_range(range)) {
    threads = kThreadsPerBlock;
    // A thread, a warp or a block per iteration.
    const int64_t workers = extent * (range == kir::LoopKind::GpuWarp ? kWarpSize : range == kir::LoopKind::GpuBlock ? threads : 1);
    blocks = std::min((workers + threads - 1) / threads, gpu_.gpu().multiprocessors() * kBlocksPerMultiprocessor);
  }
  void* arguments[] = {launch_words_.data()};
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  cu.check(cu.cuLaunchKernel(kernel.function, unsigned(blocks), 1, 1, unsigned(threads), 1, 1, 0, gpu_.stream(), arguments,
                              nullptr),
           "cuLaunchKernel");
}

void CudaDevice::gemm(const LibraryCall& call, bool ordered) {
  const Array &a = *call.inputs.at(0), &b = *call.inputs.at(1);
  const bool trans_a = call.trans_a, trans_b = call.trans_b;
  Array& out = *call.out;
  const auto [m, n, k, batch] = gemm_shape(a, trans_a, b, out);
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {
    fill(out.device_bytes(), out.numel(), out.dtype(), 0.0);
    return;
  }
  if (ordered) {
    ordered_gemm_on_gpu(gpu_, a, trans_a, b, trans_b, out, m, n, k, batch);
    return;
  }
  cudaDataType type;
  cublasComputeType_t compute;
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void *one = &one_f, *zero = &zero_f;
  switch (a.dtype()) {
    case DType::f32: type = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; break;
    case DType::f64: type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; one = &one_d; zero = &zero_d; break;
    // Tensor-core bf16 GEMMs with f32 sums (mixed precision); run on a lent GPU before issue 29 closes.
    case DType::bf16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
    default: throw DTypeError(fmt::format("GEMM on {}: {} is not supported", name_, dtype_name(a.dtype())));
  }
  // Row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T: cuBLAS gets the
  // operands swapped and each buffer as the column-major transpose it already is.
  const CublasLibrary& blas = cublas();
  cublasHandle_t handle = gpu_.cublas_handle();
  gpu_.make_current();
  blas.check(blas.gemm_strided_batched(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       int(n), int(m), int(k), one, b.device_bytes(), type, int(trans_b ? k : n), k * n,
                                       a.device_bytes(), type, int(trans_a ? m : k), m * k, zero, out.device_bytes(), type,
                                       int(n), m * n, int(batch), compute, CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

void CudaDevice::attention(const LibraryCall& call) { flash_attention_on_gpu(gpu_, call); }

void CudaDevice::grouped_gemm(const LibraryCall& call) { grouped_gemm_on_gpu(gpu_, call); }

void CudaDevice::synchronize() { gpu_.synchronize(); }

bool CudaDevice::records_runs() const { return CudaGraphRuns::enabled(); }

void CudaDevice::run_steps(const std::vector<const void*>& buffers, const std::function<void()>& steps) {
  graph_runs_.run(buffers, steps);
}

}  // namespace tessera
