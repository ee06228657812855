// Opening NVIDIA's libraries at run time: the first of several sonames that loads (a bundle built
// against one CUDA runs with another), and a table of entry points filled from it by the X-macro
// lists of backend/cuda/cuda_api.hpp. Nothing CUDA is linked, so one build runs with or without
// a GPU and with whichever CUDA the machine has.
#pragma once

#include <initializer_list>
#include <string>

namespace tessera {

// A table of entry points (CudaDriver, CublasLibrary, ...) once loaded, or why it could not be.
template <typename Table>
struct LoadedLibrary {
  Table table;
  std::string why;  // empty when loaded
};

// The library handle, or nullptr with `why` naming every soname tried and the last error.
void* open_runtime_library(std::initializer_list<const char*> sonames, std::string& why);

// The address of `symbol` in `library`, or nullptr with `why` naming it and `library_name`.
void* runtime_symbol(void* library, const char* symbol, const char* library_name, std::string& why);

// Fills `table`'s members from `library` by `FUNCTIONS` (X(member, symbol, type)); false and
// `why` set at the first symbol missing.
#define TESSERA_RESOLVE_API(FUNCTIONS, table, library, library_name, why)                        \
  [](auto& table_, void* library_, const char* library_name_, std::string& why_) {               \
    bool resolved = true;                                                                        \
    FUNCTIONS(TESSERA_RESOLVE_API_MEMBER_)                                                       \
    return resolved;                                                                             \
  }(table, library, library_name, why)
#define TESSERA_RESOLVE_API_MEMBER_(member, symbol, type)                                        \
  if (resolved) {                                                                                \
    table_.member = reinterpret_cast<ApiFunction<type>>(runtime_symbol(library_, symbol, library_name_, why_)); \
    resolved = table_.member != nullptr;                                                         \
  }

}  // namespace tessera
