#include "jit/redistribute_executor.hpp"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <optional>

#include "dsl/collective_recorder.hpp"
#include "comm/reduce_kernels.hpp"
#include "dsl/memory_counter.hpp"
#include "dsl/shard_geometry.hpp"
#include "jit/device_workers.hpp"
#include "dsl/logging.hpp"
#include "jit/mesh_communicators.hpp"
#include "partitioner/redistribute_plan.hpp"

namespace tessera {
namespace {

// True when blocks split along `axis` lie back to back in memory: every axis before it has extent 1.
bool contiguous_along(const std::vector<int64_t>& shape, int64_t axis) {
  for (int64_t a = 0; a < axis; ++a)
    if (shape[a] != 1) return false;
  return true;
}

// The buffers a communicator is handed, in its memory: host arrays (a device value read through
// its host mirror), or the device's own arrays for a communicator over device memory.
struct CommBuffers {
  Communicator* comm;
  Device* device;  // where a device-memory communicator's buffers come from
  DType dtype;

  bool in_device_memory() const { return comm && comm->memory_space() != MemorySpace::Host; }
  Array fresh(std::vector<int64_t> local_shape) const {
    return in_device_memory() ? device->new_array(std::move(local_shape), dtype) : Array::uninitialized(std::move(local_shape), dtype);
  }
  const void* read(const Array& a) const { return in_device_memory() ? a.device_bytes() : a.bytes(); }
  void* write(Array& a) const { return in_device_memory() ? a.device_bytes() : a.mutable_bytes(); }
  // Packing and unpacking around a collective: a region of one block into another, by the
  // device where the buffers are its own.
  void copy_block(const Array& src, const std::vector<int64_t>& src_offset, Array& dst, const std::vector<int64_t>& dst_offset,
                  const std::vector<int64_t>& region_offset, const std::vector<int64_t>& region_shape) const {
    if (in_device_memory()) device->copy_region(src, src_offset, dst, dst_offset, region_offset, region_shape);
    else copy_region(src, src_offset, dst, dst_offset, region_offset, region_shape);
  }
  // All of `from` into `to` at byte `offset` (a bucket's values joined).
  void copy_into(const Array& from, Array& to, int64_t offset) const {
    if (in_device_memory()) device->copy_bytes(from.device_bytes(), to.device_bytes() + offset, from.nbytes());
    else std::memcpy(to.mutable_bytes() + offset, from.bytes(), size_t(from.nbytes()));
  }
};

// Everything one device needs to run one step.
struct StepContext : CommBuffers {
  const RedistributeStep& step;
  const std::vector<int64_t>& shape;
  std::vector<int64_t> coords;

  StepContext(const RedistributeStep& step, const std::vector<int64_t>& shape, DType dtype, std::vector<int64_t> coords,
              Communicator* comm, Device* device = nullptr)
      : CommBuffers{comm, device, dtype}, step(step), shape(shape), coords(std::move(coords)) {}

