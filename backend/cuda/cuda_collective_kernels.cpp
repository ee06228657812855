#include "backend/cuda/cuda_collective_kernels.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/cuda_prelude.hpp"
#include "dsl/error.hpp"
#include "jit/compile_cache.hpp"
#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/cuda_gpu.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"

namespace tessera {
namespace {

constexpr int64_t kCollectiveThreadsPerBlock = 256;
constexpr int64_t kCollectiveBlocksPerMultiprocessor = 8;

// The launch's one by-value argument (the source's tsr_reduce_args).
struct ReduceArgs {
  const void* in[kMaxReduceOperands];
  void* out[kMaxReduceOperands];
  int64_t n_in, n_out, count;
};

// The region copy's by-value argument (the source's tsr_copy_args): element strides of both
// blocks, the region's extents, and where it starts in each block.
struct CopyArgs {
  const void* src;
  void* dst;
  int64_t rank, count, src_base, dst_base;
  int64_t shape[kMaxRegionRank], src_stride[kMaxRegionRank], dst_stride[kMaxRegionRank];
};

// Storage type, accumulator type, load and store per dtype; the ops as comm/reduce_kernels.cpp
// has them (max keeps the first NaN, else std::max's choice: a < v ? v : a).
constexpr const char* kSource = R"CUDA(
#define TSR_MAX_OPERANDS 32
struct tsr_reduce_args { const void* in[TSR_MAX_OPERANDS]; void* out[TSR_MAX_OPERANDS]; int64_t n_in, n_out, count; };

template <class S, class A> struct tsr_io {
  static __device__ __forceinline__ A load(const void* p, int64_t i) { return (A)((const S*)p)[i]; }
  static __device__ __forceinline__ void store(void* p, int64_t i, A v) { ((S*)p)[i] = (S)v; }
};
struct tsr_bool_io {  // bools: an int accumulator, stored as v != 0
  static __device__ __forceinline__ int32_t load(const void* p, int64_t i) { return (int32_t)((const uint8_t*)p)[i]; }
  static __device__ __forceinline__ void store(void* p, int64_t i, int32_t v) { ((uint8_t*)p)[i] = (uint8_t)(v != 0); }
};
struct tsr_bf16_io {
  static __device__ __forceinline__ float load(const void* p, int64_t i) { return tsr_bf16_to_f32(((const uint16_t*)p)[i]); }
  static __device__ __forceinline__ void store(void* p, int64_t i, float v) { ((uint16_t*)p)[i] = tsr_f32_to_bf16(v); }
};
struct tsr_f16_io {
  static __device__ __forceinline__ float load(const void* p, int64_t i) { return tsr_f16_to_f32(((const uint16_t*)p)[i]); }
  static __device__ __forceinline__ void store(void* p, int64_t i, float v) { ((uint16_t*)p)[i] = tsr_f32_to_f16(v); }
};

template <int OP, class A> __device__ __forceinline__ A tsr_combine(A a, A v) {
  if (OP == TSR_SUM || OP == TSR_AVG) return a + v;
  if (OP == TSR_PRODUCT) return a * v;
  if (OP == TSR_MAX) return a != a ? a : v != v ? v : (a < v ? v : a);
  return a != a ? a : v != v ? v : (v < a ? v : a);
}

template <class IO, class A, int OP> __device__ __forceinline__ void tsr_reduce(const tsr_reduce_args& args) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < args.count; i += stride) {
    A acc = IO::load(args.in[0], i);
    for (int64_t r = 1; r < args.n_in; ++r) acc = tsr_combine<OP, A>(acc, IO::load(args.in[r], i));
    if (OP == TSR_AVG) acc = acc / (A)args.n_in;
    for (int64_t o = 0; o < args.n_out; ++o) IO::store(args.out[o], i, acc);
  }
}

