#include "comm/collective_recorder.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace tessera {

struct CollectiveRecorder::Log {
  std::vector<CollectiveRecord> records;
};

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::shared_ptr<CollectiveRecorder::Log>>& open_logs() {
  static std::vector<std::shared_ptr<CollectiveRecorder::Log>> logs;
  return logs;
}
std::atomic<int> open_count{0};

}  // namespace

CollectiveRecorder::CollectiveRecorder() : log_(std::make_shared<Log>()) {
  std::lock_guard lock(registry_mutex());
  open_logs().push_back(log_);
  ++open_count;
}

CollectiveRecorder::~CollectiveRecorder() {
  std::lock_guard lock(registry_mutex());
  std::erase(open_logs(), log_);
  --open_count;
}

std::vector<CollectiveRecord> CollectiveRecorder::records() const {
  std::lock_guard lock(registry_mutex());
  return log_->records;
}

size_t CollectiveRecorder::size() const {
  std::lock_guard lock(registry_mutex());
  return log_->records.size();
}

void record_collective(const CollectiveRecord& record) {
  std::lock_guard lock(registry_mutex());
  for (auto& log : open_logs()) log->records.push_back(record);
}

bool collective_recording_active() { return open_count.load(std::memory_order_relaxed) > 0; }

}  // namespace tessera
