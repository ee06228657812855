#include "nn/pipeline.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "dsl/local_map.hpp"
#include "dsl/program_order_scope.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::GPipe: return "gpipe";
    case PipelineSchedule::LoopedBFS: return "looped-bfs";
    case PipelineSchedule::OneFOneB: return "1f1b";
    case PipelineSchedule::Interleaved1F1B: return "interleaved-1f1b";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "looped-bfs") return PipelineSchedule::LoopedBFS;
  if (name == "1f1b") return PipelineSchedule::OneFOneB;
  if (name == "interleaved-1f1b") return PipelineSchedule::Interleaved1F1B;
  throw Error("pipeline schedule '" + name + "': the schedules are gpipe, 1f1b, looped-bfs and interleaved-1f1b");
}

int64_t pipeline_stage_count(const Mesh& mesh, const std::string& mesh_dim) {
  return mesh.contains_dim(mesh_dim) ? mesh.dim_size(mesh_dim) : 1;
}

std::vector<int64_t> split_blocks(int64_t blocks, int64_t stages) {
  if (stages < 1 || stages > blocks)
    throw Error("pipeline: " + std::to_string(blocks) + " blocks cannot be split over " + std::to_string(stages) +
                " stages (each stage needs at least one block)");
  std::vector<int64_t> counts(size_t(stages), blocks / stages);
  for (int64_t s = 0; s < blocks % stages; ++s) ++counts[size_t(s)];
  return counts;
}

PipelineTimetable::PipelineTimetable(int64_t stages, int64_t virtual_stages, int64_t microbatches)
    : stages_(stages), virtual_stages_(virtual_stages), microbatches_(microbatches) {
  if (stages < 1 || virtual_stages < 1 || microbatches < 1)
    throw Error("pipeline: stages (" + std::to_string(stages) + "), virtual stages (" + std::to_string(virtual_stages) +
                ") and microbatches (" + std::to_string(microbatches) + ") must be positive");
  ticks_ = finishing_tick(microbatches - 1) + 1;
}

namespace {

// A stage, virtual stage, microbatch or tick outside [0, count): an error naming it and the
// count, where the timetable's arithmetic would answer for a stage that does not exist (an
// idle slot, or a tick of some other stage's).
void check_in_timetable(const char* what, int64_t value, int64_t count, const char* counted) {
  if (value < 0 || value >= count)
    throw MeshError("PipelineTimetable: " + std::string(what) + " " + std::to_string(value) + " does not exist: the pipeline has " +
                    std::to_string(count) + " " + counted + " (0.." + std::to_string(count - 1) + ")");
}

}  // namespace

int64_t PipelineTimetable::tick_of(int64_t m, int64_t virtual_stage, int64_t stage) const {
  check_in_timetable("microbatch", m, microbatches_, "microbatches");
  check_in_timetable("virtual stage", virtual_stage, virtual_stages_, "virtual stages");
  check_in_timetable("stage", stage, stages_, "stages");
  return m / stages_ * virtual_stages_ * stages_ + virtual_stage * stages_ + m % stages_ + stage;
}

PipelineSlot PipelineTimetable::slot(int64_t tick, int64_t stage) const {
  check_in_timetable("stage", stage, stages_, "stages");
  check_in_timetable("tick", tick, ticks_, "ticks");
  const int64_t u = tick - stage, loop = virtual_stages_ * stages_;
  if (u < 0) return {};
  const int64_t round = u / loop, v = u % loop / stages_, m = round * stages_ + u % stages_;
  return {m < microbatches_ ? m : -1, v};
}

double PipelineTimetable::bubble_fraction() const {
  return 1.0 - double(microbatches_ * virtual_stages_) / double(ticks_);
}

