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

LoadedLibrary<NcclLibrary> load_nccl(const std::string& chosen) {
  LoadedLibrary<NcclLibrary> out;
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
  if (!TESSERA_RESOLVE_API(TESSERA_NCCL_FUNCTIONS, out.table, handle, name, out.why)) return out;
  if (out.table.ncclGetVersion(&out.table.version) != ncclSuccess || out.table.version < kOldestVersion)
    out.why = fmt::format("NCCL ({}) is version code {}; Tessera needs 2.10 or newer", name, out.table.version);
  return out;
}

// Keyed by the setting, so a test (or a program) that changes it sees the other library.
const LoadedLibrary<NcclLibrary>& loaded_nccl() {
  static std::mutex mutex;
  static auto* by_setting = new std::map<std::string, LoadedLibrary<NcclLibrary>>();
  const char* setting = std::getenv("TESSERA_NCCL_LIBRARY");
  const std::string chosen = setting ? setting : "";
  std::lock_guard lock(mutex);
  auto it = by_setting->find(chosen);
  if (it == by_setting->end()) it = by_setting->emplace(chosen, load_nccl(chosen)).first;
  return it->second;
}

}  // namespace

const NcclLibrary* NcclLibrary::get() { return loaded_nccl().why.empty() ? &loaded_nccl().table : nullptr; }

std::string NcclLibrary::why_unavailable() { return loaded_nccl().why; }

void NcclLibrary::check(ncclResult_t result, const char* what) const {
  if (result == ncclSuccess) return;
  const char* text = ncclGetErrorString(result);
  throw CommError(fmt::format("NCCL: {} failed: {} (ncclResult_t {})", what, text ? text : "no error text", int(result)));
}

const NcclLibrary& nccl() {
  const LoadedLibrary<NcclLibrary>& l = loaded_nccl();
  if (!l.why.empty()) throw DeviceError(l.why);
  return l.table;
}

}  // namespace tessera
