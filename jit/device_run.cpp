#include "jit/device_run.hpp"

#include <cstring>

#include "dsl/element_count.hpp"
#include "dsl/grouped_matmul.hpp"
#include "dsl/memory_counter.hpp"
#include "jit/all_to_all_v_step.hpp"
#include "jit/backend_registry.hpp"
#include "jit/device.hpp"
#include "jit/executable.hpp"
#include "jit/redistribute_executor.hpp"

namespace tessera {
namespace {

int64_t bytes_of(const std::vector<int64_t>& shape, DType dtype) { return dtype_size(dtype) * element_count(shape); }

}  // namespace

DeviceRun::DeviceRun(const Executable& executable, size_t device, std::vector<std::atomic<int64_t>>& received,
                     const std::vector<int>& donor)
    : executable_(executable),
      device_index_(device),
      device_(*executable.devices_[device]),
      params_(executable.program_.device_params[device]),
      kernel_entries_(executable.kernel_entries_[device]),
      received_(received),
      donor_(donor),
      values_(executable.program_.nodes.size()),
      gathered_in_place_(executable.program_.nodes.size(), false),
      made_before_steps_(executable.program_.nodes.size(), false),
      counter_(charged_memory_counter()) {
  // The device's arena, allocated on the first run and reused by every later one. It is kept
  // for reuse between runs, so the device holds it (memory_stats) only while a run uses it.
  auto& arena = executable_.arenas_[device_index_];
  ChargeMemoryTo uncharged(nullptr);
  if (!arena && executable_.memory_.arena_bytes > 0) arena = device_.allocate(executable_.memory_.arena_bytes);
  held_between_runs_ = executable_.memory_.arena_bytes;
  if (executable_.checks_indices_) {  // zeroed before every run: only this run's failures count
    auto& word = executable_.status_words_[device_index_];
    held_between_runs_ += 2 * int64_t(sizeof(int64_t));
    if (!word) word = device_.allocate(2 * sizeof(int64_t));
    status_ = word.get();
    device_.fill(status_, 2, DType::i64, 0);
  }
  if (counter_) counter_->add(held_between_runs_);
}

DeviceRun::~DeviceRun() {
  if (counter_) counter_->sub(held_between_runs_);
}

std::pair<int64_t, int64_t> DeviceRun::failed_index_check() {
  if (!status_) return {0, 0};
  int64_t word[2];
  device_.copy_to_host(status_, reinterpret_cast<std::byte*>(word), sizeof word);
  return {word[0], word[1]};
}

void DeviceRun::wait_for_device() { device_.synchronize(); }

void DeviceRun::bind_inputs(const std::vector<NodeValue>& inputs) {
  const auto& nodes = executable_.program_.nodes;
  // An input made from host data (distribute_tensor of a host array on a GPU mesh) is copied to
  // the device for the run. Its host block is charged to the device already, as its tensor's
  // component, and plans count each value once: the run's copy is not charged again.
  ChargeMemoryTo uncharged(nullptr);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].kind == LocalNode::Kind::Input)
      values_[i] = device_.to_device(inputs[size_t(nodes[i].input_index)].storage->components[device_index_]);
}

void DeviceRun::run_steps(const std::function<void()>& steps) {
  if (!executable_.replayable_ || !device_.records_runs()) return steps();
  const auto& nodes = executable_.program_.nodes;
  std::vector<const void*> buffers;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].kind == LocalNode::Kind::Input) buffers.push_back(value(int(i)).device_bytes());
  for (const ScheduledStep& step : executable_.schedule_.steps)
    for (int o : step.outputs)
      if (executable_.memory_.offset[size_t(o)] < 0) {  // a program output (Executable::runs_replayable)
        const int donor = donor_[size_t(o)];
        values_[size_t(o)] = donor >= 0 ? value(donor) : device_.new_array(nodes[size_t(o)].shape_on(params_), nodes[size_t(o)].dtype);
        made_before_steps_[size_t(o)] = true;
        buffers.push_back(value(o).device_bytes());
      }
  buffers.push_back(executable_.arenas_[device_index_].get());
  buffers.push_back(status_);
  device_.run_steps(buffers, steps);
}

