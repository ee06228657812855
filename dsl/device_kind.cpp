#include "dsl/device_kind.hpp"

#include <cctype>
#include <string>

namespace tessera {

std::string_view device_kind_name(DeviceKind kind) { return kind == DeviceKind::GPU ? "GPU" : "CPU"; }

std::optional<DeviceKind> device_kind_from_name(std::string_view name) {
  if (name == "CPU") return DeviceKind::CPU;
  if (name == "GPU") return DeviceKind::GPU;
  return std::nullopt;
}

std::optional<DeviceKind> device_kind_from_user_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (upper == "CUDA") return DeviceKind::GPU;
  return device_kind_from_name(upper);
}

}  // namespace tessera