#define TSR_MAX_RANK 8
struct tsr_copy_args {
  const void* src; void* dst;
  int64_t rank, count, src_base, dst_base;
  int64_t shape[TSR_MAX_RANK], src_stride[TSR_MAX_RANK], dst_stride[TSR_MAX_RANK];
};
template <class T> __device__ __forceinline__ void tsr_copy(const tsr_copy_args& args) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < args.count; i += stride) {
    int64_t rest = i, from = args.src_base, to = args.dst_base;
    for (int64_t a = args.rank - 1; a >= 0; --a) {
      const int64_t index = rest % args.shape[a];
      rest /= args.shape[a];
      from += index * args.src_stride[a];
      to += index * args.dst_stride[a];
    }
    ((T*)args.dst)[to] = ((const T*)args.src)[from];
  }
}
extern "C" __global__ void tsr_copy_1(const tsr_copy_args args) { tsr_copy<uint8_t>(args); }
extern "C" __global__ void tsr_copy_2(const tsr_copy_args args) { tsr_copy<uint16_t>(args); }
extern "C" __global__ void tsr_copy_4(const tsr_copy_args args) { tsr_copy<uint32_t>(args); }
extern "C" __global__ void tsr_copy_8(const tsr_copy_args args) { tsr_copy<uint64_t>(args); }
)CUDA";

struct TypeSpelling {
  DType dtype;
  const char* io;   // the IO policy
  const char* acc;  // the accumulator type
};
constexpr std::array<TypeSpelling, 7> kTypes = {{{DType::f32, "tsr_io<float, float>", "float"},
                                                 {DType::f64, "tsr_io<double, double>", "double"},
                                                 {DType::i32, "tsr_io<int32_t, int32_t>", "int32_t"},
                                                 {DType::i64, "tsr_io<int64_t, int64_t>", "int64_t"},
                                                 {DType::u8, "tsr_bool_io", "int32_t"},
                                                 {DType::bf16, "tsr_bf16_io", "float"},
                                                 {DType::f16, "tsr_f16_io", "float"}}};
constexpr std::array<ReduceOp, 5> kOps = {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

std::string kernel_name(DType dtype, ReduceOp op) {
  return fmt::format("tsr_reduce_{}_{}", int(dtype), int(op));
}

std::string full_source() {
  std::string source(cuda_prelude());
  source += fmt::format("enum {{ TSR_SUM = {}, TSR_AVG = {}, TSR_PRODUCT = {}, TSR_MAX = {}, TSR_MIN = {} }};\n", int(ReduceOp::Sum),
                        int(ReduceOp::Avg), int(ReduceOp::Product), int(ReduceOp::Max), int(ReduceOp::Min));
  source += kSource;
  for (const TypeSpelling& t : kTypes)
    for (ReduceOp op : kOps)
      source += fmt::format("extern \"C\" __global__ void {}(const tsr_reduce_args args) {{ tsr_reduce<{}, {}, {}>(args); }}\n",
                            kernel_name(t.dtype, op), t.io, t.acc, int(op));
  return source;
}

// The loaded kernels of one GPU: reductions by (dtype, op), copies by element size.
struct KernelTable {
  std::map<std::pair<DType, ReduceOp>, CUfunction> reduce;
  std::map<int64_t, CUfunction> copy;
};

const KernelTable& kernels_on(CudaGpu& gpu) {
  static std::mutex mutex;
  static auto* tables = new std::map<int64_t, KernelTable>();  // lives until exit
  std::lock_guard lock(mutex);
  KernelTable& table = (*tables)[gpu.ordinal()];
  if (!table.reduce.empty()) return table;
  const std::string source = full_source();
  NvrtcCompiler compiler(gpu.compute_capability(), /*deterministic=*/true);  // sums in rank order, no contraction
  static CompileCache cache(".cubin");
  const std::string key = CompileCache::key_of_source(compiler, source);
  const CachedArtifact image = cache.get(key, [&] { return compiler.compile_source(source, "tessera_collectives.cu").binary; });
  std::vector<std::string> names;
  std::vector<std::pair<DType, ReduceOp>> entries;
  for (const TypeSpelling& t : kTypes)
    for (ReduceOp op : kOps) {
      names.push_back(kernel_name(t.dtype, op));
      entries.emplace_back(t.dtype, op);
    }
  const std::vector<int64_t> sizes = {1, 2, 4, 8};
  for (int64_t size : sizes) names.push_back(fmt::format("tsr_copy_{}", size));
  const std::vector<const CudaKernel*> loaded = gpu.load("collectives:" + key, image.bytes, names, std::vector<CudaKernel>(names.size()));
  for (size_t i = 0; i < entries.size(); ++i) table.reduce[entries[i]] = loaded[i]->function;
  for (size_t i = 0; i < sizes.size(); ++i) table.copy[sizes[i]] = loaded[entries.size() + i]->function;
  return table;
}

// A grid-stride kernel over `count` elements taking one by-value argument.
void launch(CudaGpu& gpu, CUstream stream, CUfunction function, void* argument, int64_t count, const char* what) {
  const int64_t blocks = std::min((count + kCollectiveThreadsPerBlock - 1) / kCollectiveThreadsPerBlock, gpu.multiprocessors() * kCollectiveBlocksPerMultiprocessor);
  void* arguments[] = {argument};
  const CudaDriver& cu = cuda_driver();
  gpu.make_current();
  cu.check(cu.cuLaunchKernel(function, unsigned(blocks), 1, 1, unsigned(kCollectiveThreadsPerBlock), 1, 1, 0, stream, arguments, nullptr), what);
}

}  // namespace

