#include "nn/pipeline.hpp"

#include <algorithm>
#include <string>

#include "dsl/error.hpp"
#include "dsl/local_map.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::GPipe: return "gpipe";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::GPipe;
  throw Error("pipeline schedule '" + name + "': the schedules built are: gpipe (1f1b and interleaved-1f1b are not built yet)");
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

Layout stacked_layout(const Mesh& mesh, int64_t rank, int64_t batch_axis, const std::string& mesh_dim) {
  std::vector<Placement> placements(size_t(mesh.ndim()), Replicate{});
  for (size_t d = 0; d < placements.size(); ++d) {
    if (mesh.dim_names()[d] == mesh_dim) placements[d] = Shard{0};
    if (mesh.dim_names()[d] == "dp" && batch_axis >= 0) placements[d] = Shard{batch_axis};
  }
  return Layout::from_placements(mesh, placements, rank);
}

Tensor stage_indices(const Mesh& mesh, const std::string& mesh_dim) {
  return iota({pipeline_stage_count(mesh, mesh_dim)}, 0, stacked_layout(mesh, 1, -1, mesh_dim));
}

Tensor stage_mask(const Tensor& indices, int64_t lo, int64_t hi, const std::vector<int64_t>& shape) {
  // lo <= s <= hi as one comparison: s - hi <= 0 where s >= lo, and 1 (false) below lo.
  Tensor selected = where(indices >= int64_t(lo), indices - int64_t(hi), 1) <= 0;
  std::vector<int64_t> column(shape.size(), 1);
  column[0] = shape[0];
  return broadcast_to(reshape(selected, column), shape);
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
  if (spec.microbatches < 1) throw Error("run_pipeline: microbatches must be positive, got " + std::to_string(spec.microbatches));
  const Mesh& mesh = spec.state_layout.mesh();
  const int64_t stages = pipeline_stage_count(mesh, spec.mesh_dim), count = spec.microbatches;
  const Tensor indices = stage_indices(mesh, spec.mesh_dim);
  std::vector<Tensor> last_outputs;
  std::optional<Tensor> previous;  // the stacked output of the tick before
  for (int64_t tick = 0; tick < count + stages - 1; ++tick) {
    std::optional<Tensor> stacked;
    if (tick < count) {  // stage 0 takes microbatch `tick`
      const Tensor input = spec.first(tick);
      std::vector<int64_t> shape = input.shape(), one = input.shape();
      shape.insert(shape.begin(), stages);
      one.insert(one.begin(), 1);
      const Tensor fed = broadcast_to(reshape(input, one), shape);
      // The previous tick's value is the where's first operand so that autodiff, which adds a
      // parameter's gradient terms in reverse graph order (dsl/autodiff.cpp), meets every
      // microbatch's terms in tick order whatever the stage count: the same sums, the same bits.
      stacked = previous ? where(stage_mask(indices, 1, stages - 1, shape), shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim), fed)
                         : fed;
    } else {
      stacked = shift_to_next_stage(*previous, spec.state_layout, spec.mesh_dim);
    }
    // Stages holding no microbatch this tick (the bubble, and what the ring carried round from
    // the last stage) compute on zeros; their outputs are never used.
    const int64_t lo = std::max<int64_t>(0, tick - count + 1), hi = std::min(tick, stages - 1);
    if (lo > 0 || hi < stages - 1) stacked = where(stage_mask(indices, lo, hi, stacked->shape()), *stacked, 0.0);
    const Tensor output = spec.stages(with_layout(*stacked, spec.state_layout));
    if (tick >= stages - 1) {
      const std::vector<int64_t> shape = output.shape();
      std::vector<int64_t> begin(shape.size(), 0), size = shape;
      begin[0] = stages - 1, size[0] = 1;
      const std::vector<int64_t> unstacked(shape.begin() + 1, shape.end());
      last_outputs.push_back(reshape(slice(output, begin, size), unstacked));
    }
    previous = output;
  }
  return last_outputs;
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
