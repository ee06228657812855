#include "nn/pipelined_gpt_training_step.hpp"

namespace tessera {

PipelinedGptTrainingStep::PipelinedGptTrainingStep(const GptConfig& config, const Mesh& mesh, int64_t microbatches, PipelineSchedule schedule,
                                                   bool fsdp, bool sequence_parallel)
    : PipelinedTransformerTrainingStep(std::make_unique<PipelinedGpt>(config, mesh, default_virtual_stages(schedule)), mesh, microbatches,
                                       schedule, fsdp, sequence_parallel) {}

}  // namespace tessera
