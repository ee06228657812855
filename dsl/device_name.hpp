// Device names in TensorFlow's two spellings: "CPU:0" and
// "/job:localhost/replica:0/task:0/device:CPU:0". A name prints as it was written, so mesh and
// layout strings round-trip unchanged; a name naming another job, replica or task prints in full.
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
  bool written_in_full = false;  // parsed from the /job:... form: to_string() keeps that spelling

  DeviceKind kind() const;  // MeshError for a type no backend knows

  static DeviceName parse(std::string_view text);  // MeshError naming the text when malformed
  std::string to_string() const;                   // as written; the short form for a default job/replica/task
  std::string full_string() const;                 // always the /job:... form
  // The same device, however it is spelled.
  bool operator==(const DeviceName& other) const;
};

}  // namespace tessera
