// hardware_profile(name): the Hardware (dsl/hardware.hpp) a plan's times are predicted
// with. "h100-sxm" and "h200" are published figures; "this-machine" is measured once, by a short
// calibration of this machine's CPU devices (GEMM and vector rates, memory bandwidth, the cost of
// a call, and the in-process collective's latency and bandwidth), and kept as JSON beside the
// compile cache (jit/compile_cache.hpp), so later processes read it instead of measuring. The
// first measurement in a process says so in one line; plan() given a Hardware never measures.
#pragma once

#include <string>

#include "dsl/hardware.hpp"

namespace tessera {

// Error naming the known profiles for an unknown name.
Hardware hardware_profile(const std::string& name);

// A calibration of this machine and how quiet the machine was while it ran.
struct Calibration {
  Hardware hardware;
  // The share of the cores' time other work took meanwhile (plan/other_work_meter.hpp).
  double others_share = 0;

  // Whether nothing else held the cores: other work took under a tenth of their time and the
  // in-process round trip took microseconds. Every calibration is stored for later processes,
  // marked quiet or not; one taken under load is used (with a warning naming the share other
  // work took) until recalibrate_this_machine() measures again.
  bool quiet() const;
};

// A fresh calibration of this machine's CPU device (about a second), cached nowhere: one device
// owning `cores` cores (0: all of them, as a mesh of one device does), its rates measured while
// devices like it fill the machine's other cores, as a mesh's devices run at once.
Calibration calibrate_this_machine(int cores = 0);
int64_t calibrations_taken();  // how many calibrate_this_machine ran in this process (tests)
Hardware measure_this_machine(int cores = 0);  // calibrate_this_machine(cores).hardware

// A calibration of this process's first GPU through Tessera's own kernels and library calls (a
// one-device GPU mesh, some ten seconds): `base`, a published profile (its memory size and its
// links), with the rates this GPU measures: f32 and bf16 GEMMs from 16 to 4096 (small ones
// batched) as a peak and an efficiency curve, f64 GEMMs, fused kernels and special functions
// by dtype, the memory bandwidth (a 512 MiB copy) and the cost of one call, which on a machine
// whose driver calls are slow (a sandboxed one) is most of a small step. Named base's name +
// "-measured"; hardware_to_json stores it. DeviceError where the process has no GPU.
Hardware calibrate_gpu(const Hardware& base);

// "this-machine" measured again now (both its whole-machine and its one-core calibration), for
// the rest of this process and, where the machine was quiet, for later ones: a machine whose
// speed has moved since its profile was cached (a shared one, a new BIOS setting) is predicted
// with what it does now.
Hardware recalibrate_this_machine();

// The profile of one of `devices` CPU devices of a mesh in this process, sharing this machine
// with them (and with the other clients of the job here): "this-machine" for one device, else
// scaled from a calibration of a one-core device by the cores each owns and, where the devices
// outnumber the cores, by the share of a core each gets.
Hardware this_machine_device(int64_t devices);

}  // namespace tessera
