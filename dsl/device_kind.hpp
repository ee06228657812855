// The kinds of device a mesh is made of. Code asks these instead of comparing device-type
// strings; what each kind's backend offers is its Target (ir/target.hpp). A new backend adds an
// enumerator and its name here.
#pragma once

#include <optional>
#include <string_view>

namespace tessera {

enum class DeviceKind { CPU, GPU };

// "CPU" / "GPU": the type in device names ("CPU:0") and Mesh::device_type().
std::string_view device_kind_name(DeviceKind kind);
// The kind a device-type name spells exactly ("CPU", "GPU"); nullopt for any other text.
std::optional<DeviceKind> device_kind_from_name(std::string_view name);
// The kind a user's device type names in any case, with PyTorch's spelling "cuda" for GPUs
// (init_device_mesh("cuda", ...)); nullopt for any other text.
std::optional<DeviceKind> device_kind_from_user_name(std::string_view name);

}  // namespace tessera
