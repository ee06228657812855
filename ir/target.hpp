// What a program is compiled for: its devices' kind and the settings that change its plan, its
// kernels or its library calls. Made once, where the driver binds a graph to its mesh
// (jit/driver.cpp): TESSERA_DETERMINISTIC is read there and nowhere downstream, so a program's
// partition, kernels, compiler options and GEMMs always agree on it. The partitioner stores it in
// the LocalProgram; lowering, the kernel compilers and the Devices take it from there. (Graph
// nodes also record the mode they were built in, dsl/node.cpp, so a value computed in one mode
// is never reused in the other.)
#pragma once

#include "dsl/device_kind.hpp"

namespace tessera {

struct Target {
  DeviceKind device = DeviceKind::CPU;
  // TESSERA_DETERMINISTIC=1 (dsl/determinism.hpp): no floating-point sum split across devices,
  // reductions in source order, fixed-order GEMMs, no FMA contraction on GPUs.
  bool deterministic = false;
};

}  // namespace tessera
