// An Executable: a partitioned, scheduled and compiled program. Running it dispatches ONE task to
// every device's worker thread, which walks the flat step list (kernels, GEMMs, redistribute
// steps) with a DeviceRun that asks the device's Device for each; collectives inside the steps
// keep the devices in step. No per-op host work.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "codegen/schedule.hpp"
#include "comm/communicator.hpp"
#include "jit/device.hpp"
#include "jit/memory_plan.hpp"
#include "jit/step_profiler.hpp"
#include "ir/local_program.hpp"

namespace tessera {

class Executable {
 public:
  // `fingerprint`: the canonical hash of the graph it was built from; clients sharing a mesh
  // compare it before the first collective (a mismatch raises CommError on all of them).
  explicit Executable(LocalProgram program, uint64_t fingerprint = 0);

  // The nodes of the graph being run that its collectives are reported at (CommDebugMode):
  // {program node, node}. A cached executable's program().nodes[i].origin belongs to whichever
  // graph built it (another line or module, same structure); collectives not listed use it.
  // Origins, not nodes: a jit function keeps them for its whole life, and nodes would keep the
  // traced graph, and the values its first call read, alive with it.
  using CollectiveOrigins = std::vector<std::pair<int, NodeOrigin>>;

  // inputs[k] is the value of program().inputs[k]; returns one value per program output.
  // made_by: the function or module whose jit runs it, the name TESSERA_PROFILE gives its timings
  // (identical programs of two functions share one executable, and keep a profile each).
  // donated[k]: input k's buffers may be written over by outputs (MemoryPlan::donors); its value
  // must then be read by no one after the run.
  std::vector<NodeValue> run(const std::vector<NodeValue>& inputs, const CollectiveOrigins& origins = {},
                             const std::string& made_by = {}, const std::vector<bool>& donated = {}) const;

  const LocalProgram& program() const { return program_; }
  const Schedule& schedule() const { return schedule_; }
  const MemoryPlan& memory_plan() const { return memory_; }
  int64_t kernel_count() const { return int64_t(schedule_.kernels.size()); }  // distinct kernels (steps may share one)
  // Under TESSERA_PROFILE (or set_profiling): the measured time of each step on each device,
  // summed over the runs made by `made_by` (empty: by the first function that ran it); null
  // before its first profiled run.
  std::shared_ptr<const ProgramProfile> profile(const std::string& made_by = {}) const;

 private:
  friend class DeviceRun;  // one device's pass over the steps reads the plan, arenas and communicators
  void check_fingerprints() const;
  bool runs_replayable() const;
  ProgramProfile* profile_for_run(const std::string& made_by) const;  // TESSERA_PROFILE: this program's step timings

  LocalProgram program_;
  uint64_t fingerprint_ = 0;
  mutable bool fingerprint_checked_ = false;
  Schedule schedule_;
  std::vector<std::vector<const void*>> kernel_entries_;  // per device: its load_kernels()
  std::vector<int64_t> workers_;
  MemoryPlan memory_;
  // TESSERA_PROFILE: per function that ran it, created on its first profiled run.
  mutable std::mutex profiles_mutex_;
  mutable std::vector<std::pair<std::string, std::shared_ptr<ProgramProfile>>> profiles_;
  mutable std::vector<std::shared_ptr<std::byte[]>> arenas_;  // per device; runs are serialised
  bool checks_indices_ = false;  // some kernel checks indices (dsl/index_check.hpp)
  // A run may be recorded and replayed whole (Device::run_steps): no collective, and fresh memory
  // for program outputs only (no value freed while the steps run).
  bool replayable_ = false;
  mutable std::vector<std::shared_ptr<std::byte[]>> status_words_;  // per device, where they report
  std::vector<std::vector<int64_t>> coords_;
  std::vector<std::string> device_names_;
  std::vector<struct MemoryCounter*> memory_counters_;  // per local device: what its runs hold (memory_stats)
  std::vector<std::unique_ptr<Device>> devices_;  // per local device
  std::vector<std::vector<std::shared_ptr<Communicator>>> communicators_;  // per mesh dim
  // Per mesh dim, the same groups over device memory (GPU meshes in one process); empty where
  // device values move through host memory (jit/mesh_communicators.hpp).
  std::vector<std::vector<std::shared_ptr<Communicator>>> device_communicators_;
  // Values gathered in place (memory_.in_gather), per device and node: where this device's block
  // starts in the gathered output, in elements.
  struct GatherBlock {
    int64_t offset = 0;
  };
  std::vector<std::vector<GatherBlock>> gather_blocks_;
};

}  // namespace tessera
