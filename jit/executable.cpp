#include "jit/executable.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <map>
#include <vector>

#include "dsl/collective_recorder.hpp"
#include "dsl/error.hpp"
#include "dsl/index_check.hpp"
#include "dsl/memory_counter.hpp"
#include "dsl/string_util.hpp"
#include "jit/backend_registry.hpp"
#include "jit/device_run.hpp"
#include "jit/device_workers.hpp"
#include "jit/step_description.hpp"
#include "jit/kernel_runner.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/program_plan.hpp"
#include "jit/redistribute_executor.hpp"
#include "jit/runtime.hpp"

namespace tessera {

Executable::Executable(LocalProgram program, uint64_t fingerprint) : program_(std::move(program)), fingerprint_(fingerprint) {
  if (program_.mesh.is_abstract())
    throw MeshError("a program on an abstract mesh cannot run: its devices do not exist in this process (abstract_mesh "
                    "plans programs with step.plan(args...); run them on a real mesh)");
  schedule_ = schedule_program(program_, lowering_target(program_.mesh));
  memory_ = plan_memory(program_, schedule_);
  mark_donor_buffers(schedule_, memory_);  // before the kernels compile
  const Mesh& mesh = program_.mesh;
  workers_ = mesh_worker_indices(mesh);
  coords_ = local_device_coords(mesh);
  device_names_ = mesh.local_devices();
  for (const std::string& name : device_names_) memory_counters_.push_back(&memory_counter(name));
  std::map<std::string, std::vector<const void*>> loaded;  // by kernel home: devices sharing one load once
  for (size_t d = 0; d < workers_.size(); ++d) {
    devices_.push_back(make_device(device_names_[d], DevicePlacement{workers_[d], int64_t(workers_.size())}, program_.target));
    auto [it, fresh] = loaded.try_emplace(devices_[d]->kernel_home());
    if (fresh && !schedule_.kernels.empty()) it->second = devices_[d]->load_kernels(schedule_.kernels);
    kernel_entries_.push_back(it->second);
  }
  communicators_.resize(mesh.ndim());
  device_communicators_.resize(mesh.ndim());
  for (const auto& step : schedule_.steps)
    if (step.kind == ScheduledStep::Kind::Redistribute) {
      const RedistributeStep& r = program_.nodes[step.node].step;
      if (is_collective(r.kind) && communicators_[r.mesh_dim].empty()) {
        communicators_[r.mesh_dim] = mesh_dim_communicators(mesh, r.mesh_dim);
        device_communicators_[r.mesh_dim] = mesh_dim_device_communicators(mesh, r.mesh_dim);
      }
    }
  arenas_.resize(workers_.size());
  status_words_.resize(workers_.size());
  for (const kir::Kernel& k : schedule_.kernels) checks_indices_ |= k.status_buffer >= 0;
  replayable_ = runs_replayable();
  gather_blocks_.assign(workers_.size(), std::vector<GatherBlock>(program_.nodes.size()));
  for (size_t node = 0; node < program_.nodes.size(); ++node) {
    const int gather = memory_.in_gather[node];
    if (gather < 0) continue;
    const LocalNode& g = program_.nodes[gather];
    for (size_t d = 0; d < workers_.size(); ++d) {
      GatherBlock& block = gather_blocks_[d][node];
      block.offset = all_gather_own_block_offset(g.step, g.global_shape, coords_[d]);
    }
  }
}

bool Executable::runs_replayable() const {
  std::vector<bool> is_output(program_.nodes.size(), false);
  for (int o : program_.outputs) is_output[size_t(o)] = true;
  for (const ScheduledStep& step : schedule_.steps) {
    if (step.kind == ScheduledStep::Kind::Redistribute) return false;
    for (int node : step.outputs)
      if (memory_.offset[size_t(node)] < 0 && (!is_output[size_t(node)] || memory_.in_gather[size_t(node)] >= 0)) return false;
  }
  return true;
}

ProgramProfile* Executable::profile_for_run(const std::string& made_by) const {
  std::lock_guard lock(profiles_mutex_);
  auto it = std::find_if(profiles_.begin(), profiles_.end(), [&](const auto& p) { return p.first == made_by; });
  if (it == profiles_.end()) {
    std::vector<std::string> labels, categories;
    for (const ScheduledStep& step : schedule_.steps) {
      // Where the step's op was built: the user's line (dsl/user_frame.hpp), as explain() prints it.
      labels.push_back(describe_step(*this, step, 0) + "  @" + program_.nodes[size_t(step.node)].origin.location);
      categories.push_back(step.kind == ScheduledStep::Kind::Redistribute ? "collective"
                           : step.kind == ScheduledStep::Kind::Kernel     ? "kernel"
                                                                          : "library");
    }
    const std::string program = fmt::format("program {:016x} on mesh {}", fingerprint_, program_.mesh.to_string());
    profiles_.emplace_back(made_by, register_profile(made_by.empty() ? program : made_by + " (" + program + ")", std::move(labels),
                                                     std::move(categories), workers_.size()));
    it = std::prev(profiles_.end());
  }
  it->second->count_run();
  return it->second.get();
}

std::shared_ptr<const ProgramProfile> Executable::profile(const std::string& made_by) const {
  std::lock_guard lock(profiles_mutex_);
  for (const auto& [name, p] : profiles_)
    if (name == made_by || made_by.empty()) return p;
  return nullptr;
}

void Executable::check_fingerprints() const {
  fingerprint_checked_ = true;
  if (program_.mesh.num_local_devices() == program_.mesh.size()) return;  // one client: nothing to compare
  // Among the mesh's clients only: a mesh over some clients (a pipeline stage) runs without the others.
  const std::vector<int> clients = clients_of(program_.mesh);
  std::vector<uint64_t> all;
  if (int(clients.size()) == num_clients()) {
    all = gather_from_clients(fingerprint_);  // with the world barrier that reports a missing client
  } else {
    for (int64_t f : gather_among_clients(clients, {int64_t(fingerprint_)})) all.push_back(uint64_t(f));
  }
  std::vector<std::string> differ;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(std::to_string(clients[r]));
  if (!differ.empty())
    throw CommError(fmt::format("clients are about to run different programs on mesh {}: ranks {} differ from rank 0 "
                                "(program fingerprints {:016x} here); every client must build the same computation",
                                program_.mesh.to_string(), join(differ, ", "), fingerprint_));
}

std::vector<NodeValue> Executable::run(const std::vector<NodeValue>& inputs, const CollectiveOrigins& origins, const std::string& made_by,
                                       const std::vector<bool>& donated) const {
  if (!fingerprint_checked_) check_fingerprints();
  const size_t devices = workers_.size();
  const auto& nodes = program_.nodes;
  std::vector<std::vector<Array>> outputs(program_.outputs.size(), std::vector<Array>(devices));
  std::vector<std::atomic<int64_t>> received(nodes.size());
  std::vector<std::pair<int64_t, int64_t>> failed_checks(devices);
  ProgramProfile* profile = profiling_this_thread() ? profile_for_run(made_by) : nullptr;
  const std::vector<int> donor = assign_donors(program_, memory_, donated);
  run_on_devices(workers_, [&](int64_t d) {
    // What the device allocates while it runs is charged to it (memory_stats).
    ChargeMemoryTo charge(memory_counters_[size_t(d)]);
    DeviceRun device(*this, size_t(d), received, donor);
    device.bind_inputs(inputs);
    const auto steps = [&] {
      for (size_t step_index = 0; step_index < schedule_.steps.size(); ++step_index) {
        const double started = profile ? profile_clock() : 0;
        device.run_step(schedule_.steps[step_index]);
        if (profile) {
          device.wait_for_device();  // a no-op on CPUs; on GPUs the step's own time
          profile->add(step_index, size_t(d), started, profile_clock() - started);
        }
        device.release_after(step_index);
      }
    };
    if (profile) steps();  // each step timed on its own
    else device.run_steps(steps);
    failed_checks[size_t(d)] = device.failed_index_check();
    std::vector<Array> blocks = device.take_outputs();
    for (size_t o = 0; o < blocks.size(); ++o) outputs[o][size_t(d)] = std::move(blocks[o]);
  });
  // Recorded here, on the thread that forced the value, once the devices are done.
  if (collective_recording_active())
    for (const ScheduledStep& step : schedule_.steps)
      if (step.kind == ScheduledStep::Kind::Redistribute && is_collective(nodes[step.node].step.kind)) {
        const LocalNode& n = nodes[step.node];
        int64_t elements = 0;  // a bucket is one collective, reported at its first value's op
        for (int o : step.outputs) elements += received[o];
        NodeOrigin origin = n.origin;  // the compiled graph's, unless this run's trace has its own
        for (const auto& [node, at] : origins)
          if (node == step.node) origin = at;
        record_collective(collective_record(n.step, program_.mesh, n.dtype, elements * dtype_size(n.dtype), origin));
      }
  // An index out of range (dsl/index_check.hpp): the step ran with it clamped, its results are
  // dropped. Every client of the mesh raises it, whichever holds the index, so all go on alike.
  if (checks_indices_) {
    std::vector<int64_t> first = {0, 0};
    for (const auto& [check, index] : failed_checks)
      if (check > 0 && first[0] == 0) first = {check, index};
    if (program_.mesh.num_local_devices() != program_.mesh.size()) {
      const std::vector<int64_t> all = gather_among_clients(clients_of(program_.mesh), first);
      for (size_t c = 0; c + 1 < all.size() && first[0] == 0; c += 2)
        if (all[c] > 0) first = {all[c], all[c + 1]};
    }
    if (first[0] > 0) {
      const LocalNode& n = nodes[size_t(first[0] - 1)];
      throw IndexError(index_error_message(n.attrs, n.origin.location, first[1]));
    }
  }
  std::vector<NodeValue> out;
  for (size_t o = 0; o < program_.outputs.size(); ++o)
    out.push_back(NodeValue{std::make_shared<ShardedStorage>(ShardedStorage{std::move(outputs[o])}),
                            nodes[program_.outputs[o]].layout});
  return out;
}

}  // namespace tessera
