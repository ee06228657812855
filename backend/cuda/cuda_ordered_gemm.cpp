#include "backend/cuda/cuda_ordered_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "dsl/error.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/virtual_gpu.hpp"

namespace tessera {
namespace {

// __fmul_rn / __fadd_rn are never contracted into an FMA.
constexpr const char* kSource = R"(
#define ORDERED_GEMM(NAME, T, MUL, ADD)                                                              \
extern "C" __global__ void NAME(const T* a, const T* b, T* out, long long m, long long n, long long k, \
                                int trans_a, int trans_b, long long batch) {                        \
  const long long total = batch * m * n;                                                            \
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;                   \
       e += (long long)gridDim.x * blockDim.x) {                                                    \
    const long long bi = e / (m * n), r = e % (m * n), i = r / n, j = r % n;                         \
    const T* A = a + bi * m * k;                                                                    \
    const T* B = b + bi * k * n;                                                                    \
    T sum = 0;                                                                                      \
    for (long long p = 0; p < k; ++p) {                                                             \
      const T x = trans_a ? A[p * m + i] : A[i * k + p];                                            \
      const T y = trans_b ? B[j * k + p] : B[p * n + j];                                            \
      sum = ADD(sum, MUL(x, y));                                                                    \
    }                                                                                               \
    out[e] = sum;                                                                                   \
  }                                                                                                 \
}
ORDERED_GEMM(tessera_ordered_gemm_f32, float, __fmul_rn, __fadd_rn)
ORDERED_GEMM(tessera_ordered_gemm_f64, double, __dmul_rn, __dadd_rn)
)";

CUdeviceptr pointer(const void* p) { return CUdeviceptr(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

void ordered_gemm_on_gpu(VirtualGpu& gpu, const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out,
                         int64_t m, int64_t n, int64_t k, int64_t batch) {
  CudaGpu& device = gpu.gpu();
  const std::string key = fmt::format("ordered_gemm_sm{}", device.compute_capability());
  // Compiled on first use per process (load() keeps the module by key).
  static std::mutex compile_mutex;
  std::vector<const CudaKernel*> kernels;
  {
    std::lock_guard lock(compile_mutex);
    static std::map<int, std::string> images;
    std::string& image = images[device.compute_capability()];
    if (image.empty()) image = NvrtcCompiler(device.compute_capability(), /*deterministic=*/true).compile_source(kSource, "ordered_gemm.cu").binary;
    kernels = device.load(key, image, {"tessera_ordered_gemm_f32", "tessera_ordered_gemm_f64"}, {CudaKernel{}, CudaKernel{}});
  }
  if (a.dtype() != DType::f32 && a.dtype() != DType::f64)
    throw DTypeError(fmt::format("GEMM on a GPU: {} is not supported", dtype_name(a.dtype())));
  CUfunction fn = kernels[a.dtype() == DType::f32 ? 0 : 1]->function;
  CUdeviceptr pa = pointer(a.device_bytes()), pb = pointer(b.device_bytes()), po = pointer(out.device_bytes());
  long long lm = m, ln = n, lk = k, lbatch = batch;
  int ta = trans_a, tb = trans_b;
  void* args[] = {&pa, &pb, &po, &lm, &ln, &lk, &ta, &tb, &lbatch};
  const int64_t threads = 256;
  const int64_t blocks = std::max<int64_t>(1, std::min((batch * m * n + threads - 1) / threads, device.multiprocessors() * 16));
  const CudaDriver& cu = cuda_driver();
  gpu.make_current();
  cu.check(cu.cuLaunchKernel(fn, unsigned(blocks), 1, 1, unsigned(threads), 1, 1, 0, gpu.stream(), args, nullptr),
           "cuLaunchKernel (ordered GEMM)");
}

}  // namespace tessera
