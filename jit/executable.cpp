#include "jit/executable.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/comm_debug_mode.hpp"
#include "jit/kernel_runner.hpp"
#include "dsl/determinism.hpp"
#include "dsl/error.hpp"
#include "dsl/string_util.hpp"
#include "dsl/buffer_pool.hpp"
#include "jit/device_workers.hpp"
#include "jit/explain.hpp"
#include "jit/mesh_communicators.hpp"
#include "jit/redistribute_executor.hpp"
#include "jit/runtime.hpp"
#include "jit/short_gemm.hpp"

namespace tessera {
namespace {

// Kernels smaller than this run on one core even when the device owns several.
constexpr int64_t kSplitMinimumElements = 1 << 16;

// TESSERA_DETERMINISTIC=1: out[i, j] = sum over p = 0..k-1, in that order, of a(i, p) * b(p, j),
// each a rounded multiply then a rounded add, so its bits depend neither on m or n (a device's
// share of rows or columns) nor on which lanes a vector loop gives it. OpenBLAS makes no such
// promise: its Haswell sgemm kernels (picked on AVX2 machines, or by OPENBLAS_CORETYPE=Haswell)
// sum a row differently depending on whether it falls in a 12-, 8-, 4-, 2- or 1-row block.
template <typename T>
void ordered_gemm(int64_t m, int64_t n, int64_t k, const T* a, bool trans_a, const T* b, bool trans_b, T* out) {
  std::vector<T> b_rows;  // b as [k, n] rows, so the inner loop runs over contiguous memory
  if (trans_b) {
    b_rows.resize(size_t(k * n));
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) b_rows[size_t(p * n + j)] = b[j * k + p];
    b = b_rows.data();
  }
  const int64_t a_row = trans_a ? 1 : k, a_col = trans_a ? m : 1;  // a(i, p) = a[i * a_row + p * a_col]
  for (int64_t i = 0; i < m; ++i) {
    T* o = out + i * n;
    std::fill(o, o + n, T(0));
    for (int64_t p = 0; p < k; ++p) {
      const T x = a[i * a_row + p * a_col];
      const T* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) {
        const T product = x * bp[j];  // kept apart from the add: no fused multiply-add
        o[j] += product;
      }
    }
  }
}

// Row-major batched GEMM: out[b] = op(a[b]) x op(b[b]), op = transpose when the flag is set (the
// buffer then holds the operand's transpose). Short f32 products go to short_sgemm, the rest
// to OpenBLAS; deterministic runs use ordered_gemm.
void run_gemm(const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out) {
  const auto& sa = a.shape_ref();
  const auto& so = out.shape_ref();
  const int64_t r = int64_t(sa.size());
  const int64_t m = so[r - 2], n = so[r - 1], k = trans_a ? sa[r - 2] : sa[r - 1];
  int64_t batch = 1;
  for (int64_t i = 0; i < r - 2; ++i) batch *= sa[i];
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const blasint lda = blasint(trans_a ? m : k), ldb = blasint(trans_b ? k : n);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::memset(out.mutable_bytes(), 0, size_t(out.nbytes()));
    return;
  }
  if (deterministic_mode()) {
    for (int64_t i = 0; i < batch; ++i) {
      if (a.dtype() == DType::f32)
        ordered_gemm(m, n, k, a.data<float>() + i * m * k, trans_a, b.data<float>() + i * k * n, trans_b,
                     out.mutable_data<float>() + i * m * n);
      else
        ordered_gemm(m, n, k, a.data<double>() + i * m * k, trans_a, b.data<double>() + i * k * n, trans_b,
                     out.mutable_data<double>() + i * m * n);
    }
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    if (a.dtype() == DType::f32) {
      const float *a_i = a.data<float>() + i * m * k, *b_i = b.data<float>() + i * k * n;
      float* out_i = out.mutable_data<float>() + i * m * n;
      if (!short_sgemm(m, n, k, a_i, trans_a, b_i, trans_b, out_i))
        cblas_sgemm(CblasRowMajor, ta, tb, blasint(m), blasint(n), blasint(k), 1.0f, a_i, lda, b_i, ldb, 0.0f, out_i,
                    blasint(n));
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, blasint(m), blasint(n), blasint(k), 1.0, a.data<double>() + i * m * k, lda,
                  b.data<double>() + i * k * n, ldb, 0.0, out.mutable_data<double>() + i * m * n, blasint(n));
    }
  }
}

