// Device names in TensorFlow's two spellings: "CPU:0" and
// "/job:localhost/replica:0/task:0/device:CPU:0". Local single-client devices print short.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "dsl/device_kind.hpp"

namespace tessera {

struct DeviceName {
  std::string job = "localhost";
  int64_t replica = 0;
  int64_t task = 0;
  std::string type;  // "CPU" or "GPU": device_kind_name of kind()
  int64_t index = 0;

  DeviceKind kind() const;  // MeshError for a type no backend knows

  static DeviceName parse(std::string_view text);  // MeshError naming the text when malformed
  std::string to_string() const;                   // short form when job/replica/task are default
  std::string full_string() const;                 // always the /job:... form
  bool operator==(const DeviceName&) const = default;
};

}  // namespace tessera
