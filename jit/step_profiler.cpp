#include "jit/step_profiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>

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

int& profiling_flag() {
  static int flag = [] {
    const char* v = std::getenv("TESSERA_PROFILE");
    const bool on = v && *v && std::string(v) != "0";
    registry();  // constructed first so that it outlives the exit handler below
    if (on) std::atexit([] { std::fputs(profile_report().c_str(), stderr); });
    return on ? 1 : 0;
  }();
  return flag;
}

}  // namespace

bool profiling_enabled() { return profiling_flag() != 0; }
void set_profiling(bool enabled) { profiling_flag() = enabled ? 1 : 0; }

namespace {
thread_local bool unprofiled = false;
}  // namespace

UnprofiledScope::UnprofiledScope() : previous_(unprofiled) { unprofiled = true; }
UnprofiledScope::~UnprofiledScope() { unprofiled = previous_; }
bool profiling_this_thread() { return profiling_enabled() && !unprofiled; }

ProgramProfile::ProgramProfile(std::string program, std::vector<std::string> step_labels, size_t devices)
    : program_(std::move(program)), labels_(std::move(step_labels)), devices_(devices), seconds_(labels_.size() * devices, 0.0) {}

void ProgramProfile::clear() {
  std::fill(seconds_.begin(), seconds_.end(), 0.0);
  runs_ = 0;
}

std::shared_ptr<ProgramProfile> register_profile(std::string program, std::vector<std::string> step_labels, size_t devices) {
  auto p = std::make_shared<ProgramProfile>(std::move(program), std::move(step_labels), devices);
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

void reset_profiles() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& p : r.profiles) p->clear();
}

}  // namespace tessera
