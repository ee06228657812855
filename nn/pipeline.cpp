#include "nn/pipeline.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "dsl/autodiff.hpp"
#include "dsl/error.hpp"
#include "dsl/local_map.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::GPipe: return "gpipe";
    case PipelineSchedule::LoopedBFS: return "looped-bfs";
    case PipelineSchedule::OneFOneB: return "1f1b";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "looped-bfs") return PipelineSchedule::LoopedBFS;
  if (name == "1f1b") return PipelineSchedule::OneFOneB;
  throw Error("pipeline schedule '" + name + "': the schedules built are gpipe, looped-bfs and 1f1b (interleaved-1f1b is not built yet)");
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

int64_t PipelineTimetable::finishing_tick(int64_t m) const {
  const int64_t round = m / stages_, i = m % stages_;
  return round * virtual_stages_ * stages_ + (virtual_stages_ - 1) * stages_ + i + stages_ - 1;
}

PipelineSlot PipelineTimetable::slot(int64_t tick, int64_t stage) const {
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
    if (mesh.dim_names()[d] == "dp" && batch_axis >= 0) placements[d] = Shard{batch_axis};
    if (mesh.dim_names()[d] == "sp" && batch_axis >= 0 && batch_axis + 1 < rank) placements[d] = Shard{batch_axis + 1};
  }
  return Layout::from_placements(mesh, placements, rank);
}

Tensor stage_indices(const Mesh& mesh, const std::string& mesh_dim, int64_t offset) {
  const Tensor indices = iota({pipeline_stage_count(mesh, mesh_dim)}, 0, stacked_layout(mesh, 1, -1, mesh_dim));
  return offset == 0 ? indices : indices + offset;
}

Tensor stage_mask(const Tensor& indices, const std::vector<bool>& selected, const std::vector<int64_t>& shape, int64_t offset) {
  // One comparison per run of selected stages lo..hi (s - hi <= 0 where s >= lo), or'ed by where.
  std::optional<Tensor> chosen;
  for (int64_t lo = 0; lo < int64_t(selected.size()); ++lo) {
    if (!selected[size_t(lo)]) continue;
    int64_t hi = lo;
    while (hi + 1 < int64_t(selected.size()) && selected[size_t(hi + 1)]) ++hi;
    const Tensor run = where(indices >= lo + offset, indices - (hi + offset), 1) <= 0;
    chosen = chosen ? where(run, run, *chosen) : run;
    lo = hi;
  }
  if (!chosen) chosen = indices < offset;  // none selected
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

// [P, shape...] with `value` in every stage's slot.
Tensor on_every_stage(const Tensor& value, int64_t stages) {
  std::vector<int64_t> shape = value.shape(), one = value.shape();
  shape.insert(shape.begin(), stages);
  one.insert(one.begin(), 1);
  return broadcast_to(reshape(value, one), shape);
}

// Stage `stage`'s slot of a stacked value.
Tensor stage_slot(const Tensor& stacked, int64_t stage) {
  const std::vector<int64_t> shape = stacked.shape();
  std::vector<int64_t> begin(shape.size(), 0), size = shape;
  begin[0] = stage, size[0] = 1;
  return reshape(slice(stacked, begin, size), std::vector<int64_t>(shape.begin() + 1, shape.end()));
}

}  // namespace

Tensor shift_to_next_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim) {
  return shift_stages(stacked, layout, mesh_dim, 1);
}

Tensor shift_to_previous_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim) {
  return shift_stages(stacked, layout, mesh_dim, -1);
}

