// One device's pass over a compiled program (Executable::run runs one per local device, each
// on the device's worker thread). It binds the device's input blocks, gives each step's result
// a buffer (its slot in the arena, its block of an all_gather output written in place, or fresh
// memory), and asks the Device for kernel launches, its backend's library kernels for GEMMs and
// attention (jit/library_call.hpp), and the redistribute executor for collectives. The steps themselves are the schedule's: no decisions are made here.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "dsl/array.hpp"
#include "dsl/node.hpp"
#include "codegen/schedule.hpp"
#include "jit/library_call.hpp"

namespace tessera {

class Executable;
class Device;

class DeviceRun {
 public:
  // `received`: per program node, the elements the devices received through it (CommDebugMode).
  // `donor`: per program node, the Input node whose buffer it is written into, or -1
  // (assign_donors, jit/memory_plan.hpp).
  DeviceRun(const Executable& executable, size_t device, std::vector<std::atomic<int64_t>>& received, const std::vector<int>& donor);
  ~DeviceRun();
  DeviceRun(const DeviceRun&) = delete;
  DeviceRun& operator=(const DeviceRun&) = delete;

  void bind_inputs(const std::vector<NodeValue>& inputs);
  // Runs `steps` (every run_step and release_after of the run), or has the device replay their
  // recording (Device::run_steps) where it records runs and the program allows it (Executable's
  // replayable_): the fresh outputs are made first, and the run's buffers are its key.
  void run_steps(const std::function<void()>& steps);
  void run_step(const ScheduledStep& step);
  // Drops the values step `index` was the last to read (MemoryPlan::release_after): their
  // buffers are freed once no other value shares them.
  void release_after(size_t index);
  // One block per program output, never memory that the next run overwrites.
  std::vector<Array> take_outputs();
  // The first index check that failed on this device: {program node + 1, the index}; {0, 0}: none.
  std::pair<int64_t, int64_t> failed_index_check();
  // Waits for the work queued so far (the profiler times a GPU step's work, not its queueing).
  void wait_for_device();

 private:
  // The node's value (an InternalError where it was not made: a schedule out of order).
  Array& value(int node);
  Array output_array(int node);
  // The node's value in the device's memory (copied there once if it is not).
  const Array& on_device(int node);
  // All_gather outputs written in place by their producers: where the group shares host memory.
  bool gathers_in_place() const;
  void run_kernel(const ScheduledStep& step);
  // `call` (its op and operands set) into the node's output array, by the backend's kernel.
  void run_library(LibraryCall& call, int node);
  void run_gemm(const ScheduledStep& step);
  void run_attention(const ScheduledStep& step);
  // An i64 scalar value read on the host (a device value is copied back first).
  int64_t host_scalar(int node);
  void run_grouped_gemm(const ScheduledStep& step);
  void run_redistribute(const ScheduledStep& step);

  const Executable& executable_;
  const size_t device_index_;
  Device& device_;
  const std::vector<int64_t>& params_;
  const std::vector<const void*>& kernel_entries_;
  std::vector<std::atomic<int64_t>>& received_;
  const std::vector<int>& donor_;
  // Per program node: empty until a step makes it and after its last reader (an Array made
  // for each of a program's thousands of nodes on every run cost 0.35 ms a GPT step).
  std::vector<std::optional<Array>> values_;
  std::vector<char> gathered_in_place_;    // per node: an all_gather output in a group buffer
  std::vector<char> made_before_steps_;    // per node: a fresh output made by run_steps
  std::vector<void*> buffers_;             // a kernel's arguments (kept to reuse the memory)
  // memory_stats: the counter this run charges (the device's), and what it holds of the
  // executable's reused memory while it runs (the arena, the status word).
  struct MemoryCounter* counter_ = nullptr;
  int64_t held_between_runs_ = 0;
  std::byte* status_ = nullptr;            // the device's status word, where index checks report
  std::array<const LibraryKernel*, kLibraryOpCount> library_kernels_{};  // looked up on first use
};

}  // namespace tessera
