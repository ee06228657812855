// NVRTC, loaded at run time: libnvrtc.so.13, .12 or .11.2 (Debian's libnvrtc11.2 package, CUDA
// 11.8's, which targets sm_90), whichever the machine has first. Compiling needs no GPU and no
// driver, so CI compiles every generated kernel with it. $TESSERA_NVRTC_LIBRARY (a soname or a
// path) chooses one where a machine has several, or is "none" for no NVRTC. Entry points are
// declared by backend/cuda/cuda_api.hpp.
#pragma once

#include <string>

#include "backend/cuda/cuda_api.hpp"

namespace tessera {

struct NvrtcLibrary {
  TESSERA_NVRTC_FUNCTIONS(TESSERA_DECLARE_API_MEMBER)

  // The process's NVRTC, loaded on first use; nullptr where there is none (why_unavailable()).
  static const NvrtcLibrary* get();
  static std::string why_unavailable();
};

// NVRTC, or a DeviceError naming why there is none.
const NvrtcLibrary& nvrtc();

}  // namespace tessera