Array& DeviceRun::value(int node) {
  std::optional<Array>& v = values_[size_t(node)];
  if (!v) throw InternalError("executor: node %" + std::to_string(node) + " read before it was made or after its last reader");
  return *v;
}

const Array& DeviceRun::on_device(int node) {
  Array& value = this->value(node);
  // Host values on a GPU: what a collective staged through host memory returned (groups without
  // a communicator over device memory, steps that pack regions on the host).
  if (value.memory_space() != device_.memory_space()) value = device_.to_device(value);
  return value;
}

bool DeviceRun::gathers_in_place() const { return device_.memory_space() == MemorySpace::Host; }

Array DeviceRun::output_array(int node) {
  const auto& nodes = executable_.program_.nodes;
  const MemoryPlan& memory = executable_.memory_;
  const LocalNode& n = nodes[size_t(node)];
  if (const int gather = memory.in_gather[size_t(node)]; gather >= 0 && gathers_in_place()) {
    // Written straight into this device's block of the all_gather's output. Where the group's
    // members share memory (devices of one process, clients of one node), each writes its
    // block into the same buffer and the gather is a barrier.
    const LocalNode& g = nodes[size_t(gather)];
    const int64_t offset = executable_.gather_blocks_[device_index_][size_t(node)].offset;
    const int64_t bytes = bytes_of(g.shape_on(params_), g.dtype);
    Communicator& comm = *executable_.communicators_[size_t(g.step.mesh_dim)][device_index_];
    std::shared_ptr<std::byte[]> shared;
    {
      ChargeMemoryTo uncharged(nullptr);  // one buffer for the group, held by each member
      shared = comm.allocate_group_buffer(bytes, executable_.fingerprint_ ^ (uint64_t(gather) * 0x9e3779b97f4a7c15ull));
    }
    if (shared && counter_) shared = charged(std::move(shared), bytes, *counter_);
    if (shared) {
      values_[size_t(gather)] = Array::view(shared, shared.get(), g.shape_on(params_), g.dtype);
      gathered_in_place_[size_t(gather)] = true;
    } else {
      values_[size_t(gather)] = Array::uninitialized(g.shape_on(params_), g.dtype);
    }
    return value(gather).subview(offset * dtype_size(n.dtype), n.shape_on(params_));
  }
  if (const int exchange = memory.in_exchange[size_t(node)]; exchange >= 0 && gathers_in_place()) {
    // An all_to_all_v's rows: in this member's block of a group buffer, where the communicator
    // reads them without staging them (Communicator::exchanges_from_group_buffers). The arena
    // slot planned for them stays unused; the group buffer is not charged, as the
    // communicator's own staging slots are not.
    Communicator& comm = *executable_.communicators_[size_t(nodes[size_t(exchange)].step.mesh_dim)][device_index_];
    if (comm.exchanges_from_group_buffers()) {
      const std::vector<int64_t> shape = n.shape_on(params_);
      const int64_t block = (bytes_of(shape, n.dtype) + 63) / 64 * 64;  // the same on every member: a static shape
      std::shared_ptr<std::byte[]> shared;
      {
        ChargeMemoryTo uncharged(nullptr);
        shared = comm.allocate_group_buffer(block * comm.size(), executable_.fingerprint_ ^ (uint64_t(exchange) * 0xc2b2ae3d27d4eb4full));
      }
      if (shared) return Array::view(shared, shared.get() + block * comm.rank(), shape, n.dtype);
    }
  }
  if (memory.offset[size_t(node)] < 0) {
    if (made_before_steps_[size_t(node)]) return value(node);
    // A donated input's buffer: its last reader is the kernel writing this (MemoryPlan::donors).
    if (const int donor = donor_[size_t(node)]; donor >= 0) return value(donor);
    return device_.new_array(n.shape_on(params_), n.dtype);
  }
  const auto& arena = executable_.arenas_[device_index_];
  return device_.view(arena, arena.get() + memory.offset[size_t(node)], n.shape_on(params_), n.dtype);
}