Layout stacked_layout(const Mesh& mesh, int64_t rank, int64_t batch_axis, const std::string& mesh_dim) {
  std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
  for (size_t d = 0; d < placements.size(); ++d) {
    if (mesh.dim_names()[d] == mesh_dim) placements[d] = Shard{0};
    const bool data_parallel = mesh.dim_names()[d] == "dp" || mesh.dim_names()[d] == "ep";  // ep borrows data-parallel ranks
    if (data_parallel && batch_axis >= 0) placements[d] = Shard{batch_axis};
    const bool sequence = mesh.dim_names()[d] == "sp" || mesh.dim_names()[d] == "cp";  // cp: ring attention's shards
    if (sequence && batch_axis >= 0 && batch_axis + 1 < rank) placements[d] = Shard{batch_axis + 1};
  }
  return Layout::from_placements(mesh, placements, rank);
}

Tensor stage_indices(const Mesh& mesh, const std::string& mesh_dim, int64_t tag) {
  return tagged_iota({pipeline_stage_count(mesh, mesh_dim)}, 0, stacked_layout(mesh, 1, -1, mesh_dim), tag);
}

Tensor stage_mask(const Tensor& indices, const std::vector<bool>& selected, const std::vector<int64_t>& shape) {
  // One comparison per run of selected stages lo..hi (s - hi <= 0 where s >= lo), or'ed by where.
  std::optional<Tensor> chosen;
  for (int64_t lo = 0; lo < int64_t(selected.size()); ++lo) {
    if (!selected[size_t(lo)]) continue;
    int64_t hi = lo;
    while (hi + 1 < int64_t(selected.size()) && selected[size_t(hi + 1)]) ++hi;
    const Tensor run = where(indices >= lo, indices - hi, 1) <= 0;
    chosen = chosen ? where(run, run, *chosen) : run;
    lo = hi;
  }
  if (!chosen) chosen = indices < 0;  // none selected
  std::vector<int64_t> column(shape.size(), 1);
  column[0] = shape[0];
  return broadcast_to(reshape(*chosen, column), shape);
}

namespace {

Tensor shift_stages(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim, int64_t offset) {
  if (!layout.mesh().contains_dim(mesh_dim)) return stacked;
  const std::vector<Placement> placements = layout.placements();
  auto shift_blocks = local_map([mesh_dim, offset](const Tensor& block) { return shift(block, mesh_dim, offset); }, {placements},
                                {placements}, layout.mesh(), /*redistribute_inputs=*/true);
  return shift_blocks(stacked);
}

}  // namespace

Tensor on_every_stage(const Tensor& value, int64_t stages) {
  std::vector<int64_t> shape = value.shape(), one = value.shape();
  shape.insert(shape.begin(), stages);
  one.insert(one.begin(), 1);
  return broadcast_to(reshape(value, one), shape);
}

Tensor stage_slot(const Tensor& stacked, int64_t stage, const std::string& mesh_dim) {
  const std::vector<int64_t> shape = stacked.shape();
  const Mesh& mesh = stacked.layout().mesh();
  if (mesh.contains_dim(mesh_dim) && pipeline_stage_count(mesh, mesh_dim) == shape[0]) {
    std::vector<bool> only(size_t(shape[0]), false);
    only[size_t(stage)] = true;
    const Tensor sum = reduce_sum(where(stage_mask(stage_indices(mesh, mesh_dim), only, shape), stacked, 0.0), {0});
    return with_layout(sum, sum.layout().without_partial());  // reduced here, once, not in every op downstream
  }
  std::vector<int64_t> begin(shape.size(), 0), size = shape;
  begin[0] = stage, size[0] = 1;
  return reshape(slice(stacked, begin, size), std::vector<int64_t>(shape.begin() + 1, shape.end()));
}

Tensor stage_mask(const Tensor& selected, const std::vector<int64_t>& shape) {
  std::vector<int64_t> column(shape.size(), 1);
  column[0] = shape[0];
  return broadcast_to(reshape(selected, column), shape);
}

Tensor shift_to_next_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim) {
  return shift_stages(stacked, layout, mesh_dim, 1);
}

Tensor shift_to_previous_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim) {
  return shift_stages(stacked, layout, mesh_dim, -1);
}