std::vector<Tensor> run_pipeline(const PipelineSpec& spec) {
  if (!spec.first || !spec.stages || !spec.state_layout.is_valid())
    throw Error("run_pipeline: the spec needs first, stages and a state layout");
  const Mesh& mesh = spec.state_layout.mesh();
  const int64_t stages = pipeline_stage_count(mesh, spec.mesh_dim);
  const PipelineTimetable timetable(stages, spec.virtual_stages, spec.microbatches);
  const Tensor indices = stage_indices(mesh, spec.mesh_dim);
  std::vector<std::optional<Tensor>> finished(size_t(spec.microbatches));
  std::optional<Tensor> previous;  // the stacked output of the tick before
  for (int64_t tick = 0; tick < timetable.ticks(); ++tick) {
    std::vector<PipelineSlot> slots;
    for (int64_t s = 0; s < stages; ++s) slots.push_back(timetable.slot(tick, s));
    std::optional<Tensor> stacked;
    if (slots[0].microbatch >= 0 && slots[0].virtual_stage == 0) {  // device 0 takes a new microbatch
      const Tensor fed = on_every_stage(spec.first(slots[0].microbatch), stages);
      const std::vector<int64_t> shape = fed.shape();
      // The previous tick's value is the where's first operand so that autodiff, which adds a
      // parameter's gradient terms in reverse graph order (dsl/autodiff.cpp), meets every
      // microbatch's terms in tick order whatever the stage count: the same sums, the same bits.
      std::vector<bool> others(size_t(stages), true);
      others[0] = false;
      stacked = previous ? where(stage_mask(indices, others, shape), shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim), fed)
                         : fed;
    } else {
      stacked = shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim);
    }
    // Devices holding no microbatch this tick (the bubble, and what the ring carried round from
    // the last device after the last virtual stage) compute on zeros; those outputs are never used.
    std::vector<bool> busy;
    std::vector<int64_t> virtual_stage;
    for (const PipelineSlot& slot : slots) busy.push_back(slot.microbatch >= 0), virtual_stage.push_back(slot.virtual_stage);
    if (std::count(busy.begin(), busy.end(), true) < stages) stacked = where(stage_mask(indices, busy, stacked->shape()), *stacked, 0.0);
    const Tensor output = spec.stages(with_layout(*stacked, spec.state_layout), tick, virtual_stage);
    const PipelineSlot& last = slots.back();
    if (last.microbatch >= 0 && last.virtual_stage == spec.virtual_stages - 1) finished[size_t(last.microbatch)] = stage_slot(output, stages - 1);
    previous = output;
  }
  std::vector<Tensor> outputs;
  for (const auto& out : finished) outputs.push_back(*out);
  return outputs;
}

