// The kinds of device a mesh is made of, and what each kind's backend runs as one primitive
// (capabilities). Code asks these instead of comparing device-type strings: a new backend adds
// an enumerator and its row of capabilities here.
#pragma once

#include <optional>
#include <string_view>

namespace tessera {

enum class DeviceKind { CPU, GPU };

// "CPU" / "GPU": the type in device names ("CPU:0") and Mesh::device_type().
std::string_view device_kind_name(DeviceKind kind);
// The kind a device-type name spells exactly ("CPU", "GPU"); nullopt for any other text.
std::optional<DeviceKind> device_kind_from_name(std::string_view name);

// Primitives a backend may run as one library kernel; where it cannot, the op is built from
// its parts instead.
enum class Capability {
  FusedAttention,  // attention's three parts (forward, two backward) as tiled kernels
  SparseRows,      // take_rows / scatter_add_rows: indexed row loads and row accumulation
};

bool has_capability(DeviceKind kind, Capability capability);

}  // namespace tessera
