// What this machine offers a job: its cores, and how many of the job's clients share them
// (mpirun's local size). Read once per process; the wait policy (comm/machine_load.hpp), the
// devices' threads (jit/device_workers.hpp) and this machine's hardware profile
// (plan/hardware_profiles.cpp) all divide the same cores.
#pragma once

namespace tessera {

// std::thread::hardware_concurrency(), at least 1.
int machine_cores();
// OMPI_COMM_WORLD_LOCAL_SIZE, at least 1 (1 outside mpirun).
int clients_on_this_machine();

}  // namespace tessera
