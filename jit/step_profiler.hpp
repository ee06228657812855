// TESSERA_PROFILE=1: every compiled program times each of its steps on every device, and at exit
// a table says where the time went (one row per step, as explain() names it, summed over calls).
// The timers cost two clock reads per step and are off unless asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

bool profiling_enabled();        // TESSERA_PROFILE, read once
void set_profiling(bool enabled);  // for tests and benchmarks

// While one lives, the programs this thread runs stay out of the profile: the planner's
// calibration of this machine (jit/hardware_profiles.hpp) runs programs that are not the user's.
class UnprofiledScope {
 public:
  UnprofiledScope();
  ~UnprofiledScope();
  UnprofiledScope(const UnprofiledScope&) = delete;
  UnprofiledScope& operator=(const UnprofiledScope&) = delete;

 private:
  bool previous_;
};
// profiling_enabled(), and no UnprofiledScope on this thread.
bool profiling_this_thread();

// The timings of one program's steps. Each device adds only to its own slots and runs of one
// program are serialised, so no locking on the hot path.
class ProgramProfile {
 public:
  ProgramProfile(std::string program, std::vector<std::string> step_labels, size_t devices);
  void add(size_t step, size_t device, double seconds) { seconds_[step * devices_ + device] += seconds; }
  void count_run() { ++runs_; }
  void clear();

  const std::string& program() const { return program_; }
  const std::vector<std::string>& labels() const { return labels_; }
  int64_t runs() const { return runs_; }
  double seconds(size_t step, size_t device) const { return seconds_[step * devices_ + device]; }
  size_t devices() const { return devices_; }

 private:
  std::string program_;
  std::vector<std::string> labels_;
  size_t devices_;
  std::vector<double> seconds_;
  int64_t runs_ = 0;
};

// A new profile, kept for the report (profiles live until exit).
std::shared_ptr<ProgramProfile> register_profile(std::string program, std::vector<std::string> step_labels, size_t devices);

// Programs by total time; per program its steps by time (the slowest device's, and the
// fastest's), with ms per run and share.
std::string profile_report();
void reset_profiles();  // zero every profile's timings

}  // namespace tessera