PipelineGradients run_pipeline_1f1b(const PipelineSpec& spec, const PipelineLoss& loss) {
  if (!spec.first || !spec.stages || !spec.state_layout.is_valid() || !loss.loss)
    throw Error("run_pipeline_1f1b: the spec needs first, stages, a state layout and a loss");
  if (spec.virtual_stages != 1) throw Error("run_pipeline_1f1b: one stage per device (interleaved 1F1B is not built yet)");
  const Mesh& mesh = spec.state_layout.mesh();
  const int64_t stages = pipeline_stage_count(mesh, spec.mesh_dim), count = spec.microbatches;
  const PipelineTimetable timetable(stages, 1, count);
  const int64_t ticks = timetable.ticks();  // forward ticks; as many backward ones
  const Tensor indices = stage_indices(mesh, spec.mesh_dim);
  const std::vector<int64_t> forward_stage(size_t(stages), 0);
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
  PipelineGradients out{Tensor(), zeros_like_all(loss.first_parameters), zeros_like_all(loss.stage_parameters),
                        zeros_like_all(loss.last_parameters)};
  auto with_wrt = [](std::vector<Tensor> head, const std::vector<Tensor>& rest) {
    head.insert(head.end(), rest.begin(), rest.end());
    return head;
  };

  // Forward ticks, GPipe's: each keeps its stage inputs (no gradient flows through them).
  std::vector<Tensor> kept;                        // stacked stage inputs per forward tick
  std::vector<std::optional<Tensor>> last_cotangent(static_cast<size_t>(count));  // d loss / d last output, per microbatch
  std::optional<Tensor> previous, total;
  for (int64_t tick = 0; tick < ticks; ++tick) {
    std::optional<Tensor> stacked;
    if (tick < count) {
      const Tensor fed = on_every_stage(spec.first(tick), stages);
      std::vector<bool> others(size_t(stages), true);
      others[0] = false;
      stacked = previous ? where(stage_mask(indices, others, fed.shape()), shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim), fed)
                         : fed;
    } else {
      stacked = shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim);
    }
    std::vector<bool> busy;
    for (int64_t s = 0; s < stages; ++s) busy.push_back(timetable.slot(tick, s).microbatch >= 0);
    if (std::count(busy.begin(), busy.end(), true) < stages) stacked = where(stage_mask(indices, busy, stacked->shape()), *stacked, 0.0);
    kept.push_back(stop_gradient(with_layout(*stacked, spec.state_layout)));
    const Tensor output = spec.stages(kept.back(), tick, forward_stage);
    if (tick >= stages - 1) {  // the last stage finished microbatch m: its loss, and the loss's VJP
      const int64_t m = tick - (stages - 1);
      const Tensor last_output = stop_gradient(stage_slot(output, stages - 1));
      const Tensor term = loss.loss(last_output, m);
      total = total ? *total + term : term;
      const std::vector<Tensor> g = gradients(term / double(count), with_wrt({last_output}, loss.last_parameters));
      last_cotangent[size_t(m)] = g[0];
      accumulate(out.last, g, 1);
    }
    previous = output;
  }
  out.loss = *total / double(count);

  // Backward ticks: device s on microbatch b - (P - 1 - s), recomputing its stage from what its
  // forward kept, its output's cotangent from the stage after (the last stage: the loss's).
  std::optional<Tensor> input_cotangent;  // the backward tick before's d stage input
  for (int64_t b = 0; b < ticks; ++b) {
    std::vector<int64_t> microbatch_of(static_cast<size_t>(stages));
    for (int64_t s = 0; s < stages; ++s) microbatch_of[size_t(s)] = b - (stages - 1 - s);
    auto valid = [&](int64_t s) { return microbatch_of[size_t(s)] >= 0 && microbatch_of[size_t(s)] < count; };
    // Each device's kept input (forward tick m + s), through masks of this tick's own: the
    // backward tick's nodes must not be the forward's (hash-consing) or autodiff's sums regroup.
    const int64_t unique = (ticks + b + 1) * stages;
    const Tensor salted = stage_indices(mesh, spec.mesh_dim, unique);
    std::optional<Tensor> input;
    for (int64_t s = 0; s < stages; ++s) {
      if (!valid(s)) continue;
      const Tensor& from = kept[size_t(microbatch_of[size_t(s)] + s)];
      const Tensor mask = stage_mask(salted, only(s), from.shape(), unique);
      input = input ? where(mask, from, *input) : where(mask, from, 0.0);
    }
    if (!input) continue;
    std::optional<Tensor> cotangent;
    const int64_t last_m = microbatch_of[size_t(stages - 1)];
    if (last_m >= 0 && last_m < count) {
      const Tensor fed = on_every_stage(*last_cotangent[size_t(last_m)], stages);
      cotangent = input_cotangent ? where(stage_mask(salted, only(stages - 1), fed.shape(), unique), fed,
                                          shift_to_previous_stage(*input_cotangent, spec.state_layout, spec.mesh_dim))
                                  : fed;
    } else {
      cotangent = shift_to_previous_stage(*input_cotangent, spec.state_layout, spec.mesh_dim);
    }
    std::vector<bool> busy;
    for (int64_t s = 0; s < stages; ++s) busy.push_back(valid(s));
    cotangent = where(stage_mask(salted, busy, cotangent->shape(), unique), *cotangent, 0.0);
    const Tensor recomputed_input = stop_gradient(with_layout(*input, spec.state_layout));
    const Tensor recomputed = spec.stages(recomputed_input, ticks + b, forward_stage);
    // A vector-Jacobian product as a gradient: d sum(y * c) / d x with c held constant (c is
    // itself built from the parameters, which autodiff must not follow).
    const std::vector<Tensor> g = gradients(reduce_sum(recomputed * stop_gradient(with_layout(*cotangent, spec.state_layout))),
                                            with_wrt({recomputed_input}, loss.stage_parameters));
    accumulate(out.stages, g, 1);
    input_cotangent = g[0];
    const int64_t first_m = microbatch_of[0];
    if (first_m >= 0 && first_m < count) {  // stage 0 finished microbatch first_m: into the first part's parameters
      const std::vector<Tensor> e = gradients(reduce_sum(spec.first(first_m) * stop_gradient(stage_slot(g[0], 0))), loss.first_parameters);
      accumulate(out.first, e, 0);
    }
  }
  return out;
}

Tensor microbatch(const Tensor& batch, int64_t m, int64_t count) {
  if (batch.rank() < 1 || count < 1 || batch.shape()[0] % count != 0 || m < 0 || m >= count)
    throw ShapeError("microbatch " + std::to_string(m) + " of " + std::to_string(count) + ": the batch " + shape_string(batch.shape()) +
                     " does not split into " + std::to_string(count) + " equal microbatches along axis 0");
  std::vector<int64_t> split = batch.shape();
  split[0] = batch.shape()[0] / count;
  split.insert(split.begin() + 1, count);
  std::vector<int64_t> begin(split.size(), 0), size = split;
  begin[1] = m, size[1] = 1;
  std::vector<int64_t> shape = batch.shape();
  shape[0] /= count;
  return reshape(slice(reshape(batch, split), begin, size), shape);
}

}  // namespace tessera
