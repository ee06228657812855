#include "backend/cpu/cpu_backend.hpp"

#include "backend/cpu/cpu_device.hpp"
#include "jit/backend_registry.hpp"

namespace tessera {

void register_cpu_backend() {
  Backend cpu;
  cpu.kind = DeviceKind::CPU;
  cpu.lowering_target = kir::LoopTarget::Cpu;
  cpu.make_device = [](const DeviceName& name, const DevicePlacement& p, const Target& target) -> std::unique_ptr<Device> {
    return std::make_unique<CpuDevice>(name.to_string(), p.worker, p.devices_in_run, p.sets_blas_threads, target);
  };
  cpu.device_count = [](int64_t wanted) { return wanted; };  // virtual devices: as many as asked
  register_backend(std::move(cpu));
}

}  // namespace tessera
