#include "ir/target.hpp"

namespace tessera {

std::string Target::to_string() const {
  return std::string(device_kind_name(device)) + (deterministic ? " deterministic" : "");
}

}  // namespace tessera
