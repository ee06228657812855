// What a program is compiled for: its devices' kind, what their backend offers, and the
// settings that change its plan, its kernels or its library calls. Made once, where the driver
// binds a graph to its mesh (jit/driver.cpp, from the backend's description:
// jit/backend_registry.hpp): TESSERA_DETERMINISTIC is read there and nowhere downstream, so a
// program's partition, kernels, compiler options and GEMMs always agree on it. The partitioner
// stores it in the LocalProgram; lowering, the kernel compilers and the Devices take it from
// there. (Graph nodes also record the mode they were built in, dsl/node.cpp, so a value computed
// in one mode is never reused in the other.)
#pragma once

#include <string>

#include "dsl/device_kind.hpp"
#include "ir/library_op.hpp"

namespace tessera {

struct Target {
  DeviceKind device = DeviceKind::CPU;
  // TESSERA_DETERMINISTIC=1 (dsl/determinism.hpp): no floating-point sum split across devices,
  // reductions in source order, fixed-order GEMMs, no FMA contraction on GPUs.
  bool deterministic = false;
  // The exact device the kernels are compiled for, in its backend's words: LLVM's name of the
  // host CPU ("znver3"), a GPU's "sm_90". Programs for different ones are different programs.
  std::string arch;
  // The primitives the backend runs as one library kernel; the others are built from their parts.
  LibraryOpSet library;

  bool runs(LibraryOp op) const { return library.contains(op); }
  // "CPU znver3", "GPU sm_90 deterministic": for explain() and logs.
  std::string to_string() const;
};

}  // namespace tessera
