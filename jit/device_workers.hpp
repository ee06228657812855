// Threads for virtual devices. Work for a set of devices runs on a thread each in parallel (so
// collectives between them can meet), and the caller waits for all of them; the caller itself
// runs the first device's share (with the same floating-point settings). Pool threads are bound
// to CPUs, placed from the caller's CPU on: device i of a call i * (its cores) CPUs on, its
// helpers on the CPUs between, so no two share a core while cores are left.
// Worker threads run with flush-to-zero and denormals-are-zero set: denormals slow kernels by
// orders of magnitude and training produces them (the training steps' small gradients).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/machine_cores.hpp"  // machine_cores(), clients_on_this_machine(): what cores_per_device divides

namespace tessera {

// Runs task(i) for virtual device device_indices[i] on a thread of its own, for every i, and waits.
// The first exception thrown by any task is rethrown here after all tasks have finished.
void run_on_devices(const std::vector<int64_t>& device_indices, const std::function<void(int64_t)>& task);

// From a device's thread: runs part(0..parts-1), part 0 on the calling thread and the others on
// that device's helper threads (its extra cores), and waits.
void run_split(int64_t device, int parts, const std::function<void(int)>& part);

// The cores each of `devices` virtual devices owns: the machine's cores divided among them and
// the other clients on this machine (at least 1); TESSERA_CORES_PER_DEVICE overrides.
int cores_per_device(int64_t devices);

// Overrides the cores each device owns from now on (0: back to TESSERA_CORES_PER_DEVICE / automatic).
void set_cores_per_device(int cores);
int cores_per_device_override();  // what set_cores_per_device last set (0: none)


}  // namespace tessera