  ShardBox box(const Layout& layout, int64_t group_rank) const {
    std::vector<int64_t> c = coords;
    c[step.mesh_dim] = group_rank;
    return shard_geometry(shape, layout, c);
  }
  int64_t group_size() const { return step.before.mesh().shape()[step.mesh_dim]; }
  int64_t my_rank() const { return coords[step.mesh_dim]; }
};

// Each function returns the device's new component and adds the bytes it received to `received`.

Array run_all_gather(const StepContext& ctx, const Array& in, int64_t& received, const Array* preallocated) {
  const int64_t axis = *ctx.step.before.sharded_axis_of(ctx.step.mesh_dim);
  const ShardBox out_box = ctx.box(ctx.step.after, ctx.my_rank());
  Array out = preallocated ? *preallocated : ctx.fresh(out_box.local_shape);
  std::vector<ShardBox> blocks;
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < ctx.group_size(); ++r) {
    blocks.push_back(ctx.box(ctx.step.before, r));
    counts.push_back(blocks.back().num_elements());
  }
  received = out.numel() - in.numel();
  if (contiguous_along(out_box.local_shape, axis)) {
    ctx.comm->all_gather_v(ctx.read(in), in.numel(), ctx.write(out), counts, ctx.dtype);
    return out;
  }
  // Blocks that do not lie back to back in the output: gathered into a staging buffer, then
  // each copied to its place.
  Array staging = ctx.fresh({out.numel()});
  ctx.comm->all_gather_v(ctx.read(in), in.numel(), ctx.write(staging), counts, ctx.dtype);
  const int64_t esize = dtype_size(ctx.dtype);
  int64_t offset = 0;
  for (const ShardBox& b : blocks) {
    ctx.copy_block(staging.subview(offset * esize, b.local_shape), b.global_offset, out, out_box.global_offset, b.global_offset,
                   b.local_shape);
    offset += b.num_elements();
  }
  return out;
}

Array run_all_to_all(const StepContext& ctx, const Array& in, int64_t& received) {
  const ShardBox in_box = ctx.box(ctx.step.before, ctx.my_rank());
  const ShardBox out_box = ctx.box(ctx.step.after, ctx.my_rank());
  std::vector<ShardBox> send_regions, recv_regions;
  for (int64_t r = 0; r < ctx.group_size(); ++r) {
    send_regions.push_back(intersect(in_box, ctx.box(ctx.step.after, r)));
    recv_regions.push_back(intersect(ctx.box(ctx.step.before, r), out_box));
  }
  Array out = ctx.fresh(out_box.local_shape);
  ctx.comm->all_to_all_regions(ctx.read(in), in_box, send_regions, ctx.write(out), out_box, recv_regions, ctx.dtype);
  received = out.numel() - recv_regions[ctx.my_rank()].num_elements();
  return out;
}

Array run_all_reduce(const StepContext& ctx, const Array& in, int64_t& received) {
  Array out = ctx.fresh(in.shape());
  ctx.comm->all_reduce(ctx.read(in), ctx.write(out), in.numel(), ctx.dtype, ctx.step.op);
  const int64_t k = ctx.group_size();
  received = 2 * in.numel() * (k - 1) / k;
  return out;
}

Array run_reduce_scatter(const StepContext& ctx, const Array& in, int64_t& received) {
  const int64_t esize = dtype_size(ctx.dtype);
  const int64_t axis = *ctx.step.after.sharded_axis_of(ctx.step.mesh_dim);
  const ShardBox in_box = ctx.box(ctx.step.before, ctx.my_rank());
  std::vector<ShardBox> blocks;
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < ctx.group_size(); ++r) {
    blocks.push_back(ctx.box(ctx.step.after, r));
    counts.push_back(blocks.back().num_elements());
  }
  Array out = ctx.fresh(blocks[ctx.my_rank()].local_shape);
  const void* send = ctx.read(in);
  Array staging;
  if (!contiguous_along(in_box.local_shape, axis)) {  // each rank's block packed back to back first
    staging = ctx.fresh({in.numel()});
    int64_t offset = 0;
    for (const ShardBox& b : blocks) {
      Array packed = staging.subview(offset * esize, b.local_shape);
      ctx.copy_block(in, in_box.global_offset, packed, b.global_offset, b.global_offset, b.local_shape);
      offset += b.num_elements();
    }
    send = ctx.read(staging);
  }
  ctx.comm->reduce_scatter_v(send, ctx.write(out), counts, ctx.dtype, ctx.step.op);
  received = out.numel() * (ctx.group_size() - 1);
  return out;
}

// A permutation step: this device's block goes to device destinations[me] of the mesh dim and
// the block of the device whose destination is this one arrives, as an all_to_all with one
// non-empty block each way (every backend has that collective). A device that keeps its own
// block still takes part in the collective, but receives nothing from the others.
Array run_shift(const StepContext& ctx, const Array& in, int64_t& received) {
  const int64_t k = ctx.group_size(), me = ctx.my_rank();
  const std::vector<int64_t>& destinations = ctx.step.destinations;
  const int64_t source = std::find(destinations.begin(), destinations.end(), me) - destinations.begin();
  std::vector<int64_t> send_counts(size_t(k), 0), recv_counts(size_t(k), 0);
  send_counts[size_t(destinations[size_t(me)])] = in.numel();
  recv_counts[size_t(source)] = in.numel();
  Array out = ctx.fresh(in.shape());
  ctx.comm->all_to_all_v(ctx.read(in), send_counts, ctx.write(out), recv_counts, ctx.dtype);
  received = source == me ? 0 : in.numel();
  return out;
}

// Where `out` starts inside `in` (elements), when it lies there contiguously: every axis before
// the first cut one has extent 1 and every axis after it is whole (a range of rows, say).
std::optional<int64_t> contiguous_offset(const ShardBox& in, const ShardBox& out) {
  const size_t rank = in.local_shape.size();
  size_t cut = 0;
  while (cut < rank && out.local_shape[cut] == in.local_shape[cut]) ++cut;
  for (size_t a = cut + 1; a < rank; ++a)
    if (out.local_shape[a] != in.local_shape[a]) return std::nullopt;
  int64_t offset = 0, stride = 1;
  for (size_t a = rank; a-- > 0;) {
    if (a < cut && out.local_shape[a] != 1) return std::nullopt;
    offset += (out.global_offset[a] - in.global_offset[a]) * stride;
    stride *= in.local_shape[a];
  }
  return offset;
}

