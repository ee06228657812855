#include "backend/cuda/nvrtc_library.hpp"

#include <cstdlib>
#include <string_view>

#include "backend/cuda/runtime_library.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

LoadedLibrary<NvrtcLibrary> load_nvrtc() {
  LoadedLibrary<NvrtcLibrary> out;
  // $TESSERA_NVRTC_LIBRARY (a soname or a path) picks one NVRTC where a machine has several;
  // "none" turns NVRTC off (scripts/sanitize.sh: NVRTC's own code needs no sanitizer run).
  const char* chosen = std::getenv("TESSERA_NVRTC_LIBRARY");
  if (chosen && std::string_view(chosen) == "none") {
    out.why = "NVRTC is off (TESSERA_NVRTC_LIBRARY=none)";
    return out;
  }
  void* handle = chosen && *chosen ? open_runtime_library({chosen}, out.why)
                                   : open_runtime_library({"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"}, out.why);
  if (!handle) {
    out.why = "NVRTC not found: " + out.why;
    return out;
  }
  TESSERA_RESOLVE_API(TESSERA_NVRTC_FUNCTIONS, out.table, handle, "NVRTC", out.why);
  return out;
}

const LoadedLibrary<NvrtcLibrary>& loaded_nvrtc() {
  static const auto* instance = new LoadedLibrary<NvrtcLibrary>(load_nvrtc());
  return *instance;
}

}  // namespace

const NvrtcLibrary* NvrtcLibrary::get() { return loaded_nvrtc().why.empty() ? &loaded_nvrtc().table : nullptr; }

std::string NvrtcLibrary::why_unavailable() { return loaded_nvrtc().why; }

const NvrtcLibrary& nvrtc() {
  if (const NvrtcLibrary* library = NvrtcLibrary::get()) return *library;
  throw DeviceError(NvrtcLibrary::why_unavailable());
}

}  // namespace tessera
