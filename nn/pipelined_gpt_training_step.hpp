// The GPT sample's pipelined training step: PipelinedTransformerTrainingStep
// (nn/pipelined_transformer_training_step.hpp) of a PipelinedGpt.
#pragma once

#include "nn/pipelined_gpt.hpp"
#include "nn/pipelined_transformer_training_step.hpp"

namespace tessera {

class PipelinedGptTrainingStep : public PipelinedTransformerTrainingStep {
 public:
  PipelinedGptTrainingStep(const GptConfig& config, const Mesh& mesh, int64_t microbatches, PipelineSchedule schedule, bool fsdp = false,
                           bool sequence_parallel = false);
  PipelinedGpt& model() { return static_cast<PipelinedGpt&>(PipelinedTransformerTrainingStep::model()); }
};

}  // namespace tessera
