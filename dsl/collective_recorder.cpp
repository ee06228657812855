#include "dsl/collective_recorder.hpp"

#include "dsl/live_registry.hpp"

namespace tessera {

struct CollectiveRecorder::Log {
  std::vector<CollectiveRecord> records;
};

namespace {

LiveRegistry<CollectiveRecorder::Log>& recorders() {
  static auto& registry = *new LiveRegistry<CollectiveRecorder::Log>();  // used until the last thread ends
  return registry;
}

}  // namespace

CollectiveRecorder::CollectiveRecorder() : log_(recorders().open()) {}

CollectiveRecorder::~CollectiveRecorder() { recorders().close(log_); }

std::vector<CollectiveRecord> CollectiveRecorder::records() const {
  return recorders().read(*log_, [](const Log& log) { return log.records; });
}

size_t CollectiveRecorder::size() const {
  return recorders().read(*log_, [](const Log& log) { return log.records.size(); });
}

void record_collective(const CollectiveRecord& record) {
  recorders().for_each_open([&](CollectiveRecorder::Log& log) { log.records.push_back(record); });
}

bool collective_recording_active() { return recorders().any_open(); }

}  // namespace tessera
