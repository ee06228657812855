// A virtual CPU device: host memory from the buffer pool, kernels run on the device's worker
// thread (large ones split over the cores it owns). Its library kernels (registered by
// backend/cpu/cpu_backend.cpp): GEMMs by backend/cpu/cpu_gemm, fused attention by
// backend/cpu/cpu_attention, on the same cores. Calls complete before they return, so
// synchronize() has nothing to wait for.
#pragma once

#include "jit/device.hpp"
#include "jit/library_call.hpp"

namespace tessera {

class CpuDevice final : public Device {
 public:
  // `worker`: the device's worker thread (jit/device_workers); `devices_in_run`: how many
  // devices of this process run together, which divides the cores among them (a library
  // call shares its work among the device's cores on the device's own helper threads).
  CpuDevice(std::string name, int64_t worker, int64_t devices_in_run);

  const std::string& name() const override { return name_; }
  MemorySpace memory_space() const override { return MemorySpace::Host; }
  std::shared_ptr<std::byte[]> allocate(int64_t bytes) override;
  void copy_from_host(const std::byte* host, std::byte* device, int64_t bytes) override;
  void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) override;
  void copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                   const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                   const std::vector<int64_t>& region_shape) override;
  void fill(std::byte* device, int64_t count, DType dtype, double value) override;
  void copy_bytes(const std::byte* from, std::byte* to, int64_t bytes) override;
  Array view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype) override {
    return Array::view(std::move(owner), data, std::move(shape), dtype);
  }
  Array to_device(const Array& array) override { return array.memory_space() == MemorySpace::Host ? array : array.clone(); }
  Array copy(const Array& array) override { return array.clone(); }
  std::vector<const void*> load_kernels(const std::vector<kir::Kernel>& kernels) override;
  std::string kernel_home() const override { return "host"; }
  void launch(const KernelLaunch& launch) override;
  void synchronize() override {}

  // Library kernels: a GEMM (`ordered`: each sum in source order), an attention part.
  void gemm(const LibraryCall& call, bool ordered);
  void attention(const LibraryCall& call);
  // A grouped GEMM of dsl/grouped_matmul.hpp (its op says which), the group bounds read from its
  // ends buffer now.
  void grouped_gemm(const LibraryCall& call);

 private:
  std::string name_;
  int64_t worker_;
  int64_t devices_in_run_;
};

}  // namespace tessera
