// Whether NVRTC is here for a test case that compiles CUDA C. Where it is missing the case is
// skipped (a MESSAGE says why and nvrtc_available() is false), except under
// TESSERA_REQUIRE_NVRTC=1, which the README's test command sets after installing Debian's NVRTC:
// there a missing NVRTC fails the case.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <string_view>

#include "backend/cuda/nvrtc_library.hpp"

inline bool nvrtc_available() {
  if (tessera::NvrtcLibrary::get() != nullptr) return true;
  const char* required = std::getenv("TESSERA_REQUIRE_NVRTC");
  if (required && std::string_view(required) == "1") FAIL("TESSERA_REQUIRE_NVRTC=1: ", tessera::NvrtcLibrary::why_unavailable());
  MESSAGE("skipped: ", tessera::NvrtcLibrary::why_unavailable());
  return false;
}