namespace {

// The looped forward (GPipe with one virtual stage): every tick's stacked input and output,
// the inputs held constant (no gradient flows into them) when `detach_inputs`.
struct ForwardTick {
  Tensor input, output;
};

// Built in ProgramOrderScope(positions[tick]) per tick when positions are given.
std::vector<ForwardTick> forward_ticks(const PipelineSpec& spec, const PipelineTimetable& timetable, bool detach_inputs,
                                       const std::vector<int64_t>& positions = {}) {
  const int64_t stages = timetable.stages();
  const Tensor indices = stage_indices(spec.state_layout.mesh(), spec.mesh_dim);
  std::vector<ForwardTick> ticks;
  for (int64_t tick = 0; tick < timetable.ticks(); ++tick) {
    std::optional<ProgramOrderScope> in_order;
    if (!positions.empty()) in_order.emplace(positions[size_t(tick)]);
    std::vector<PipelineSlot> slots;
    for (int64_t s = 0; s < stages; ++s) slots.push_back(timetable.slot(tick, s));
    const std::optional<Tensor> previous = ticks.empty() ? std::nullopt : std::optional<Tensor>(ticks.back().output);
    std::optional<Tensor> stacked;
    if (slots[0].microbatch >= 0 && slots[0].virtual_stage == 0) {  // device 0 takes a new microbatch
      const Tensor fed = on_every_stage(spec.first(slots[0].microbatch), stages);
      // The previous tick's value is the where's first operand so that autodiff, which adds a
      // parameter's gradient terms in reverse graph order (dsl/autodiff.cpp), meets every
      // microbatch's terms in tick order whatever the stage count: the same sums, the same bits.
      std::vector<bool> others(size_t(stages), true);
      others[0] = false;
      stacked = previous ? where(stage_mask(indices, others, fed.shape()), shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim), fed)
                         : fed;
    } else {
      stacked = shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim);
    }
    // Devices holding no microbatch this tick (the bubble, and what the ring carried round from
    // the last device after the last virtual stage) compute on zeros; those outputs are never used.
    std::vector<bool> busy;
    for (const PipelineSlot& slot : slots) busy.push_back(slot.microbatch >= 0);
    if (std::count(busy.begin(), busy.end(), true) < stages) stacked = where(stage_mask(indices, busy, stacked->shape()), *stacked, 0.0);
    Tensor input = with_layout(*stacked, spec.state_layout);
    if (detach_inputs) input = stop_gradient(input);
    ticks.push_back({input, spec.stages(input, tick, slots)});
  }
  return ticks;
}

// Backward tick b's (microbatch, virtual stage) per device: the forward's timetable on the ring
// reversed (device P - 1 - s there is device s here, virtual stage V - 1 - v is v).
std::vector<PipelineSlot> backward_slots(const PipelineTimetable& timetable, int64_t b) {
  std::vector<PipelineSlot> slots;
  for (int64_t s = 0; s < timetable.stages(); ++s) {
    PipelineSlot reversed = timetable.slot(b, timetable.stages() - 1 - s);
    reversed.virtual_stage = timetable.virtual_stages() - 1 - reversed.virtual_stage;
    slots.push_back(reversed);
  }
  return slots;
}

// Where 1F1B's ticks run (ProgramOrderScope positions): each backward tick just after the last
// forward tick it reads (the loss of the microbatch it takes in, the stage inputs it recomputes
// from), and each microbatch's loss with its finishing forward tick. A stage input then lives
// about 2P ticks whatever the microbatch count, rather than from the forward to a backward that
// would run after every forward.
struct OneFOneBOrder {
  std::vector<int64_t> forward, backward, loss;
};

