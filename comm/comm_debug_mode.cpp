#include "comm/comm_debug_mode.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace tessera {

struct CommDebugMode::Tally {
  std::map<std::string, int64_t> calls, bytes;
};

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::shared_ptr<CommDebugMode::Tally>>& active_tallies() {
  static std::vector<std::shared_ptr<CommDebugMode::Tally>> tallies;
  return tallies;
}

}  // namespace

CommDebugMode::CommDebugMode() : tally_(std::make_shared<Tally>()) {
  std::lock_guard lock(registry_mutex());
  active_tallies().push_back(tally_);
}

CommDebugMode::~CommDebugMode() {
  std::lock_guard lock(registry_mutex());
  std::erase(active_tallies(), tally_);
}

std::map<std::string, int64_t> CommDebugMode::counts() const {
  std::lock_guard lock(registry_mutex());
  return tally_->calls;
}

std::map<std::string, int64_t> CommDebugMode::bytes_by_kind() const {
  std::lock_guard lock(registry_mutex());
  return tally_->bytes;
}

int64_t CommDebugMode::total_bytes() const {
  std::lock_guard lock(registry_mutex());
  int64_t total = 0;
  for (const auto& [kind, n] : tally_->bytes) total += n;
  return total;
}

int64_t CommDebugMode::total_count() const {
  std::lock_guard lock(registry_mutex());
  int64_t total = 0;
  for (const auto& [kind, n] : tally_->calls) total += n;
  return total;
}

void record_collective(std::string_view kind, int64_t bytes) {
  std::lock_guard lock(registry_mutex());
  for (auto& tally : active_tallies()) {
    tally->calls[std::string(kind)] += 1;
    tally->bytes[std::string(kind)] += bytes;
  }
}

}  // namespace tessera