void launch_device_reduce(CudaGpu& gpu, CUstream stream, void* const* outs, int n_out, const void* const* ins, int n_in,
                          int64_t count, DType dtype, ReduceOp op) {
  if (count <= 0 || n_out <= 0) return;
  if (n_in < 1 || n_in > kMaxReduceOperands || n_out > kMaxReduceOperands)
    throw InternalError(fmt::format("device reduction of {} inputs into {} outputs (at most {} each)", n_in, n_out,
                                    kMaxReduceOperands));
  ReduceArgs args{};
  std::copy(ins, ins + n_in, args.in);
  std::copy(outs, outs + n_out, args.out);
  args.n_in = n_in;
  args.n_out = n_out;
  args.count = count;
  launch(gpu, stream, kernels_on(gpu).reduce.at({dtype, op}), &args, count, "cuLaunchKernel (collective reduction)");
}

void launch_device_copy_region(CudaGpu& gpu, CUstream stream, const void* src, const std::vector<int64_t>& src_shape,
                               const std::vector<int64_t>& src_offset, void* dst, const std::vector<int64_t>& dst_shape,
                               const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                               const std::vector<int64_t>& region_shape, int64_t element_size) {
  const int64_t rank = int64_t(region_shape.size());
  if (rank > kMaxRegionRank) throw InternalError(fmt::format("device region copy of rank {} (at most {})", rank, kMaxRegionRank));
  CopyArgs args{};
  args.src = src;
  args.dst = dst;
  args.rank = rank;
  args.count = 1;
  int64_t src_stride = 1, dst_stride = 1;
  for (int64_t a = rank - 1; a >= 0; --a) {
    args.shape[a] = region_shape[size_t(a)];
    args.src_stride[a] = src_stride;
    args.dst_stride[a] = dst_stride;
    args.src_base += (region_offset[size_t(a)] - src_offset[size_t(a)]) * src_stride;
    args.dst_base += (region_offset[size_t(a)] - dst_offset[size_t(a)]) * dst_stride;
    src_stride *= src_shape[size_t(a)];
    dst_stride *= dst_shape[size_t(a)];
    args.count *= region_shape[size_t(a)];
  }
  if (args.count == 0) return;
  const auto& copies = kernels_on(gpu).copy;
  const auto it = copies.find(element_size);
  if (it == copies.end()) throw InternalError(fmt::format("device region copy of {}-byte elements", element_size));
  launch(gpu, stream, it->second, &args, args.count, "cuLaunchKernel (region copy)");
}

}  // namespace tessera