Array run_local_chunk(const StepContext& ctx, const Array& in) {
  const ShardBox in_box = ctx.box(ctx.step.before, ctx.my_rank());
  const ShardBox out_box = ctx.box(ctx.step.after, ctx.my_rank());
  // A contiguous block is read where it lies (the memory plan keeps the input alive as long).
  if (auto offset = contiguous_offset(in_box, out_box)) return in.subview(*offset * dtype_size(ctx.dtype), out_box.local_shape);
  Array out = Array::uninitialized(out_box.local_shape, ctx.dtype);
  copy_region(in, in_box.global_offset, out, out_box.global_offset, out_box.global_offset, out_box.local_shape);
  return out;
}

// Replicate -> Partial(op) on one mesh dim: sum and product keep the value at coordinate 0 and
// put the identity elsewhere (exact for every dtype); avg, max and min keep it everywhere.
// With a device, the identity is filled in its memory (a GPU value never visits the host).
Array partial_component(const Array& in, ReduceOp op, int64_t coord, Device* device = nullptr) {
  if (coord == 0 || (op != ReduceOp::Sum && op != ReduceOp::Product)) return in;
  const double identity = reduce_identity(op);
  if (device) {
    Array out = device->new_array(in.shape(), in.dtype());
    device->fill(out.device_bytes(), out.numel(), out.dtype(), identity);
    return out;
  }
  Array out = Array::uninitialized(in.shape(), in.dtype());
  for (int64_t i = 0; i < out.numel(); ++i) store_from_double(out.mutable_bytes(), out.dtype(), i, identity);
  return out;
}

}  // namespace

std::vector<Array> run_all_reduce_bucket(const std::vector<Array>& inputs, DType dtype, ReduceOp op, Communicator* comm,
                                         std::vector<int64_t>& received, Device* device) {
  const int64_t esize = dtype_size(dtype);
  int64_t total = 0;
  for (const Array& in : inputs) total += in.numel();
  const CommBuffers ctx{comm, device, dtype};
  Array joined = ctx.fresh({total});
  int64_t offset = 0;
  for (const Array& in : inputs) {
    ctx.copy_into(in, joined, offset * esize);
    offset += in.numel();
  }
  comm->all_reduce(ctx.read(joined), ctx.write(joined), total, dtype, op);
  std::vector<Array> out;
  received.clear();
  offset = 0;
  const int64_t k = comm->size();
  for (const Array& in : inputs) {
    out.push_back(joined.subview(offset * esize, in.shape()));
    received.push_back(2 * in.numel() * (k - 1) / k);
    offset += in.numel();
  }
  return out;
}

StepAllocation redistribute_step_allocation(const RedistributeStep& step, const std::vector<int64_t>& shape, DType dtype,
                                            const std::vector<int64_t>& coords, bool all_gather_preallocated) {
  const StepContext ctx{step, shape, dtype, coords, nullptr};
  const ShardBox in_box = ctx.box(step.before, ctx.my_rank()), out_box = ctx.box(step.after, ctx.my_rank());
  const int64_t esize = dtype_size(dtype), in_bytes = in_box.num_elements() * esize, out_bytes = out_box.num_elements() * esize;
  switch (step.kind) {
    case RedistributeKind::AllGather: {  // mirrors run_all_gather
      const int64_t axis = *step.before.sharded_axis_of(step.mesh_dim);
      return {all_gather_preallocated ? 0 : out_bytes, contiguous_along(out_box.local_shape, axis) ? 0 : out_bytes};
    }
    case RedistributeKind::ReduceScatter: {  // mirrors run_reduce_scatter
      const int64_t axis = *step.after.sharded_axis_of(step.mesh_dim);
      return {out_bytes, contiguous_along(in_box.local_shape, axis) ? 0 : in_bytes};
    }
    case RedistributeKind::AllToAll:
    case RedistributeKind::AllToAllV:  // mirrors run_all_to_all_v_step: its bound, the rows out
    case RedistributeKind::AllReduce:
    case RedistributeKind::Shift: return {out_bytes, 0};
    case RedistributeKind::LocalChunk: return {contiguous_offset(in_box, out_box) ? 0 : out_bytes, 0};
    case RedistributeKind::LocalPartial:  // mirrors partial_component
      return {coords[step.mesh_dim] == 0 || (step.op != ReduceOp::Sum && step.op != ReduceOp::Product) ? 0 : out_bytes, 0};
  }
  throw InternalError("redistribute_step_allocation: bad kind");
}

