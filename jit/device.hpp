// A Device: what one mesh device offers the executor. Its memory (a space, a pool, copies and
// fills), kernel launches, and a point where its queued work is done. The executor walks a
// program's steps and asks the device for each; it never touches device memory itself. Library
// kernels (GEMMs, fused attention) are not Device methods: each backend's table holds them
// (jit/library_call.hpp). backend/cpu/cpu_device is the CPU implementation; the CUDA device
// (backend/cuda/cuda_device) implements the same calls with a stream and a memory pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel_ir.hpp"
#include "dsl/array.hpp"
#include "dsl/memory_space.hpp"

namespace tessera {

// One kernel launch: the kernel's IR (its outer extent, whether it may split, and what a
// substitute runner interprets), the target's compiled entry point, and its arguments in the
// kernel ABI (codegen/kernel_ir.hpp).
struct KernelLaunch {
  const kir::Kernel& kernel;
  const void* entry;               // from the device's load_kernels
  void** buffers;
  const int64_t* params;
  int64_t param_count;
  int64_t output_elements;         // the main output's size: small kernels run unsplit
};

// Whether a CPU device owning several cores splits this kernel over them: its range loop is
// parallel and its main output has at least 2^16 elements (smaller ones run on one core).
inline bool kernel_splits_over_cores(const kir::Kernel& kernel, int64_t output_elements) {
  return output_elements >= (int64_t(1) << 16) && kernel.range_loop() == kir::LoopKind::Parallel;
}

class Device {
 public:
  virtual ~Device() = default;
  virtual const std::string& name() const = 0;
  virtual MemorySpace memory_space() const = 0;

  // Memory from the device's pool; back to the pool when the last reference drops.
  virtual std::shared_ptr<std::byte[]> allocate(int64_t bytes) = 0;
  virtual void copy_from_host(const std::byte* host, std::byte* device, int64_t bytes) = 0;
  virtual void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) = 0;
  // The global-coordinate region of src's block (at src_offset) into dst's block (at dst_offset).
  virtual void copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                           const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                           const std::vector<int64_t>& region_shape) = 0;
  virtual void fill(std::byte* device, int64_t count, DType dtype, double value) = 0;
  // `bytes` from one buffer of this device's memory to another, in its queue order.
  virtual void copy_bytes(const std::byte* from, std::byte* to, int64_t bytes) = 0;

  // Arrays in the device's memory: a view into memory it allocated, a fresh one, and a copy of
  // any array (one already in this device's memory is returned as it is by to_device).
  virtual Array view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype) = 0;
  Array new_array(std::vector<int64_t> shape, DType dtype);
  virtual Array to_device(const Array& array) = 0;
  virtual Array copy(const Array& array) = 0;

  // The kernels compiled for the device's target and loaded: one entry per kernel, in order,
  // which launch() takes back as KernelLaunch::entry.
  virtual std::vector<const void*> load_kernels(const std::vector<kir::Kernel>& kernels) = 0;
  // Devices with the same kernel home share loaded kernels ("host" for CPUs, one per GPU).
  virtual std::string kernel_home() const = 0;

  virtual void launch(const KernelLaunch& launch) = 0;
  // Returns once everything queued on the device is done (a no-op where calls are synchronous).
  virtual void synchronize() = 0;

  // Whether the device can record a run's queued work and replay it (CUDA graphs). The executor
  // then makes a run's fresh outputs before its steps, so their addresses are known, and hands
  // the steps to run_steps with every buffer address they touch.
  virtual bool records_runs() const { return false; }
  // Queues `steps` (one run's work), or a replay of an earlier run's recording with the same
  // `buffers`. A device that records nothing runs them.
  virtual void run_steps(const std::vector<const void*>& buffers, const std::function<void()>& steps) {
    (void)buffers;
    steps();
  }
};

}  // namespace tessera
