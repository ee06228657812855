#include "dsl/device_kind.hpp"

namespace tessera {

std::string_view device_kind_name(DeviceKind kind) { return kind == DeviceKind::GPU ? "GPU" : "CPU"; }

std::optional<DeviceKind> device_kind_from_name(std::string_view name) {
  if (name == "CPU") return DeviceKind::CPU;
  if (name == "GPU") return DeviceKind::GPU;
  return std::nullopt;
}

bool has_capability(DeviceKind kind, Capability capability) {
  switch (capability) {
    // The CUDA backend has no fused attention kernel yet (docs/GPU.md): its graphs use the parts.
    case Capability::FusedAttention: return kind == DeviceKind::CPU;
    case Capability::SparseRows: return true;
  }
  return false;
}

}  // namespace tessera