void DeviceRun::run_step(const ScheduledStep& step) {
  switch (step.kind) {
    case ScheduledStep::Kind::Kernel: run_kernel(step); break;
    case ScheduledStep::Kind::Gemm: run_gemm(step); break;
    case ScheduledStep::Kind::GroupedGemm: run_grouped_gemm(step); break;
    case ScheduledStep::Kind::Attention: run_attention(step); break;
    case ScheduledStep::Kind::Redistribute: run_redistribute(step); break;
  }
}

void DeviceRun::release_after(size_t index) {
  for (int node : executable_.memory_.release_after[index]) values_[size_t(node)].reset();
}

void DeviceRun::run_kernel(const ScheduledStep& step) {
  buffers_.clear();
  for (int o : step.outputs) {
    values_[size_t(o)] = output_array(o);
    buffers_.push_back(value(o).device_bytes());
  }
  for (size_t b = step.outputs.size(); b < step.buffer_nodes.size(); ++b)
    buffers_.push_back(on_device(step.buffer_nodes[b]).device_bytes());
  const kir::Kernel& kernel = executable_.schedule_.kernels[size_t(step.kernel)];
  if (kernel.status_buffer >= 0) buffers_.push_back(status_);
  device_.launch(KernelLaunch{kernel, kernel_entries_[size_t(step.kernel)],
                              buffers_.data(), params_.data(), int64_t(params_.size()), value(step.node).numel()});
}

void DeviceRun::run_library(LibraryCall& call, int node) {
  const LibraryKernel*& kernel = library_kernels_[size_t(call.op)];
  if (!kernel) kernel = &library_kernel(executable_.program_.target.device, call.op);
  Array out = output_array(node);
  call.out = &out;
  (*kernel)(device_, call);
  values_[size_t(node)] = std::move(out);
}

void DeviceRun::run_gemm(const ScheduledStep& step) {
  LibraryCall call;
  call.inputs = {&on_device(step.gemm_a), &on_device(step.gemm_b)};
  call.op = gemm_library_op(call.inputs[0]->dtype(), executable_.program_.target.deterministic);
  call.trans_a = step.trans_a;
  call.trans_b = step.trans_b;
  run_library(call, step.node);
}

void DeviceRun::run_attention(const ScheduledStep& step) {
  const auto& nodes = executable_.program_.nodes;
  const LocalNode& n = nodes[size_t(step.node)];
  const LocalNode& q = nodes[size_t(n.inputs[0])];
  LibraryCall call;
  call.attention = attention_attrs(n.attrs);
  call.op = library_op_of(call.attention.part);
  call.q_offset = q.local_offset[size_t(q.rank() - 2)].on(params_);
  const size_t operands = attention_operand_count(call.attention.part);
  for (size_t i = 0; i < operands; ++i) call.inputs.push_back(&on_device(n.inputs[i]));
  if (n.inputs.size() > operands) call.q_offset += host_scalar(n.inputs.back());  // the mask's shift
  run_library(call, step.node);
}

int64_t DeviceRun::host_scalar(int node) {
  const Array& a = value(node);
  int64_t x = 0;
  if (a.dtype() != DType::i64 || a.numel() != 1) throw InternalError("host_scalar: not an i64 scalar");
  if (a.memory_space() == MemorySpace::Host) std::memcpy(&x, a.bytes(), sizeof x);
  else device_.copy_to_host(a.device_bytes(), reinterpret_cast<std::byte*>(&x), sizeof x);
  return x;
}

// The group bounds (ends) are global rows: a device holding a block of x's rows computes the
// part of each group that falls in it (inside local_map they count the device's own rows).
void DeviceRun::run_grouped_gemm(const ScheduledStep& step) {
  const auto& nodes = executable_.program_.nodes;
  const LocalNode& n = nodes[size_t(step.node)];
  LibraryCall call;
  call.op = grouped_library_op(n.op);
  call.row_offset = detail::grouped_bounds_are_local(n.attrs) ? 0 : nodes[size_t(n.inputs[0])].local_offset[0].on(params_);
  call.ordered = executable_.program_.target.deterministic;
  for (int in : n.inputs) call.inputs.push_back(&on_device(in));
  run_library(call, step.node);
}

