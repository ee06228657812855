// How much of this machine's cores other work took while a measurement ran. A calibration
// (jit/hardware_profiles.cpp) taken beside a build or a test run measures the share of the cores
// it got, not the machine: on this project's 2-core VM one taken beside a CI run cached memory at
// 2.7 GB/s and GEMMs at 20 GFLOP/s (quiet: 5.8 and 40-55), and every later plan was 2-3x slow.
#pragma once

#include <cstdint>

namespace tessera {

class OtherWorkMeter {
 public:
  // Starts the interval now.
  OtherWorkMeter();

  // The share (0 to 1) of all the cores' time since construction that went to work other than
  // this process: other processes' user and system time, interrupts, and a virtual machine's
  // steal time (its host running other guests). From /proc/stat less this process's CPU time
  // (getrusage); 0 where /proc/stat cannot be read. (In a container, /proc/stat counts the
  // host's cores: other containers' work counts too.)
  double others_share() const;

 private:
  struct Sample {
    int64_t busy_ticks = 0, total_ticks = 0;  // all cores, in clock ticks (/proc/stat)
    double own_seconds = 0;                   // this process's threads, user and system
    bool valid = false;
  };
  static Sample sample();

  Sample start_;
};

}  // namespace tessera
