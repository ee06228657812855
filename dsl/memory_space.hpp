// Where a buffer lives. Host memory is what Arrays read and write directly; device memory (a
// GPU's) is reached only through its Device (jit/device.hpp): copies, kernels, GEMMs.
#pragma once

#include <string_view>

namespace tessera {

enum class MemorySpace { Host, Cuda };

constexpr std::string_view memory_space_name(MemorySpace space) {
  return space == MemorySpace::Host ? "host" : "cuda";
}

}  // namespace tessera
