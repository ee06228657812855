// Byte views of untyped buffers: communicators move untyped data and offset it in bytes.
#pragma once

#include <cstddef>

namespace tessera {

inline const std::byte* bytes(const void* p) { return static_cast<const std::byte*>(p); }
inline std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }

}  // namespace tessera
