// Where this machine's cores' time went: every core's busy and total time (/proc/stat) and this
// process's own (getrusage). Two samples give the share of the cores that other work took between
// them: a calibration taken beside other work (plan/other_work_meter.hpp), and waits that should
// sleep sooner while other processes need the cores (comm/machine_load.hpp).
#pragma once

#include <cstdint>

namespace tessera {

struct CpuTimeSample {
  int64_t busy_ticks = 0, total_ticks = 0;  // all cores, in clock ticks (/proc/stat)
  double own_seconds = 0;                   // this process's threads, user and system
  bool valid = false;                       // false where /proc/stat cannot be read
};

CpuTimeSample sample_cpu_time();

// The share (0 to 1) of all the cores' time between the samples that went to work other than
// this process: other processes' user and system time, interrupts, and a virtual machine's steal
// time (its host running other guests). 0 when either sample is invalid or no tick passed. (In a
// container, /proc/stat counts the host's cores: other containers' work counts too.)
double others_share(const CpuTimeSample& from, const CpuTimeSample& to);

}  // namespace tessera
