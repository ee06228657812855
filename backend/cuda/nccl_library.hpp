// NCCL, loaded at run time: libnccl.so.2 (NVIDIA's, or pip's nvidia-nccl on the library path),
// like the driver and cuBLAS, so one build runs with or without it; only GPU groups spanning
// processes (backend/cuda/nccl_communicator.hpp) need it. $TESSERA_NCCL_LIBRARY (a soname or a
// path) chooses another file, or is "none" for no NCCL. Entry points are declared by
// backend/cuda/cuda_api.hpp.
#pragma once

#include <string>

#include "backend/cuda/cuda_api.hpp"

namespace tessera {

struct NcclLibrary {
  TESSERA_NCCL_FUNCTIONS(TESSERA_DECLARE_API_MEMBER)
  int version = 0;  // ncclGetVersion's code: 22703 for 2.27.3

  // The NCCL that $TESSERA_NCCL_LIBRARY names now (each setting is loaded once); nullptr where
  // it is missing, off, or older than 2.10 (why_unavailable() says which and names the file).
  static const NcclLibrary* get();
  static std::string why_unavailable();

  // Throws CommError "NCCL: <what> failed: <ncclGetErrorString's text>" unless `result` is success.
  void check(ncclResult_t result, const char* what) const;
};

// NCCL, or a DeviceError naming the library and why it is unavailable.
const NcclLibrary& nccl();

}  // namespace tessera
