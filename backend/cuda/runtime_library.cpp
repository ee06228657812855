#include "backend/cuda/runtime_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

namespace tessera {

void* open_runtime_library(std::initializer_list<const char*> sonames, std::string& why) {
  std::string tried;
  const char* error = "";
  for (const char* soname : sonames) {
    if (void* library = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return library;
    error = dlerror();
    tried += tried.empty() ? soname : std::string(", ") + soname;
  }
  why = fmt::format("none of {} could be loaded (last: {})", tried, error ? error : "no error text");
  return nullptr;
}

void* runtime_symbol(void* library, const char* symbol, const char* library_name, std::string& why) {
  void* address = dlsym(library, symbol);
  if (!address) why = fmt::format("{} lacks {} (too old a release?)", library_name, symbol);
  return address;
}

}  // namespace tessera
