#include "nn/pipeline.hpp"

#include <algorithm>
#include <optional>
#include <string>

#include "dsl/error.hpp"
#include "dsl/local_map.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::GPipe: return "gpipe";
    case PipelineSchedule::LoopedBFS: return "looped-bfs";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  if (name == "looped-bfs") return PipelineSchedule::LoopedBFS;
  throw Error("pipeline schedule '" + name + "': the schedules built are gpipe and looped-bfs (1f1b and interleaved-1f1b are not built yet)");
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

Tensor shift_to_next_stage(const Tensor& stacked, const Layout& layout, const std::string& mesh_dim) {
  if (!layout.mesh().contains_dim(mesh_dim)) return stacked;
  const std::vector<Placement> placements = layout.placements();
  auto shift_blocks = local_map([mesh_dim](const Tensor& block) { return shift(block, mesh_dim, 1); }, {placements}, {placements},
                                layout.mesh(), /*redistribute_inputs=*/true);
  return shift_blocks(stacked);
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
      const Tensor input = spec.first(slots[0].microbatch);
      std::vector<int64_t> shape = input.shape(), one = input.shape();
      shape.insert(shape.begin(), stages);
      one.insert(one.begin(), 1);
      const Tensor fed = broadcast_to(reshape(input, one), shape);
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
    if (last.microbatch >= 0 && last.virtual_stage == spec.virtual_stages - 1) {
      const std::vector<int64_t> shape = output.shape();
      std::vector<int64_t> begin(shape.size(), 0), size = shape;
      begin[0] = stages - 1, size[0] = 1;
      const std::vector<int64_t> unstacked(shape.begin() + 1, shape.end());
      finished[size_t(last.microbatch)] = reshape(slice(output, begin, size), unstacked);
    }
    previous = output;
  }
  std::vector<Tensor> outputs;
  for (const auto& out : finished) outputs.push_back(*out);
  return outputs;
}

Tensor microbatch(const Tensor& batch, int64_t m, int64_t count) {
  if (batch.rank() < 1 || count < 1 || batch.shape()[0] % count != 0 || m < 0 || m >= count)
    throw ShapeError("microbatch " + std::to_string(m) + " of " + std::to_string(count) + ": the batch " + shape_string(batch.shape()) +
                     " must split into that many equal microbatches along axis 0");
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
