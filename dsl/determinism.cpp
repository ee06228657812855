#include "dsl/determinism.hpp"

#include <cstdlib>
#include <string>

namespace tessera {

bool deterministic_mode() {
  const char* v = std::getenv("TESSERA_DETERMINISTIC");
  return v && *v && std::string(v) != "0";
}

}  // namespace tessera