int64_t bytes_of(const std::vector<int64_t>& shape, DType dtype) {
  int64_t n = dtype_size(dtype);
  for (int64_t e : shape) n *= e;
  return n;
}

}  // namespace

Executable::Executable(LocalProgram program, uint64_t fingerprint) : program_(std::move(program)), fingerprint_(fingerprint) {
  schedule_ = schedule_program(program_);
  functions_ = load_kernels(schedule_.kernels);
  const Mesh& mesh = program_.mesh;
  workers_ = mesh_worker_indices(mesh);
  coords_ = local_device_coords(mesh);
  device_names_ = mesh.local_devices();
  communicators_.resize(mesh.ndim());
  for (const auto& step : schedule_.steps)
    if (step.kind == ScheduledStep::Kind::Redistribute) {
      const RedistributeStep& r = program_.nodes[step.node].step;
      if (is_collective(r.kind) && communicators_[r.mesh_dim].empty())
        communicators_[r.mesh_dim] = mesh_dim_communicators(mesh, r.mesh_dim);
    }
  memory_ = plan_memory(program_, schedule_);
  arenas_.resize(workers_.size());
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
                                program_.mesh.to_string(), join(differ, ", ", [](const std::string& s) { return s; }), fingerprint_));
}

std::vector<NodeValue> Executable::run(const std::vector<NodeValue>& inputs, const CollectiveOrigins& origins) const {
  if (!fingerprint_checked_) check_fingerprints();
  const size_t devices = workers_.size();
  const auto& nodes = program_.nodes;
  std::vector<std::vector<Array>> outputs(program_.outputs.size(), std::vector<Array>(devices));
  std::vector<std::atomic<int64_t>> received(nodes.size());
  // The machine's cores are divided among the devices; OpenBLAS and split kernels get the cores
  // one device owns (only one thread pool may be busy at a time: two fighting pools cost
  // libtorch 2x here).
  const int cores = cores_per_device(int64_t(devices));
  ProgramProfile* profile = nullptr;
  if (profiling_enabled()) {
    if (!profile_) {
      std::vector<std::string> labels;
      for (const ScheduledStep& step : schedule_.steps) labels.push_back(describe_step(*this, step, program_.device_params[0]));
      profile_ = register_profile(fmt::format("program {:016x} on mesh {}", fingerprint_, program_.mesh.to_string()),
                                  std::move(labels), devices);
    }
    profile = profile_.get();
    profile->count_run();
  }
  run_on_devices(workers_, [&](int64_t d) {
    const std::vector<int64_t>& params = program_.device_params[d];
    std::vector<Array> values(nodes.size());
    std::vector<char> gathered_in_place(nodes.size(), false);  // outputs in a group buffer
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].kind == LocalNode::Kind::Input) values[i] = inputs[nodes[i].input_index].storage->components[d];
    // The device's arena, allocated on the first run and reused by every later one.
    if (!arenas_[d] && memory_.arena_bytes > 0) arenas_[d] = allocate_buffer(memory_.arena_bytes, false);
    auto output_array = [&](int node) {
      const LocalNode& n = nodes[node];
      if (const int gather = memory_.in_gather[node]; gather >= 0) {
        // Written straight into this device's block of the all_gather's output.
        const LocalNode& g = nodes[gather];
        const GatherBlock& block = gather_blocks_[d][node];
        // Where the group's members share memory (devices of one process, clients of one
        // node), each writes its block into the same buffer and the gather is a barrier.
        const int64_t bytes = bytes_of(g.shape_on(params), g.dtype);
        if (auto shared = communicators_[g.step.mesh_dim][d]->allocate_group_buffer(bytes)) {
          values[gather] = Array::view(shared, shared.get(), g.shape_on(params), g.dtype);
          gathered_in_place[gather] = true;
        } else {
          values[gather] = Array::uninitialized(g.shape_on(params), g.dtype);
        }
        return values[gather].subview(block.offset * dtype_size(n.dtype), n.shape_on(params));
      }
      if (memory_.offset[node] < 0) return Array::uninitialized(n.shape_on(params), n.dtype);
      return Array::view(arenas_[d], arenas_[d].get() + memory_.offset[node], n.shape_on(params), n.dtype);
    };
    std::vector<void*> buffers;
    for (size_t step_index = 0; step_index < schedule_.steps.size(); ++step_index) {
      const ScheduledStep& step = schedule_.steps[step_index];
      const LocalNode& n = nodes[step.node];
      const auto started = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      switch (step.kind) {
        case ScheduledStep::Kind::Kernel: {
          buffers.clear();
          for (int o : step.outputs) {
            values[o] = output_array(o);
            buffers.push_back(values[o].mutable_bytes());
          }
          Array& out = values[step.node];
          for (size_t b = step.outputs.size(); b < step.buffer_nodes.size(); ++b)
            buffers.push_back(const_cast<std::byte*>(values[step.buffer_nodes[b]].bytes()));
          const kir::Kernel& kernel = schedule_.kernels[step.kernel];
          const KernelFunction fn = functions_[step.kernel];
          const int64_t extent = kir::evaluate(kernel.outer_extent, params.data());
          // A device owning several cores splits large kernels over its outer loop.
          const int parts = kernel.splittable && out.numel() >= kSplitMinimumElements ? int(std::min<int64_t>(cores, extent)) : 1;
          const KernelRunner* substitute = substitute_kernel_runner();
          run_split(workers_[d], parts, [&](int part) {
            const int64_t begin = extent * part / parts, end = extent * (part + 1) / parts;
            if (substitute) (*substitute)(kernel, buffers.data(), params.data(), begin, end);
            else fn(buffers.data(), params.data(), begin, end);
          });
          break;
        }
        case ScheduledStep::Kind::Gemm: {
          if (d == 0) openblas_set_num_threads(cores);
          Array out = output_array(step.node);
          run_gemm(values[step.gemm_a], step.trans_a, values[step.gemm_b], step.trans_b, out);
          values[step.node] = std::move(out);
          break;
        }
        case ScheduledStep::Kind::Redistribute: {
          const RedistributeStep& r = n.step;
          Communicator* comm = is_collective(r.kind) ? communicators_[r.mesh_dim][d].get() : nullptr;
          if (step.outputs.size() > 1) {  // a bucket of small all_reduces
            std::vector<Array> ins;
            for (int o : step.outputs) ins.push_back(values[nodes[o].inputs[0]]);
            std::vector<int64_t> got;
            std::vector<Array> outs = run_all_reduce_bucket(ins, n.dtype, r.op, comm, got);
            for (size_t i = 0; i < outs.size(); ++i) {
              values[step.outputs[i]] = std::move(outs[i]);
              received[step.outputs[i]] += got[i];
            }
            break;
          }
          int64_t got = 0;
          const bool preallocated = memory_.in_gather[n.inputs[0]] == step.node;
          if (preallocated && gathered_in_place[step.node]) {
            comm->barrier();  // every block has been written into the one shared output
            received[step.node] += values[step.node].numel() - values[n.inputs[0]].numel();
            break;
          }
          values[step.node] = run_redistribute_step(r, n.global_shape, n.dtype, coords_[d], comm, values[n.inputs[0]], got,
                                                    preallocated ? &values[step.node] : nullptr);
          received[step.node] += got;
          break;
        }
      }
      if (profile)
        profile->add(step_index, size_t(d), std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    for (size_t o = 0; o < program_.outputs.size(); ++o) {
      Array v = values[program_.outputs[o]];
      // Outputs belong to the user: never hand out memory the next run will overwrite.
      const std::byte* arena = arenas_[d].get();
      if (arena && v.bytes() >= arena && v.bytes() < arena + memory_.arena_bytes) v = v.clone();
      outputs[o][d] = v.on_device(device_names_[d]);
    }
  });
  // Recorded here, on the thread that forced the value, once the devices are done.
  if (comm_debug_mode_active())
    for (const ScheduledStep& step : schedule_.steps)
      if (step.kind == ScheduledStep::Kind::Redistribute && is_collective(nodes[step.node].step.kind)) {
        const LocalNode& n = nodes[step.node];
        int64_t elements = 0;  // a bucket is one collective, reported at its first value's op
        for (int o : step.outputs) elements += received[o];
        const Node* origin = n.origin.get();
        for (const auto& [node, at] : origins)
          if (node == step.node) origin = at.get();
        record_collective(collective_record(n.step, program_.mesh, n.dtype, elements * dtype_size(n.dtype), origin));
      }
  std::vector<NodeValue> out;
  for (size_t o = 0; o < program_.outputs.size(); ++o)
    out.push_back(NodeValue{std::make_shared<ShardedStorage>(ShardedStorage{std::move(outputs[o])}),
                            nodes[program_.outputs[o]].layout});
  return out;
}

}  // namespace tessera
