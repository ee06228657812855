// Runs of a compiled program on one GPU device recorded as CUDA graphs and replayed: a replay is
// one cuGraphLaunch where the run queued every kernel and GEMM with its own launch (a 20-op call
// spent 41-51 us of host time so). A recording is only valid for the buffers it was recorded
// with (kernels take their buffers' addresses by value), so each is kept under its run's key:
// every address the run's steps touch. A run whose key was seen in the previous runs but has no
// recording is recorded (stream capture) and replayed; a key seen for the first time just runs,
// so programs whose buffers move every call never pay for a capture. A training loop's buffers
// alternate (each step's new parameters are the next step's inputs), so a few are kept.
// A run whose capture fails (a call capture refuses) runs as queued, and the program's runs on
// this device are not recorded again. Buffers must not be freed into the device's stream by
// another thread while a run is recorded (a host program dropping tensors on one thread while
// another runs a program on the same GPU device). TESSERA_CUDA_GRAPHS=0 turns recording off.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_api.hpp"

namespace tessera {

class VirtualGpu;

class CudaGraphRuns {
 public:
  explicit CudaGraphRuns(VirtualGpu& gpu) : gpu_(gpu) {}
  ~CudaGraphRuns();
  CudaGraphRuns(const CudaGraphRuns&) = delete;
  CudaGraphRuns& operator=(const CudaGraphRuns&) = delete;

  // Whether runs are recorded at all (TESSERA_CUDA_GRAPHS, read once).
  static bool enabled();

  // Queues `steps` (all of one run's work, on the device's stream, touching exactly the buffers
  // `key` names) or the replay of their recording under `key`. `steps` may be called twice in
  // one run (a failed capture, then as queued): it must redo the run from its start.
  void run(const std::vector<const void*>& key, const std::function<void()>& steps);

 private:
  struct Recording {
    std::vector<const void*> key;
    CUgraphExec exec = nullptr;
  };
  static constexpr size_t kKept = 4;  // recordings (and keys seen) per device, most recent last

  // The steps recorded and instantiated, or null where capture failed (nothing ran then).
  CUgraphExec record(const std::function<void()>& steps);

  VirtualGpu& gpu_;
  std::deque<Recording> recordings_;
  std::deque<std::vector<const void*>> seen_;
  bool refused_ = false;  // a capture failed: run as queued from then on
};

// Process-wide counts, for tests and benchmarks: runs recorded and runs replayed.
struct CudaGraphCounts {
  int64_t recorded = 0;
  int64_t replayed = 0;
};
CudaGraphCounts cuda_graph_counts();

}  // namespace tessera
