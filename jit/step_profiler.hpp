// TESSERA_PROFILE=1: every compiled program times each of its steps on every device, and at exit
// a table says where the time went (one row per step, as explain() names it, summed over calls),
// each program named by the function or module whose jit made it (jit/jit_function.hpp).
// TESSERA_PROFILE=FILE.json: the table, and every profiled step as a Chrome trace event written to
// FILE.json at exit: one track per device, kernels, library calls (GEMMs, attention) and
// collectives by category, for Perfetto (ui.perfetto.dev) or chrome://tracing.
// The timers cost two clock reads per step and are off unless asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

struct ProfileSettings {
  bool enabled = false;
  std::string trace_path;  // empty: no trace
};
// TESSERA_PROFILE's value: unset, empty or "0" off; a path ending in ".json" the table and that
// trace; anything else the table.
ProfileSettings parse_profile_setting(const char* text);

bool profiling_enabled();        // TESSERA_PROFILE, read once
void set_profiling(bool enabled);  // for tests and benchmarks
bool tracing_enabled();          // whether profiled steps are kept as trace events
void set_tracing(bool enabled);  // for tests (TESSERA_PROFILE=FILE.json sets it)
double profile_clock();          // seconds since the process's first profiled step

// While one lives, the programs this thread runs stay out of the profile: the planner's
// calibration of this machine (plan/hardware_profiles.hpp) runs programs that are not the user's.
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
  // step_categories: per step, "kernel", "library" or "collective" (the trace's categories).
  ProgramProfile(std::string program, std::vector<std::string> step_labels, std::vector<std::string> step_categories, size_t devices);
  // A step that started at `start` (profile_clock) and took `seconds` on `device`.
  void add(size_t step, size_t device, double start, double seconds) {
    seconds_[step * devices_ + device] += seconds;
    if (tracing_enabled() && events_[device].size() < kMaxEventsPerDevice) events_[device].push_back({uint32_t(step), start, seconds});
  }
  void count_run() { ++runs_; }
  void clear();

  const std::string& program() const { return program_; }
  const std::vector<std::string>& labels() const { return labels_; }
  const std::vector<std::string>& categories() const { return categories_; }
  struct Event {
    uint32_t step;
    double start, seconds;
  };
  const std::vector<Event>& events(size_t device) const { return events_[device]; }
  // A trace keeps the first events of a long run: about 64 MB of JSON per device.
  static constexpr size_t kMaxEventsPerDevice = 500000;
  int64_t runs() const { return runs_; }
  double seconds(size_t step, size_t device) const { return seconds_[step * devices_ + device]; }
  size_t devices() const { return devices_; }

 private:
  std::string program_;
  std::vector<std::string> labels_, categories_;
  size_t devices_;
  std::vector<double> seconds_;
  std::vector<std::vector<Event>> events_;  // per device: each device appends to its own
  int64_t runs_ = 0;
};

// A new profile, kept for the report (profiles live until exit).
std::shared_ptr<ProgramProfile> register_profile(std::string program, std::vector<std::string> step_labels,
                                                 std::vector<std::string> step_categories, size_t devices);

// Programs by total time; per program its steps by time (the slowest device's, and the
// fastest's), with ms per run and share.
std::string profile_report();
void reset_profiles();  // zero every profile's timings and events

// Every program's trace events in the Chrome trace-event format (JSON): complete events ("X") in
// microseconds, one track (tid) per device of the mesh a program runs on, named "device d".
std::string chrome_trace_json();
void write_chrome_trace(const std::string& path);  // IOError naming the path when it cannot be written

}  // namespace tessera
