#include "ir/target.hpp"

namespace tessera {

std::string Target::to_string() const {
  std::string out(device_kind_name(device));
  if (!arch.empty()) out += " " + arch;
  if (deterministic) out += " deterministic";
  return out;
}

}  // namespace tessera