OneFOneBOrder one_f_one_b_order(const PipelineTimetable& timetable, int64_t microbatches) {
  const int64_t ticks = timetable.ticks(), stages = timetable.stages();
  std::vector<int64_t> last_read(size_t(ticks), 0);  // per backward tick, the last forward tick it reads
  for (int64_t b = 0; b < ticks; ++b) {
    const std::vector<PipelineSlot> slots = backward_slots(timetable, b);
    for (int64_t s = 0; s < stages; ++s)
      if (slots[size_t(s)].microbatch >= 0)
        last_read[size_t(b)] =
            std::max(last_read[size_t(b)], timetable.tick_of(slots[size_t(s)].microbatch, slots[size_t(s)].virtual_stage, s));
    const PipelineSlot& last = slots.back();
    if (last.microbatch >= 0 && last.virtual_stage == timetable.virtual_stages() - 1)
      last_read[size_t(b)] = std::max(last_read[size_t(b)], timetable.finishing_tick(last.microbatch));
  }
  OneFOneBOrder order{std::vector<int64_t>(size_t(ticks)), std::vector<int64_t>(size_t(ticks)), std::vector<int64_t>(size_t(microbatches))};
  int64_t position = 0, b = 0;
  for (int64_t t = 0; t < ticks; ++t) {
    order.forward[size_t(t)] = position++;
    for (; b < ticks && last_read[size_t(b)] <= t; ++b) order.backward[size_t(b)] = position++;
  }
  for (int64_t m = 0; m < microbatches; ++m) order.loss[size_t(m)] = order.forward[size_t(timetable.finishing_tick(m))];
  return order;
}

void check_spec(const PipelineSpec& spec, const char* who) {
  if (!spec.first || !spec.stages || !spec.state_layout.is_valid())
    throw Error(std::string(who) + ": the spec needs first, stages and a state layout");
}

}  // namespace

std::vector<Tensor> run_pipeline(const PipelineSpec& spec) {
  check_spec(spec, "run_pipeline");
  const PipelineTimetable timetable(pipeline_stage_count(spec.state_layout.mesh(), spec.mesh_dim), spec.virtual_stages, spec.microbatches);
  const std::vector<ForwardTick> ticks = forward_ticks(spec, timetable, false);
  std::vector<Tensor> outputs;  // each microbatch's, off the last device at its finishing tick
  for (int64_t m = 0; m < spec.microbatches; ++m)
    outputs.push_back(stage_slot(ticks[size_t(timetable.finishing_tick(m))].output, timetable.stages() - 1, spec.mesh_dim));
  return outputs;
}

