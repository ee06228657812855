// The backends this process has: one per DeviceKind, each a folder under backend/ (backend/cpu,
// backend/cuda) that fills a Backend and registers it from backend/builtin_backends.cpp. The
// pipeline reaches a device kind's Devices, its library kernels, its device count and its
// device-memory communicators only through this table, so jit/ includes no backend header. A
// new backend is a folder and one line in backend/builtin_backends.cpp (docs/BACKENDS.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "dsl/device_kind.hpp"
#include "dsl/device_name.hpp"
#include "ir/target.hpp"
#include "jit/device.hpp"
#include "jit/library_call.hpp"

namespace tessera {

class ClientGroup;

// Where a Device stands in one executable's run.
struct DevicePlacement {
  int64_t worker = 0;              // the worker thread that drives it (jit/device_workers.hpp)
  int64_t devices_in_run = 1;      // devices the run drives: a CPU device's share of the cores
};

struct Backend {
  DeviceKind kind = DeviceKind::CPU;
  // The loop structures kernels are lowered to for these devices (codegen/lower_kernel.hpp).
  kir::LoopTarget lowering_target = kir::LoopTarget::Cpu;
  // The exact device kernels are compiled for (Target::arch), asked once per process.
  std::function<std::string()> arch;
  // The primitives these devices run as one library kernel; a graph's ops whose primitive is
  // missing here are built from their parts (jit/library_fallback.hpp).
  std::map<LibraryOp, LibraryKernel> library;
  // The Device behind `name`, a name of this kind, running programs compiled for `target`.
  std::function<std::unique_ptr<Device>(const DeviceName& name, const DevicePlacement& placement, const Target& target)>
      make_device;
  // How many devices of this kind the process has; with `wanted` > 0 it first makes sure there
  // are at least that many (virtual devices where the hardware has fewer) or throws DeviceError.
  std::function<int64_t(int64_t wanted)> device_count;
  // The communicators of a group of this kind's devices (their indices, in rank order) that
  // move data in device memory; empty, or no function, where the group goes through the host.
  std::function<std::vector<std::shared_ptr<Communicator>>(const std::vector<int64_t>& devices)> device_group;
  // This client's communicator over device memory for a group of clients with one device each
  // (`device`, this client's member; collective over `clients`): the CUDA backend's NCCL. Null,
  // on every member alike, or no function, where the group goes through the host.
  std::function<std::shared_ptr<Communicator>(ClientGroup& clients, int64_t device)> client_device_group;
};

// Replaces an earlier backend of the same kind.
void register_backend(Backend backend);
// The backend of `kind`; DeviceError naming the kind when this build has none.
const Backend& backend_for(DeviceKind kind);
bool has_backend(DeviceKind kind);

// The Target of programs on `kind`'s devices (ir/target.hpp): the backend's arch and library
// ops, with the determinism the driver read.
Target target_for(DeviceKind kind, bool deterministic);
// The loop structures kernels for `kind`'s devices are lowered to: the backend's, or (a build
// without that backend, planning on an abstract mesh) the kind's natural ones.
kir::LoopTarget lowering_target_for(DeviceKind kind);
// The Target of programs on an abstract mesh of `kind` (abstract_mesh): the backend's library,
// where this build has the backend, and `arch` as given; no device is asked anything.
Target abstract_target(DeviceKind kind, std::string arch, bool deterministic);

// `op`'s kernel on `kind`'s devices; DeviceError naming both when the backend has none.
const LibraryKernel& library_kernel(DeviceKind kind, LibraryOp op);

// The Device behind a mesh device name ("CPU:0", "GPU:1"), for programs compiled for `target`.
std::unique_ptr<Device> make_device(const std::string& name, const DevicePlacement& placement, const Target& target);

// Defined by backend/builtin_backends.cpp: registers every backend this build compiled. The
// table calls it once, before its first lookup.
void register_builtin_backends();

}  // namespace tessera
