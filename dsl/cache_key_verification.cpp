#include "dsl/cache_key_verification.hpp"

#include <cstdlib>
#include <string_view>

namespace tessera {

bool verify_cache_keys() {
#ifdef NDEBUG
  static const bool on = [] {
    const char* v = std::getenv("TESSERA_VERIFY_CACHE_KEYS");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
#else
  return true;  // a debug build always checks
#endif
}

}  // namespace tessera