PipelineGradients run_pipeline_1f1b(const PipelineSpec& spec, const PipelineLoss& loss) {
  check_spec(spec, "run_pipeline_1f1b");
  if (!loss.loss) throw Error("run_pipeline_1f1b: no loss");
  const Mesh& mesh = spec.state_layout.mesh();
  const int64_t stages = pipeline_stage_count(mesh, spec.mesh_dim), count = spec.microbatches, virtuals = spec.virtual_stages;
  const PipelineTimetable timetable(stages, virtuals, count);
  auto only = [&](int64_t stage) {
    std::vector<bool> selected(size_t(stages), false);
    selected[size_t(stage)] = true;
    return selected;
  };
  // Gradients: zeros, then each term added in microbatch order (acc + term, on every device).
  auto zeros_like_all = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> z;
    for (const Tensor& t : ts) z.push_back(zeros(t.shape(), t.layout().without_partial(), t.dtype()));
    return z;
  };
  auto accumulate = [](std::vector<Tensor>& acc, const std::vector<Tensor>& terms, size_t from) {
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + terms[from + i];
  };
  auto with_wrt = [](std::vector<Tensor> head, const std::vector<Tensor>& rest) {
    head.insert(head.end(), rest.begin(), rest.end());
    return head;
  };
  PipelineGradients out{Tensor(), zeros_like_all(loss.first_parameters), zeros_like_all(loss.stage_parameters),
                        zeros_like_all(loss.last_parameters)};

  // The forward, keeping each tick's stage inputs; each microbatch's loss and the loss's VJP
  // (d loss / d last output, and the last part's gradient terms) as it finishes.
  const OneFOneBOrder order = one_f_one_b_order(timetable, count);
  const std::vector<ForwardTick> ticks = forward_ticks(spec, timetable, true, order.forward);
  std::vector<Tensor> last_cotangent;
  std::optional<Tensor> total;
  for (int64_t m = 0; m < count; ++m) {
    const ProgramOrderScope in_order(order.loss[size_t(m)]);
    const Tensor last_output = stop_gradient(stage_slot(ticks[size_t(timetable.finishing_tick(m))].output, stages - 1, spec.mesh_dim));
    const Tensor term = loss.loss(last_output, m);
    total = total ? *total + term : term;
    const std::vector<Tensor> g = gradients(term / double(count), with_wrt({last_output}, loss.last_parameters));
    last_cotangent.push_back(g[0]);
    accumulate(out.last, g, 1);
  }
  out.loss = *total / double(count);

  // The backward is the forward's timetable run on the ring reversed (backward_slots), so
  // microbatches enter at the last device's last virtual stage (from the loss) and cotangents
  // shift to the previous device (device 0's to the last, one virtual stage down). Each device
  // recomputes its stage from the input its forward kept and multiplies the transposed Jacobian in.
  std::optional<Tensor> input_cotangent;  // the backward tick before's d stage input
  for (int64_t b = 0; b < timetable.ticks(); ++b) {
    const ProgramOrderScope in_order(order.backward[size_t(b)]);
    const std::vector<PipelineSlot> slots = backward_slots(timetable, b);
    // Masks of this tick's own: the backward's nodes must not be the forward's (hash-consing),
    // or autodiff's sums regroup.
    const int64_t unique = (timetable.ticks() + b + 1) * stages;
    const Tensor salted = stage_indices(mesh, spec.mesh_dim, unique);  // a node of this tick's own
    std::optional<Tensor> input;
    std::vector<bool> busy;
    for (int64_t s = 0; s < stages; ++s) {
      const PipelineSlot& slot = slots[size_t(s)];
      busy.push_back(slot.microbatch >= 0);
      if (slot.microbatch < 0) continue;
      const Tensor& kept = ticks[size_t(timetable.tick_of(slot.microbatch, slot.virtual_stage, s))].input;
      const Tensor mask = stage_mask(salted, only(s), kept.shape());
      input = input ? where(mask, kept, *input) : where(mask, kept, 0.0);
    }
    if (!input) continue;
    const PipelineSlot& last = slots.back();
    std::optional<Tensor> cotangent;
    if (last.microbatch >= 0 && last.virtual_stage == virtuals - 1) {  // the last device takes a microbatch's loss cotangent
      const Tensor fed = on_every_stage(last_cotangent[size_t(last.microbatch)], stages);
      cotangent = input_cotangent ? where(stage_mask(salted, only(stages - 1), fed.shape()), fed,
                                          shift_to_previous_stage(*input_cotangent, spec.state_layout, spec.mesh_dim))
                                  : fed;
    } else {
      cotangent = shift_to_previous_stage(*input_cotangent, spec.state_layout, spec.mesh_dim);
    }
    cotangent = where(stage_mask(salted, busy, cotangent->shape()), *cotangent, 0.0);
    // One stage (gradient accumulation without pp): a microbatch's backward runs just after its
    // forward (one_f_one_b_order), so it differentiates the forward's own graph, whose values are
    // still held, and recomputes nothing. The same ops either way, so the same bits.
    Tensor stage_input, stage_output;
    if (stages == 1 && virtuals == 1) {
      const ForwardTick& kept = ticks[size_t(timetable.tick_of(slots.front().microbatch, 0, 0))];
      stage_input = kept.input, stage_output = kept.output;
    } else {
      stage_input = stop_gradient(with_layout(*input, spec.state_layout));
      stage_output = spec.stages(stage_input, timetable.ticks() + b, slots);
    }
    // A vector-Jacobian product as a gradient: d sum(y * c) / d x with c held constant (c is
    // itself built from the parameters, which autodiff must not follow).
    const std::vector<Tensor> g = gradients(reduce_sum(stage_output * stop_gradient(with_layout(*cotangent, spec.state_layout))),
                                            with_wrt({stage_input}, loss.stage_parameters));
    accumulate(out.stages, g, 1);
    input_cotangent = g[0];
    const PipelineSlot& first = slots.front();
    if (first.microbatch >= 0 && first.virtual_stage == 0) {  // device 0's first chunk finished a microbatch: into the first part
      const std::vector<Tensor> e =
          gradients(reduce_sum(spec.first(first.microbatch) * stop_gradient(stage_slot(g[0], 0, spec.mesh_dim))), loss.first_parameters);
      accumulate(out.first, e, 0);
    }
  }
  // Handed out as gradients() hands out one: a partial sum over dp that clipping and the
  // optimizer both read is then reduced once, not once for each.
  for (auto [sums, parameters] : {std::pair{&out.first, &loss.first_parameters}, std::pair{&out.stages, &loss.stage_parameters},
                                  std::pair{&out.last, &loss.last_parameters}})
    for (size_t i = 0; i < sums->size(); ++i)
      (*sums)[i] = hand_out_gradient((*sums)[i], (*parameters)[i].layout().without_partial());
  return out;
}