void DeviceRun::run_redistribute(const ScheduledStep& step) {
  const auto& nodes = executable_.program_.nodes;
  const LocalNode& n = nodes[size_t(step.node)];
  const RedistributeStep& r = n.step;
  const bool bucket = step.outputs.size() > 1;  // small all_reduces, one collective
  Communicator* comm = is_collective(r.kind) ? executable_.communicators_[size_t(r.mesh_dim)][device_index_].get() : nullptr;
  // Device values move on the device where the group has a communicator over device memory.
  bool in_device_memory = !comm && r.kind == RedistributeKind::LocalPartial;  // a fill
  if (const auto& on_device = executable_.device_communicators_[size_t(r.mesh_dim)]; comm && !on_device.empty()) {
    comm = on_device[device_index_].get();
    in_device_memory = true;
  }
  Device* device = in_device_memory ? &device_ : nullptr;
  // A device-memory step reads its inputs on the device (a host-staged collective's result is
  // moved there first).
  auto input = [&](int node) -> const Array& { return device ? on_device(node) : value(node); };
  if (r.kind == RedistributeKind::AllToAllV) {
    // The counts matrix (n * n integers), read on the host as the step runs.
    const Array& counts = value(n.inputs[1]);
    std::vector<int64_t> host(size_t(counts.numel()));
    if (counts.memory_space() == MemorySpace::Host) std::memcpy(host.data(), counts.bytes(), size_t(counts.nbytes()));
    else device_.copy_to_host(counts.device_bytes(), reinterpret_cast<std::byte*>(host.data()), counts.nbytes());
    // Into its arena slot where the communicator writes this device's memory.
    const bool in_arena = executable_.memory_.offset[size_t(step.node)] >= 0 &&
                          (device ? device_.memory_space() : MemorySpace::Host) == device_.memory_space();
    std::optional<Array> into;
    if (in_arena) into = output_array(step.node);
    int64_t got = 0;
    values_[size_t(step.node)] = run_all_to_all_v_step(*comm, input(n.inputs[0]), host, n.shape_on(params_), n.dtype, got, device,
                                                       into ? &*into : nullptr);
    received_[size_t(step.node)] += got;
    return;
  }
  if (bucket) {
    std::vector<Array> ins;
    for (int o : step.outputs) ins.push_back(input(nodes[size_t(o)].inputs[0]));
    std::vector<int64_t> got;
    std::vector<Array> outs = run_all_reduce_bucket(ins, n.dtype, r.op, comm, got, device);
    for (size_t i = 0; i < outs.size(); ++i) {
      values_[size_t(step.outputs[i])] = std::move(outs[i]);
      received_[size_t(step.outputs[i])] += got[i];
    }
    return;
  }
  const bool preallocated = executable_.memory_.in_gather[size_t(n.inputs[0])] == step.node && gathers_in_place();
  if (preallocated && gathered_in_place_[size_t(step.node)]) {
    comm->barrier();  // every block has been written into the one shared output
    received_[size_t(step.node)] += value(step.node).numel() - value(n.inputs[0]).numel();
    return;
  }
  int64_t got = 0;
  values_[size_t(step.node)] =
      run_redistribute_step(r, n.global_shape, n.dtype, executable_.coords_[device_index_], comm, input(n.inputs[0]), got,
                            preallocated ? &value(step.node) : nullptr, device);
  received_[size_t(step.node)] += got;
}

std::vector<Array> DeviceRun::take_outputs() {
  std::vector<Array> out;
  const auto& arena = executable_.arenas_[device_index_];
  const int64_t arena_bytes = executable_.memory_.arena_bytes;
  for (int node : executable_.program_.outputs) {
    Array v = value(node);
    // Outputs belong to the user: never hand out memory the next run will overwrite.
    if (arena && v.device_bytes() >= arena.get() && v.device_bytes() < arena.get() + arena_bytes) v = device_.copy(v);
    out.push_back(v.on_device(executable_.device_names_[device_index_]));
  }
  // A run ends with its work done: another device's stream may read these outputs next.
  device_.synchronize();
  return out;
}

}  // namespace tessera
