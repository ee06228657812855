// The GPT sample's training step: TransformerTrainingStep (nn/transformer_training_step.hpp) of a
// Gpt, its loss gpt_loss; with microbatches > 1, gradient accumulation.
#pragma once

#include "nn/gpt.hpp"
#include "nn/transformer_training_step.hpp"

namespace tessera {

class GptTrainingStep : public TransformerTrainingStep {
 public:
  GptTrainingStep(const GptConfig& config, const Mesh& mesh, bool sequence_parallel = false, bool fsdp = false, int64_t microbatches = 1);
  Gpt& model() { return static_cast<Gpt&>(TransformerTrainingStep::model()); }
};

}  // namespace tessera