int64_t all_gather_own_block_offset(const RedistributeStep& step, const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& coords) {
  // The communicator concatenates the blocks in group-rank order.
  std::vector<int64_t> c = coords;
  int64_t offset = 0;
  for (c[step.mesh_dim] = 0; c[step.mesh_dim] < coords[step.mesh_dim]; ++c[step.mesh_dim])
    offset += shard_geometry(shape, step.before, c).num_elements();
  return offset;
}

std::vector<Array> apply_partial_rule(std::vector<Array> components, const Layout& layout) {
  const auto coords = local_device_coords(layout.mesh());
  const auto& partial = layout.partial_ops();
  for (size_t m = 0; m < partial.size(); ++m)
    if (partial[m])
      for (size_t i = 0; i < components.size(); ++i) components[i] = partial_component(components[i], *partial[m], coords[i][m]);
  return components;
}

Array run_redistribute_step(const RedistributeStep& step, const std::vector<int64_t>& shape, DType dtype,
                            const std::vector<int64_t>& coords, Communicator* comm, const Array& input,
                            int64_t& received, const Array* all_gather_output, Device* device) {
  StepContext ctx{step, shape, dtype, coords, comm, device};
  if (ctx.in_device_memory() && !device)
    throw InternalError("a " + std::string(redistribute_kind_name(step.kind)) + " step over device memory without its device");
  received = 0;
  switch (step.kind) {
    case RedistributeKind::AllGather: return run_all_gather(ctx, input, received, all_gather_output);
    case RedistributeKind::AllToAll: return run_all_to_all(ctx, input, received);
    case RedistributeKind::AllReduce: return run_all_reduce(ctx, input, received);
    case RedistributeKind::ReduceScatter: return run_reduce_scatter(ctx, input, received);
    case RedistributeKind::LocalChunk: return run_local_chunk(ctx, input);
    case RedistributeKind::LocalPartial: return partial_component(input, step.op, coords[step.mesh_dim], device);
    case RedistributeKind::Shift: return run_shift(ctx, input, received);
    case RedistributeKind::AllToAllV: break;  // reads its counts too: jit/all_to_all_v_step.hpp
  }
  throw InternalError("run_redistribute_step: bad kind");
}

CollectiveRecord collective_record(const RedistributeStep& step, const Mesh& mesh, DType dtype, int64_t bytes,
                                   const NodeOrigin& origin) {
  CollectiveRecord r;
  r.kind = redistribute_kind_name(step.kind);
  r.mesh_dim = mesh.dim_names()[size_t(step.mesh_dim)];
  r.mesh = mesh.to_string();
  r.dtype = dtype_name(dtype);
  r.source_line = origin.location;
  r.module = !origin.known ? CommModuleScope::current() : origin.module ? *origin.module : std::string();
  r.bytes = bytes;
  return r;
}

NodeValue execute_redistribute(const NodeValue& value, const std::vector<int64_t>& shape, DType dtype,
                               const Layout& target) {
  std::vector<RedistributeStep> plan = plan_redistribute(shape, dtype, value.layout, target);
  component_logger("partitioner").debug("redistribute {}: {}", value.layout.to_string(), describe_plan(plan));
  if (plan.empty()) return NodeValue{value.storage, target};
  const Mesh& mesh = target.mesh();
  const std::vector<int64_t> workers = mesh_worker_indices(mesh);
  const auto coords = local_device_coords(mesh);
  const std::vector<std::string> device_names = mesh.local_devices();
  std::vector<Array> components = value.storage->components;
  for (const RedistributeStep& step : plan) {
    std::vector<std::shared_ptr<Communicator>> comms;
    if (is_collective(step.kind)) comms = mesh_dim_communicators(mesh, step.mesh_dim);
    std::vector<Array> next(components.size());
    std::atomic<int64_t> received_elements{0};
    run_on_devices(workers, [&](int64_t i) {
      ChargeMemoryTo charge(&memory_counter(device_names[size_t(i)]));
      int64_t received = 0;
      next[i] = run_redistribute_step(step, shape, dtype, coords[i], comms.empty() ? nullptr : comms[i].get(),
                                      components[i], received)
                    .on_device(device_names[i]);
      received_elements += received;
    });
    if (is_collective(step.kind) && collective_recording_active())
      record_collective(collective_record(step, mesh, dtype, received_elements * dtype_size(dtype), NodeOrigin{}));
    components = std::move(next);
  }
  return NodeValue{std::make_shared<ShardedStorage>(ShardedStorage{std::move(components)}), target};
}

}  // namespace tessera
