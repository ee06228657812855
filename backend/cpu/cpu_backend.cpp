#include "backend/cpu/cpu_backend.hpp"

#include <llvm/ADT/StringRef.h>
#include <llvm/TargetParser/Host.h>

#include "backend/cpu/cpu_device.hpp"
#include "jit/backend_registry.hpp"

namespace tessera {

void register_cpu_backend() {
  Backend cpu;
  cpu.kind = DeviceKind::CPU;
  cpu.lowering_target = kir::LoopTarget::Cpu;
  cpu.arch = [] { return llvm::sys::getHostCPUName().str(); };  // what the ORC engine compiles for
  cpu.library = {
      {LibraryOp::Gemm, [](Device& d, const LibraryCall& call) { device_as<CpuDevice>(d).gemm(call, false); }},
      {LibraryOp::OrderedGemm, [](Device& d, const LibraryCall& call) { device_as<CpuDevice>(d).gemm(call, true); }},
      {LibraryOp::Bf16Gemm, [](Device& d, const LibraryCall& call) { device_as<CpuDevice>(d).gemm(call, false); }},
      {LibraryOp::OrderedBf16Gemm, [](Device& d, const LibraryCall& call) { device_as<CpuDevice>(d).gemm(call, true); }},
  };
  for (LibraryOp part : {LibraryOp::AttentionForward, LibraryOp::AttentionGradQ, LibraryOp::AttentionGradKV})
    cpu.library[part] = [](Device& d, const LibraryCall& call) { device_as<CpuDevice>(d).attention(call); };
  for (LibraryOp grouped : {LibraryOp::GroupedGemm, LibraryOp::GroupedWeightGradGemm})
    cpu.library[grouped] = [](Device& d, const LibraryCall& call) { device_as<CpuDevice>(d).grouped_gemm(call); };
  cpu.make_device = [](const DeviceName& name, const DevicePlacement& p, const Target&) -> std::unique_ptr<Device> {
    return std::make_unique<CpuDevice>(name.to_string(), p.worker, p.devices_in_run);
  };
  cpu.device_count = [](int64_t wanted) { return wanted; };  // virtual devices: as many as asked
  register_backend(std::move(cpu));
}

}  // namespace tessera
