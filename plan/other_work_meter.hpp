// How much of this machine's cores other work took while a measurement ran. A calibration
// (plan/hardware_profiles.cpp) taken beside a build or a test run measures the share of the cores
// it got, not the machine: on this project's 2-core VM one taken beside a CI run cached memory at
// 2.7 GB/s and GEMMs at 20 GFLOP/s (quiet: 5.8 and 40-55), and every later plan was 2-3x slow.
#pragma once

#include "comm/cpu_time_sample.hpp"

namespace tessera {

class OtherWorkMeter {
 public:
  // Starts the interval now.
  OtherWorkMeter() : start_(sample_cpu_time()) {}

  // The share (0 to 1) of all the cores' time since construction that went to work other than
  // this process (comm/cpu_time_sample.hpp's others_share).
  double others_share() const { return tessera::others_share(start_, sample_cpu_time()); }

 private:
  CpuTimeSample start_;
};

}  // namespace tessera
