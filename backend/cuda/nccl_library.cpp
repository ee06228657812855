#include "backend/cuda/nccl_library.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

#include "backend/cuda/runtime_library.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

// ncclAvg and ncclBfloat16 came with 2.10 (NCCL_VERSION(2, 10, 0) = 21000).
constexpr int kOldestVersion = 21000;

struct Loaded {
  NcclLibrary library;
  std::string why;  // empty when loaded
};

Loaded load(const std::string& chosen) {
  Loaded out;
  if (chosen == "none") {
    out.why = "NCCL is off (TESSERA_NCCL_LIBRARY=none)";
    return out;
  }
  const char* name = chosen.empty() ? "libnccl.so.2" : chosen.c_str();
  void* handle = open_runtime_library({name}, out.why);
  if (!handle) {
    out.why = "NCCL not found: " + out.why;
    return out;
  }
  if (!TESSERA_RESOLVE_API(TESSERA_NCCL_FUNCTIONS, out.library, handle, name, out.why)) return out;
  if (out.library.ncclGetVersion(&out.library.version) != ncclSuccess || out.library.version < kOldestVersion)
    out.why = fmt::format("NCCL ({}) is version code {}; Tessera needs 2.10 or newer", name, out.library.version);
  return out;
}

// Keyed by the setting, so a test (or a program) that changes it sees the other library.
const Loaded& loaded() {
  static std::mutex mutex;
  static auto* by_setting = new std::map<std::string, Loaded>();
  const char* setting = std::getenv("TESSERA_NCCL_LIBRARY");
  const std::string chosen = setting ? setting : "";
  std::lock_guard lock(mutex);
  auto it = by_setting->find(chosen);
  if (it == by_setting->end()) it = by_setting->emplace(chosen, load(chosen)).first;
  return it->second;
}

}  // namespace

const NcclLibrary* NcclLibrary::get() { return loaded().why.empty() ? &loaded().library : nullptr; }

std::string NcclLibrary::why_unavailable() { return loaded().why; }

void NcclLibrary::check(ncclResult_t result, const char* what) const {
  if (result == ncclSuccess) return;
  const char* text = ncclGetErrorString(result);
  throw CommError(fmt::format("NCCL: {} failed: {} (ncclResult_t {})", what, text ? text : "no error text", int(result)));
}

const NcclLibrary& nccl() {
  const Loaded& l = loaded();
  if (!l.why.empty()) throw DeviceError(l.why);
  return l.library;
}

}  // namespace tessera
