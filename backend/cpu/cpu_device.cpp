#include "backend/cpu/cpu_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dsl/buffer_pool.hpp"
#include "dsl/error.hpp"
#include "backend/cpu/cpu_attention.hpp"
#include "backend/cpu/cpu_gemm.hpp"
#include "backend/cpu/cpu_grouped_gemm.hpp"
#include "jit/device_workers.hpp"
#include "jit/kernel_runner.hpp"
#include "backend/cpu/orc_engine.hpp"

namespace tessera {
namespace {

// An operand of the fused attention as T, its sums' type: 16-bit q, k and v (mixed precision:
// the primitive's result is f32) widened into `wide`, which is exact.
template <class T>
const T* attention_operand(const Array& a, std::vector<T>& wide) {
  if (a.dtype() == dtype_of<T>()) return a.data<T>();
  if (!is_16_bit_float(a.dtype()))
    throw InternalError("fused attention: a " + std::string(dtype_name(a.dtype())) + " operand for a " +
                        std::string(dtype_name(dtype_of<T>())) + " result");
  const auto* bits = reinterpret_cast<const uint16_t*>(a.bytes());
  wide.resize(size_t(a.numel()));
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = T(a.dtype() == DType::bf16 ? bf16_to_float(bits[i]) : f16_to_float(bits[i]));
  return wide.data();
}

template <class T>
void run_attention(const LibraryCall& call, Array& out, int parts, const PartRunner& run) {
  const Array &q_array = *call.inputs[0], &k_array = *call.inputs[1], &v_array = *call.inputs[2];
  std::vector<T> wide_q, wide_k, wide_v;
  const T* q = attention_operand(q_array, wide_q);
  const T* k = attention_operand(k_array, wide_k);
  const T* v = attention_operand(v_array, wide_v);
  const size_t r = q_array.shape().size();
  AttentionExtents x;
  for (size_t a = 0; a + 2 < r; ++a) x.batch *= q_array.shape()[a];
  x.lq = q_array.shape()[r - 2];
  x.e = q_array.shape()[r - 1];
  x.lk = k_array.shape()[r - 2];
  x.ev = v_array.shape()[r - 1];
  x.q_offset = call.q_offset;
  x.causal = call.attention.causal;
  x.scale = call.attention.scale;
  // A device may hold no rows of a sharded axis: nothing to compute, and no sums to start (a
  // grad_kv over no queries is zero).
  if (x.batch == 0 || x.lq == 0 || x.lk == 0) {
    std::fill(out.mutable_data<T>(), out.mutable_data<T>() + out.numel(), T(0));
    return;
  }
  T* o = out.mutable_data<T>();
  switch (call.attention.part) {
    case AttentionPart::Forward: attention_forward(x, q, k, v, o, parts, run); break;
    case AttentionPart::GradQ: attention_grad_q(x, q, k, v, call.inputs[3]->data<T>(), call.inputs[4]->data<T>(), o, parts, run); break;
    case AttentionPart::GradKV:
      attention_grad_kv(x, q, k, v, call.inputs[3]->data<T>(), call.inputs[4]->data<T>(), o, parts, run);
      break;
  }
}

}  // namespace

CpuDevice::CpuDevice(std::string name, int64_t worker, int64_t devices_in_run)
    : name_(std::move(name)), worker_(worker), devices_in_run_(devices_in_run) {}

std::shared_ptr<std::byte[]> CpuDevice::allocate(int64_t bytes) { return allocate_buffer(bytes, false); }

void CpuDevice::copy_from_host(const std::byte* host, std::byte* device, int64_t bytes) {
  std::memcpy(device, host, size_t(bytes));
}

void CpuDevice::copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) {
  std::memcpy(host, device, size_t(bytes));
}

void CpuDevice::copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                            const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                            const std::vector<int64_t>& region_shape) {
  tessera::copy_region(src, src_offset, dst, dst_offset, region_offset, region_shape);
}

void CpuDevice::fill(std::byte* device, int64_t count, DType dtype, double value) {
  if (value == 0.0 && !std::signbit(value)) {
    std::memset(device, 0, size_t(count * dtype_size(dtype)));
    return;
  }
  for (int64_t i = 0; i < count; ++i) store_from_double(device, dtype, i, value);
}

void CpuDevice::copy_bytes(const std::byte* from, std::byte* to, int64_t bytes) {
  if (bytes > 0 && from != to) std::memmove(to, from, size_t(bytes));
}

std::vector<const void*> CpuDevice::load_kernels(const std::vector<kir::Kernel>& kernels) {
  // Kernels lowered for a GPU (a test's substitute lowering target) run as the CPU runs them.
  std::vector<kir::Kernel> mapped;
  for (const kir::Kernel& k : kernels)
    mapped.push_back(kir::is_gpu_range(k.range_loop()) ? kir::for_target(k, kir::LoopTarget::Cpu) : k);
  std::vector<const void*> entries;
  for (KernelFunction fn : tessera::load_kernels(mapped)) entries.push_back(reinterpret_cast<const void*>(fn));
  return entries;
}

void CpuDevice::launch(const KernelLaunch& launch) {
  const int64_t extent = kir::evaluate(launch.kernel.outer_extent, launch.params);
  // A device owning several cores splits a large kernel over its range loop (small kernels,
  // the common case, skip the loop-kind lookup).
  const bool split = kernel_splits_over_cores(launch.kernel, launch.output_elements);
  const int parts = split ? int(std::min<int64_t>(cores_per_device(devices_in_run_), extent)) : 1;
  const KernelRunner* substitute = substitute_kernel_runner();
  const auto fn = reinterpret_cast<KernelFunction>(const_cast<void*>(launch.entry));
  run_split(worker_, parts, [&](int part) {
    const int64_t begin = extent * part / parts, end = extent * (part + 1) / parts;
    if (substitute) (*substitute)(launch.kernel, launch.buffers, launch.params, begin, end);
    else fn(launch.buffers, launch.params, begin, end);
  });
}

void CpuDevice::gemm(const LibraryCall& call, bool ordered) {
  const int parts = cores_per_device(devices_in_run_);
  host_gemm(*call.inputs.at(0), call.trans_a, *call.inputs.at(1), call.trans_b, *call.out, ordered, parts,
            [this](int used, const std::function<void(int)>& part) { run_split(worker_, used, part); });
}

void CpuDevice::grouped_gemm(const LibraryCall& call) {
  const int parts = cores_per_device(devices_in_run_);
  const PartRunner run = [this](int used, const std::function<void(int)>& part) { run_split(worker_, used, part); };
  const Array &x = *call.inputs.at(0), &other = *call.inputs.at(1), &ends = *call.inputs.at(2);
  if (call.op == LibraryOp::GroupedGemm) tessera::grouped_gemm(x, other, ends, call.row_offset, *call.out, call.ordered, parts, run);
  else grouped_weight_grad_gemm(x, other, ends, call.row_offset, *call.out, call.ordered, parts, run);
}

void CpuDevice::attention(const LibraryCall& call) {
  const int parts = cores_per_device(devices_in_run_);
  const PartRunner run = [this](int used, const std::function<void(int)>& part) { run_split(worker_, used, part); };
  Array& out = *call.out;
  switch (out.dtype()) {
    case DType::f32: run_attention<float>(call, out, parts, run); break;
    case DType::f64: run_attention<double>(call, out, parts, run); break;
    default: throw InternalError("fused attention on " + std::string(dtype_name(out.dtype())) + " (its kernel is f32 and f64)");
  }
}

}  // namespace tessera