namespace {

// Error unless `batch` splits into `count` microbatches along axis 0; `which` names the call.
void check_microbatch_split(const Tensor& batch, int64_t count, const std::string& which) {
  if (count < 1) throw ShapeError(which + ": count must be at least 1");
  if (batch.rank() < 1) throw ShapeError(which + ": a scalar batch has no axis 0 to split");
  if (batch.shape()[0] % count != 0)
    throw ShapeError(which + ": the batch " + shape_string(batch.shape()) + " does not split into " + std::to_string(count) +
                     " equal microbatches along axis 0");
}

}  // namespace

Tensor microbatch(const Tensor& batch, int64_t m, int64_t count) {
  // Each mistake said as itself: a microbatch that does not exist is not a batch that does not split.
  const std::string which = "microbatch(m = " + std::to_string(m) + ", count = " + std::to_string(count) + ")";
  if (count >= 1 && (m < 0 || m >= count))
    throw ShapeError(which + ": microbatch " + std::to_string(m) + " does not exist; there are " + std::to_string(count) +
                     " (0.." + std::to_string(count - 1) + ")");
  check_microbatch_split(batch, count, which);
  std::vector<int64_t> split = batch.shape();
  split[0] = batch.shape()[0] / count;
  split.insert(split.begin() + 1, count);
  std::vector<int64_t> begin(split.size(), 0), size = split;
  begin[1] = m, size[1] = 1;
  std::vector<int64_t> shape = batch.shape();
  shape[0] /= count;
  return reshape(slice(reshape(batch, split), begin, size), shape);
}

Tensor microbatch(const Tensor& batch, const Tensor& index, int64_t count) {
  const std::string which = "microbatch(index, count = " + std::to_string(count) + ")";
  check_microbatch_split(batch, count, which);
  if (index.rank() != 0 || index.dtype() != DType::i32)
    throw ShapeError(which + ": the index must be an int32 scalar, got " + std::string(dtype_name(index.dtype())) + " " + shape_string(index.shape()));
  // [B, ...] -> [B / count, count, ...] as microbatch(m) splits it; microbatch m is column m.
  std::vector<int64_t> split = batch.shape();
  split[0] = batch.shape()[0] / count;
  split.insert(split.begin() + 1, count);
  std::vector<int64_t> column(split.size(), 1);
  column[1] = count;
  const Tensor chosen = iota({count}, 0, Layout::replicated(batch.layout().mesh(), 1)) == index;
  const Tensor mask = broadcast_to(reshape(chosen, column), split);
  // A sum of one value and zeros: exact, in the batch's dtype again (integer sums widen).
  return cast(reduce_sum(where(mask, reshape(batch, split), 0), {1}), batch.dtype());
}

}  // namespace tessera
