#include "jit/step_profiler.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>

#include "dsl/error.hpp"

namespace tessera {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<ProgramProfile>> profiles;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::atomic<bool> tracing{false};

const ProfileSettings& settings() {
  static const ProfileSettings s = parse_profile_setting(std::getenv("TESSERA_PROFILE"));
  return s;
}

void report_at_exit() {
  std::fputs(profile_report().c_str(), stderr);
  if (settings().trace_path.empty()) return;
  try {
    write_chrome_trace(settings().trace_path);
    std::fprintf(stderr, "TESSERA_PROFILE: trace written to %s (open it in ui.perfetto.dev)\n", settings().trace_path.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "TESSERA_PROFILE: %s\n", e.what());
  }
}

int& profiling_flag() {
  static int flag = [] {
    registry();  // constructed first so that it outlives the exit handler below
    profile_clock();  // the epoch, before any step
    if (settings().enabled) std::atexit(report_at_exit);
    tracing = !settings().trace_path.empty();
    return settings().enabled ? 1 : 0;
  }();
  return flag;
}

}  // namespace

ProfileSettings parse_profile_setting(const char* text) {
  ProfileSettings s;
  const std::string v = text ? text : "";
  s.enabled = !v.empty() && v != "0";
  if (s.enabled && v.size() > 5 && v.ends_with(".json")) s.trace_path = v;
  return s;
}

bool profiling_enabled() { return profiling_flag() != 0; }
void set_profiling(bool enabled) { profiling_flag() = enabled ? 1 : 0; }
bool tracing_enabled() { return tracing.load(std::memory_order_relaxed); }
void set_tracing(bool enabled) { tracing = enabled; }

double profile_clock() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

namespace {
thread_local bool unprofiled = false;
}  // namespace

UnprofiledScope::UnprofiledScope() : previous_(unprofiled) { unprofiled = true; }
UnprofiledScope::~UnprofiledScope() { unprofiled = previous_; }
bool profiling_this_thread() { return profiling_enabled() && !unprofiled; }

ProgramProfile::ProgramProfile(std::string program, std::vector<std::string> step_labels, std::vector<std::string> step_categories,
                               size_t devices)
    : program_(std::move(program)),
      labels_(std::move(step_labels)),
      categories_(std::move(step_categories)),
      devices_(devices),
      seconds_(labels_.size() * devices, 0.0),
      events_(devices) {
  if (categories_.size() != labels_.size())
    throw InternalError("ProgramProfile: " + std::to_string(categories_.size()) + " categories for " + std::to_string(labels_.size()) + " steps");
}

void ProgramProfile::clear() {
  std::fill(seconds_.begin(), seconds_.end(), 0.0);
  for (auto& device_events : events_) device_events.clear();
  runs_ = 0;
}

std::shared_ptr<ProgramProfile> register_profile(std::string program, std::vector<std::string> step_labels,
                                                 std::vector<std::string> step_categories, size_t devices) {
  auto p = std::make_shared<ProgramProfile>(std::move(program), std::move(step_labels), std::move(step_categories), devices);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.profiles.push_back(p);
  return p;
}

std::string profile_report() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  // Programs by the time they took in all (a training step before its one-off initialisers).
  auto time_of = [](const ProgramProfile& p) {
    double sum = 0;
    for (size_t s = 0; s < p.labels().size(); ++s)
      for (size_t d = 0; d < p.devices(); ++d) sum += p.seconds(s, d);
    return sum;
  };
  std::vector<std::shared_ptr<ProgramProfile>> programs = r.profiles;
  std::stable_sort(programs.begin(), programs.end(), [&](const auto& a, const auto& b) { return time_of(*a) > time_of(*b); });
  std::string out;
  for (const auto& p : programs) {
    if (p->runs() == 0) continue;
    // A step's cost is its slowest device: the others wait for it at the next collective.
    std::vector<double> slowest(p->labels().size(), 0.0);
    for (size_t s = 0; s < slowest.size(); ++s)
      for (size_t d = 0; d < p->devices(); ++d) slowest[s] = std::max(slowest[s], p->seconds(s, d));
    const double total = std::accumulate(slowest.begin(), slowest.end(), 0.0);
    std::vector<size_t> order(slowest.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return slowest[a] > slowest[b]; });
    std::string per_device;
    for (size_t d = 0; d < p->devices(); ++d) {
      double sum = 0;
      for (size_t s = 0; s < slowest.size(); ++s) sum += p->seconds(s, d);
      per_device += fmt::format("{}{:.3f}", d ? ", " : "", 1e3 * sum / double(p->runs()));
    }
    out += fmt::format("profile of {}: {} runs on {} devices, {:.3f} ms per run in steps (slowest device of each; "
                       "per device {} ms)\n", p->program(), p->runs(), p->devices(), 1e3 * total / double(p->runs()), per_device);
    for (size_t s : order) {
      // The fastest device's time too: a collective's spread is mostly waiting for the others.
      double fastest = slowest[s];
      for (size_t d = 0; d < p->devices(); ++d) fastest = std::min(fastest, p->seconds(s, d));
      out += fmt::format("  {:6.3f} ms {:5.1f}%  (fastest device {:6.3f})  step {:<3} {}\n", 1e3 * slowest[s] / double(p->runs()),
                         total > 0 ? 100.0 * slowest[s] / total : 0.0, 1e3 * fastest / double(p->runs()), s, p->labels()[s]);
    }
  }
  return out;
}

void reset_profiles() {  // timings and trace events
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& p : r.profiles) p->clear();
}

std::string chrome_trace_json() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  nlohmann::json events = nlohmann::json::array();
  size_t tracks = 0;
  for (const auto& p : r.profiles) {
    tracks = std::max(tracks, p->devices());
    for (size_t d = 0; d < p->devices(); ++d)
      for (const ProgramProfile::Event& e : p->events(d))
        events.push_back({{"name", p->labels()[e.step]},
                          {"cat", p->categories()[e.step]},
                          {"ph", "X"},
                          {"ts", 1e6 * e.start},
                          {"dur", 1e6 * e.seconds},
                          {"pid", 0},
                          {"tid", d},
                          {"args", {{"program", p->program()}, {"step", e.step}}}});
  }
  for (size_t d = 0; d < tracks; ++d)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", d}, {"args", {{"name", fmt::format("device {}", d)}}}});
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void write_chrome_trace(const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IOError("TESSERA_PROFILE: cannot write the trace to '" + path + "'");
  out << chrome_trace_json();
  if (!out.flush()) throw IOError("TESSERA_PROFILE: writing the trace to '" + path + "' failed");
}

}  // namespace tessera
