#include "backend/cuda/cuda_graph_runs.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/virtual_gpu.hpp"

namespace tessera {
namespace {

std::atomic<int64_t> recorded_runs{0}, replayed_runs{0};

}  // namespace

bool CudaGraphRuns::enabled() {
  static const bool on = [] {
    const char* value = std::getenv("TESSERA_CUDA_GRAPHS");
    return !value || std::strcmp(value, "0") != 0;
  }();
  return on;
}

CudaGraphRuns::~CudaGraphRuns() {
  const CudaDriver* cu = CudaDriver::get();
  if (!cu) return;
  gpu_.make_current();
  for (const Recording& r : recordings_) cu->cuGraphExecDestroy(r.exec);
}

CUgraphExec CudaGraphRuns::record(const std::function<void()>& steps) {
  const CudaDriver& cu = cuda_driver();
  gpu_.make_current();
  if (cu.cuStreamBeginCapture(gpu_.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) return nullptr;
  CUgraph graph = nullptr;
  bool captured = true;
  try {
    steps();
  } catch (...) {
    captured = false;  // a call capture refuses, or a real error the plain run will raise again
  }
  // Ended whatever happened, so the stream takes work again.
  const CUresult ended = cu.cuStreamEndCapture(gpu_.stream(), &graph);
  CUgraphExec exec = nullptr;
  if (captured && ended == CUDA_SUCCESS && graph && cu.cuGraphInstantiateWithFlags(&exec, graph, 0) != CUDA_SUCCESS)
    exec = nullptr;
  if (graph) cu.cuGraphDestroy(graph);
  if (exec) ++recorded_runs;
  return exec;
}

void CudaGraphRuns::run(const std::vector<const void*>& key, const std::function<void()>& steps) {
  const CudaDriver& cu = cuda_driver();
  auto recording = std::find_if(recordings_.begin(), recordings_.end(), [&](const Recording& r) { return r.key == key; });
  if (recording == recordings_.end()) {
    auto seen = std::find(seen_.begin(), seen_.end(), key);
    if (seen == seen_.end()) {  // first seen: run as it is, remember the key
      steps();
      seen_.push_back(key);
      if (seen_.size() > kKept) seen_.pop_front();
      return;
    }
    seen_.erase(seen);
    if (refused_) {  // a run of this program could not be recorded: none is tried again
      steps();
      return;
    }
    CUgraphExec exec = record(steps);
    if (!exec) {
      // Nothing ran while capturing: the steps run now, as queued (a real error is raised here).
      refused_ = true;
      steps();
      return;
    }
    if (recordings_.size() == kKept) {
      gpu_.make_current();
      cu.cuGraphExecDestroy(recordings_.front().exec);  // its last replay is queued: the driver defers the free
      recordings_.pop_front();
    }
    recordings_.push_back(Recording{key, exec});
    recording = std::prev(recordings_.end());
  } else {
    ++replayed_runs;
  }
  gpu_.make_current();
  cu.check(cu.cuGraphLaunch(recording->exec, gpu_.stream()), "cuGraphLaunch");
}

CudaGraphCounts cuda_graph_counts() { return {recorded_runs.load(), replayed_runs.load()}; }

}  // namespace tessera
